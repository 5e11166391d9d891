"""Greedy speculative output equals greedy autoregressive output of the target, token for token.

The ground truth is a naive loop (full forward, no cache, argmax) over the target alone, so a
request's reference is also its output "when run alone".
"""

from __future__ import annotations

import copy

import pytest
import torch

from engine.drafters import ModelDrafter, NgramDrafter
from engine.errors import EngineInputError
from engine.generate import generate
from engine.loader import ModelPair
from engine.speculative import Request, SpecConfig, SpecEngine

N_NEW = 20  # tokens per request; the conftest `reference` fixture reads it

GAMMAS = [1, 3, 5, 8]

pytestmark = pytest.mark.usefixtures("apply_engine_mode")  # every test x ENGINE_MODES (conftest)


def cut_at_eos(tokens: list[int], eos: int) -> list[int]:
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def run_engine(target, drafter, config, requests, max_batch_size, eos_ids=()):
    """generate()'s admission loop with a step bound (a stalled row fails instead of hanging).

    Returns each request's tokens and stop reason, and every step's per-row emitted counts.
    """
    max_seq = max(len(r.prompt_ids) + r.max_new_tokens for r in requests) + config.max_gamma + 3
    engine = SpecEngine(target, drafter, config, max_batch_size, max_seq, eos_ids)
    out, emitted, waiting = {}, [], list(requests)
    with torch.inference_mode():
        while waiting or engine.n:
            admit, waiting = waiting[: engine.free_slots()], waiting[engine.free_slots() :]
            engine.add(admit)
            out.update((f.id, f) for f in engine.retire())
            if engine.n:
                emitted.append(engine.step())
                assert len(emitted) <= sum(r.max_new_tokens for r in requests), "no progress"
                out.update((f.id, f) for f in engine.retire())
    return [out[r.id].tokens for r in requests], [out[r.id].reason for r in requests], emitted


@pytest.fixture(scope="module")
def self_pair(target) -> ModelPair:
    """Draft == target: every greedy proposal is accepted."""
    return ModelPair(target, target, None, None, None)


@pytest.fixture(scope="module")
def adversarial_pair(target) -> ModelPair:
    """A draft whose token j scores like the target's token j+1: it always proposes argmax - 1."""
    bad = copy.deepcopy(target)
    with torch.no_grad():
        bad.lm_head.weight.copy_(target.lm_head.weight.roll(-1, dims=0))
    return ModelPair(target, bad, None, None, None)


def test_reference_has_no_eos_and_engine_ar_matches_naive_loop(pair, prompts, reference, make_requests):
    assert all(len(r) == N_NEW for r in reference)
    for drafter in ("none", "model"):
        out = generate(pair, make_requests(prompts, N_NEW), SpecConfig(gamma=0), drafter, eos_ids=())
        assert out.tokens == reference
        assert out.reasons == ["length"] * len(prompts)
        assert out.metrics["acceptance_rate"] is None  # nothing was proposed


@pytest.mark.parametrize("gamma", GAMMAS)
def test_draft_model_matches_autoregressive(pair, prompts, reference, make_requests, gamma):
    out = generate(pair, make_requests(prompts, N_NEW), SpecConfig(gamma=gamma), "model", eos_ids=())
    assert out.tokens == reference
    assert 0.0 < out.metrics["acceptance_rate"] < 1.0  # both accept and reject paths ran


def test_rows_accept_different_lengths_in_one_batch(target, draft, prompts, reference, make_requests):
    config = SpecConfig(gamma=5, max_gamma=5)
    tokens, _, emitted = run_engine(
        target, ModelDrafter(draft), config, make_requests(prompts, N_NEW), len(prompts)
    )
    assert tokens == reference
    assert any(len(set(step)) > 1 for step in emitted), "no step had rows emitting different lengths"
    assert any(n == 6 for step in emitted for n in step)  # some row accepted a full block


@pytest.mark.parametrize("gamma", GAMMAS)
def test_all_accept_when_draft_is_target(self_pair, prompts, reference, make_requests, gamma):
    n_new = 1 + 2 * (gamma + 1)  # prefill token + two full blocks: no budget cut
    out = generate(self_pair, make_requests(prompts, n_new), SpecConfig(gamma=gamma), "model", eos_ids=())
    assert out.tokens == [r[:n_new] for r in reference]
    m = out.metrics
    assert m["acceptance_rate"] == 1.0
    assert m["mean_acceptance_length"] == gamma + 1
    assert m["rollback_frequency"] == 0.0
    assert m["per_position_acceptance"] == [1.0] * gamma
    assert out.steps == 2


@pytest.mark.parametrize("gamma", GAMMAS)
def test_all_reject_with_adversarial_draft(adversarial_pair, prompts, reference, make_requests, gamma):
    out = generate(
        adversarial_pair, make_requests(prompts, N_NEW), SpecConfig(gamma=gamma), "model", eos_ids=()
    )
    assert out.tokens == reference
    m = out.metrics
    assert m["acceptance_rate"] == 0.0
    assert m["rollback_frequency"] == 1.0
    assert m["mean_acceptance_length"] == 1.0


def _eos_mid_block(reference: list[list[int]], gamma: int) -> tuple[int, int]:
    """(row, eos token) whose first occurrence is at an index that is not a block end.

    With draft == target, generated index 0 comes from the prefill and the blocks of
    ``gamma + 1`` tokens end at indices that are multiples of ``gamma + 1``.
    """
    for k in range(gamma + 2, N_NEW):  # inside the second block or later
        for row, toks in enumerate(reference):
            if toks.index(toks[k]) == k and k % (gamma + 1) != 0:
                return row, toks[k]
    raise AssertionError(f"no mid-block EOS candidate for gamma={gamma}")


@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("drafter", ["self", "model", "ngram"])
def test_eos_mid_block_stops_at_and_includes_eos(
    target, draft, prompts, reference, make_requests, gamma, drafter
):
    row, eos = _eos_mid_block(reference, gamma)
    drafter_obj = {"self": ModelDrafter(target), "model": ModelDrafter(draft), "ngram": NgramDrafter()}[
        drafter
    ]
    reqs = make_requests(prompts, N_NEW)
    tokens, reasons, _ = run_engine(
        target, drafter_obj, SpecConfig(gamma=gamma), reqs, len(reqs), eos_ids=(eos,)
    )
    expected = [cut_at_eos(r, eos) for r in reference]
    assert tokens == expected
    assert tokens[row][-1] == eos and len(tokens[row]) < N_NEW
    assert reasons == ["eos" if eos in r else "length" for r in reference]


@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("budget", [1, 2, 7])
def test_max_new_tokens_mid_block_is_never_exceeded(
    pair, self_pair, prompts, reference, make_requests, gamma, budget
):
    for use in (self_pair, pair):
        out = generate(use, make_requests(prompts, budget), SpecConfig(gamma=gamma), "model", eos_ids=())
        assert out.tokens == [r[:budget] for r in reference]
        assert out.reasons == ["length"] * len(prompts)


def test_zero_max_new_tokens_is_refused(pair, prompts, make_requests):
    """max_new_tokens=0 is bad input: refused in one line naming the request, nothing emitted."""
    with pytest.raises(EngineInputError, match="max_new_tokens must be >= 1"):
        generate(pair, make_requests(prompts[:2], 0), SpecConfig(gamma=3), "model", eos_ids=())


def test_documented_step_loop_never_emits_past_eos(target, draft, prompts, reference):
    """SpecEngine's docstring loop (step, then retire) with EOS as the very first token."""
    eos = reference[0][0]
    engine = SpecEngine(target, ModelDrafter(draft), SpecConfig(gamma=3), 4, 64, eos_ids=(eos,))
    engine.add([Request(prompts[0], N_NEW)])
    done = []
    with torch.inference_mode():
        for _ in range(N_NEW):
            if not engine.n:
                break
            engine.step()
            done += engine.retire()
    assert engine.n == 0
    assert [(f.tokens, f.reason) for f in done] == [([eos], "eos")]


@pytest.mark.parametrize("gamma", GAMMAS)
def test_ngram_drafter_matches_autoregressive(pair, prompts, reference, make_requests, gamma):
    out = generate(pair, make_requests(prompts, N_NEW), SpecConfig(gamma=gamma), "ngram", eos_ids=())
    assert out.tokens == reference
    assert out.metrics["acceptance_rate"] > 0  # the repetitive outputs gave matches to propose


@pytest.mark.parametrize("use", ["self", "model"])
def test_heuristic_gamma_schedule_matches_autoregressive(
    pair, self_pair, prompts, reference, make_requests, use
):
    config = SpecConfig(gamma=2, gamma_schedule="heuristic", max_gamma=6)
    out = generate(
        self_pair if use == "self" else pair, make_requests(prompts, N_NEW), config, "model", eos_ids=()
    )
    assert out.tokens == reference
    per_pos = out.metrics["per_position_acceptance"]
    assert len(per_pos) == 6
    assert per_pos[4] is not None  # gamma grew past its start value of 2


def test_initial_gamma_above_max_gamma_is_refused():
    """gamma=12 with the heuristic schedule capped at max_gamma=2 is refused, naming both values."""
    with pytest.raises(EngineInputError, match="must be <= max_gamma .* 12 > 2"):
        SpecConfig(gamma=12, gamma_schedule="heuristic", max_gamma=2)


@pytest.mark.parametrize("threshold", [0.15, 0.3])  # the draft's median top probability is ~0.18
def test_confidence_threshold_matches_autoregressive(pair, prompts, reference, make_requests, threshold):
    base = generate(pair, make_requests(prompts, N_NEW), SpecConfig(gamma=4), "model", eos_ids=())
    out = generate(
        pair,
        make_requests(prompts, N_NEW),
        SpecConfig(gamma=4, confidence_threshold=threshold),
        "model",
        eos_ids=(),
    )
    assert out.tokens == reference
    proposed = int(out.engine.stats.proposed)
    assert 0 < proposed < int(base.engine.stats.proposed)  # the threshold cut some drafts short


@pytest.mark.parametrize("drafter", ["model", "ngram", "none"])
@pytest.mark.parametrize("max_batch_size", [1, 2, 4])
def test_continuous_batching_is_batch_invariant(pair, prompts, reference, drafter, max_batch_size):
    """Fewer slots than requests, ragged budgets and an EOS: rows retire and others are admitted mid-run."""
    eos = reference[3][8]
    budgets = [N_NEW, 4, 11, N_NEW, 1, 15]
    reqs = [Request(p, n, id=10 + i) for i, (p, n) in enumerate(zip(prompts, budgets, strict=True))]
    expected = [cut_at_eos(r[:n], eos) for r, n in zip(reference, budgets, strict=True)]
    assert sum(e[-1] == eos for e in expected) >= 2  # the EOS cuts some rows short
    out = generate(pair, reqs, SpecConfig(gamma=3), drafter, max_batch_size=max_batch_size, eos_ids=(eos,))
    assert out.tokens == expected
    assert out.metrics["mean_batch_size"] <= max_batch_size


@pytest.mark.parametrize("ids", [None, [9, 4, 7, 0, 2, 1]])
def test_outputs_come_back_in_request_order(pair, prompts, reference, ids):
    """Default (all equal) or unsorted ids: tokens[i] belongs to requests[i], whatever finishes first."""
    budgets = [N_NEW, 2, 9, 5, 17, 1]
    reqs = [
        Request(p, n) if ids is None else Request(p, n, id=ids[i])
        for i, (p, n) in enumerate(zip(prompts, budgets, strict=True))
    ]
    out = generate(pair, reqs, SpecConfig(gamma=3), "model", max_batch_size=3, eos_ids=())
    assert out.tokens == [r[:n] for r, n in zip(reference, budgets, strict=True)]
