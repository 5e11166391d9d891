"""End to end: sampled speculative output has exactly the target's distribution.

One tiny model with an 8-token vocabulary. 20 000 copies of one prompt run through generate()
as large batches; the first generated token comes from the prefill, the next two from the
first speculative step (draft position 0 and 1, or the recovered / bonus token). Their joint
is compared with the exact target joint p(t1) p(t2 | t1) p(t3 | t1, t2), enumerated from the
target's logits with the same temperature / top-k processing.
"""

from __future__ import annotations

import pytest
import torch

from engine.generate import generate
from engine.loader import ModelPair
from engine.sampling import process_logits, sample
from engine.speculative import Request, SpecConfig

V = 8
N = 20_000
PROMPT = [3, 1, 4, 1]
P_OK = 1e-3


pytestmark = pytest.mark.usefixtures("apply_engine_mode")  # every test x ENGINE_MODES (conftest)


def exact_factors(model, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """p(t1) (V,) and p(t2, t3 | t1) (V, V, V) under ``model``, enumerated from its logits."""
    tk = torch.tensor([top_k])

    def next_probs(prefixes: torch.Tensor) -> torch.Tensor:  # (M, T) -> (M, V)
        with torch.inference_mode():
            logits = model(prefixes)[:, -1:]  # (M, 1, V)
        m = prefixes.shape[0]
        return process_logits(logits, torch.ones(m), tk.expand(m) if top_k else None)[:, 0]

    prompt = torch.tensor(PROMPT)
    p1 = next_probs(prompt[None])[0]  # (V,)
    t1 = torch.arange(V)
    p2 = next_probs(torch.cat([prompt.expand(V, -1), t1[:, None]], 1))  # (V, V): [t1, t2]
    grid = torch.cartesian_prod(t1, t1)  # (V*V, 2)
    p3 = next_probs(torch.cat([prompt.expand(V * V, -1), grid], 1)).view(V, V, V)  # [t1, t2, t3]
    return p1, p2[:, :, None] * p3


def exact_joint(model, top_k: int) -> torch.Tensor:
    """(V, V, V) probabilities of the first three generated tokens under ``model``."""
    p1, p23 = exact_factors(model, top_k)
    return p1[:, None, None] * p23


def run(pair: ModelPair, gamma: int, top_k: int, seed: int = 0, n: int = N):
    reqs = [Request(PROMPT, 3, temperature=1.0, top_k=top_k, id=i) for i in range(n)]
    drafter = "model" if gamma else "none"
    out = generate(pair, reqs, SpecConfig(gamma=gamma), drafter, max_batch_size=4096, seed=seed, eos_ids=())
    toks = torch.tensor(out.tokens)  # (N, 3)
    assert toks.shape == (n, 3)
    return toks, out.metrics


def joint_codes(toks: torch.Tensor, n: int) -> torch.Tensor:
    code = torch.zeros(toks.shape[0], dtype=torch.long)
    for j in range(n):
        code = code * V + toks[:, j]
    return code


def wrong_accept(draft_tokens, draft_probs, target_probs, n_proposed, generator):
    """Correct acceptance test, but a rejection resamples from the target (not max(0, p - q))."""
    b, g = draft_tokens.shape
    p_at = target_probs[:, :g].gather(-1, draft_tokens[..., None]).squeeze(-1)
    q_at = draft_probs.gather(-1, draft_tokens[..., None]).squeeze(-1)
    u = torch.rand(b, g, generator=generator, dtype=torch.float64)
    ok = (u * q_at < p_at) & (torch.arange(g)[None] < n_proposed[:, None])
    n_acc = ok.long().cumprod(-1).sum(-1)
    return n_acc, sample(target_probs[torch.arange(b), n_acc], generator)


@pytest.mark.parametrize(
    ("gamma", "top_k"), [(2, 0), (3, 4)]
)  # each gamma and each filter once: 2 x 20k rows
def test_first_three_tokens_have_the_target_joint(small_pair, chi2, gamma, top_k):
    toks, metrics = run(small_pair, gamma, top_k)
    codes = joint_codes(toks, 3)
    p1, p23 = exact_factors(small_pair.target, top_k)
    # The speculative step alone: (t2, t3) given the prefill's t1 follow the target's conditional.
    assert bool((p23.flatten()[codes] > 0).all()), "a speculative token outside the top-k support"
    t1_freq = torch.bincount(toks[:, 0], minlength=V).double() / N
    assert chi2(codes, (t1_freq[:, None, None] * p23).flatten()) > P_OK
    # The whole joint, the prefill's token included.
    joint = p1[:, None, None] * p23
    assert bool((joint.flatten()[codes] > 0).all()), "a token outside the top-k support"
    assert chi2(codes, joint.flatten()) > P_OK
    assert chi2(joint_codes(toks, 2), joint.sum(-1).flatten()) > P_OK
    assert 0.2 < metrics["acceptance_rate"] < 0.9  # both acceptance and recovery happened often
    # Power: the same samples are far from the draft's own joint.
    assert chi2(codes, exact_joint(small_pair.draft, top_k).flatten()) < P_OK


def test_the_check_fails_for_a_wrong_acceptance_rule(small_pair, chi2, monkeypatch):
    monkeypatch.setattr("engine.speculative.accept", wrong_accept)
    toks, _ = run(small_pair, gamma=3, top_k=0, n=N // 4)
    assert chi2(joint_codes(toks, 3), exact_joint(small_pair.target, 0).flatten()) < P_OK


@pytest.mark.parametrize("drafter", ["none", "model", "ngram"])
@pytest.mark.parametrize("filters", [{"top_k": 1}, {"top_p": 1e-4}])
def test_a_one_token_filter_samples_like_greedy_from_the_first_token(pair, prompts, drafter, filters):
    """top_k=1 (or a tiny top_p) leaves one token: sampling at temperature 1 must equal greedy,
    the first generated token (sampled at prefill) included."""
    greedy = generate(
        pair, [Request(p, 6, id=i) for i, p in enumerate(prompts)], SpecConfig(gamma=0), "none", eos_ids=()
    )
    reqs = [Request(p, 6, temperature=1.0, id=i, **filters) for i, p in enumerate(prompts)]
    for seed in range(3):
        out = generate(pair, reqs, SpecConfig(gamma=3), drafter, seed=seed, eos_ids=())
        assert [t[0] for t in out.tokens] == [t[0] for t in greedy.tokens], "first token ignored the filter"
        assert out.tokens == greedy.tokens
