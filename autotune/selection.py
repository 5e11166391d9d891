"""Choosing the result of a study: Pareto front, SLO-feasible winner, gamma-by-batch schedule.

Pure functions over :class:`Point` records (one per trial or re-measurement), so the rules are
tested on synthetic fronts without running anything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Point:
    """One measured configuration: its knobs, objectives and per-batch-size throughput."""

    params: Mapping[str, object]
    tokens_per_second: float
    latency_ms: float
    violation: float = 0.0  # sum of positive SLO excesses (0 = feasible)
    per_batch: Mapping[int, float] = field(default_factory=dict)  # batch size -> tokens/s
    number: int | None = None

    @property
    def feasible(self) -> bool:
        return self.violation <= 0


def pareto_front(points: Sequence[Point]) -> list[Point]:
    """Non-dominated points (max tokens/s, min latency), sorted by tokens/s descending.

    Example:
        >>> a, b, c = Point({}, 10, 5), Point({}, 8, 3), Point({}, 7, 6)
        >>> [p.tokens_per_second for p in pareto_front([a, b, c])]
        [10, 8]
    """
    front = [p for p in points if not any(
        q.tokens_per_second >= p.tokens_per_second and q.latency_ms <= p.latency_ms
        and (q.tokens_per_second > p.tokens_per_second or q.latency_ms < p.latency_ms) for q in points)]
    return sorted(front, key=lambda p: (-p.tokens_per_second, p.latency_ms))


def knee_point(front: Sequence[Point]) -> Point:
    """The front's balanced point: the best tokens/s per ms of latency.

    Relative gains trade one for one (10% more throughput is worth 10% more latency), so the
    rule is scale-free and, unlike a distance to the front's corners, never ties on a front of
    two points. Ties go to the higher throughput.
    """
    return max(front, key=lambda p: (math.log(max(p.tokens_per_second, 1e-12)) - math.log(max(p.latency_ms, 1e-12)),
                                     p.tokens_per_second))


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


def gamma_schedule(points: Sequence[Point], batch_sizes: Sequence[int],
                   min_gain: float = 1.02) -> tuple[list[dict], int | None]:
    """Per batch size, the gamma of the fastest measured configuration there.

    Speculation must beat the best gamma=0 measurement at that batch size by ``min_gain``
    (2% by default: smaller gains are noise on a shared machine), else the entry is gamma 0.
    The crossover is the smallest batch size from which every larger one has gamma 0 (None
    when speculation pays at every measured batch size).

    Example:
        >>> pts = [Point({"gamma": 0}, 0, 0, per_batch={1: 10, 8: 80}),
        ...        Point({"gamma": 4}, 0, 0, per_batch={1: 20, 8: 60})]
        >>> gamma_schedule(pts, [1, 8])
        ([{'batch_size': 1, 'gamma': 4, 'tokens_per_second': 20, 'baseline_tokens_per_second': 10}, \
{'batch_size': 8, 'gamma': 0, 'tokens_per_second': 80, 'baseline_tokens_per_second': 80}], 8)
    """
    schedule = []
    for b in batch_sizes:
        at_b = [p for p in points if b in p.per_batch]
        base = max((p.per_batch[b] for p in at_b if p.params.get("gamma") == 0), default=None)
        spec = max((p for p in at_b if p.params.get("gamma", 0) > 0), key=lambda p: p.per_batch[b], default=None)
        if spec is not None and (base is None or spec.per_batch[b] >= min_gain * base):
            schedule.append({"batch_size": b, "gamma": int(spec.params["gamma"]),
                             "tokens_per_second": spec.per_batch[b], "baseline_tokens_per_second": base})
        else:
            schedule.append({"batch_size": b, "gamma": 0, "tokens_per_second": base,
                             "baseline_tokens_per_second": base})
    crossover = None
    for entry in reversed(schedule):
        if entry["gamma"] != 0:
            break
        crossover = entry["batch_size"]
    return schedule, crossover
