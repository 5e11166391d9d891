"""Selection rules on synthetic points: Pareto front, SLO winner, knee, per-level choices, the table verdict."""

from __future__ import annotations

import pytest

from autotune.decide.selection import (
    choose,
    choose_with_margin,
    knee_point,
    pareto_front,
    per_level_choices,
    plan_table,
    table_of,
    table_verdict,
)
from autotune.knobs import Knobs
from autotune.records import Point

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


def test_choose_without_slos_takes_the_highest_throughput_or_asked_the_knee_not_an_extreme() -> None:
    extreme_tps = pt(100, 100, name="max-throughput")
    balanced = pt(90, 20, name="balanced")
    extreme_lat = pt(20, 10, name="min-latency")
    dominated = pt(50, 50, name="dominated")
    points = [extreme_lat, balanced, dominated, extreme_tps]
    choice = choose(points, has_slo=False)
    assert choice.point is extreme_tps and choice.met_slo is True
    assert choice.reason == "highest throughput (no SLOs set)"
    choice = choose(points, has_slo=False, knee=True)
    assert choice.point is balanced
    assert choice.met_slo is True and "knee" in choice.reason
    assert knee_point(pareto_front([extreme_tps, balanced, extreme_lat])) is balanced
    # with SLOs the knee is not asked for: the fastest feasible point
    assert choose([*points[:3], pt(100, 100, violation=1.0)], has_slo=True, knee=True).point is balanced


def test_the_default_keeps_a_significantly_faster_drafter_that_the_knee_would_drop() -> None:
    """The mixed-drafter study: no speculation had the lower TPOT p95 (19.5 vs 27.5 ms on the trial
    points, more in the re-measurement), EAGLE-3 gamma 4 1.55x its tokens/s in every round."""
    ar = Point(knobs(0), 95.0, 19.5, rounds=((95.0, 19.5), (98.0, 18.0), (92.0, 21.0)))
    head = Point(knobs(4), 150.0, 34.0, rounds=((150.0, 34.0), (149.0, 31.0), (146.0, 36.0)))
    assert choose_with_margin([ar, head], has_slo=False, knee=True).point is ar
    choice = choose_with_margin([ar, head], has_slo=False)
    assert choice.point is head, choice.reason
    assert "significantly better (ratio 1.5" in choice.reason


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
# per-level choices and the table verdict (paired rounds per load level)


def levels(k: Knobs, **rounds: tuple[float, ...]) -> Point:
    """``k`` measured at load levels ``b1=(...)``, ``b16=(...)``: paired rounds of tokens/s per level."""
    per = {int(name[1:]): tuple(r) for name, r in rounds.items()}
    return Point(
        k,
        0.0,
        0.0,
        per_batch={b: sorted(r)[len(r) // 2] for b, r in per.items()},
        per_batch_rounds=per,
    )


OFF = levels(Knobs("model", 0), b1=(83, 85, 84, 86), b4=(296, 300, 303, 298), b16=(461, 450, 455, 448))
K2 = levels(Knobs("model", 2), b1=(143, 141, 145, 144), b4=(304, 300, 306, 303), b16=(428, 425, 431, 426))
K5 = levels(Knobs("model", 5), b1=(207, 205, 210, 208), b4=(395, 390, 398, 393), b16=(474, 440, 470, 452))


def test_per_level_choices_leave_the_constant_only_where_another_k_is_significantly_faster() -> None:
    # anchored on K=5 (the sweep's constant): at 16, speculation off is faster but inside the noise
    choices = per_level_choices([OFF, K2, K5], [1, 4, 16], "model", K5.knobs)
    assert [(c.batch_size, c.gamma) for c in choices] == [(1, 5), (4, 5), (16, 5)]
    assert all("is the fastest here" in c.reason for c in choices)
    # anchored on no speculation at 16 only: K=5's gain there is inside the noise
    (choice,) = per_level_choices([OFF, K2, K5], [16], "model", OFF.knobs)
    assert choice.gamma == 0
    assert "kept the constant gamma=0" in choice.reason and "no significant difference" in choice.reason
    # anchored on K=2: K=5 is significantly faster at every level (at 16 no speculation is too, less so)
    choices = per_level_choices([OFF, K2, K5], [1, 4, 16], "model", K2.knobs)
    assert table_of(choices) == ((1, 5), (4, 5), (16, 5))
    assert all("significantly better" in c.reason for c in choices)


def test_per_level_choices_keep_the_constant_inside_the_noise_whichever_k_it_is() -> None:
    """Noisy rounds give the constant at every level: a table departs from it only on evidence."""
    k5 = levels(Knobs("model", 5), b1=(120, 152, 95), b4=(268, 355, 320))
    k1 = levels(Knobs("model", 1), b1=(98, 87, 100), b4=(286, 248, 201))
    off = levels(Knobs("model", 0), b1=(69, 76, 74), b4=(199, 224, 210))
    assert [c.gamma for c in per_level_choices([off, k1, k5], [1, 4], "model", k5.knobs)] == [5, 5]
    # the margin rule's old habit, the smaller K inside the noise, is gone: K=1 is no safer a table entry
    assert [c.gamma for c in per_level_choices([off, k1, k5], [1, 4], "model", k1.knobs)] == [1, 1]


def test_per_level_choices_take_the_fastest_of_the_significantly_faster() -> None:
    k3 = levels(Knobs("model", 3), b1=(150, 152, 151, 153))
    k4 = levels(Knobs("model", 4), b1=(160, 158, 161, 159))
    (choice,) = per_level_choices([OFF, K2, k3, k4], [1], "model", OFF.knobs)
    assert choice.gamma == 4 and "over the constant gamma=0" in choice.reason


def test_per_level_choices_use_constant_chains_of_one_drafter_only() -> None:
    ngram = levels(Knobs("ngram", 4), b1=(400, 401, 402, 399))
    heuristic = levels(Knobs("model", 6, gamma_policy="heuristic"), b1=(500, 501, 502, 499))
    tree = levels(Knobs.for_tree((2, 1), 4), b1=(600, 601, 602, 599))
    (choice,) = per_level_choices([OFF, K2, ngram, heuristic, tree], [1], "model", OFF.knobs)
    assert choice.point.knobs == K2.knobs


def test_a_level_without_paired_rounds_of_equal_length_or_the_constant_gets_no_choice() -> None:
    short = levels(Knobs("model", 2), b1=(143, 141))
    assert per_level_choices([OFF, short], [1], "model", OFF.knobs) == []
    assert per_level_choices([OFF, K2], [8], "model", OFF.knobs) == []
    assert per_level_choices([OFF, K2], [1], "model", K5.knobs) == []  # the constant was not measured


def test_a_table_holds_k_of_at_least_one_where_the_per_level_choice_is_off() -> None:
    """The vLLM run's shape: K=5 fastest at batch 1, no speculation significantly faster from 4 up.
    The per-level choices say so (stored); the table cannot (its K=0 range still runs the drafter):
    it holds the fastest K >= 1 at each level, here K=5 everywhere, the constant: nothing to serve."""
    off = levels(Knobs("model", 0), b1=(83, 85, 84, 86), b4=(410, 414, 416, 411), b16=(520, 515, 524, 518))
    plan = plan_table([off, K2, K5], [1, 4, 16], off, K5, "model")
    assert [(c.batch_size, c.gamma) for c in plan.levels] == [(1, 5), (4, 0), (16, 0)]
    assert plan.table == ((1, 5), (4, 5), (16, 5)) and plan.drafter == "model"
    assert (
        "its K=0 range still runs the drafter" in plan.unserved
        and "K=5 at every level: one K" in plan.unserved
    )


def test_a_table_the_constants_already_beat_at_one_level_is_not_served() -> None:
    """No speculation is the constant; K=5 wins at 1 and K=2 beats K=5 at 16, but no speculation is
    significantly faster than K=2 there: served, the table would lose at 16."""
    k2 = levels(Knobs("model", 2), b1=(143, 141, 145, 144), b4=(304, 300, 306, 303), b16=(500, 496, 503, 499))
    off = levels(Knobs("model", 0), b1=(83, 85, 84, 86), b4=(330, 334, 336, 331), b16=(520, 515, 524, 518))
    plan = plan_table([off, k2, K5], [1, 4, 16], off, K5, "model")
    assert plan.table == ((1, 5), (4, 5), (16, 2))
    assert "holds K=2 at batch 16" in plan.unserved and "cannot win there" in plan.unserved


def test_a_table_no_level_of_which_beats_the_constant_is_not_served() -> None:
    """No speculation is the constant, and K=2 beats it at batch 1; the table (anchored on the best
    constant K, K=5) holds K=5 at 1 and 4 and K=2 at 16, none of them significantly faster than no
    speculation where it stands: served, it could not win anywhere."""
    noisy = (300, 420, 290, 410)
    off = levels(Knobs("model", 0), b1=(100, 102, 101, 99), b4=noisy, b16=(520, 470, 530, 480))
    k2 = levels(Knobs("model", 2), b1=(120, 121, 119, 122), b4=noisy, b16=(500, 496, 503, 499))
    k5 = levels(Knobs("model", 5), b1=(115, 80, 150, 95), b4=noisy, b16=(470, 460, 475, 465))
    plan = plan_table([off, k2, k5], [1, 4, 16], off, k5, "model")
    assert [c.gamma for c in plan.levels] == [2, 0, 0] and plan.table == ((1, 5), (4, 5), (16, 2))
    assert "holds no K significantly faster than the constant" in plan.unserved, plan.unserved


def test_a_table_whose_levels_each_beat_the_constant_is_served() -> None:
    """K=5 is the constant; K=2 is significantly faster at 16: the table 1-4:5, 16:2 is worth a run."""
    k2 = levels(Knobs("model", 2), b1=(143, 141, 145, 144), b4=(304, 300, 306, 303), b16=(500, 496, 503, 499))
    plan = plan_table([OFF, k2, K5], [1, 4, 16], K5, K5, "model")
    assert plan.table == ((1, 5), (4, 5), (16, 2)) and plan.unserved == ""
    assert [c.gamma for c in plan.levels] == [5, 5, 2]


def table_point(table: tuple[tuple[int, int], ...], **rounds: tuple[float, ...]) -> Point:
    return levels(Knobs.for_table("model", table, 16), **rounds)


def test_a_table_level_with_the_constant_at_two_levels_and_better_at_one_wins() -> None:
    k5 = levels(
        Knobs("model", 5), b1=K5.per_batch_rounds[1], b4=K5.per_batch_rounds[4], b16=(430, 428, 433, 427)
    )
    table = table_point(
        ((1, 5), (4, 5), (16, 0)), b1=(206, 207, 209, 208), b4=(394, 391, 397, 392), b16=(458, 452, 456, 450)
    )
    verdict = table_verdict(table, k5, OFF, [1, 4, 16])
    assert verdict.won, verdict.reason
    by_level = {lv["batch_size"]: lv for lv in verdict.per_level}
    assert [by_level[b]["table_gamma"] for b in (1, 4, 16)] == [5, 5, 0]
    assert [by_level[b]["significant_over_constant"] for b in (1, 4, 16)] == [False, False, True]
    assert not any(lv["significantly_worse_than_constant"] for lv in verdict.per_level)
    assert "better at batch 16" in verdict.reason and "not worse anywhere" in verdict.reason


def test_a_table_worse_at_any_level_loses_even_when_better_elsewhere() -> None:
    table = table_point(
        ((1, 5), (16, 0)), b1=(260, 262, 261, 263), b4=(350, 352, 351, 349), b16=(456, 452, 455, 450)
    )
    verdict = table_verdict(table, K5, OFF, [1, 4, 16])
    assert not verdict.won
    assert "worse at batch 4" in verdict.reason and "significantly worse" in verdict.reason


def test_a_table_inside_the_noise_everywhere_keeps_the_constant_and_says_so() -> None:
    table = table_point(((1, 5), (16, 2)), b1=K5.per_batch_rounds[1], b4=K5.per_batch_rounds[4])
    verdict = table_verdict(table, K5, OFF, [1, 4])
    assert not verdict.won and "not significantly better at any load level" in verdict.reason
    assert all(lv["ratio_over_constant"]["value"] == pytest.approx(1.0) for lv in verdict.per_level)


def test_a_table_that_beats_the_constant_where_it_switches_speculation_off_wins() -> None:
    k5 = levels(Knobs("model", 5), b1=(207, 205, 210, 208), b16=(400, 402, 398, 401))
    table = table_point(((1, 5), (16, 0)), b1=(206, 206, 209, 207), b16=(455, 452, 457, 450))
    verdict = table_verdict(table, k5, OFF, [1, 16])
    assert verdict.won and "batch 16: significantly better" in verdict.reason


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


def test_between_two_k_of_one_structure_the_faster_wins_without_a_margin() -> None:
    """The sweep that retired the old habit: K=5 1.2x K=3 inside the noise, both far above AR."""
    ar = remeasured(0, AR)
    k2 = remeasured(2, [150.0, 120.0, 160.0, 140.0, 155.0])
    k5 = remeasured(5, [185.0, 140.0, 190.0, 170.0, 186.0])
    choice = choose_with_margin([ar, k2, k5], has_slo=True)
    assert choice.point is k5, choice.reason
    assert "over gamma=0 (no speculation): significantly better" in choice.reason
    # a threshold is another structure: it must beat the plain chain by a margin
    thr = remeasured(5, [192.0, 137.0, 188.0, 175.0, 184.0], confidence_threshold=0.3)
    assert choose_with_margin([ar, k5, thr], has_slo=True).point is k5


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
