"""Backends for tests: trials as a function of the knobs, or the real engine with a fault injected.

``run_tune(cfg, backend_for=backend_of(fn))`` runs the whole main job with ``fn(cfg, knobs, seed)``
as every trial; ``backend_for=faulty_engine(n, exc)`` runs the real engine and raises ``exc`` on the
n-th trial run. :class:`ScriptedHost` is the host as the per-trial disturbance checks read it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from autotune.backends.base import Backend, TrialBudget
from autotune.backends.engine import EngineBackend
from autotune.config import TuneConfig
from autotune.context import Context
from autotune.knobs import Knobs
from autotune.records import LEVEL_KEYS, TrialResult

RunFn = Callable[[TuneConfig, Knobs, int], TrialResult]


class FakeBackend:
    """Every trial is ``run(cfg, knobs, seed)``; records the knobs it ran."""

    name = "engine"
    fixed_knobs: dict[str, Any] = {}
    order = "interleaved"  # what remeasure_order says
    serves_table = True
    skips_drafter_at_k0 = False  # as the engine: a table's K=0 still feeds the drafter
    plans_by_cost = False
    deployment = None  # an in-process stand-in: no server flags

    def __init__(self, ctx: Context, run: RunFn) -> None:
        self.cfg, self._run = ctx.cfg, run
        self.ran: list[Knobs] = []
        self.levels_run: list[tuple[int, ...] | None] = []  # per run: the batch sizes it ran (None: all)
        self.closed = False

    def remeasure_order(self, n_configs: int) -> str:  # noqa: ARG002
        return self.order

    def server_need(self) -> None:
        return None  # a stand-in: nothing held beside the engine

    def budget(self) -> TrialBudget:
        return TrialBudget(self.cfg.budget.n_trials, self.cfg.budget.timeout_s, "budget")

    def prepare(self, knobs: Knobs) -> None:
        pass

    def run(
        self, knobs: Knobs, seed: int, with_trace: bool = False, levels: Collection[int] | None = None
    ) -> TrialResult:  # noqa: ARG002
        """``levels``: the run's levels at those batch sizes only, aggregated over them like the real loop."""
        self.ran.append(knobs)
        self.levels_run.append(None if levels is None else tuple(levels))
        result = self._run(self.cfg, knobs, seed)
        if levels is None:
            return result
        return result_of({b: lv.to_json() for b, lv in result.per_level.items() if b in levels})

    def describe(self) -> dict[str, Any]:
        return {"name": self.name}

    def close(self) -> None:
        self.closed = True


def backend_of(run: RunFn) -> Callable[[Context], Backend]:
    """A ``run_tune(backend_for=...)`` whose trials are ``run``."""
    return lambda ctx: FakeBackend(ctx, run)


def faulty_engine(fault_on_call: int, fault: BaseException) -> Callable[[Context], Backend]:
    """The real engine backend, raising ``fault`` on its n-th run."""

    class Faulty(EngineBackend):
        calls = 0

        def run(self, knobs: Knobs, seed: int, **kw: Any) -> TrialResult:
            Faulty.calls += 1
            if Faulty.calls == fault_on_call:
                raise fault
            return super().run(knobs, seed, **kw)

    return Faulty


def result_of(per_level: dict[int, dict[str, Any]], latency: str = "tpot_ms_p95") -> TrialResult:
    """A TrialResult from per-level metrics (missing level keys 1.0), aggregated like the real loop."""
    levels = {b: {**dict.fromkeys(LEVEL_KEYS, 1.0), **lv} for b, lv in per_level.items()}
    tokens = sum(lv["generated_tokens"] for lv in levels.values())
    wall = sum(lv["wall_s"] for lv in levels.values())
    worst = max(lv[latency] for lv in levels.values())
    return TrialResult.from_json(
        {"tokens_per_second": tokens / wall, "latency_ms": worst, "per_level": levels}
    )


def synthetic_run(cfg, knobs: Knobs, seed: int) -> TrialResult:  # noqa: ARG001 - a backend run's signature
    """Deterministic stand-in for a load run: speculation helps at B=1 and hurts at B=2 (a table's K
    follows the level)."""
    thr = knobs.confidence_threshold
    per_level = {}
    for c in cfg.workload.concurrency:
        g = knobs.gamma_at(c)
        tps = 100.0 * c + (10.0 * g if c == 1 else -10.0 * g) + thr
        per_level[c] = {
            "tokens_per_second": tps,
            "tpot_ms_p95": 40.0 - g - thr,
            "acceptance_rate": 0.5,
            "generated_tokens": 12,
            "wall_s": 12 / tps,
        }
    return result_of(per_level)


class ScriptedHost:
    """A :class:`autotune.search.guard.HostWatch` reading what a test says: other processes' CPU share
    over each run (``during``, in order) and over each window read between runs (``between``); ``idle``
    once a list runs out. A 2-CPU host whose load average is 1 + 2 x the share."""

    def __init__(
        self, during: Sequence[float] = (), between: Sequence[float] = (), idle: float = 0.0
    ) -> None:
        self.during, self.between, self.idle = list(during), list(between), idle
        self.windows = 0

    @staticmethod
    def reading(others: float, seconds: float) -> dict[str, Any]:
        return {"window_s": seconds, "others_cpu_share": others, "loadavg_1m": 1.0 + 2 * others, "cpus": 2}

    def mark(self) -> None:
        pass

    def since_mark(self) -> dict[str, Any]:
        return self.reading(self.during.pop(0) if self.during else self.idle, 5.0)

    def window(self, seconds: float) -> dict[str, Any]:
        self.windows += 1
        return self.reading(self.between.pop(0) if self.between else self.idle, seconds)
