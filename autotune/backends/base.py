"""The shape every backend has, and the one loop that runs a trial over the workload's load levels.

A backend (:class:`Backend`) runs one configuration (:class:`autotune.knobs.Knobs`) at every load
level and returns a :class:`autotune.records.TrialResult`; the study, the re-measurement, the
selection and the profile never ask which backend ran. :func:`run_levels` is the loop every
backend shares: one level after the other under the trial's time limit
(``budget.trial_timeout_s``, or the tighter :data:`TRIAL_CUT` the study sets from the trials so
far), each level's metrics kept as a :class:`autotune.records.LevelMetrics`, the objectives
aggregated over all levels; then, with ``workload.trace`` set, the arrival trace
(:mod:`autotune.workload.trace`) once through the same ``run_level`` under the same limit, its metrics kept
apart (``TrialResult.trace``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

from autotune.config import LoadLevel, TuneConfig
from autotune.device.capacity import Need
from autotune.knobs import Knobs
from autotune.records import LevelMetrics, TrialResult
from engine.speculative import Request
from profiles.deployment import Deployment
from profiles.schema import MISSING

LevelRun = Callable[[LoadLevel, "float | None"], Mapping[str, Any]]
"""Runs one load level within the seconds left of the trial (None: no limit) -> the run's metrics
(``generated_tokens``, ``wall_s`` and the level keys of docs/metrics.md). A level whose ``trace``
is set replays those arrivals instead (each request at its offset)."""


@dataclass(frozen=True)
class TrialCut:
    """A limit tighter than ``budget.trial_timeout_s`` for the trial now running: ``seconds``, and
    ``why`` for the message (e.g. ``"4x the 12.0 s expected from 5 finished trials"``)."""

    seconds: float
    why: str


TRIAL_CUT: ContextVar[TrialCut | None] = ContextVar("trial_cut", default=None)
"""Set by the study around one trial (:class:`autotune.search.guard.TrialGuard`); every backend's
:func:`run_levels` reads it, so no backend knows about it."""


@dataclass(frozen=True)
class TrialBudget:
    """How many trials a study runs on a backend, its wall-clock cap, and the tune.yaml section saying so."""

    n_trials: int
    timeout_s: float | None
    section: str  # "budget" (the engine) or "backend" (a serving stack: each trial a server start)


class Backend(Protocol):
    """Where a trial runs: the engine in process, or a serving stack (one real server per configuration)."""

    name: str
    fixed_knobs: Mapping[str, Any]  # knobs the backend cannot express, and the value they are fixed at
    serves_table: bool  # runs a by-batch-size K table (Knobs.table) as one configuration
    # a table's K=0 range runs no drafter there: it is speculation off, so a table may hold "off"
    # at a load level (autotune.decide.selection.plan_table); False where K=0 still feeds the drafter.
    # Where True, describe()["k0_skip"] names what makes it so: {"plugin": distribution, "env": switch}
    skips_drafter_at_k0: bool
    # after the warm starts, serve only the K its fitted step costs predict best at some level, then
    # stop (autotune.cost.stackcost; for a stack whose every trial is a minutes-long server start)
    plans_by_cost: bool

    @property
    def deployment(self) -> Deployment | None:
        """The server flags every trial runs with, stored in the profile and exported (None: the engine)."""

    def server_need(self) -> Need | None:
        """What one of the backend's servers holds in memory (None: no server, or unknown)."""

    def budget(self) -> TrialBudget:
        """The study's trial count and cap on this backend (from tune.yaml)."""

    def remeasure_order(self, n_configs: int) -> str:
        """How ``n_configs`` configurations are re-measured here: "interleaved" (A B C B C A) or
        "back-to-back per server" (where alternating would restart a server every run)."""

    def prepare(self, knobs: Knobs) -> None:
        """Start (or reuse) what a run of ``knobs`` needs, before the host is read for the run: a
        server's start-up (its compile workers come and go) is no part of the run's disturbance reading."""

    def run(
        self, knobs: Knobs, seed: int, with_trace: bool = False, levels: Collection[int] | None = None
    ) -> TrialResult:
        """One configuration at every load level of the workload (``levels``: only at these batch
        sizes, a second look's rounds); ``with_trace``: then the workload's arrival trace
        (``workload.trace``; the re-measurement runs it, study trials do not)."""

    def describe(self) -> dict[str, Any]:
        """What measured a profile (the profile's ``backend``): name, and for a stack its version and flags."""

    def close(self) -> None:
        """Release what the backend holds (stop its servers)."""


def run_levels(
    cfg: TuneConfig,
    max_batch_size: int,
    run_level: LevelRun,
    clock: Callable[[], float] = time.perf_counter,
    startup_s: float | None = MISSING,
    trace: Sequence[tuple[float, Request]] | None = None,
    only: Collection[int] | None = None,
) -> TrialResult:
    """Run every load level of ``cfg``'s workload (``only``: the levels of these batch sizes, e.g.
    the undecided ones of a second look); aggregate the two objectives over the levels run.

    ``tokens_per_second`` is generated tokens / wall time over all levels, ``latency_ms`` the
    configured latency percentile at the worst level. ``budget.trial_timeout_s`` covers the whole
    trial, or :data:`TRIAL_CUT` where it is set and tighter: each level gets what is left of it,
    read from ``clock``; a level that runs out raises TimeoutError saying which limit and how many
    levels were done. ``trace`` (the arrivals of ``workload.trace``, ``Context.trace``; passed by the
    re-measurement) runs last, as ``LoadLevel(trace=...)`` within what is left; its metrics are
    ``TrialResult.trace``, in neither objective.
    """
    if trace is not None and cfg.workload.trace is None:
        raise ValueError("run_levels: arrivals given but workload.trace is not set")
    per_level: dict[int, LevelMetrics] = {}
    tokens = wall = 0.0
    levels = cfg.workload.load_levels
    if only is not None:
        levels = tuple(lv for lv in levels if lv.batch_key(max_batch_size) in only)
        if not levels:
            raise ValueError(f"run_levels: no load level at batch sizes {sorted(only)}")
    if trace is not None:
        levels = (*levels, LoadLevel(trace=tuple(trace)))
    fixed, cut = cfg.budget.trial_timeout_s, TRIAL_CUT.get()
    if cut is not None and fixed is not None and cut.seconds >= fixed:
        cut = None
    limit = fixed if cut is None else cut.seconds
    trace_metrics: LevelMetrics | None = None
    t0 = clock()
    for done, level in enumerate(levels):
        left = None if limit is None else limit - (clock() - t0)
        try:
            if left is not None and left <= 0:
                raise TimeoutError
            metrics = run_level(level, left)
        except TimeoutError:  # the limit is the whole trial's, every load level (and the trace) included
            n_levels = len(levels) - (trace is not None)
            levels_done = f"({min(done, n_levels)} of {n_levels} load levels done)"
            if level.trace is not None:
                levels_done = f"(all {n_levels} load levels done, not the workload.trace run)"
            if cut is not None:
                raise TimeoutError(f"trial cut after {cut.seconds:.0f} s, {cut.why} {levels_done}") from None
            raise TimeoutError(f"trial exceeded trial_timeout_s={fixed:g} s {levels_done}") from None
        if level.trace is not None:
            trace_metrics = LevelMetrics.from_metrics(metrics)
            continue
        per_level[level.batch_key(max_batch_size)] = LevelMetrics.from_metrics(metrics)
        tokens += metrics["generated_tokens"]
        wall += metrics["wall_s"]
    worst = max(getattr(lv, cfg.objectives.latency) or 0.0 for lv in per_level.values())
    return TrialResult(tokens / wall, worst, per_level, startup_s=startup_s, trace=trace_metrics)
