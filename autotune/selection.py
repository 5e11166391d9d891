"""Choosing the result of a study: Pareto front, SLO-feasible winner, gamma-by-batch schedule.

Pure functions over :class:`Point` records (one per trial or re-measurement), so the rules are
tested on synthetic fronts without running anything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from autotune.knobs import Knobs
from autotune.stats import Estimate, describe_difference, paired_ratio, significant


@dataclass(frozen=True)
class Point:
    """One measured configuration: its knobs, objectives and per-batch-size throughput."""

    knobs: Knobs
    tokens_per_second: float
    latency_ms: float
    violation: float = 0.0  # sum of positive SLO excesses (0 = feasible)
    per_batch: Mapping[int, float] = field(default_factory=dict)  # batch size -> tokens/s
    number: int | None = None
    # re-measured points: (tokens/s, latency) per round, and tokens/s per batch size per round; the
    # rounds of all re-measured points are paired (same seeds, measured alternately)
    rounds: tuple[tuple[float, float], ...] = ()
    per_batch_rounds: Mapping[int, tuple[float, ...]] = field(default_factory=dict)

    @property
    def feasible(self) -> bool:
        return self.violation <= 0


def pareto_front(points: Sequence[Point]) -> list[Point]:
    """Non-dominated points (max tokens/s, min latency), sorted by tokens/s descending.

    Example:
        >>> k = Knobs("model", 2)
        >>> a, b, c = Point(k, 10, 5), Point(k, 8, 3), Point(k, 7, 6)
        >>> [p.tokens_per_second for p in pareto_front([a, b, c])]
        [10, 8]
    """
    front = [
        p
        for p in points
        if not any(
            q.tokens_per_second >= p.tokens_per_second
            and q.latency_ms <= p.latency_ms
            and (q.tokens_per_second > p.tokens_per_second or q.latency_ms < p.latency_ms)
            for q in points
        )
    ]
    return sorted(front, key=lambda p: (-p.tokens_per_second, p.latency_ms))


def knee_point(front: Sequence[Point]) -> Point:
    """The front's balanced point: the best tokens/s per ms of latency.

    Relative gains trade one for one (10% more throughput is worth 10% more latency), so the
    rule is scale-free and, unlike a distance to the front's corners, never ties on a front of
    two points. Ties go to the higher throughput.
    """
    return max(
        front,
        key=lambda p: (
            math.log(max(p.tokens_per_second, 1e-12)) - math.log(max(p.latency_ms, 1e-12)),
            p.tokens_per_second,
        ),
    )


@dataclass(frozen=True)
class Choice:
    point: Point
    met_slo: bool
    reason: str


def choose(points: Sequence[Point], has_slo: bool) -> Choice:
    """Highest tokens/s meeting every SLO; without SLOs, the knee of the Pareto front.

    When nothing meets the SLOs, the point with the smallest violation is returned with
    ``met_slo=False`` so the caller can say what came closest.
    """
    if not points:
        raise ValueError("choose: no measured points")
    if has_slo:
        feasible = [p for p in points if p.feasible]
        if feasible:
            best = max(feasible, key=lambda p: (p.tokens_per_second, -p.latency_ms))
            return Choice(best, True, "highest throughput meeting every SLO")
        closest = min(points, key=lambda p: (p.violation, -p.tokens_per_second))
        return Choice(closest, False, "no configuration met the SLOs; this one came closest")
    return Choice(knee_point(pareto_front(points)), True, "knee of the Pareto front (no SLOs set)")


def score_ratio(a: Point, b: Point, has_slo: bool) -> Estimate:  # noqa: ARG001 - one rule with or without SLOs
    """A over B in tokens/s (the throughput objective), from paired rounds when both have them.

    The rule *ranks* by tokens/s (with SLOs) or tokens/s per ms of latency (the knee, without),
    but a configuration *replaces* a simpler one only on throughput: the knee score divides by a
    p95 latency of a few requests, whose round-to-round noise made a 1.3x throughput gain
    "not significant" (95% CI 0.80-1.91 over 3 rounds) while every batch size's own throughput
    ratio excluded 1. Points without (equally many) rounds compare as one run each.
    """

    def scores(p: Point) -> list[float]:
        rounds = p.rounds or ((p.tokens_per_second, p.latency_ms),)
        return [t for t, _ in rounds]

    sa, sb = scores(a), scores(b)
    if len(sa) != len(sb):
        sa, sb = (
            scores(Point(a.knobs, a.tokens_per_second, a.latency_ms)),
            scores(Point(b.knobs, b.tokens_per_second, b.latency_ms)),
        )
    return paired_ratio([max(x, 1e-12) for x in sa], [max(x, 1e-12) for x in sb])


def choose_with_margin(points: Sequence[Point], has_slo: bool) -> Choice:
    """:func:`choose`, except that a configuration replaces a simpler one only by a margin.

    The rule's winner must beat every simpler eligible point (see :func:`simplicity`; with SLOs
    only feasible ones) with a ratio interval excluding 1 (:func:`autotune.stats.significant`).
    Otherwise it leaves the pool, the rule picks again, and the reason says which comparison was
    not significant. When nothing meets the SLOs, the closest point is returned as before.

    Example:
        >>> ar = Point(Knobs("model", 0), 100, 10, rounds=((100, 10), (104, 10), (96, 10)))
        >>> g4 = Point(Knobs("model", 4), 103, 10, rounds=((103, 10), (99, 10), (106, 10)))
        >>> c = choose_with_margin([ar, g4], has_slo=False)
        >>> c.point is ar, c.reason.split(";")[1].strip()[:45]
        (True, 'kept gamma=0 (no speculation): gamma=4 thr=0.')
    """
    pool = list(points)
    notes: list[str] = []
    while True:
        choice = choose(pool, has_slo)
        winner = choice.point
        if not choice.met_slo:
            return choice
        simpler = sorted(
            (
                p
                for p in pool
                if p is not winner
                and (p.feasible or not has_slo)
                and p.knobs.simplicity < winner.knobs.simplicity
            ),
            key=lambda p: p.knobs.simplicity,
        )
        blocked = None
        for s in simpler:
            ratio = score_ratio(winner, s, has_slo)
            if not significant(ratio):
                blocked = (s, ratio)
                break
        if blocked is None:
            reason = choice.reason
            if notes:
                reason += "; kept " + winner.knobs.label + ": " + "; ".join(notes)
            elif simpler:
                ratio = score_ratio(winner, simpler[0], has_slo)
                reason += f"; over {simpler[0].knobs.label}: {describe_difference(ratio)}"
            else:  # the simplest won outright: say how the runner-up compared
                others = [p for p in pool if p is not winner and (p.feasible or not has_slo)]
                if others:
                    runner_up = choose(others, has_slo).point
                    ratio = score_ratio(runner_up, winner, has_slo)
                    reason += f"; {runner_up.knobs.label} vs it: {describe_difference(ratio)}"
            return Choice(winner, choice.met_slo, reason)
        s, ratio = blocked
        notes.append(f"{winner.knobs.label} vs {s.knobs.label}: {describe_difference(ratio)}")
        pool = [p for p in pool if p is not winner]


def batch_schedule(
    points: Sequence[Point], batch_sizes: Sequence[int], min_gain: float = 1.02, prefer: Point | None = None
) -> tuple[list[dict], int | None]:
    """Per batch size, the gamma of the fastest measured configuration there.

    Speculation must beat the best gamma=0 measurement at that batch size by ``min_gain``
    (2% by default: smaller gains are noise on a shared machine), else the entry is gamma 0.
    Where re-measured points carry paired per-round throughput at that batch size (``per_batch_rounds``,
    2 rounds or more), the decision is instead made among them by the interval rule: the fastest
    speculative one must beat the fastest gamma=0 one with a ratio interval above 1, and the entry
    records the ``ratio`` (value, 95% interval, rounds) and ``significant``. With ``prefer`` (the
    chosen configuration) the same margin rule keeps the schedule coherent with the choice: at a
    batch size where the fastest speculative point does not beat ``prefer`` significantly,
    ``prefer``'s gamma stands for speculation there (the entry's ``kept_chosen`` says so), so the
    exports that take the table and those that take the chosen gamma agree unless the data says
    otherwise.
    The crossover is the smallest batch size from which every larger one has gamma 0 (None
    when speculation pays at every measured batch size).

    Example:
        >>> pts = [Point(Knobs("model", 0), 0, 0, per_batch={1: 10, 8: 80}),
        ...        Point(Knobs("model", 4), 0, 0, per_batch={1: 20, 8: 60})]
        >>> batch_schedule(pts, [1, 8])
        ([{'batch_size': 1, 'gamma': 4, 'tokens_per_second': 20, 'baseline_tokens_per_second': 10}, \
{'batch_size': 8, 'gamma': 0, 'tokens_per_second': 80, 'baseline_tokens_per_second': 80}], 8)
    """
    schedule = []
    for b in batch_sizes:
        at_b = [p for p in points if b in p.per_batch]
        entry = _schedule_entry_with_margin(at_b, b, prefer)
        if entry is not None:
            schedule.append(entry)
            continue
        base = max((p.per_batch[b] for p in at_b if p.knobs.gamma == 0), default=None)
        spec = max((p for p in at_b if p.knobs.gamma > 0), key=lambda p: p.per_batch[b], default=None)
        if spec is not None and (base is None or spec.per_batch[b] >= min_gain * base):
            schedule.append(
                {
                    "batch_size": b,
                    "gamma": spec.knobs.gamma,
                    "tokens_per_second": spec.per_batch[b],
                    "baseline_tokens_per_second": base,
                }
            )
        else:
            schedule.append(
                {"batch_size": b, "gamma": 0, "tokens_per_second": base, "baseline_tokens_per_second": base}
            )
    crossover = None
    for entry in reversed(schedule):
        if entry["gamma"] != 0:
            break
        crossover = entry["batch_size"]
    return schedule, crossover


def _schedule_entry_with_margin(at_b: Sequence[Point], b: int, prefer: Point | None = None) -> dict | None:
    """The interval-rule entry at batch size ``b``, or None where no paired repeats exist there."""
    repeated = [p for p in at_b if len(p.per_batch_rounds.get(b, ())) >= 2]
    base = max((p for p in repeated if p.knobs.gamma == 0), key=lambda p: p.per_batch[b], default=None)
    fastest = max((p for p in repeated if p.knobs.gamma > 0), key=lambda p: p.per_batch[b], default=None)
    if base is None or fastest is None or len(base.per_batch_rounds[b]) != len(fastest.per_batch_rounds[b]):
        return None
    spec, kept = fastest, False
    mine = next((p for p in repeated if prefer is not None and p.knobs == prefer.knobs), None)
    if (
        mine is not None
        and mine is not fastest
        and mine.knobs.gamma > 0
        and len(mine.per_batch_rounds[b]) == len(fastest.per_batch_rounds[b])
        and not significant(paired_ratio(fastest.per_batch_rounds[b], mine.per_batch_rounds[b]))
    ):
        spec, kept = mine, True  # the fastest is not separable from the chosen configuration here
    ratio = paired_ratio(spec.per_batch_rounds[b], base.per_batch_rounds[b])
    win = significant(ratio)
    chosen = spec if win else base
    entry = {
        "batch_size": b,
        "gamma": chosen.knobs.gamma,
        "tokens_per_second": chosen.per_batch[b],
        "baseline_tokens_per_second": base.per_batch[b],
        "ratio": ratio.as_dict(),
        "significant": win,
        "best_speculative_gamma": fastest.knobs.gamma,
    }
    if kept:
        entry["kept_chosen"] = True
    return entry
