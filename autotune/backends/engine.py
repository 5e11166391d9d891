"""The engine backend (the default): every trial is a run of this project's engine, in process.

Seconds per trial, every knob expressible (drafters, thresholds, per-row policies, token trees).
The context's pair and requests are reused across trials; ``search.ngram_min``/``ngram_max``
give the prompt-lookup window of the drafters that look up n-grams.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypedDict

from autotune.backends.base import TrialBudget, run_levels
from autotune.config import LoadLevel
from autotune.context import Context
from autotune.device.capacity import Need
from autotune.knobs import Knobs
from autotune.records import TrialResult
from autotune.workload.runner import LoadSpec, run_load
from profiles.deployment import Deployment


class _NgramWindow(TypedDict, total=False):
    """run_load's ``ngram`` keyword, passed to the drafters that look up n-grams only."""

    ngram: tuple[int, int]


class EngineBackend:
    """Runs trials on the engine (see the module docstring)."""

    name = "engine"
    fixed_knobs: Mapping[str, Any] = {}
    serves_table = True  # SpecConfig.batch_gammas: K follows the running rows at every step
    skips_drafter_at_k0 = False  # a K=0 step still feeds the drafter (Drafter.catch_up, engine.speculative)
    plans_by_cost = False  # trials take seconds: the study searches every knob
    deployment: Deployment | None = None  # in process: no server flags

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.cfg = ctx.cfg

    def server_need(self) -> Need | None:
        return None  # in process: the engine is what runs

    def remeasure_order(self, n_configs: int) -> str:  # noqa: ARG002
        return "interleaved"  # in process: alternating costs nothing

    def budget(self) -> TrialBudget:
        return TrialBudget(self.cfg.budget.n_trials, self.cfg.budget.timeout_s, "budget")

    def prepare(self, knobs: Knobs) -> None:
        """Nothing to start: the pair is loaded."""

    def run(
        self,
        knobs: Knobs,
        seed: int,
        with_trace: bool = False,
        levels: Collection[int] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> TrialResult:
        cfg, ctx = self.cfg, self.ctx
        spec = knobs.spec_config()
        ngram: _NgramWindow = (
            {"ngram": (cfg.search.ngram_min, cfg.search.ngram_max)}
            if knobs.drafter in ("ngram", "hybrid")
            else {}
        )

        def run_level(level: LoadLevel, left: float | None) -> Mapping[str, Any]:
            load = LoadSpec(
                max_batch_size=knobs.max_batch_size,
                concurrency=level.concurrency,
                rate=level.rate,
                num_requests=cfg.workload.requests_at(level.concurrency),
                arrivals=level.trace,  # the workload's arrival trace (run_levels runs it last)
            )
            return run_load(
                ctx.pair, ctx.requests, spec, knobs.drafter, load, seed, time_limit_s=left, **ngram
            ).metrics

        trace = getattr(ctx, "trace", None) if with_trace else None  # a test's stand-in context may lack it
        return run_levels(cfg, knobs.max_batch_size, run_level, clock, trace=trace, only=levels)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name}

    def close(self) -> None:
        """Nothing to release: the pair belongs to the context."""
