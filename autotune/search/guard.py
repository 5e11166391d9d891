"""Per-trial disturbance: was a trial measured on the host the study runs on, or beside a process
that took the cores its threads need?

The host checks before and after tuning (:mod:`autotune.device.hostnoise`) never see a process that starts
after the first one, and two torch threads sharing a core with a busy loop run many times slower
(intra-op threads wait for each other at the end of every op: docs/decisions.md#threads-on-busy-host). So every study trial, whatever its
backend, runs through :class:`TrialGuard`:

- **Threads follow the free cores.** Before each run, when the latest reading says other processes
  hold a core, torch gets the cores they leave (:func:`autotune.device.hostnoise.threads_for`, at least 1)
  for that run, recorded as the trial's ``torch_threads``; the study's count is restored after.
- **A reading over the run's own duration.** /proc's counters (:class:`autotune.device.hostnoise.CpuSample`)
  read when the run starts and when it ends: other processes' share of all cores over exactly the
  run (10 ms ticks: a run of seconds reads to a fraction of a percent), and the 1-minute load
  average. Two file reads per run.
- **The reference is the run's own time**: its seconds per generated token over the median of the
  study's finished trials (:class:`Expectation`; every trial runs the same requests at the same
  load levels). The fixed matmul of the host check is not timed per trial: it samples one instant
  after the run, not the run, and on a 2-core host one reading of it right after heavy work is
  noise (a high CV on a quiet host: docs/decisions.md#host-busy-rule), while the counters integrate
  over exactly the run at no cost.
- **Disturbed** (:func:`verdict`): other processes held, for most of the run, a core the study's
  threads need (the host would have been given fewer threads: hostnoise's ``OTHERS_BUSY`` rule);
  or the run had fewer threads than the study; or it took more than :data:`SLOW` times its expected
  time (or was cut) while other processes took at least :data:`EVIDENCE_CORES` of a needed core,
  or the load average exceeded the CPU count. The load average alone decides nothing: it lags a
  minute behind (a loop stopped half a minute ago still raises it) and counts this process's threads.
- **What a disturbed run gets.** Its measurement is kept in the trial's ``disturbed`` user
  attribute, never returned as the trial's values: the guard waits for a quiet host (windows of
  :data:`QUIET_WINDOW_S`, up to :data:`QUIET_WAIT_S`) and runs the same knobs with the same seed
  again, up to ``budget.disturbed_reruns`` times; otherwise the trial is pruned
  (``optuna.TrialPruned``, its reason in the ``pruned`` user attribute), so it is on no Pareto front
  and TPE never gets it as a measurement. Once a wait ran out, a later disturbed run gets one quiet
  check instead of the whole wait, until the host reads quiet again: a process that stays costs
  each trial seconds, not a minute.
- **Proportional time-outs.** From :data:`MIN_FINISHED` finished trials on, a run is cut after
  :data:`CUT_FACTOR` times its expected seconds (at least :data:`CUT_MIN_S`, never later than
  ``budget.trial_timeout_s``) through :data:`autotune.backends.base.TRIAL_CUT`, which every
  backend's ``run_levels`` reads. A cut (or timed-out) run is disturbed when the host says so;
  otherwise the trial fails with the cut's one-line reason.

The final re-measurement (:mod:`autotune.decide.decision`) does not run through the guard: its interleaved,
paired rounds are its own defence against drift.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import optuna
import torch

from autotune.backends.base import TRIAL_CUT, Backend, TrialCut
from autotune.config import TuneConfig
from autotune.device import hostnoise
from autotune.knobs import Knobs
from autotune.records import TrialResult

QUIET_WINDOW_S = 2.0
"""Seconds of /proc accounting per check while waiting for a quiet host."""
QUIET_WAIT_S = 60.0
"""Longest wait for a quiet host before re-running a disturbed trial (then it is pruned)."""
CUT_FACTOR = 4.0
"""A run is cut after this many times its expected seconds."""
CUT_MIN_S = 30.0
"""No run is cut before this many seconds (a trial of a second is not cut for a page fault)."""
MIN_FINISHED = 3
"""Finished trials needed before a trial has an expected time."""
SLOW = 2.0
"""A run slower than this many times its expected time is disturbed when the host shows any load."""
EVIDENCE_CORES = 0.1
"""Cores the study's threads need that other processes took, averaged over a slow run, that make it
disturbed (a tenth of a core, averaged over the run)."""


class HostWatch(Protocol):
    """The readings the guard takes (:class:`ProcWatch` reads /proc; tests script them). A reading has
    :meth:`autotune.device.hostnoise.CpuSample.since`'s keys: ``window_s``, ``others_cpu_share``,
    ``loadavg_1m``, ``cpus``."""

    def mark(self) -> None:
        """A run starts: the next :meth:`since_mark` reads from here."""

    def since_mark(self) -> dict[str, Any]:
        """The reading since the last :meth:`mark`."""

    def window(self, seconds: float) -> dict[str, Any]:
        """A reading over the next ``seconds`` (this process sleeps)."""


class ProcWatch:
    """:class:`HostWatch` over /proc (``proc``: the folder, for tests)."""

    def __init__(self, proc: str | Path = "/proc") -> None:
        self.proc = proc
        self.start = hostnoise.CpuSample.read(proc)

    def mark(self) -> None:
        self.start = hostnoise.CpuSample.read(self.proc)

    def since_mark(self) -> dict[str, Any]:
        return hostnoise.CpuSample.read(self.proc).since(self.start)

    def window(self, seconds: float) -> dict[str, Any]:
        return hostnoise.others_now(seconds, self.proc)


def open_watch() -> HostWatch:
    """The watch a tune uses (tests replace this function to script the host)."""
    return ProcWatch()


@dataclass(frozen=True)
class Expectation:
    """What a run of this study should take: the medians, over ``trials`` finished trials, of their
    seconds per generated token and of their generated tokens."""

    seconds_per_token: float
    tokens: float
    trials: int

    @property
    def seconds(self) -> float:
        return self.seconds_per_token * self.tokens

    @classmethod
    def of(cls, trials: Sequence[optuna.trial.FrozenTrial]) -> Expectation | None:
        """From the finished trials' per-level ``wall_s`` and ``generated_tokens``; None with fewer than
        :data:`MIN_FINISHED` of them."""
        per_token, tokens = [], []
        for t in trials:
            levels = t.user_attrs.get("per_level", {}).values()
            wall = sum(lv.get("wall_s") or 0.0 for lv in levels)
            n = sum(lv.get("generated_tokens") or 0 for lv in levels)
            if wall > 0 and n > 0:
                per_token.append(wall / n)
                tokens.append(n)
        if len(per_token) < MIN_FINISHED:
            return None
        return cls(statistics.median(per_token), statistics.median(tokens), len(per_token))

    def slowness(self, result: TrialResult) -> float | None:
        """The run's seconds per generated token over the expected ones (None when it generated nothing)."""
        wall = sum(lv.wall_s or 0.0 for lv in result.per_level.values())
        n = sum(lv.generated_tokens or 0 for lv in result.per_level.values())
        return wall / n / self.seconds_per_token if wall > 0 and n > 0 else None

    def cut(self) -> TrialCut:
        """The limit a run gets: :data:`CUT_FACTOR` times the expected seconds, at least :data:`CUT_MIN_S`.

        Example:
            >>> Expectation(0.5, 40, 5).cut()
            TrialCut(seconds=80.0, why='4x the 20.0 s expected from 5 finished trials')
        """
        why = f"{CUT_FACTOR:g}x the {self.seconds:.1f} s expected from {self.trials} finished trials"
        if CUT_FACTOR * self.seconds < CUT_MIN_S:
            return TrialCut(CUT_MIN_S, f"{why}, at least {CUT_MIN_S:g} s")
        return TrialCut(CUT_FACTOR * self.seconds, why)


def verdict(reading: Mapping[str, Any], study_threads: int, slowness: float | None = None) -> str | None:
    """Why a run was disturbed, or None (see the module docstring). ``reading``: the run's
    :class:`HostWatch` reading, with ``torch_threads`` where the run had them; ``slowness``: its time
    over the expected one (``math.inf``: cut by its time limit).

    Example:
        >>> verdict({"others_cpu_share": 0.48, "loadavg_1m": 3.0, "cpus": 2}, study_threads=2)
        'other processes 48% of the CPU, load 3.00 on 2 CPUs'
        >>> verdict({"others_cpu_share": 0.02, "loadavg_1m": 2.1, "cpus": 2}, study_threads=2) is None
        True
        >>> verdict({"others_cpu_share": 0.5, "loadavg_1m": 2.0, "cpus": 2}, study_threads=1) is None
        True
        >>> verdict({"others_cpu_share": 0.1, "loadavg_1m": 2.4, "cpus": 2}, study_threads=2, slowness=3.1)
        '3.1x its expected time; other processes 10% of the CPU, load 2.40 on 2 CPUs'
    """
    others, free = reading.get("others_cpu_share"), hostnoise.free_cores(reading)
    if others is None or free is None:
        return None  # no /proc here: nothing to judge by
    cpus, load = reading["cpus"], reading.get("loadavg_1m")
    host = f"other processes {others:.0%} of the CPU" + (
        f", load {load:.2f} on {cpus} CPUs" if load is not None else ""
    )
    threads = reading.get("torch_threads", study_threads)
    if threads < study_threads:
        return f"ran on {threads} of the study's {study_threads} torch threads; {host}"
    if others > hostnoise.OTHERS_BUSY and int(free + 0.5) < study_threads:
        return host
    if slowness is not None and slowness > SLOW:
        taken = study_threads - free  # cores the study's threads need that others took
        if taken >= EVIDENCE_CORES or (load is not None and load > cpus + 0.5):
            slow = "cut by its time limit" if math.isinf(slowness) else f"{slowness:.1f}x its expected time"
            return f"{slow}; {host}"
    return None


class TrialGuard:
    """Runs the study's trials on ``backend``: threads sized per run, a host reading around each run,
    disturbed runs re-run or the trial pruned, proportional time-outs (see the module docstring).

    ``note(number, text)`` hears what happens while a trial runs (``disturbed (...): re-running``).
    The study's thread count is torch's when the guard is made.
    """

    def __init__(
        self,
        cfg: TuneConfig,
        backend: Backend,
        watch: HostWatch,
        note: Callable[[int, str], None] | None = None,
    ) -> None:
        self.backend, self.watch = backend, watch
        self.reruns = cfg.budget.disturbed_reruns
        self.study_threads = torch.get_num_threads()
        self.note = note or (lambda number, text: None)
        self.last: dict[str, Any] | None = None  # the latest reading: sizes the next run
        self.gave_up = False  # a wait for quiet ran out and no reading has been quiet since

    def run(self, trial: optuna.Trial, knobs: Knobs, seed: int, expected: Expectation | None) -> TrialResult:
        """The result of an undisturbed run of ``knobs``. Records ``torch_threads``, ``host`` (the run's
        reading), ``expected_s`` and every disturbed run (``disturbed``) as user attributes; raises
        ``optuna.TrialPruned`` when no run was undisturbed, or what the backend raised."""
        if expected is not None:
            trial.set_user_attr("expected_s", expected.seconds)
        disturbed: list[dict[str, Any]] = []
        for attempt in range(self.reruns + 1):
            result, error, reading = self._run_once(knobs, seed, expected)
            slowness = None
            if result is None:
                slowness = math.inf
            elif expected is not None:
                slowness = expected.slowness(result)
            reason = verdict(reading, self.study_threads, slowness)
            if reason is None:
                self.gave_up = False
                if error is not None:
                    raise error
                assert result is not None
                trial.set_user_attr("torch_threads", reading["torch_threads"])
                trial.set_user_attr("host", reading)
                return result
            measured = (
                {"result": result.to_json()}
                if result is not None
                else {"error": f"{type(error).__name__}: {error}"}
            )
            disturbed.append({"reason": reason, "host": reading, **measured})
            trial.set_user_attr("disturbed", disturbed)  # kept however the trial ends
            if attempt == self.reruns:
                why = f"{reason}; " + (
                    f"disturbed in all {attempt + 1} runs"
                    if attempt
                    else "no re-run (budget.disturbed_reruns: 0)"
                )
                break
            busy = self._wait_for_quiet(trial.number, reason)
            if busy is not None:
                why = f"{reason}; {busy}"
                break
        trial.set_user_attr("pruned", why)
        raise optuna.TrialPruned(why)

    def _run_once(
        self, knobs: Knobs, seed: int, expected: Expectation | None
    ) -> tuple[TrialResult | None, TimeoutError | None, dict[str, Any]]:
        """One run on the free cores under the proportional cut: (result or None, the time-out or None,
        the reading with the run's ``torch_threads``)."""
        if self.last is None or verdict(self.last, self.study_threads) is not None:
            self.last = self.watch.window(hostnoise.WINDOW_S)  # size from now, not from a busy past
        threads = hostnoise.threads_for(self.last, self.study_threads)
        if threads != self.study_threads:
            torch.set_num_threads(threads)
        self.backend.prepare(knobs)  # a server's start-up is not the run (its workers come and go)
        token = TRIAL_CUT.set(None if expected is None else expected.cut())
        self.watch.mark()
        result: TrialResult | None = None
        error: TimeoutError | None = None
        try:
            result = self.backend.run(knobs, seed)
        except TimeoutError as exc:  # the fixed or the proportional limit: slow, the host may say why
            error = exc
        finally:
            TRIAL_CUT.reset(token)
            if threads != self.study_threads:
                torch.set_num_threads(self.study_threads)
        self.last = {**self.watch.since_mark(), "torch_threads": threads}
        return result, error, self.last

    def _wait_for_quiet(self, number: int, reason: str) -> str | None:
        """Wait until a window reads quiet (None: then re-run) or the wait runs out (what the host did).
        After a wait that ran out, one window until a reading is quiet again."""
        again = self.gave_up
        limit = QUIET_WINDOW_S if again else QUIET_WAIT_S
        waited = 0.0
        while waited < limit:
            self.last = self.watch.window(QUIET_WINDOW_S)
            waited += QUIET_WINDOW_S
            if verdict(self.last, self.study_threads) is None:
                self.gave_up = False
                after = f" (the host was quiet after {waited:.0f} s)" if waited > QUIET_WINDOW_S else ""
                self.note(number, f"disturbed ({reason}): re-running{after}")
                return None
            if waited == QUIET_WINDOW_S and limit > waited:
                self.note(number, f"disturbed ({reason}): waiting up to {limit:.0f} s for a quiet host")
        self.gave_up = True
        if again:
            return f"the host is still busy (it stayed busy through a {QUIET_WAIT_S:.0f} s wait)"
        return f"the host stayed busy for {QUIET_WAIT_S:.0f} s"
