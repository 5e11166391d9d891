"""Intervals and paired ratios (autotune.stats) on hand-made repeats."""

from __future__ import annotations

import math
import random

import pytest

from autotune.stats import (
    Estimate,
    bootstrap_interval,
    describe_difference,
    estimate,
    pairable,
    paired_half_width,
    paired_ratio,
    significant,
    significantly_below,
    t975,
)


def test_estimate_is_the_median_with_a_t_interval_of_the_mean() -> None:
    e = estimate([100.0, 104.0, 96.0, 100.0])
    sd = math.sqrt(sum((x - 100.0) ** 2 for x in [100.0, 104.0, 96.0, 100.0]) / 3)
    assert e.value == 100.0 and e.n == 4
    assert (e.low, e.high) == pytest.approx((100 - 3.182 * sd / 2, 100 + 3.182 * sd / 2))


def test_one_repeat_has_no_interval_and_the_point_decides() -> None:
    e = estimate([5.0])
    assert (e.value, e.low, e.high, e.n) == (5.0, 5.0, 5.0, 1)
    assert significant(paired_ratio([1.01], [1.0])) and not significant(paired_ratio([1.0], [1.0]))
    assert "1 run, no interval" in paired_ratio([2.0], [1.0]).text(unit="x")


def test_paired_ratio_cancels_drift_that_hits_both() -> None:
    """A is 10% faster than B in every round while the host slows down 3x: the ratio is exact."""
    drift = [1.0, 0.5, 0.33, 0.8]
    r = paired_ratio([110 * d for d in drift], [100 * d for d in drift])
    assert r.value == pytest.approx(1.1) and r.low == pytest.approx(1.1) and r.high == pytest.approx(1.1)
    assert significant(r)


def test_paired_ratio_interval_is_the_reciprocal_of_the_reverse() -> None:
    a, b = [150.0, 160.0, 155.0, 149.0], [100.0, 104.0, 98.0, 103.0]
    ab, ba = paired_ratio(a, b), paired_ratio(b, a)
    assert ab.value == pytest.approx(1 / ba.value)
    assert (ab.low, ab.high) == pytest.approx((1 / ba.high, 1 / ba.low))


def test_noise_without_a_difference_is_not_significant() -> None:
    rng = random.Random(0)
    a = [100 * rng.gauss(1, 0.08) for _ in range(5)]
    b = [100 * rng.gauss(1, 0.08) for _ in range(5)]
    r = paired_ratio(a, b)
    assert r.low < 1 < r.high and not significant(r)
    assert describe_difference(r).startswith("no significant difference (ratio ")


def test_a_clear_gain_is_significant_through_the_same_noise() -> None:
    rng = random.Random(0)
    a = [150 * rng.gauss(1, 0.08) for _ in range(5)]
    b = [100 * rng.gauss(1, 0.08) for _ in range(5)]
    assert significant(paired_ratio(a, b))


def test_text_formats_the_interval() -> None:
    assert Estimate(1.62, 1.51, 1.70, 5).text(unit="x") == "1.62x (95% CI 1.51-1.70)"
    assert (
        describe_difference(Estimate(1.03, 0.95, 1.11, 5))
        == "no significant difference (ratio 1.03, 95% CI 0.95-1.11)"
    )


def test_paired_ratio_refuses_unpaired_or_non_positive_input() -> None:
    with pytest.raises(ValueError, match="equally many rounds"):
        paired_ratio([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="positive"):
        paired_ratio([0.0], [1.0])


def test_t_quantiles() -> None:
    assert t975(1) == 12.706 and t975(4) == 2.776 and t975(31) == 1.96
    with pytest.raises(ValueError):
        t975(0)


def test_bootstrap_is_seeded_and_covers_the_statistic() -> None:
    xs = [1.0, 1.2, 0.9, 1.1, 1.05, 0.95]
    first = bootstrap_interval([xs], lambda s: sorted(s)[len(s) // 2], seed=3)
    assert first == bootstrap_interval([xs], lambda s: sorted(s)[len(s) // 2], seed=3)
    assert min(xs) <= first[0] <= first[1] <= max(xs)


def test_an_estimate_comes_back_from_its_stored_dict_and_prints_as_a_cell() -> None:
    r = paired_ratio([150.0, 160.0, 155.0], [100.0, 104.0, 98.0])
    assert Estimate.from_dict({**r.as_dict(), "across": "bridge"}) == r
    assert r.cell() == f"{r.value:.2f} ({r.low:.2f}-{r.high:.2f})" and r.low < r.value < r.high
    assert paired_ratio([2.0], [1.0]).cell() == "2.00"  # one round: no interval to print


def test_pairable_wants_equally_many_positive_rounds() -> None:
    assert pairable([1.0, 2.0], [3.0, 4.0], [5.0, 6.0])
    assert not pairable([1.0, 2.0], [3.0])
    assert not pairable([], [])
    assert not pairable([1.0, None], [3.0, 4.0])  # a round that measured nothing
    assert not pairable([1.0, 0.0], [3.0, 4.0])


def test_the_half_width_a_noise_predicts_is_the_one_paired_ratios_get() -> None:
    rng = random.Random(1)
    cv, rounds = 0.05, 8
    widths = []
    for _ in range(400):
        a = [100 * rng.gauss(1, cv) for _ in range(rounds)]
        b = [100 * rng.gauss(1, cv) for _ in range(rounds)]
        r = paired_ratio(a, b)
        widths.append((math.log(r.high) - math.log(r.low)) / 2)
    typical = sorted(widths)[len(widths) // 2]
    assert typical == pytest.approx(paired_half_width(cv, rounds), rel=0.15)
    assert paired_half_width(cv, 16) < paired_half_width(cv, 4)
    with pytest.raises(ValueError):
        paired_half_width(cv, 1)


def test_below_a_bar_needs_the_whole_interval_under_it_and_is_the_worse_verdict() -> None:
    slower = paired_ratio([96.0, 97.0, 95.5], [100.0, 101.0, 99.5])  # 0.96 in every round
    assert significantly_below(slower) and significantly_below(slower, 0.98)
    assert not significantly_below(slower, 0.9)
    noisy = paired_ratio([90.0, 104.0, 96.0], [100.0, 99.0, 101.0])
    assert noisy.value < 0.98 and not significantly_below(noisy, 0.98)  # the point, not the interval
    assert significantly_below(Estimate(0.97, 0.97, 0.97, 1), 0.98)  # one round: the point decides
    assert describe_difference(slower).startswith("significantly worse")
    assert not describe_difference(noisy).startswith("significantly worse")
