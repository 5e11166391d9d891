"""Typed records of what the tuner measures: the profiler's measurement and a trial's result.

Each has ``to_json`` / ``from_json`` for the JSON it is stored as (the measurement in the
profile store, a trial's per-level metrics as Optuna user attributes); ``from_json(d).to_json()``
gives ``d`` back. The stored profile itself is :class:`profiles.schema.Profile`; the cost model's
inputs are :class:`autotune.records.Curves` and :class:`autotune.records.StepSample`.
Metric definitions: docs/metrics.md.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from autotune.knobs import Knobs
from profiles.schema import MISSING

# The metrics of one load level, in the order they are stored (docs/metrics.md).
LEVEL_KEYS = (
    "tokens_per_second",
    "tpot_ms_p50",
    "tpot_ms_p95",
    "ttft_ms_p50",
    "ttft_ms_p95",
    "e2e_ms_p50",
    "e2e_ms_p95",
    "acceptance_rate",
    "mean_acceptance_length",
    "rollback_frequency",
    "batch_utilization",
    "mean_batch_size",
    "requests_per_second",
    "generated_tokens",
    "wall_s",
)
PER_POSITION = "per_position_acceptance"
"""A level's per-position acceptance (a list; a serving stack's counters, the engine's stats): kept
next to :data:`LEVEL_KEYS` and stored only where measured, so results without it read as before."""


@dataclass(frozen=True)
class StepSample:
    """One profiled verify step of one row: tokens accepted and draft confidence per position."""

    n_accepted: int
    confidence: tuple[float, ...]

    def to_json(self) -> list:
        """``[n_accepted, [confidence, ...]]``, as the profiler stores it (``acceptance.samples[i]``)."""
        return [self.n_accepted, list(self.confidence)]

    @classmethod
    def from_json(cls, data: Sequence) -> StepSample:
        n, confidence = data
        return cls(int(n), tuple(confidence))


@dataclass(frozen=True)
class Curves:
    """Measured step times in seconds.

    ``t_verify[B][k]``: a target forward of B rows x k tokens; ``t_draft[B]``: one draft
    forward of B rows x 1 token; ``overhead[B]``: the engine's own work per step (sampling,
    acceptance, bookkeeping) measured as an engine decode step minus the bare forward;
    ``draft_overhead[B]``: likewise for one draft forward inside the engine;
    ``t_prefill[B]``: prefilling B prompts of ``prefill_tokens`` (the workload's median length). Batch sizes are the
    measured ones (powers of two); other batch sizes are interpolated linearly.
    """

    t_verify: dict[int, dict[int, float]]
    t_draft: dict[int, float]
    overhead: dict[int, float] = field(default_factory=dict)  # engine work per step beyond the forwards
    t_prefill: dict[int, float] = field(default_factory=dict)  # prefill of B prompts of typical length
    draft_overhead: dict[int, float] = field(default_factory=dict)  # engine work per draft forward
    prefill_tokens: int = 0  # prompt length t_prefill was measured at (0: unknown)

    @classmethod
    def from_json(cls, curves: Mapping[str, Any]) -> Curves:
        """From the profiler's stored ``curves`` (mapping keys are strings there; other keys are ignored)."""

        def floats(key: str) -> dict[int, float]:
            return {int(b): float(t) for b, t in curves.get(key, {}).items()}

        return cls(
            {int(b): {int(k): float(t) for k, t in row.items()} for b, row in curves["t_verify"].items()},
            floats("t_draft"),
            floats("overhead"),
            floats("t_prefill"),
            floats("draft_overhead"),
            int(curves.get("prompt_tokens") or 0),
        )

    def to_json(self) -> dict:
        """The part of the stored ``curves`` the cost model reads (the profiler stores more: knee curve, samples)."""
        return {
            "t_verify": {b: dict(row) for b, row in self.t_verify.items()},
            "t_draft": dict(self.t_draft),
            "overhead": dict(self.overhead),
            "t_prefill": dict(self.t_prefill),
            "draft_overhead": dict(self.draft_overhead),
            "prompt_tokens": self.prefill_tokens,
        }

    def step_overhead(self, batch: float) -> float:
        return max(interpolate(self.overhead, batch), 0.0) if self.overhead else 0.0

    def prefill(self, batch: float, tokens: int | None = None) -> float:
        """Prefilling ``batch`` prompts; with ``tokens`` (the batch's longest prompt: shorter
        rows are padded to it) scaled linearly from the measured prompt length."""
        t = interpolate(self.t_prefill, batch) if self.t_prefill else 0.0
        return t * tokens / self.prefill_tokens if tokens and self.prefill_tokens else t

    def verify(self, batch: float, k: float) -> float:
        """T_verify at batch size ``batch`` and (possibly fractional, mean) verify width ``k``."""
        lo = max(1, min(int(k), max(max(row) for row in self.t_verify.values())))
        frac = min(max(k - lo, 0.0), 1.0)

        def at(width: int) -> float:
            return interpolate({b: row[min(width, max(row))] for b, row in self.t_verify.items()}, batch)

        return at(lo) if frac == 0 else (1 - frac) * at(lo) + frac * at(lo + 1)

    def draft(self, batch: float) -> float:
        """One draft forward inside the engine: the bare forward plus the engine's work around it."""
        if not self.t_draft:
            return 0.0
        extra = max(interpolate(self.draft_overhead, batch), 0.0) if self.draft_overhead else 0.0
        return interpolate(self.t_draft, batch) + extra


def interpolate(points: dict[int, float], x: float) -> float:
    """Piecewise-linear in x through measured points; linear extrapolation from the last two."""
    xs = sorted(points)
    if len(xs) == 1:
        return points[xs[0]] * max(x, 1) / xs[0] if x > xs[0] else points[xs[0]]
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1 = xs[i - 1], xs[i]
    y0, y1 = points[x0], points[x1]
    return max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), min(y0, y1) if x < x0 else 0.0)


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


@dataclass(frozen=True)
class LevelMetrics:
    """One configuration at one load level (a trial's ``per_level[B]``); None where a backend cannot measure it."""

    tokens_per_second: float | None = None
    tpot_ms_p50: float | None = None
    tpot_ms_p95: float | None = None
    ttft_ms_p50: float | None = None
    ttft_ms_p95: float | None = None
    e2e_ms_p50: float | None = None
    e2e_ms_p95: float | None = None
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    rollback_frequency: float | None = None
    batch_utilization: float | None = None
    mean_batch_size: float | None = None
    requests_per_second: float | None = None
    generated_tokens: int | None = None
    wall_s: float | None = None
    # unconditional acceptance of draft position i, i = 0.. (docs/metrics.md; None: not measured)
    per_position_acceptance: tuple[float | None, ...] | None = None

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, Any]) -> LevelMetrics:
        """The level keys of a run's metrics (absent ones None) and its per-position acceptance; other
        metrics are not kept."""
        ppa = metrics.get(PER_POSITION)
        return cls(
            **{k: metrics.get(k) for k in LEVEL_KEYS},
            per_position_acceptance=tuple(ppa) if isinstance(ppa, (list, tuple)) and ppa else None,
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LevelMetrics:
        return cls.from_metrics(data)

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in LEVEL_KEYS}
        if self.per_position_acceptance is not None:
            out[PER_POSITION] = list(self.per_position_acceptance)
        return out


@dataclass(frozen=True)
class TrialResult:
    """One configuration run at every load level: the two objectives and the per-level metrics.

    ``tokens_per_second`` is generated tokens / wall time over all levels; ``latency_ms`` the
    chosen latency percentile at the worst level. ``per_level`` is keyed by batch size (the
    concurrency, or max_batch_size under an open-loop rate). ``startup_s``: a serving-stack
    backend's server start-up, present only there. ``trace``: the run of the workload's arrival
    trace (``workload.trace``, :mod:`autotune.workload.trace`) after the levels, None without one; it is no
    batch-size level and no part of the two objectives.
    """

    tokens_per_second: float
    latency_ms: float
    per_level: Mapping[int, LevelMetrics]
    startup_s: float | None = MISSING
    extra: Mapping[str, Any] = field(default_factory=dict)
    trace: LevelMetrics | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrialResult:
        known = ("tokens_per_second", "latency_ms", "per_level", "startup_s", "trace")
        trace = data.get("trace")
        return cls(
            data["tokens_per_second"],
            data["latency_ms"],
            {b: LevelMetrics.from_json(lv) for b, lv in data["per_level"].items()},
            data.get("startup_s", MISSING),
            {k: v for k, v in data.items() if k not in known},
            None if trace is None else LevelMetrics.from_json(trace),
        )

    @staticmethod
    def full_rounds(rounds: Sequence[TrialResult]) -> list[TrialResult]:
        """The rounds that ran every load level the rounds hold (a second look's rounds may run some)."""
        every = max((r.per_level.keys() for r in rounds), key=len)
        return [r for r in rounds if r.per_level.keys() == every]

    @classmethod
    def median(cls, rounds: Sequence[TrialResult]) -> TrialResult:
        """One result from repeated runs of a configuration: the median of every numeric metric, top level,
        per level and of the trace runs (a metric some round lacks, or a non-number, is taken from the
        first round). A round that ran some load levels only (a second look's, ``Backend.run(levels=...)``)
        counts at those levels; the top-level metrics, which aggregate the whole sweep, are the medians
        of the rounds that ran every level."""

        def med(values: list[Any]) -> Any:
            nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
            return statistics.median(nums) if nums and len(nums) == len(values) else values[0]

        full = cls.full_rounds(rounds)
        first = full[0]
        per_level = {
            b: LevelMetrics(
                **{
                    k: med([getattr(r.per_level[b], k) for r in rounds if b in r.per_level])
                    for k in LEVEL_KEYS
                },
                per_position_acceptance=first.per_level[
                    b
                ].per_position_acceptance,  # greedy: the same each round
            )
            for b in first.per_level
        }
        startup = MISSING if first.startup_s is MISSING else med([r.startup_s for r in full])
        extra = {k: med([r.extra.get(k) for r in full]) for k in first.extra}
        traces = [r.trace for r in full if r.trace is not None]
        trace = (
            LevelMetrics(**{k: med([getattr(t, k) for t in traces]) for k in LEVEL_KEYS}) if traces else None
        )
        return cls(
            med([r.tokens_per_second for r in full]),
            med([r.latency_ms for r in full]),
            per_level,
            startup,
            extra,
            trace,
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "tokens_per_second": self.tokens_per_second,
            "latency_ms": self.latency_ms,
            "per_level": {b: lv.to_json() for b, lv in self.per_level.items()},
        }
        if self.startup_s is not MISSING:
            out["startup_s"] = self.startup_s
        if self.trace is not None:  # absent without a trace: a stored result without one reads as before
            out["trace"] = self.trace.to_json()
        return {**out, **self.extra}


@dataclass(frozen=True)
class Measurement:
    """What the profiler measured for one device, pair and workload (stored before the first trial).

    ``curves``: t_verify[B][k], t_draft[B], t_prefill[B], overheads, the knee curve and the timing
    samples; ``acceptance``: gamma_max, drafter, acceptance rate, per-position acceptance and the
    per-step samples; ``classification``: the per-batch-size table (autotune.device.classify).
    """

    fingerprint: Mapping[str, Any]
    ceilings: Mapping[str, Any]
    curves: Mapping[str, Any]
    knee_tokens: int | None
    acceptance: Mapping[str, Any]
    verification_efficiency: Mapping[Any, Any]
    draft_cost_ratio: Mapping[Any, Any]
    classification: Mapping[str, Any]
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Measurement:
        names = [f.name for f in fields(cls) if f.name != "extra"]
        return cls(**{n: data[n] for n in names}, extra={k: v for k, v in data.items() if k not in names})

    def to_json(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}, **self.extra}

    @property
    def has_engine(self) -> bool:
        """Whether the engine measured this pair (curves and samples); False for a serving-stack run
        whose pair did not fit in the engine (autotune.context.no_engine_measurement)."""
        return bool(self.curves)

    @property
    def gamma_max(self) -> int:
        """The largest gamma the profiler measured (the acceptance pass ran at it)."""
        return int(self.acceptance["gamma_max"])

    def cost_curves(self) -> Curves:
        return Curves.from_json(self.curves)

    def samples(self) -> list[StepSample]:
        return [StepSample.from_json(s) for s in self.acceptance["samples"]]
