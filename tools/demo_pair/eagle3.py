"""Reproducible training of an EAGLE-3 head for the demo target shipped in ``engine/demo/pair``.

Run::

    python -m tools.demo_pair.eagle3 [--pair engine/demo/pair] [--out engine/demo/eagle3]
        [--budget-minutes 15] [--seed 0] [--steps N] [--train-prompts N] [--val-prompts N] [--threads 2]
        [--draft-vocab N]

A smoke run (a couple of minutes): ``--steps 3 --train-prompts 4 --val-prompts 4 --out eagle3-smoke``.

Offline, CPU-only, seeded. The steps:

1. **Data** (the on-policy data of :mod:`tools.demo_pair.onpolicy`): prompts cut from the stdlib
   **train** files (``train.build_prompts``, the on-policy phase's seeds), their last
   ``context_tokens`` continued by the frozen target, alternating greedy and temperature 1;
   validation-file prompts the same way for the figures. The prompt count is fixed, not timed.
2. **Training-time test** (EAGLE-3, Li et al. 2025): for every anchor position a of a
   sequence at once, the head is unrolled ``unroll_steps`` times exactly as
   engine.eagle3.Eagle3Drafter drafts. Step k sits at head position a + k, reads token a + k + 1
   (the one-token shift), the fused target state of a at step 0 and its own pre-norm output of
   step k - 1 after, and proposes token a + k + 2. Its attention sees the step-0 entries of
   positions <= a (the target-fed cache) and the entries of its own steps 1..k (the speculative
   cache entries of this chain), which is what a query at position a + k sees while drafting.
   Loss: sum over k of KL(target || head) at that token, weighted as ``onpolicy.pack`` weights
   positions (1 on generated tokens, ``prompt_weight`` on prompt tokens). The target's aux states
   (layer ids (2, L // 2, L - 3), vLLM's default) and logits come from one ``forward_hidden`` per
   batch. AdamW, warmup then cosine decay, gradient clipping, the wall-clock budget of
   ``train.run_phase``.
3. **Export**: ``save_eagle3`` (vLLM's config.json keys + model.safetensors) in bf16, reloaded with
   ``load_eagle3`` for teacher-forced per-position acceptance on the validation continuations, and
   a check that greedy speculative output with the ``eagle3`` drafter equals the target's greedy
   output on held-out prompts (a mismatch exits 1). ``train_log.json`` holds the rest.

Choices: the draft vocabulary (``--draft-vocab N``, default the full 4096 tokens) is the ``N`` target
ids most frequent in the train continuations, as EAGLE-3 builds its ``d2t``; a reduced one caps
every position's acceptance at its coverage (``train_log.json`` records it for 512..2048 rows) and
cuts the lm_head's and the loss's share of every draft and training step. The loss then holds the
head against the target's distribution renormalised over the draft vocabulary. The lm_head starts
as the target's (its rows of the draft ids); the embeddings are the target's, frozen and not
stored. Training runs in fp32 (bf16 autocast is ~5x slower on a CPU without bf16 instructions, and
no faster on one with AVX-512 bf16 but no AMX); the head is stored in bf16 like the pair (~6 MB at
the full vocabulary), and the figures are computed on the stored weights.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.config import ModelConfig
from engine.eagle3 import Eagle3Config, Eagle3Head, load_eagle3, save_eagle3
from engine.generate import generate
from engine.loader import load_model, load_pair, load_tokenizer
from engine.model import Attention, Transformer, rotate_half
from engine.speculative import Request, SpecConfig
from tools.demo_pair import train
from tools.demo_pair.onpolicy import (
    OnPolicyConfig,
    OnPolicyData,
    pack,
    tails,
    target_continuations,
    weighted_kl,
)

Example = tuple[list[int], list[int], float]  # (prompt, continuation, temperature)
COVERAGE_SIZES = (512, 1024, 2048)


@dataclass
class HeadTrainConfig:
    """Settings of a head's training run (all written to ``train_log.json``)."""

    seed: int = 0
    budget_minutes: float = 15.0
    train_prompts: int = 1200  # prompts cut from the train files (fewer if the files hold fewer)
    val_prompts: int = 64  # from the validation files: figures and the greedy check
    context_tokens: int = 128
    max_new_tokens: int = 128
    temperatures: tuple[float, ...] = (0.0, 1.0)  # alternated over prompts
    draft_vocab: int | None = None  # draft_vocab_size: the most frequent train ids (None: full vocabulary)
    gen_batch: int = 96
    prompt_weight: float = 0.25
    unroll_steps: int = 3  # training-time-test depth: draft positions 1..3
    batch_size: int = 16
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    init_std: float = 0.02
    reserve_seconds: float = 60.0  # kept back for export, figures and the greedy check
    check_prompts: int = 4
    check_new_tokens: int = 48
    threads: int = 2

    def data(self) -> OnPolicyConfig:
        """The continuation settings in onpolicy.target_continuations' terms."""
        return OnPolicyConfig(
            context_tokens=self.context_tokens,
            max_new_tokens=self.max_new_tokens,
            temperatures=self.temperatures,
            gen_batch=self.gen_batch,
        )


# ---------------------------------------------------------------------------- the head


def head_config(c: ModelConfig, draft_vocab: int | None = None) -> Eagle3Config:
    """One Llama layer of the target's shape, ``draft_vocab`` draft ids (None: the full vocabulary),
    vLLM's default aux layer ids: the config.json :meth:`Eagle3Config.to_dict` writes, without
    ``eagle_config`` (so the reader takes vLLM's default layer ids), read back through the reader
    every head folder passes."""
    layer = replace(c, num_hidden_layers=1, tie_word_embeddings=False, model_type="llama")
    raw = Eagle3Config(layer, (), c.hidden_size, draft_vocab or c.vocab_size).to_dict()
    del raw["eagle_config"]
    return Eagle3Config.from_dict(raw, c, "the trainer's head config")


def new_head(
    target: Transformer, seed: int, std: float = 0.02, ids: torch.Tensor | None = None
) -> Eagle3Head:
    """A trainable head for ``target``: N(0, std) matrices (residual outputs / sqrt(2)), unit norms,
    the lm_head a copy of the target's (its rows ``ids``, the sorted draft vocabulary, when given:
    ``d2t`` maps them back); bound to the target's embedding table."""
    full = ids is None or len(ids) == target.config.vocab_size
    head = Eagle3Head(head_config(target.config, None if full else len(ids))).bind(target)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if p.dim() == 2:
                scale = std / math.sqrt(2) if name.endswith(("o_proj.weight", "down_proj.weight")) else std
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
        if full:
            head.lm_head.weight.copy_(target.lm_head.weight)
        else:
            head.lm_head.weight.copy_(target.lm_head.weight[ids])
            head.d2t.copy_(ids - torch.arange(len(ids)))
    return head.train()


def frequency_order(train_data: list[Example], vocab: int) -> torch.Tensor:
    """Target ids by how often the train continuations hold them, most frequent first (stable)."""
    counts = torch.bincount(
        torch.tensor([t for _, c, _ in train_data for t in c], dtype=torch.long), minlength=vocab
    )
    return counts.argsort(descending=True, stable=True)


def _attend(
    attn: Attention,
    x: torch.Tensor,  # (B, A, 2H)
    cos: torch.Tensor,  # (1, 1, A, hd) at positions a + k
    sin: torch.Tensor,
    past: list[tuple[torch.Tensor, torch.Tensor]],  # keys/values of steps 0..k-1, (B, nh, A, hd) each
    causal: torch.Tensor,  # (A, A) bool: anchor a sees the step-0 entry of anchor a' <= a
) -> torch.Tensor:  # (B, A, H)
    """Step k's attention for all anchors: the step-0 entries of anchors <= a, then the anchor's own
    entries of steps 1..k (its chain's speculative cache entries, positions a + 1 .. a + k)."""
    b, a, _ = x.shape
    nh, hd, rep = attn.n_heads, attn.hd, attn.n_heads // attn.n_kv
    q = attn.q_proj(x).view(b, a, nh, hd).transpose(1, 2)  # (B, nh, A, hd)
    k = attn.k_proj(x).view(b, a, attn.n_kv, hd).transpose(1, 2)  # (B, nkv, A, hd)
    v = attn.v_proj(x).view(b, a, attn.n_kv, hd).transpose(1, 2)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    past.append((k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)))  # GQA: kv head i // rep
    scale = hd**-0.5
    k0, v0 = past[0]
    first = (q @ k0.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))  # (B, nh, A, A)
    own = [(q * kj).sum(-1, keepdim=True) * scale for kj, _ in past[1:]]  # (B, nh, A, 1) each
    w = torch.cat([first, *own], -1).float().softmax(-1).to(q.dtype)  # (B, nh, A, A + k)
    y = w[..., :a] @ v0  # (B, nh, A, hd)
    for j, (_, vj) in enumerate(past[1:]):
        y = y + w[..., a + j : a + j + 1] * vj
    out: torch.Tensor = attn.o_proj(y.transpose(1, 2).reshape(b, a, nh * hd))
    return out


def unroll(
    head: Eagle3Head,
    embed: torch.nn.Module,  # the target's embedding table
    tokens: torch.Tensor,  # (B, N)
    aux: torch.Tensor,  # (B, N, k * C) the target's aux states of ``tokens``
    steps: int,
) -> list[torch.Tensor]:  # per step k: (B, N - 2, draft V) logits at anchors a = 0 .. N - 3
    """The head's draft steps 0..steps-1 from every anchor a at once (module docstring, step 2);
    step k's logits (over the draft vocabulary) at anchor a propose token a + k + 2. Anchors whose
    chain runs past the sequence read a padding token; they reach no other anchor's chain and their
    loss weight is 0."""
    assert head.lm_head is not None, "the trainer's heads own their lm_head"
    n = tokens.shape[1]
    a = n - 2
    layer = head.midlayer
    hidden = head.fc(aux[:, :a])  # (B, A, H): the fused target state of anchor a
    causal = torch.ones(a, a, dtype=torch.bool, device=tokens.device).tril()
    past: list[tuple[torch.Tensor, torch.Tensor]] = []
    logits: list[torch.Tensor] = []
    for k in range(steps):
        inp = F.pad(tokens[:, k + 1 : k + 1 + a], (0, max(k - 1, 0)))  # (B, A): token a + k + 1
        pos = torch.arange(a, device=tokens.device) + k  # head position of step k
        freqs = pos[:, None].float() * head.inv_freq  # (A, hd/2)
        emb = torch.cat((freqs, freqs), -1)[None, None]  # (1, 1, A, hd)
        x = torch.cat([layer.input_layernorm(embed(inp)), layer.hidden_norm(hidden)], -1)  # (B, A, 2H)
        residual = hidden + _attend(layer.self_attn, x, emb.cos(), emb.sin(), past, causal)
        hidden = residual + layer.mlp(layer.post_attention_layernorm(residual))  # pre-norm, fed back
        logits.append(head.lm_head(head.norm(hidden)))  # (B, A, V)
    return logits


def step_targets(
    t_logits: torch.Tensor, d_logits: list[torch.Tensor], weights: torch.Tensor
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per step k: (target logits, head logits, weights) over the anchors whose proposed token
    a + k + 2 exists. ``t_logits`` (B, N, V) of the tokens; ``weights`` (B, N - 1) from ``pack``
    (weights[j]: the prediction of token j + 1, i.e. the target's logits at j)."""
    n = t_logits.shape[1]
    return [
        (t_logits[:, k + 1 : n - 1], d[:, : n - 2 - k], weights[:, k + 1 :]) for k, d in enumerate(d_logits)
    ]


class HeadTrainer:
    """AdamW on the head; one :meth:`step` per batch of packed sequences."""

    def __init__(self, target: Transformer, head: Eagle3Head, cfg: HeadTrainConfig) -> None:
        self.target, self.head, self.cfg = target.eval().requires_grad_(False), head, cfg
        decay = [p for p in head.parameters() if p.dim() >= 2]
        rest = [p for p in head.parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}]
        self.opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas)
        self.losses: list[float] = []

    def loss(self, tokens: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Sum over the unrolled steps of the weighted KL(target || head), and each step's term."""
        with torch.no_grad():
            t_logits, aux = self.target.forward_hidden(tokens, layers=self.head.config.layer_ids)
            if self.head.remaps:  # the target's distribution renormalised over the draft vocabulary
                t_logits = t_logits.index_select(-1, self.head.target_ids())
        d_logits = unroll(self.head, self.target.model.embed_tokens, tokens, aux, self.cfg.unroll_steps)
        per_step = [weighted_kl(t, d, w) for t, d, w in step_targets(t_logits, d_logits, weights)]
        return torch.stack(per_step).sum(), per_step

    def step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, float]:
        total, per_step = self.loss(*batch)
        total.backward()
        gn = torch.nn.utils.clip_grad_norm_(self.head.parameters(), self.cfg.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.losses.append(round(total.item(), 5))
        return {
            "loss": total.item(),
            **{f"kl{k + 1}": t.item() for k, t in enumerate(per_step)},
            "gn": gn.item(),
        }


# ---------------------------------------------------------------------------- figures


@torch.no_grad()
def acceptance_by_position(
    target: Transformer, head: Eagle3Head, examples: list[Example], steps: int, pad: int, batch: int = 16
) -> dict[str, object]:
    """Teacher-forced acceptance of draft positions 1..steps on the generated tokens of ``examples``:
    greedy argmax match on greedy continuations, sum(min(p, q)) on temperature-1 ones (q is 0 off
    the draft vocabulary). Position k feeds the true tokens before it, so it estimates acceptance
    given positions < k were accepted."""
    figures: dict[str, object] = {}
    ids = head.target_ids()
    n_tokens = 0
    for name, temp in (("greedy_match", 0.0), ("expected_accept_t1", 1.0)):
        group = [e for e in examples if e[2] == temp and e[1]]
        hit, seen = torch.zeros(steps, dtype=torch.float64), torch.zeros(steps, dtype=torch.float64)
        for start in range(0, len(group), batch):
            chunk = group[start : start + batch]
            tokens, weights = pack(chunk, max(len(p) + len(c) for p, c, _ in chunk), pad, 0.0)
            t_logits, aux = target.forward_hidden(tokens, layers=head.config.layer_ids)
            d_logits = unroll(head, target.model.embed_tokens, tokens, aux, steps)
            for k, (t, d, w) in enumerate(step_targets(t_logits, d_logits, weights)):
                if temp == 0.0:
                    score = (t.argmax(-1) == ids[d.argmax(-1)]).double()
                else:
                    p = t.float().softmax(-1).index_select(-1, ids)
                    score = torch.minimum(p, d.float().softmax(-1)).sum(-1).double()
                hit[k] += (score * w).sum()
                seen[k] += w.sum()
        figures[name] = [round(float(h / max(s, 1.0)), 4) for h, s in zip(hit, seen, strict=True)]
        n_tokens += int(seen[0])
    return figures | {"tokens": n_tokens}


def vocab_coverage(train_data: list[Example], val: list[Example], vocab: int) -> dict[str, float]:
    """Share of the validation continuations' tokens inside the ``size`` most frequent tokens of the
    train continuations: the acceptance ceiling of a head with that ``draft_vocab_size``."""
    val_tokens = torch.tensor([t for _, c, _ in val for t in c], dtype=torch.long)
    order = frequency_order(train_data, vocab)
    out = {}
    for size in COVERAGE_SIZES:
        keep = torch.zeros(vocab, dtype=torch.bool)
        keep[order[:size]] = True
        out[str(size)] = round(float(keep[val_tokens].float().mean()), 4) if len(val_tokens) else 0.0
    return out


class GreedyCheckFailed(RuntimeError):
    """Greedy speculative output with the head differs from the target's own greedy output."""


def greedy_check(
    target_dir: Path, head_dir: Path, prompts: list[list[int]], new_tokens: int, gamma: int
) -> dict:
    """Greedy output of the reloaded pair with the ``eagle3`` drafter vs. the target alone; the
    engine's acceptance figures of that run. ``equal`` False names the first differing prompt."""
    pair = load_pair(target_dir, eagle3=head_dir)
    reqs = [Request(p, new_tokens, id=i) for i, p in enumerate(prompts)]
    want = generate(pair, reqs, SpecConfig(gamma=0), drafter="none").tokens
    got = generate(pair, reqs, SpecConfig(gamma=gamma), drafter="eagle3")
    differ = [i for i, (a, b) in enumerate(zip(got.tokens, want, strict=True)) if a != b]
    m = got.metrics
    return {
        "equal": not differ,
        "first_differing_prompt": differ[0] if differ else None,
        "prompts": len(reqs),
        "gamma": gamma,
        "tokens": sum(len(t) for t in want),
        "acceptance_rate": m["acceptance_rate"],
        "mean_acceptance_length": m["mean_acceptance_length"],
        "per_position_acceptance": m["per_position_acceptance"],
    }


# ---------------------------------------------------------------------------- the run


def export(head: Eagle3Head, out: Path) -> Path:
    """``head`` in bf16 as a vLLM EAGLE-3 folder (``torch_dtype`` recorded in config.json)."""
    stored = Eagle3Head(head.config)
    stored.load_state_dict(head.state_dict())
    save_eagle3(stored.to(torch.bfloat16), out)
    path = out / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"torch_dtype": "bfloat16"}, indent=2) + "\n")
    return out


def run(
    pair_dir: Path,
    out: Path,
    splits: dict[str, list[tuple[str, str]]],
    cfg: HeadTrainConfig,
    fixed_steps: int | None = None,
    log: Callable[[str], None] = train.log,
) -> dict[str, object]:
    """Train a head for ``pair_dir``/target on continuations of prompts from ``splits`` (train.py's
    corpus split), write it and ``train_log.json`` to ``out``; returns the log. Trains until the
    budget's deadline or ``fixed_steps``. Raises GreedyCheckFailed after writing the log."""
    wall0 = time.time()
    deadline = wall0 + cfg.budget_minutes * 60 - cfg.reserve_seconds
    torch.manual_seed(cfg.seed)
    target_dir = pair_dir / "target"
    target = load_model(target_dir, "float32")
    tok = load_tokenizer(target_dir)
    pad = target.config.eos_token_ids[0]
    oc = cfg.data()
    train_prompts = train.build_prompts(splits["train"], tok, cfg.seed + 1, kind_limit=cfg.train_prompts // 2)
    val_prompts = train.build_prompts(splits["val"], tok, cfg.seed + 2, kind_limit=cfg.val_prompts // 2)
    log(f"eagle3: {len(train_prompts)} train-file prompts, {len(val_prompts)} validation-file prompts")
    data = target_continuations(target, tails(train_prompts, tok, cfg.context_tokens), oc, cfg.seed, log)
    val = target_continuations(
        target, tails(val_prompts, tok, cfg.context_tokens), oc, cfg.seed + 10**6, lambda _: None
    )
    data_s = time.time() - wall0
    coverage = vocab_coverage(data, val, target.config.vocab_size)
    log(f"eagle3: data in {data_s / 60:.1f} min; top-k vocabulary coverage of validation tokens {coverage}")

    vocab = target.config.vocab_size
    ids = None
    if cfg.draft_vocab is not None and cfg.draft_vocab < vocab:
        ids = frequency_order(data, vocab)[: cfg.draft_vocab].sort().values
    head = new_head(target, cfg.seed, cfg.init_std, ids)
    n_params = sum(p.numel() for p in head.parameters())
    log(
        f"eagle3: head {n_params / 1e6:.2f}M params, aux layers {head.config.layer_ids}, "
        f"draft vocabulary {head.config.draft_vocab_size}"
    )
    length = cfg.context_tokens + cfg.max_new_tokens
    tokens, weights = pack(data, length, pad, cfg.prompt_weight)
    trainer = HeadTrainer(target, head, cfg)

    def quick_val() -> str:
        head.eval()
        r = acceptance_by_position(target, head, val[:16], cfg.unroll_steps, pad)
        head.train()
        return " ".join(f"{k} {v}" for k, v in r.items())

    phase_tc = replace(
        train.TrainConfig(), batch_size=cfg.batch_size, seq_len=length, min_lr_ratio=cfg.min_lr_ratio
    )
    phase = train.run_phase(
        "eagle3",
        trainer.step,
        [(trainer.opt, cfg.lr, cfg.warmup_steps)],
        deadline - time.time(),
        deadline,
        phase_tc,
        OnPolicyData(tokens, weights, cfg.batch_size, cfg.seed),
        quick_val,
        fixed_steps=fixed_steps,
        calib_steps=min(8, cfg.warmup_steps),
    )
    export(head, out)
    stored = load_eagle3(out, target)
    figures = acceptance_by_position(target, stored, val, cfg.unroll_steps, pad)
    log(f"eagle3: teacher-forced acceptance by draft position on validation continuations {figures}")
    check_ids = [p for p, _, _ in val[: cfg.check_prompts]]
    check = greedy_check(target_dir, out, check_ids, cfg.check_new_tokens, cfg.unroll_steps)
    log(f"eagle3: greedy check on {check['prompts']} held-out prompts: {check}")
    result = {
        "wall_seconds": round(time.time() - wall0, 1),
        "config": asdict(cfg),
        "head": {
            "params": n_params,
            "layer_ids": list(head.config.layer_ids),
            "draft_vocab_size": head.config.draft_vocab_size,
            "stored_dtype": "bfloat16",
            "output_bytes": train.folder_bytes(out),
        },
        "data": {
            "train_prompts": len(data),
            "generated_tokens": sum(len(c) for _, c, _ in data),
            "validation_prompts": len(val),
            "seconds": round(data_s, 1),
            "vocab_coverage_top_k": coverage,
        },
        "phase": phase,
        "losses": trainer.losses,
        "validation_by_position": figures,
        "greedy_check": check,
        "versions": {"torch": torch.__version__, "python": sys.version.split()[0]},
    }
    (out / "train_log.json").write_text(json.dumps(result, indent=2) + "\n")
    size_mb = train.folder_bytes(out) / 1e6
    log(f"eagle3: wall time {result['wall_seconds'] / 60:.1f} min; wrote {out} ({size_mb:.1f} MB)")
    if not check["equal"]:
        raise GreedyCheckFailed(
            f"{out}: greedy output with the eagle3 drafter differs from the target's on held-out prompt "
            f"{check['first_differing_prompt']} (the head or the engine is broken)"
        )
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Train an EAGLE-3 head for the demo target on its own continuations (CPU)."
    )
    p.add_argument("--pair", type=Path, default=Path("engine/demo/pair"), help="pair folder holding target/")
    p.add_argument(
        "--out", type=Path, default=None, help="head folder (default: eagle3/ beside the pair folder)"
    )
    p.add_argument("--budget-minutes", type=float, default=15.0, help="wall-clock budget for the whole run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=None, help="fixed optimizer steps (default: fit the budget)")
    p.add_argument(
        "--train-prompts", type=int, default=HeadTrainConfig.train_prompts, help="train-file prompts"
    )
    p.add_argument(
        "--val-prompts", type=int, default=HeadTrainConfig.val_prompts, help="validation-file prompts"
    )
    p.add_argument("--threads", type=int, default=HeadTrainConfig.threads, help="torch intra-op threads")
    p.add_argument(
        "--draft-vocab",
        type=int,
        default=None,
        help="draft_vocab_size: the N most frequent target ids of the train continuations (default: all)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.steps is not None and args.steps < 1:
        print("error: --steps must be at least 1", file=sys.stderr)
        return 2
    if args.draft_vocab is not None and args.draft_vocab < 1:
        print(f"error: --draft-vocab must be at least 1 (got {args.draft_vocab})", file=sys.stderr)
        return 2
    cfg = HeadTrainConfig(
        seed=args.seed,
        budget_minutes=args.budget_minutes,
        train_prompts=args.train_prompts,
        val_prompts=args.val_prompts,
        threads=args.threads,
        draft_vocab=args.draft_vocab,
    )
    torch.set_num_threads(cfg.threads)
    if not (args.pair / "target").is_dir():
        print(f"error: {args.pair}: no target/ folder (expected a demo pair)", file=sys.stderr)
        return 2
    target_config = args.pair / "target" / "config.json"
    vocab = json.loads(target_config.read_text()).get("vocab_size") if target_config.is_file() else None
    if args.draft_vocab is not None and isinstance(vocab, int) and args.draft_vocab > vocab:
        print(
            f"error: --draft-vocab {args.draft_vocab} exceeds the target's vocab_size {vocab} "
            f"({target_config})",
            file=sys.stderr,
        )
        return 2
    root = Path(sysconfig.get_paths()["stdlib"])
    splits = train.collect_corpus(root)
    train.log(f"corpus {root}: " + ", ".join(f"{k} {len(v)} files" for k, v in splits.items()))
    try:
        run(args.pair, args.out or args.pair.parent / "eagle3", splits, cfg, args.steps)
    except GreedyCheckFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
