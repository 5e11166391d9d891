"""The hybrid drafter: n-gram when the prompt lookup matches, else the draft model, else nothing.

Greedy output equals the target's greedy autoregressive output for every batch composition
(including steps where every row takes the n-gram and the draft model does not run), the
metrics split usage and acceptance by source, and sampled output keeps the target's exact
joint while n-gram (one-hot q) and model (q) rows share a step. The greedy checks run in the
CPU default step and in the sync-free step (CUDA's default, passed on to the draft model).
"""

from __future__ import annotations

import pytest
import torch

import engine.speculative
from engine.drafters import HybridDrafter
from engine.generate import DRAFTERS, generate, make_drafter
from engine.loader import ModelPair
from engine.sampling import process_logits
from engine.speculative import Request, SpecConfig

N_NEW = 20  # tokens per request; the conftest `reference` fixture reads it


@pytest.fixture(params=[False, True], ids=["cpu-default", "sync-free"])
def sync_free(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """The engine's step for the test: the CPU default (device reads) or sync-free."""
    monkeypatch.setattr(engine.speculative, "default_sync_free", lambda device: request.param)
    return request.param


def test_hybrid_is_a_named_drafter(pair):
    assert "hybrid" in DRAFTERS
    assert isinstance(make_drafter("hybrid", pair), HybridDrafter)


@pytest.mark.parametrize("gamma", [1, 3, 6])
@pytest.mark.parametrize("max_batch_size", [1, 3, 6])
def test_hybrid_matches_autoregressive(
    pair, prompts, reference, make_requests, gamma, max_batch_size, sync_free
):
    out = generate(
        pair,
        make_requests(prompts, N_NEW),
        SpecConfig(gamma=gamma),
        "hybrid",
        max_batch_size=max_batch_size,
        eos_ids=(),
    )
    assert out.tokens == reference
    assert out.engine.drafter.model.sync_free is sync_free
    src = out.metrics["draft_sources"]
    assert src["ngram"]["row_steps"] > 0 and src["model"]["row_steps"] > 0  # both sources served rows
    assert abs(sum(s["share"] for s in src.values()) - 1.0) < 1e-9
    assert src["ngram"]["proposed"] + src["model"]["proposed"] == int(out.engine.stats.proposed)
    assert src["ngram"]["accepted"] + src["model"]["accepted"] == int(out.engine.stats.accepted)


def test_threshold_leaves_some_rows_without_a_draft(pair, prompts, reference, make_requests, sync_free):
    out = generate(
        pair,
        make_requests(prompts, N_NEW),
        SpecConfig(gamma=4, confidence_threshold=0.3),
        "hybrid",
        eos_ids=(),
    )
    assert out.tokens == reference
    assert out.engine.drafter.model.sync_free is sync_free
    src = out.metrics["draft_sources"]
    assert src["none"]["row_steps"] > 0 and src["none"]["proposed"] == 0


def test_other_drafters_report_no_sources(pair, prompts, make_requests):
    out = generate(pair, make_requests(prompts[:2], 4), SpecConfig(gamma=2), "model", eos_ids=())
    assert out.metrics["draft_sources"] is None


V = 8
N = 20_000
PROMPT = [3, 1, 4, 1, 5]
P_OK = 1e-3


def test_sampled_hybrid_has_the_target_joint(model_factory, perturb, chi2):
    """n_min = 1: after the prefill's token t1, rows with t1 in the prompt take the n-gram."""
    target = model_factory(seed=11, vocab=V)
    pair = ModelPair(target, perturb(target, seed=12, sigma=0.08), None, None, None)
    reqs = [Request(PROMPT, 3, temperature=1.0, id=i) for i in range(N)]
    out = generate(
        pair,
        reqs,
        SpecConfig(gamma=2),
        HybridDrafter(pair.draft, 1, 2),
        max_batch_size=4096,
        seed=3,
        eos_ids=(),
    )
    src = out.metrics["draft_sources"]
    assert src["ngram"]["row_steps"] > 1000 and src["model"]["row_steps"] > 1000  # both sources in one step
    toks = torch.tensor(out.tokens)
    codes = (toks[:, 0] * V + toks[:, 1]) * V + toks[:, 2]

    def next_probs(prefixes):
        with torch.inference_mode():
            return process_logits(target(prefixes)[:, -1:], torch.ones(prefixes.shape[0]))[:, 0]

    prompt, t = torch.tensor(PROMPT), torch.arange(V)
    p1 = next_probs(prompt[None])[0]
    p2 = next_probs(torch.cat([prompt.expand(V, -1), t[:, None]], 1))
    p3 = next_probs(torch.cat([prompt.expand(V * V, -1), torch.cartesian_prod(t, t)], 1)).view(V, V, V)
    joint = (p1[:, None, None] * p2[:, :, None] * p3).flatten()
    assert chi2(codes, joint) > P_OK
