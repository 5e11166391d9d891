"""The one acceptance model (autotune.cost.acceptance): measured from samples or counters, extended one way."""

from __future__ import annotations

import pytest

from autotune.cost.acceptance import expected_tokens, extend, from_counts, from_samples
from autotune.records import StepSample


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.8, 0.95])
@pytest.mark.parametrize("gamma", [0, 1, 3, 6])
def test_expected_tokens_matches_leviathan_closed_form(alpha, gamma) -> None:
    per_position = [alpha**i for i in range(1, 7)]  # P(first i draft tokens accepted)
    closed = (1 - alpha ** (gamma + 1)) / (1 - alpha)
    assert expected_tokens(per_position, gamma) == pytest.approx(closed, rel=1e-12)


def test_perfect_draft_gives_gamma_plus_one() -> None:
    assert expected_tokens([1.0] * 5, 5) == 6.0


def test_expected_tokens_refuses_unprofiled_positions() -> None:
    with pytest.raises(ValueError, match="gamma 4 beyond the 3 profiled positions"):
        expected_tokens([0.9, 0.8, 0.7], 4)


def test_from_samples_is_unconditional() -> None:
    samples = [StepSample(n, (1.0,) * 3) for n in (3, 1, 0, 2)]
    # position i accepted when n_accepted > i: 3/4, 2/4, 1/4
    assert from_samples(samples, 3) == [0.75, 0.5, 0.25]
    assert from_samples([], 2) == [0.0, 0.0]


def test_from_counts_holds_each_position_at_most_the_one_before() -> None:
    """A difference of two scrapes that split one step's increments counts a later position ahead
    of an earlier one; a negative difference (counters reset under the tuner) reads as none."""
    assert from_counts([60.0, 40.0, 20.0], 100.0) == [0.6, 0.4, 0.2]
    assert from_counts([60.0, 41.0, 42.0, 5.0], 100.0) == [0.6, 0.41, 0.41, 0.05]
    assert from_counts([120.0, -3.0], 100.0) == [1.0, 0.0]
    assert from_counts([5.0], 0.0) == [] and from_counts((), 10.0) == []


@pytest.mark.parametrize("alpha", [0.3, 0.6, 0.9])
def test_a_constant_conditional_rate_is_continued_exactly(alpha) -> None:
    measured = [alpha**i for i in range(1, 4)]
    assert extend(measured, 7) == pytest.approx([alpha**i for i in range(1, 8)])


def test_the_tail_continues_at_the_mean_conditional_rate_not_the_last() -> None:
    """Conditional rates 0.9 then 0.5 (p = 0.9, 0.45): the mean rate is sqrt(0.45) = 0.67; the last
    one (0.5) would put position 3 at 0.225, the mean rate at 0.30."""
    tail = extend([0.9, 0.45], 4)
    rate = 0.45**0.5
    assert tail == pytest.approx((0.9, 0.45, 0.45 * rate, 0.45 * rate**2))
    assert expected_tokens(tail, 4) == pytest.approx(1 + 0.9 + 0.45 + 0.45 * rate + 0.45 * rate**2)


def test_extend_clamps_cuts_and_pads() -> None:
    assert extend([1.2, 0.5], 3) == pytest.approx((1.0, 0.5, 0.5**1.5))  # a stored value above 1 is 1
    assert extend([0.8, 0.6, 0.5], 2) == (0.8, 0.6)
    assert extend([0.5, 0.0], 4) == (0.5, 0.0, 0.0, 0.0)
    assert extend([], 3) == (0.0, 0.0, 0.0)
