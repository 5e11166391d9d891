"""Sampling and exact speculative acceptance (pure functions).

Vocabulary, after vLLM's rejection sampler:

- *accepted* tokens: draft tokens kept because ``u < target_probs(x) / draft_probs(x)``;
- *recovered* token: on the first rejection, a sample of ``normalize(max(0, target_probs -
  draft_probs))`` at that position;
- *bonus* token: when every proposed token is accepted, a sample of ``target_probs`` at the
  next position.

Greedy decoding (temperature 0) is the same rule applied to one-hot distributions: a draft
token is accepted iff it equals the target's argmax, and the recovered/bonus token is the
target's argmax. One code path therefore serves greedy and sampled rows in one batch.

Randomness comes only from an explicit ``torch.Generator``; uniforms are float64; a zero
draft probability rejects; categorical draws use ``argmax(probs / Exp(1))`` (no divide by a
normaliser, no renormalisation). References: Leviathan et al. 2023 (Thm 3.5), Chen et al. 2023.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class BatchSampling:
    """Per-row sampling parameters of a batch; ``all_greedy`` lets hot loops skip the softmax."""

    temperature: torch.Tensor  # (B,) 0 = greedy
    top_k: torch.Tensor | None = None  # (B,) 0 = off; None when no row filters
    top_p: torch.Tensor | None = None  # (B,) 1 = off; None when no row filters
    all_greedy: bool = False
    top_k_max: int | None = None  # host copy of the largest top_k (0 = a row without), if known

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """:func:`process_logits` for this batch; all-greedy batches go straight to one-hot."""
        if self.all_greedy:
            return torch.zeros_like(logits, dtype=torch.float32).scatter_(
                -1, logits.argmax(-1, keepdim=True), 1.0
            )
        return process_logits(logits, self.temperature, self.top_k, self.top_p, self.top_k_max)


def process_logits(
    logits: torch.Tensor,  # (B, T, V)
    temperature: torch.Tensor,  # (B,) float; 0 = greedy
    top_k: torch.Tensor | None = None,  # (B,) int; 0 = off
    top_p: torch.Tensor | None = None,  # (B,) float; 1 = off
    top_k_max: int | None = None,  # the host's copy of top_k.max() (0 counts as the vocabulary)
) -> torch.Tensor:  # (B, T, V) float32 probabilities
    """The distribution a row samples from: temperature, then top-k, then top-p.

    Greedy rows (temperature 0) get the one-hot distribution of the raw argmax. Draft and
    target go through this same function, so both see identical processing. ``top_k_max``
    lets a caller that knows its rows' settings spare the device read that sizes top-k.

    Example:
        >>> logits = torch.tensor([[[2.0, 1.0, 0.0]]])
        >>> process_logits(logits, torch.tensor([0.0]))
        tensor([[[1., 0., 0.]]])
    """
    logits = logits.float()
    greedy = temperature <= 0  # (B,)
    temp = torch.where(greedy, torch.ones_like(temperature), temperature).float()
    scaled = logits / temp[:, None, None]
    if top_k is not None:
        vocab = scaled.shape[-1]
        k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))  # (B,)
        kmax = int(k.max()) if top_k_max is None else (vocab if top_k_max <= 0 else min(top_k_max, vocab))
        kth = scaled.topk(kmax, dim=-1).values  # (B, T, kmax) descending
        cutoff = kth.gather(-1, (k - 1)[:, None, None].expand(-1, scaled.shape[1], 1))  # (B, T, 1)
        scaled = scaled.masked_fill(scaled < cutoff, float("-inf"))
    probs = scaled.softmax(-1)
    if top_p is not None:
        sorted_p, order = probs.sort(-1, descending=True)
        drop = (sorted_p.cumsum(-1) - sorted_p) >= top_p[:, None, None].float()  # keep the minimal nucleus
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    one_hot = torch.zeros_like(probs).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    return torch.where(greedy[:, None, None], one_hot, probs)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One categorical draw per row of ``probs`` (..., V) -> (...), as argmax(probs / Exp(1))."""
    noise = torch.empty_like(probs).exponential_(generator=generator).clamp_(min=1e-30)
    return (probs / noise).argmax(-1)


def accept(
    draft_tokens: torch.Tensor,  # (B, G) int64 proposals (garbage past n_proposed)
    draft_probs: torch.Tensor | None,  # (B, G, V); None = deterministic drafter (one-hot q)
    target_probs: torch.Tensor,  # (B, G + 1, V)
    n_proposed: torch.Tensor,  # (B,) int64, 0..G
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact speculative acceptance for a batch of rows.

    Returns ``(n_accepted, next_token)``: row b keeps ``draft_tokens[b, :n_accepted[b]]``
    followed by ``next_token[b]`` (recovered on a rejection, bonus when all were accepted).
    The emitted sequence has exactly the target's distribution.

    Example:
        >>> p = torch.tensor([[[0.0, 1.0], [1.0, 0.0]]])  # target: token 1, then token 0
        >>> n, nxt = accept(torch.tensor([[1]]), None, p, torch.tensor([1]), None)
        >>> int(n), int(nxt)
        (1, 0)
    """
    b, g = draft_tokens.shape
    rows = torch.arange(b, device=draft_tokens.device)
    p_at = target_probs[:, :g].gather(-1, draft_tokens[..., None]).squeeze(-1).double()  # (B, G)
    if draft_probs is None:
        q_at = torch.ones_like(p_at)
    else:
        q_at = draft_probs.gather(-1, draft_tokens[..., None]).squeeze(-1).double()  # (B, G)
    u = torch.rand(b, g, generator=generator, dtype=torch.float64, device=draft_tokens.device)
    proposed = torch.arange(g, device=draft_tokens.device)[None, :] < n_proposed[:, None]  # (B, G)
    ok = (q_at > 0) & (u * q_at < p_at) & proposed
    n_acc = ok.long().cumprod(-1).sum(-1)  # (B,) index of the first rejection
    p_next = target_probs[rows, n_acc]  # (B, V)
    rejected = n_acc < n_proposed  # (B,)
    at = n_acc.clamp(max=max(g - 1, 0))
    if g == 0:
        residual = p_next
    else:
        if draft_probs is None:
            q_next = torch.zeros_like(p_next).scatter_(-1, draft_tokens[rows, at][:, None], 1.0)
        else:
            q_next = draft_probs[rows, at]
        residual = torch.where(rejected[:, None], (p_next - q_next).clamp(min=0), p_next)
        empty = residual.sum(-1, keepdim=True) <= 0  # p == q exactly: cannot reject, guard anyway
        residual = torch.where(empty, p_next, residual)
    return n_acc, sample(residual, generator)
