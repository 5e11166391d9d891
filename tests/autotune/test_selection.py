"""Selection rules on synthetic points: Pareto front, SLO winner, knee, gamma-by-batch schedule."""

from __future__ import annotations

import pytest

from autotune.knobs import Knobs
from autotune.selection import (
    Point,
    batch_schedule,
    choose,
    choose_with_margin,
    knee_point,
    pareto_front,
)

_NAMES: dict[str, int] = {}


def knobs(gamma: int = 0, **params) -> Knobs:
    """A configuration from flat params (the draft model unless said otherwise)."""
    return Knobs.from_params({"drafter": "model", "gamma": gamma, **params})


def pt(tps: float, lat: float, violation: float = 0.0, name: str = "") -> Point:
    """A point named by its (otherwise unused) max_batch_size: the rules compare objectives only."""
    return Point(
        Knobs("model", 1, max_batch_size=_NAMES.setdefault(name, len(_NAMES) + 1)), tps, lat, violation
    )


def name_of(point: Point) -> str:
    return next(n for n, i in _NAMES.items() if i == point.knobs.max_batch_size)


def names(points) -> list[str]:
    return [name_of(p) for p in points]


# ------------------------------------------------------------------------------------------
# pareto_front


def test_pareto_front_removes_dominated_points_and_sorts_by_throughput() -> None:
    points = [
        pt(100, 50, name="fast"),
        pt(60, 10, name="snappy"),
        pt(80, 20, name="middle"),
        pt(70, 30, name="dominated-by-middle"),
        pt(100, 60, name="same-tps-slower"),  # dominated by "fast" (equal tps, worse latency)
        pt(50, 10, name="same-latency-less-tps"),  # dominated by "snappy"
    ]
    assert names(pareto_front(points)) == ["fast", "middle", "snappy"]


def test_pareto_front_keeps_exact_ties() -> None:
    points = [pt(80, 20, name="a"), pt(80, 20, name="b"), pt(40, 40, name="c")]
    assert sorted(names(pareto_front(points))) == ["a", "b"]


def test_pareto_front_of_one_point() -> None:
    assert names(pareto_front([pt(1, 1, name="only")])) == ["only"]


# ------------------------------------------------------------------------------------------
# choose


def test_choose_with_slos_takes_the_highest_feasible_throughput() -> None:
    points = [
        pt(120, 80, violation=30, name="fastest-but-violates"),
        pt(90, 45, name="best-feasible"),
        pt(70, 30, name="feasible-slower"),
    ]
    choice = choose(points, has_slo=True)
    assert name_of(choice.point) == "best-feasible"
    assert choice.met_slo is True


def test_choose_with_slos_breaks_throughput_ties_by_latency() -> None:
    points = [pt(90, 45, name="slow"), pt(90, 30, name="quick")]
    assert name_of(choose(points, has_slo=True).point) == "quick"


def test_choose_with_slos_nothing_feasible_returns_the_closest() -> None:
    points = [
        pt(120, 80, violation=30, name="far"),
        pt(60, 52, violation=2, name="closest-slow"),
        pt(90, 52, violation=2, name="closest-fast"),
        pt(100, 60, violation=10, name="middle"),
    ]
    choice = choose(points, has_slo=True)
    assert name_of(choice.point) == "closest-fast"  # smallest violation, then throughput
    assert choice.met_slo is False
    assert "closest" in choice.reason


def test_choose_without_slos_takes_the_knee_not_an_extreme() -> None:
    extreme_tps = pt(100, 100, name="max-throughput")
    balanced = pt(90, 20, name="balanced")
    extreme_lat = pt(20, 10, name="min-latency")
    dominated = pt(50, 50, name="dominated")
    choice = choose([extreme_tps, extreme_lat, balanced, dominated], has_slo=False)
    assert choice.point is balanced
    assert choice.met_slo is True
    assert knee_point(pareto_front([extreme_tps, balanced, extreme_lat])) is balanced


def test_knee_point_is_scale_free() -> None:
    """Relative trade-offs: multiplying latencies by 1000 does not move the knee."""
    front = [pt(100, 100, name="a"), pt(90, 20, name="b"), pt(20, 10, name="c")]
    scaled = [pt(p.tokens_per_second, p.latency_ms * 1000, name=name_of(p)) for p in front]
    assert name_of(knee_point(front)) == name_of(knee_point(scaled)) == "b"


def test_knee_point_of_two_points_takes_the_better_trade() -> None:
    # the bundled demo's front: speculation is 41% faster for 4% more tpot p95; AR must not win a tie
    ar, spec = pt(110, 16.5, name="ar"), pt(155, 17.2, name="spec")
    assert knee_point([ar, spec]) is spec and knee_point([spec, ar]) is spec
    slow_spec = pt(120, 30, name="slow-spec")  # 9% more throughput for 82% more latency
    assert knee_point([ar, slow_spec]) is ar


def test_knee_point_of_a_single_point() -> None:
    only = pt(5, 5, name="only")
    assert knee_point([only]) is only


def test_choose_refuses_nothing() -> None:
    with pytest.raises(ValueError):
        choose([], has_slo=False)


# ------------------------------------------------------------------------------------------
# batch_schedule


def run(gamma: int, per_batch: dict[int, float]) -> Point:
    return Point(knobs(gamma), 0.0, 0.0, per_batch=per_batch)


def test_schedule_speculation_wins_small_loses_large() -> None:
    points = [
        run(0, {1: 10, 2: 20, 4: 40, 8: 80}),
        run(2, {1: 18, 2: 30, 4: 38, 8: 60}),
        run(4, {1: 22, 2: 28, 4: 35, 8: 50}),
    ]
    schedule, crossover = batch_schedule(points, [1, 2, 4, 8])
    assert [(e["batch_size"], e["gamma"]) for e in schedule] == [(1, 4), (2, 2), (4, 0), (8, 0)]
    assert [e["tokens_per_second"] for e in schedule] == [22, 30, 40, 80]
    assert [e["baseline_tokens_per_second"] for e in schedule] == [10, 20, 40, 80]
    assert crossover == 4


def test_schedule_all_zero_crosses_over_at_the_smallest_batch() -> None:
    points = [run(0, {1: 10, 4: 40}), run(3, {1: 9, 4: 30})]
    schedule, crossover = batch_schedule(points, [1, 4])
    assert [e["gamma"] for e in schedule] == [0, 0]
    assert crossover == 1


def test_schedule_speculation_pays_everywhere_no_crossover() -> None:
    points = [run(0, {1: 10, 4: 40}), run(3, {1: 25, 4: 60})]
    schedule, crossover = batch_schedule(points, [1, 4])
    assert [e["gamma"] for e in schedule] == [3, 3]
    assert crossover is None


def test_schedule_crossover_is_where_it_stays_off() -> None:
    """Speculation off at B=2 but on again at B=4: the crossover is after the last win."""
    points = [run(0, {1: 10, 2: 20, 4: 40, 8: 80}), run(2, {1: 20, 2: 19, 4: 50, 8: 70})]
    schedule, crossover = batch_schedule(points, [1, 2, 4, 8])
    assert [e["gamma"] for e in schedule] == [2, 0, 2, 0]
    assert crossover == 8


@pytest.mark.parametrize(("spec_tps", "expected_gamma"), [(101.9, 0), (102.0, 3), (102.1, 3)])
def test_schedule_two_percent_rule(spec_tps, expected_gamma) -> None:
    points = [run(0, {1: 100.0}), run(3, {1: spec_tps})]
    schedule, _ = batch_schedule(points, [1])
    assert schedule[0]["gamma"] == expected_gamma
    assert schedule[0]["baseline_tokens_per_second"] == 100.0


def test_schedule_min_gain_is_configurable() -> None:
    points = [run(0, {1: 100.0}), run(3, {1: 104.0})]
    assert batch_schedule(points, [1], min_gain=1.05)[0][0]["gamma"] == 0
    assert batch_schedule(points, [1], min_gain=1.0)[0][0]["gamma"] == 3


def test_schedule_compares_against_the_best_baseline() -> None:
    points = [run(0, {1: 100.0}), run(0, {1: 120.0}), run(2, {1: 115.0})]
    schedule, _ = batch_schedule(points, [1])
    assert schedule[0] == {
        "batch_size": 1,
        "gamma": 0,
        "tokens_per_second": 120.0,
        "baseline_tokens_per_second": 120.0,
    }


def test_schedule_without_a_baseline_takes_the_fastest_speculative() -> None:
    points = [run(2, {1: 50.0}), run(5, {1: 70.0})]
    schedule, crossover = batch_schedule(points, [1])
    assert schedule[0]["gamma"] == 5 and schedule[0]["baseline_tokens_per_second"] is None
    assert crossover is None


def test_schedule_only_uses_points_measured_at_that_batch() -> None:
    points = [run(0, {1: 10, 4: 40}), run(4, {1: 30})]  # gamma 4 never ran at B=4
    schedule, crossover = batch_schedule(points, [1, 4])
    assert [e["gamma"] for e in schedule] == [4, 0]
    assert crossover == 4


# ------------------------------------------------------------------------------------------
# decisions with a margin (paired re-measurement rounds)


def remeasured(gamma: int, tps: list[float], lat: float = 10.0, violation: float = 0.0, **params) -> Point:
    rounds = tuple((t, lat) for t in tps)
    med = sorted(tps)[len(tps) // 2]
    return Point(
        knobs(gamma, **params),
        med,
        lat,
        violation,
        {1: med},
        rounds=rounds,
        per_batch_rounds={1: tuple(tps)},
    )


AR = [100.0, 104.0, 96.0, 101.0, 99.0]


def test_a_gain_inside_the_noise_keeps_the_baseline_and_says_so() -> None:
    ar = remeasured(0, AR)
    g4 = remeasured(4, [103.0, 99.0, 106.0, 98.0, 104.0])  # the knee rule alone would take it
    assert choose([ar, g4], has_slo=False).point is g4
    choice = choose_with_margin([ar, g4], has_slo=False)
    assert choice.point is ar
    assert "no significant difference (ratio 1.0" in choice.reason and "95% CI" in choice.reason


def test_a_clear_gain_replaces_the_baseline_with_its_interval_in_the_reason() -> None:
    ar, g4 = remeasured(0, AR), remeasured(4, [150.0, 158.0, 147.0, 152.0, 149.0])
    choice = choose_with_margin([ar, g4], has_slo=False)
    assert choice.point is g4
    assert "significantly better (ratio 1.5" in choice.reason


def test_a_complex_winner_falls_back_to_the_simpler_finalist_not_to_the_baseline() -> None:
    """Heuristic schedule ties the constant gamma it extends; both clearly beat AR: constant is kept."""
    ar = remeasured(0, AR)
    const = remeasured(6, [150.0, 156.0, 146.0, 151.0, 149.0])
    heur = remeasured(6, [152.0, 155.0, 149.0, 150.0, 151.0], gamma_schedule="heuristic")
    choice = choose_with_margin([ar, const, heur], has_slo=False)
    assert choice.point is const
    assert "no significant difference" in choice.reason


def test_with_slos_only_feasible_simpler_points_block_and_nothing_feasible_is_unchanged() -> None:
    ar = remeasured(0, AR, violation=5.0)  # infeasible: cannot be the safer choice
    g2 = remeasured(2, [101.0, 103.0, 99.0, 100.0, 102.0])
    assert choose_with_margin([ar, g2], has_slo=True).point is g2
    both_bad = [remeasured(0, AR, violation=5.0), remeasured(2, AR, violation=1.0)]
    assert "closest" in choose_with_margin(both_bad, has_slo=True).reason


def test_without_rounds_the_margin_rule_is_the_point_rule() -> None:
    ar, g4 = Point(knobs(0), 100, 10), Point(knobs(4), 101, 10)
    assert choose_with_margin([ar, g4], has_slo=False).point is g4


def test_simplicity_orders_baseline_constant_threshold_gamma() -> None:
    ks = [
        knobs(4, gamma_schedule="heuristic"),
        knobs(4, confidence_threshold=0.2),
        knobs(8),
        knobs(2),
        knobs(0, gamma_schedule="heuristic"),
    ]
    assert sorted(ks, key=lambda k: k.simplicity) == [ks[4], ks[3], ks[2], ks[1], ks[0]]


def test_schedule_uses_the_interval_rule_where_paired_repeats_exist() -> None:
    noisy = [remeasured(0, AR), remeasured(3, [103.0, 99.0, 106.0, 98.0, 104.0])]
    (entry,), crossover = batch_schedule(noisy, [1], min_gain=1.0)  # the point rule would take gamma 3
    assert entry["gamma"] == 0 and entry["significant"] is False and crossover == 1
    assert entry["ratio"]["n"] == 5 and entry["ratio"]["ci95"][0] < 1 < entry["ratio"]["ci95"][1]
    clear = [remeasured(0, AR), remeasured(3, [150.0, 158.0, 147.0, 152.0, 149.0])]
    (entry,), crossover = batch_schedule(clear, [1])
    assert entry["gamma"] == 3 and entry["significant"] is True and crossover is None


def test_a_steady_throughput_gain_is_not_blocked_by_noisy_p95_latency() -> None:
    # 1.3x tokens/s in every round; the p95 latency of a few requests jumps around
    ar = Point(knobs(0), 100, 10, rounds=((100, 10), (99, 9), (104, 11)))
    spec = Point(
        knobs(8, confidence_threshold=0.0, gamma_schedule="constant"),
        130,
        8,
        rounds=((130, 5), (128, 20), (135, 8)),
    )
    choice = choose_with_margin([ar, spec], has_slo=False)
    assert choice.point is spec, choice.reason
    assert "significantly better" in choice.reason


def test_the_schedule_follows_the_chosen_gamma_where_the_fastest_is_not_separable_from_it() -> None:
    """Chosen gamma 8 and the fastest gamma 5 within noise at B=1: the table says 8, like the choice."""
    ar = remeasured(0, AR)
    g5 = remeasured(5, [152.0, 149.0, 156.0, 150.0, 153.0])
    g8 = remeasured(8, [150.0, 151.0, 153.0, 147.0, 152.0])
    schedule, _ = batch_schedule([ar, g5, g8], [1])
    assert schedule[0]["gamma"] == 5 and "kept_chosen" not in schedule[0]  # without a choice: the fastest
    schedule, _ = batch_schedule([ar, g5, g8], [1], prefer=g8)
    assert schedule[0]["gamma"] == 8 and schedule[0]["kept_chosen"] and schedule[0]["significant"]
    assert schedule[0]["best_speculative_gamma"] == 5


def test_a_significantly_faster_gamma_still_replaces_the_chosen_one_in_the_schedule() -> None:
    ar = remeasured(0, AR)
    g2 = remeasured(2, [120.0, 118.0, 121.0, 119.0, 122.0])
    g5 = remeasured(5, [152.0, 149.0, 156.0, 150.0, 153.0])
    schedule, _ = batch_schedule([ar, g2, g5], [1], prefer=g2)
    assert schedule[0]["gamma"] == 5 and "kept_chosen" not in schedule[0]
