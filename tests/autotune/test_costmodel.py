"""Cost model on synthetic curves and samples whose answers are worked out by hand."""

from __future__ import annotations

import pytest

from autotune.cost.acceptance import from_samples
from autotune.cost.costmodel import (
    best_gamma,
    chain_stats,
    predict,
    row_outcomes,
    simulate_closed_loop,
    steady_tokens_per_second,
    step_stats,
)
from autotune.records import Curves, StepSample

T_VERIFY = 0.010  # seconds, flat in k: verifying k tokens costs as much as decoding one
T_DRAFT = 0.001


def flat_curves(batches=(1, 4), gamma_max: int = 4) -> Curves:
    return Curves(
        {b: {k: T_VERIFY for k in range(1, gamma_max + 2)} for b in batches}, {b: T_DRAFT for b in batches}
    )


def test_a_chains_steady_state_from_per_position_acceptance_is_what_predict_gives_at_one_row() -> None:
    """The watch predicts a constant K from per-position acceptance (chain_stats); at one row and
    threshold 0 that is what predict makes of the samples the acceptance was measured from."""
    curves = Curves({1: {1: 0.010, 2: 0.011, 3: 0.012, 4: 0.013}}, {1: 0.002}, {1: 0.0005})
    samples = [StepSample(n, (1.0,) * 3) for n in (3, 1, 0, 2, 3)]
    acceptance = from_samples(samples, 3)
    for gamma in range(4):
        steady = steady_tokens_per_second(curves, 1, chain_stats(acceptance, gamma))
        assert steady == pytest.approx(predict(curves, samples, gamma, 0.0, 1).tokens_per_second, rel=1e-12)
    # K=2 by hand: E = 1 + 0.8 + 0.6, step = 2 x 0.002 + T_verify(1, 3) + 0.0005
    assert steady_tokens_per_second(curves, 1, chain_stats(acceptance, 2)) == pytest.approx(2.4 / 0.0165)


def test_step_stats_threshold_zero_proposes_gamma() -> None:
    samples = [StepSample(n, (1.0,) * 4) for n in (4, 1)]
    st = step_stats(samples, gamma=3, threshold=0.0)
    assert st.tokens == pytest.approx((1 + 3 + 1 + 1) / 2)  # accepted capped at gamma, plus bonus
    assert st.draft_forwards == 3 and st.verify_width == 4


def test_step_stats_confidence_drop_caps_proposals() -> None:
    """Confidence below the threshold at position 2: 2 tokens proposed, 3 draft forwards run."""
    conf = (0.9, 0.9, 0.1, 0.9)
    samples = [StepSample(4, conf), StepSample(1, conf)]
    st = step_stats(samples, gamma=4, threshold=0.5)
    assert st.tokens == pytest.approx(((1 + 2) + (1 + 1)) / 2)  # min(n_accepted, 2) + 1
    assert st.draft_forwards == 3  # low + 1: the forward that produced the unsure token ran
    assert st.verify_width == 3  # 1 + 2 proposals
    below = step_stats(samples, gamma=4, threshold=0.05)  # nothing below 0.05: full gamma
    assert (below.tokens, below.draft_forwards, below.verify_width) == (pytest.approx(3.5), 4, 5)


def test_step_stats_confidence_equal_to_the_threshold_keeps_drafting() -> None:
    """The engine keeps a row active while confidence >= threshold; the model must agree."""
    st = step_stats([StepSample(3, (0.5, 0.5, 0.4))], gamma=3, threshold=0.5)
    assert (st.tokens, st.draft_forwards, st.verify_width) == (3.0, 3, 3.0)


def test_step_stats_drop_at_first_position_proposes_nothing() -> None:
    st = step_stats([StepSample(3, (0.2, 0.9, 0.9))], gamma=3, threshold=0.5)
    assert (st.tokens, st.draft_forwards, st.verify_width) == (1.0, 1, 1.0)


def test_step_stats_gamma_zero_is_plain_decoding() -> None:
    st = step_stats([StepSample(3, (1.0,) * 3)], gamma=0, threshold=0.0)
    assert (st.tokens, st.draft_forwards, st.verify_width) == (1.0, 0.0, 1.0)


def test_step_stats_batch_uses_the_longest_row() -> None:
    """In lock step the batch drafts as long as its longest row: mixed rows push the mean up."""
    samples = [StepSample(4, (0.9, 0.1, 0.9, 0.9)), StepSample(4, (0.9,) * 4)]
    single = step_stats(samples, gamma=4, threshold=0.5, batch=1)
    batched = step_stats(samples, gamma=4, threshold=0.5, batch=8)
    assert single.draft_forwards == pytest.approx((2 + 4) / 2)
    assert 3.0 < batched.draft_forwards <= 4.0  # P(all 8 rows short) = 1/256
    assert batched.tokens == single.tokens  # tokens per row do not depend on the batch
    assert step_stats(samples, 4, 0.5, batch=8, seed=1) == step_stats(samples, 4, 0.5, batch=8, seed=1)


@pytest.mark.parametrize("batch", [1, 4])
def test_predict_on_flat_curve_matches_hand_computation(batch) -> None:
    gamma = 3
    samples = [StepSample(n, (1.0,) * 4) for n in (3, 1, 0, 2)]
    e = ((1 + 3) + (1 + 1) + (1 + 0) + (1 + 2)) / 4  # 2.5 tokens per row per step
    step = gamma * T_DRAFT + T_VERIFY
    p = predict(flat_curves(), samples, gamma, 0.0, batch)
    assert p.tokens_per_step == pytest.approx(e)
    assert p.step_time_s == pytest.approx(step)
    assert p.tokens_per_second == pytest.approx(batch * e / step)
    assert p.tpot_ms == pytest.approx(1e3 * step / e)
    assert p.speedup == pytest.approx((batch * e / step) / (batch / T_VERIFY))
    assert (p.gamma, p.batch_size, p.confidence_threshold) == (gamma, batch, 0.0)


def test_predict_gamma_zero_is_the_decode_rate() -> None:
    p = predict(flat_curves(), [StepSample(2, (1.0,) * 4)], 0, 0.0, 4)
    assert p.tokens_per_second == pytest.approx(4 / T_VERIFY) and p.speedup == pytest.approx(1.0)


def test_predict_uses_measured_verify_width_and_draft_cost() -> None:
    curves = Curves({1: {1: 0.010, 2: 0.012, 3: 0.014}}, {1: 0.002})
    p = predict(curves, [StepSample(2, (1.0, 1.0))], gamma=2, threshold=0.0, batch=1)
    assert p.step_time_s == pytest.approx(2 * 0.002 + 0.014)
    assert p.tokens_per_second == pytest.approx(3 / 0.018)


def test_curves_interpolate_between_measured_batch_sizes() -> None:
    curves = Curves({1: {1: 0.010}, 4: {1: 0.016}}, {1: 0.001, 4: 0.004})
    assert curves.verify(2, 1) == pytest.approx(0.012)
    assert curves.draft(2) == pytest.approx(0.002)
    assert curves.verify(4, 5) == 0.016  # k beyond the measured widths clamps to the widest


def test_best_gamma_flat_curve_high_acceptance_takes_the_largest() -> None:
    samples = [StepSample(4, (1.0,) * 4)] * 4
    assert best_gamma(flat_curves(), samples, 1, 4).gamma == 4


def test_best_gamma_zero_acceptance_turns_speculation_off() -> None:
    samples = [StepSample(0, (1.0,) * 4)] * 4
    assert best_gamma(flat_curves(), samples, 1, 4).gamma == 0


def test_closed_loop_replay_matches_hand_computation_when_rows_stay_in_step() -> None:
    # 6 requests x 9 tokens through 2 slots, every row emits 2 tokens per step (gamma 3, 1 accepted):
    # three waves of [prefill(2) + 4 steps of (3 draft + verify)], 8 = 9 - 1 tokens from steps
    curves = Curves(
        {1: {k: T_VERIFY for k in range(1, 5)}, 2: {k: 2 * T_VERIFY for k in range(1, 5)}},
        {1: T_DRAFT, 2: T_DRAFT},
        t_prefill={1: 0.05, 2: 0.08},
    )
    rows = row_outcomes([StepSample(1, (1.0,) * 3)], 3, 0.0)
    assert rows == [(2, 3, 3)]
    prefill = 0.08 * (1 + T_DRAFT / T_VERIFY)  # the draft model prefills too, at its cost ratio
    wall = 3 * (prefill + 4 * (3 * T_DRAFT + 2 * T_VERIFY))
    assert simulate_closed_loop(curves, rows, 2, 9, 6) == pytest.approx(6 * 9 / wall)
    # prompts twice as long as the measured prefill length cost twice as much (padded to the longest)
    long = Curves(curves.t_verify, curves.t_draft, t_prefill=curves.t_prefill, prefill_tokens=100)
    assert long.prefill(2, 200) == pytest.approx(0.16) and long.prefill(2) == 0.08
    wall = 3 * (2 * prefill + 4 * (3 * T_DRAFT + 2 * T_VERIFY))
    assert simulate_closed_loop(long, rows, 2, 9, 6, prompt_lens=[200]) == pytest.approx(6 * 9 / wall)
    # without a draft model (gamma 0) nothing is added to the target's prefill
    ar = row_outcomes([StepSample(1, (1.0,) * 3)], 0, 0.0)
    assert simulate_closed_loop(curves, ar, 2, 9, 6) == pytest.approx(6 * 9 / (3 * (0.08 + 8 * 2 * T_VERIFY)))


def test_closed_loop_replay_pays_for_rows_that_drift_apart_and_the_drain() -> None:
    # rows that emit 1 or 5 tokens per step finish at different steps: requests arrive one at a
    # time (T_prefill(1) each instead of one T_prefill(B) per wave) and the last ones run in a
    # partly empty batch, so the replay predicts less than the wave formula
    curves = Curves(
        {b: {k: T_VERIFY * (1 + b / 8) for k in range(1, 6)} for b in (1, 8)},
        {1: T_DRAFT, 8: T_DRAFT},
        t_prefill={1: 0.02, 8: 0.05},
    )
    samples = [StepSample(0, (1.0,) * 4), StepSample(4, (1.0,) * 4)]
    p = predict(curves, samples, 4, 0.0, 8, new_tokens=64, num_requests=16)
    e, step = 3.0, p.step_time_s
    waves = 8 * 64 / (64 / e * step + curves.prefill(8))
    assert p.tokens_per_second < 0.97 * waves
    assert p.speedup == pytest.approx(
        p.tokens_per_second / simulate_closed_loop(curves, row_outcomes(samples, 0, 0.0), 8, 64, 16)
    )
    # deterministic (seeded)
    again = predict(curves, samples, 4, 0.0, 8, new_tokens=64, num_requests=16)
    assert again.tokens_per_second == p.tokens_per_second
    # a long run is the full batch with one single-request prefill per request (63 tokens from steps)
    long_run = predict(curves, samples, 4, 0.0, 8, new_tokens=64, num_requests=2000)
    assert long_run.tokens_per_second == pytest.approx(8 * 64 / (63 / e * step + 8 * 0.02), rel=0.02)


def test_closed_loop_replay_of_a_long_workload_is_capped_and_stays_close(monkeypatch) -> None:
    from autotune.cost import costmodel

    curves = Curves(
        {b: {k: T_VERIFY * (1 + b / 16) for k in range(1, 6)} for b in (1, 32)},
        {1: T_DRAFT, 32: 2 * T_DRAFT},
        t_prefill={1: 0.02, 32: 0.3},
    )
    rows = row_outcomes([StepSample(n, (1.0,) * 4) for n in range(5)], 4, 0.0)
    capped = simulate_closed_loop(curves, rows, 32, 256, 2000)  # 2000 x ~85 row-steps: over the cap
    monkeypatch.setattr(costmodel, "REPLAY_ROW_STEPS", 10**9)
    full = simulate_closed_loop(curves, rows, 32, 256, 2000, repeats=1)
    assert capped == pytest.approx(full, rel=0.05)
