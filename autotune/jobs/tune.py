"""``autotune tune``: profile -> Optuna study -> re-measure and select -> schedule -> store -> export.

Faults lose nothing already measured: the profiler measurement is stored before the first
trial, every trial is committed to the RDB storage as it finishes, a crashing trial is recorded
as failed with its reason, and an interrupt (Ctrl-C, SIGTERM) stops after the running trial is
marked failed; ``autotune tune --resume`` continues the same study. The profile is written in
one transaction at the very end, and exports are written atomically after it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import signal
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import torch

from autotune import context as ctx_mod
from autotune.backends import Backend, open_backend
from autotune.config import DEFAULT_CACHE, TuneConfig
from autotune.cost import stackcost
from autotune.decide.decision import build_profile, decide
from autotune.device import hostnoise
from autotune.device.capacity import Need
from autotune.device.hardware import nvml_selectors
from autotune.errors import BusyHostError, ConfigError
from autotune.knobs import Knobs
from autotune.records import TrialResult
from autotune.search import guard as disturbance
from autotune.search import study as study_mod
from autotune.search.budget import RunBudget, minutes_text
from profiles.exporters import export, write_export
from profiles.schema import MISSING, Profile
from profiles.store import redact_url

Say = Callable[[str], None]
OpenBackend = Callable[[ctx_mod.Context], Backend]
LOG_DIR = DEFAULT_CACHE / "logs"
"""Where a study's library log goes (Optuna's tracebacks of failed trials): the console gets one line."""
_log_handler: logging.Handler | None = None


class Interrupted(Exception):
    """The study was stopped by the user; finished trials are kept in the storage."""


def default_study_name(ctx: ctx_mod.Context) -> str:
    """``autotune-<device>-<target>-<workload>``, with ``-<backend>`` for a serving-stack backend."""
    suffix = "" if ctx.cfg.backend.name == "engine" else f"-{ctx.cfg.backend.name}"
    return f"autotune-{ctx.device_key[:8]}-{ctx.target_hash[:6]}-{ctx.workload_hash[:8]}{suffix}"


def _resolve_study_name(ctx: ctx_mod.Context, resume: bool) -> str:
    base = ctx.cfg.storage.study_name or default_study_name(ctx)
    runs = {}
    for summary in optuna.get_all_study_summaries(ctx.cfg.storage.url, include_best_trial=False):
        m = re.fullmatch(re.escape(base) + r"(?:-run(\d+))?", summary.study_name)
        if m:
            runs[int(m.group(1) or 1)] = summary.study_name
    family = [runs[k] for k in sorted(runs)]
    if resume:
        if not family:
            raise ConfigError(
                f"--resume: no study named {base!r} in {redact_url(ctx.cfg.storage.url)} to resume"
            )
        return family[-1]
    if not family:
        return base
    return f"{base}-run{max(runs) + 1}"


def _sigterm_as_interrupt(signum, frame):  # noqa: ARG001
    raise KeyboardInterrupt


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt inside the block, as Ctrl-C does: the running trial is marked
    failed and a serving stack's servers are stopped; the previous handler comes back after it."""
    old = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def run_tune(
    cfg: TuneConfig,
    resume: bool = False,
    reprofile: bool = False,
    say: Say = print,
    strict: bool = False,
    backend_for: OpenBackend = open_backend,
) -> dict:
    """The whole main job for one host; returns the stored profile (with its id).

    1. Context: load the pair and workload, fingerprint the device (:func:`autotune.context.build`).
    2. Host noise before, then open the backend (``backend_for``, by default ``backend.name``'s:
       the engine in process, or a serving stack, one real server per configuration), so a
       missing stack fails in seconds.
    3. Profile the device, or reuse the stored measurement (:func:`autotune.context.ensure_profile`).
    4. Study: shape the space, warm-start it from the cost model and the nearest stored profile,
       run the trials (:func:`_run_study`), each through :class:`autotune.search.guard.TrialGuard`
       (a run another process disturbed is re-run, or the trial pruned).
    5. Re-measure the finalists, choose, build the batch schedule and the profile
       (:func:`autotune.decide.decision.decide`, :func:`autotune.decide.decision.build_profile`).
    6. Host noise after, store the profile (:func:`_store`), write the exports (:func:`write_exports`).

    The host's noise is measured before profiling and again after the study
    (:mod:`autotune.device.hostnoise`), warned about in one line when busy and recorded in
    ``profile["host_noise"]``; with ``strict`` a busy host raises :class:`BusyHostError` and no
    profile is stored. See docs/architecture.md (data flow of ``autotune tune``).
    """
    clock = RunBudget.of_minutes(cfg.budget.minutes)
    ctx = ctx_mod.build(cfg, say, reprofile)
    cfg = ctx.cfg  # models.dtype resolved
    say(f"device: {ctx.fingerprint['label']} [{ctx.device_key}]")
    for note in ctx.notes:
        say(note)
    say(ctx.compile_note)
    gpus = nvml_selectors(ctx.fingerprint)
    noise_before = _host_noise(say, strict, "before tuning", gpus)
    threads = torch.get_num_threads()
    _size_threads(ctx, noise_before, say)
    backend = backend_for(ctx)  # before profiling: a missing stack fails in seconds
    try:
        with _sigterm_interrupts():  # servers are stopped on SIGTERM too
            measurement = _profile(ctx, reprofile, say, backend.server_need(), clock)
            run = _run_study(ctx, backend, measurement, resume, say, clock)
            decision = decide(cfg, backend, run.space, measurement, run.points, say, clock)
            typed = build_profile(ctx, run.space, measurement, run.study, decision)
            typed = dataclasses.replace(typed, study={**typed.study, "run_budget": clock.to_json()})
            if clock.seconds is not None:
                cut = "; ".join(clock.cuts) if clock.cuts else "nothing"
                say(f"budget: {minutes_text(clock.spent())} of {minutes_text(clock.seconds)}; cut: {cut}")
            noise_after = _host_noise(say, strict, "after the study", gpus)
            profile = _store(ctx, backend, typed, run, noise_before, noise_after, say)
            profile["exports"] = write_exports(
                profile, cfg.export.formats, cfg.export.dir, say, _gguf_models(ctx)
            )
            return profile
    finally:
        torch.set_num_threads(threads)
        backend.close()


PRIOR_SHARE = 0.2
"""The share of ``budget.minutes`` a serving-stack run gives the engine's profile (its prior): past it,
profiling stops and the study starts without the prior (the server trials are the measurement)."""


def _profile(
    ctx: ctx_mod.Context,
    reprofile: bool,
    say: Say,
    beside: Need | None = None,
    clock: RunBudget | None = None,
) -> dict:
    """The profiler measurement (stored, or measured now and stored), extended for the trees searched;
    ``beside``: what one of a serving stack's servers holds (the engine profiles only where it fits too)."""
    notes = len(ctx.notes)

    def progress(step: str) -> None:
        say(f"  profiling: {step}")
        share = None if clock is None or clock.seconds is None else PRIOR_SHARE * clock.seconds
        if (
            ctx.cfg.backend.name != "engine"
            and share is not None
            and clock is not None
            and clock.spent() > share
        ):
            raise ctx_mod.PriorOverBudget(
                f"{minutes_text(clock.spent())} spent, over {PRIOR_SHARE:.0%} of budget.minutes"
            )

    measurement, reused = ctx_mod.ensure_profile(ctx, reprofile, progress=progress, say=say, beside=beside)
    for note in ctx.notes[notes:]:
        say(note)
    if reused:
        say("profile: reused stored measurement (--reprofile to measure again)")
    elif measurement.get("engine") != "not loaded":
        say("profile: measured and stored")
    else:
        say("profile: no engine measurement (the study starts without the cost model's prior)")
    return ctx_mod.extend_for_trees(ctx, measurement, say)


def _size_threads(ctx: ctx_mod.Context, noise: dict, say: Say) -> None:
    """On a host other processes keep busy, run torch on the cores they leave (hostnoise.threads_for).

    The count is recorded in ``noise["torch_threads"]`` (``profile["host_noise"]["before"]``).
    It is not part of the workload identity: a study interrupted on a busy host must resume on a
    quiet one (the reused profiler measurement then says how many threads it had).
    """
    current = torch.get_num_threads()
    want = hostnoise.threads_for(noise, current)
    noise["torch_threads"] = want
    if want == current:
        return
    torch.set_num_threads(want)
    say(
        f"host: other processes use {noise['others_cpu_share']:.0%} of {noise['cpus']} CPUs; torch threads "
        f"{current} -> {want} for this run (threads sharing a busy core stall every op)"
    )


def _host_noise(say: Say, strict: bool, when: str, gpus: list[int | str] | None = None) -> dict:
    """The host's noise now (on a GPU host, only the GPUs this run uses are read)."""
    noise = hostnoise.measure(gpus=gpus)
    say(hostnoise.summary(noise) + f" [{when}]")
    if strict and noise["busy"]:
        raise BusyHostError(
            f"--strict: busy host {when} ({'; '.join(noise['reasons'])}); no profile stored "
            "(finished trials, if any, are kept for `autotune tune --resume` on a quiet host)"
        )
    return noise


@dataclass
class _StudyRun:
    """A finished (or budget-stopped) study: its space, the study, its finished trials and the budget's count."""

    space: study_mod.Space
    study: optuna.Study
    points: list  # autotune.records.Point, one per finished trial
    trials_planned: int
    trials_run: int
    provisional: bool  # the budget's timeout stopped the study before trials_planned


def _run_study(
    ctx: ctx_mod.Context,
    backend: Backend,
    measurement: dict,
    resume: bool,
    say: Say,
    clock: RunBudget | None = None,
) -> _StudyRun:
    """Shape the space, open (or resume) the study, enqueue warm starts, run the remaining trials."""
    cfg = ctx.cfg
    space = study_mod.shape_space(cfg, measurement, backend.fixed_knobs)
    if backend.fixed_knobs:
        say(
            f"backend: {backend.name}, a real server per configuration; fixed (the stack has no such knob): "
            + ", ".join(f"{k}={v}" for k, v in backend.fixed_knobs.items())
        )
    budget = backend.budget()
    name = _resolve_study_name(ctx, resume)
    study = study_mod.open_study(ctx, name, resume)
    log = _library_log(name)
    done_before = len(study_mod.finished(study))
    if not resume:
        _enqueue_warm_starts(ctx, backend, study, space, measurement)
    remaining = max(budget.n_trials - done_before, 0)
    say(
        f"study: {name} ({'resumed, ' + str(done_before) + ' finished trials kept' if resume else 'new'}); "
        f"{remaining} trials; gamma in [{space.gamma_low}, {space.gamma_high}]"
        + (
            f" (capped by the profiler at {space.search_gamma_cap})"
            if space.search_gamma_cap is not None
            else ""
        )
    )
    started_before = _n_finished(study)
    if remaining:
        _optimize(ctx, backend, study, space, remaining, budget.timeout_s, say, log, clock)
    ran = _n_finished(study) - started_before
    provisional = budget.timeout_s is not None and ran < remaining
    if provisional:
        say(
            f"warning: the {budget.section}.timeout_s={budget.timeout_s:g} s budget stopped the study "
            f"after {ran} of {remaining} trials; the choice is provisional (`autotune tune --resume` runs the rest)"
        )
    trials = study_mod.finished(study)
    if not trials:
        raise RuntimeError(f"study {name!r}: no trial finished (see failed trials' 'error' attribute)")
    points = [study_mod.point_from_trial(t) for t in trials]
    return _StudyRun(space, study, points, remaining, ran, provisional)


def _enqueue_warm_starts(
    ctx: ctx_mod.Context, backend: Backend, study: optuna.Study, space: study_mod.Space, measurement: dict
) -> None:
    """Queue a new study's first trials: the cost model's picks and the nearest stored profile's."""
    nearest = ctx.store.nearest_profile(
        ctx.fingerprint["label"], target_hash=ctx.target_hash, draft_hash=ctx.draft_hash
    )
    for label, params in study_mod.warm_starts(
        ctx, space, measurement, nearest, in_stack=backend.plans_by_cost
    ):
        # a new study: nothing to skip, and an in-stack study's baseline runs twice on purpose
        study.enqueue_trial(params, user_attrs={"warm_start": label}, skip_if_exists=False)


def _optimize(
    ctx: ctx_mod.Context,
    backend: Backend,
    study: optuna.Study,
    space: study_mod.Space,
    remaining: int,
    timeout_s: float | None,
    say: Say,
    log: Path,
    clock: RunBudget | None = None,
) -> None:
    """Run ``remaining`` trials within ``timeout_s`` (None: no cap), each through a
    :class:`autotune.search.guard.TrialGuard`; an interrupt (Ctrl-C, or SIGTERM under
    :func:`_sigterm_interrupts`) raises :class:`Interrupted` once the running trial is marked failed."""
    cfg = ctx.cfg
    guard = disturbance.TrialGuard(
        cfg, backend, disturbance.open_watch(), note=lambda number, text: say(f"  trial {number}: {text}")
    )
    planner = [study_mod.stack_planner(space, say, backend.serves_table)] if backend.plans_by_cost else []
    if clock is not None:
        planner.append(_budget_stop(cfg, clock, say))
    try:
        study.optimize(
            study_mod.make_objective(cfg, guard, space, _trial_logger(cfg, remaining, say, log)),
            n_trials=remaining,
            timeout=timeout_s,
            catch=(Exception,),
            gc_after_trial=False,
            callbacks=planner,
        )
    except KeyboardInterrupt:
        n = len(study_mod.finished(study))
        raise Interrupted(
            f"interrupted: {n} finished trials are kept in study {study.study_name!r}; "
            f"continue with `autotune tune --resume`"
        ) from None


def _budget_stop(
    cfg: TuneConfig, clock: RunBudget, say: Say
) -> Callable[[optuna.Study, optuna.trial.FrozenTrial], None]:
    """An Optuna callback for ``budget.minutes``: keeps the median trial's run seconds (on the budget's
    clock, less a server's start-up, which the re-measurement does not pay again in a kept server) as
    the cost of one configuration's run (:attr:`RunBudget.run_s`, which the re-measurement sizes its
    rounds from), and stops the study when one more trial (start-up included) would leave too little
    for one re-measurement round of its finalists (``remeasure_top`` + the baseline and best constant):
    the re-measurement fits its further rounds to what is left itself."""
    finalists = cfg.budget.remeasure_top + 2
    runs: list[float] = []
    starts: list[float] = []
    last = [clock.clock()]

    def stop(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        now = clock.clock()
        startup = float(trial.user_attrs.get("startup_s") or 0.0)
        runs.append(max(now - last[0] - startup, 0.0))
        starts.append(startup)
        last[0] = now
        clock.run_s = statistics.median(runs)
        if clock.seconds is None:
            return
        next_trial = clock.run_s + statistics.median(starts)
        reserve = clock.run_s * finalists
        if not clock.allows(next_trial + reserve):
            say(
                clock.cut(
                    f"study stopped after {len(runs)} trials: one more ({minutes_text(next_trial)}) and "
                    f"a re-measurement round ({minutes_text(reserve)}) would pass budget.minutes"
                )
            )
            study.stop()

    return stop


def _library_log(study_name: str) -> Path:
    """Send Optuna's log (a failed trial's traceback) to a file named after the study, not the console:
    the trial line already says what failed. Returns the file."""
    global _log_handler
    path = (LOG_DIR / f"{study_name}.log").expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    logger = optuna.logging.get_logger("optuna")
    optuna.logging.disable_default_handler()
    if _log_handler is not None:  # an earlier run in this process (tests, benchmarks)
        logger.removeHandler(_log_handler)
        _log_handler.close()
    _log_handler = logging.FileHandler(path, encoding="utf-8")
    _log_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger.addHandler(_log_handler)
    return path


def _trial_logger(
    cfg: TuneConfig, remaining: int, say: Say, log: Path, clock: Callable[[], float] = time.monotonic
) -> study_mod.OnTrial:
    """One line per finished trial: its objectives, knobs, the best so far and ``[done/planned, ETA]``;
    a failed trial's line gives the reason (its traceback is in ``log``), a pruned one's why every run
    of it was disturbed."""
    best = {"tps": 0.0}
    progress = {"done": 0, "t0": clock()}
    last: list[Knobs] = []  # the previous trial's knobs: a stack serves the same ones in the same server

    def on_trial(
        number: int, knobs: Knobs, result: TrialResult | None, error: str | None, pruned: bool = False
    ) -> None:
        progress["done"] += 1
        same = last[-1:] == [knobs]
        last[:] = [knobs] if result is not None and not pruned else []  # a failed trial's server is dropped
        done, elapsed = progress["done"], clock() - progress["t0"]
        eta = f"[{done}/{remaining}, ETA {_duration(elapsed / done * (remaining - done))}]"
        described = (
            f"gamma={knobs.gamma} thr={knobs.confidence_threshold:.2f} {knobs.gamma_policy} "
            f"B={knobs.max_batch_size} {knobs.drafter}"
            + (f" tree={knobs.tree_name}" if knobs.is_tree else "")
        )
        if pruned:
            say(f"  trial {number}: pruned ({error}) | {described} {eta}")
            return
        if result is None:
            say(f"  trial {number}: failed ({error}) | {described} (traceback in {log}) {eta}")
            return
        best["tps"] = max(best["tps"], result.tokens_per_second)
        startup = (
            ""
            if not result.startup_s
            else " (same server)"
            if same
            else f" (server start {result.startup_s:.0f} s)"
        )
        say(
            f"  trial {number}: {result.tokens_per_second:.1f} tok/s, {cfg.objectives.latency} {result.latency_ms:.1f} ms "
            f"| {described} | best so far {best['tps']:.1f} tok/s{startup} {eta}"
        )

    return on_trial


def _store(
    ctx: ctx_mod.Context,
    backend: Backend,
    typed: Profile,
    run: _StudyRun,
    noise_before: dict | None,
    noise_after: dict,
    say: Say,
) -> dict:
    """Add the study's budget, host noise and backend to the profile, store it, and return its JSON with its id."""
    noises = [n for n in (noise_before, noise_after) if n is not None]
    typed = dataclasses.replace(
        typed,
        study={
            **typed.study,
            "trials_planned": run.trials_planned,
            "trials_run": run.trials_run,
            "provisional": run.provisional,
        },
        host_noise={"busy": any(n["busy"] for n in noises), "before": noise_before, "after": noise_after},
        backend=backend.describe(),
        deployment=backend.deployment if backend.deployment is not None else MISSING,
        stack_cost=stack_cost_section(run.study, backend.name),
    )
    profile = json.loads(json.dumps(typed.to_json()))
    profile_id = ctx.store.save_profile(profile)
    profile["id"] = profile_id
    say(f"profile #{profile_id} stored in {redact_url(ctx.cfg.storage.url)}")
    return profile


def stack_cost_section(study: optuna.Study, backend: str) -> Any:
    """``profile["stack_cost"]``: the fit of the study's trials (autotune.cost.stackcost), its residuals per
    measured (level, K) and how many trials (server starts, on a stack) the study ran; MISSING
    without a fit."""
    found = study_mod.stack_observations(study_mod.finished(study))
    cost = stackcost.calibrate(found[1], found[0]) if found is not None else None
    if found is None or cost is None:
        return MISSING
    obs = found[1]
    return {
        "backend": backend,
        **cost.to_json(),
        "predicted_vs_measured": stackcost.predicted_vs_measured(cost, obs),
        "trials": sum(t.state.is_finished() for t in study.get_trials(deepcopy=False)),
    }


def _n_finished(study: optuna.Study) -> int:
    """Trials that ran to an end (complete, failed, pruned); enqueued warm starts are not counted until they run."""
    return sum(t.state.is_finished() for t in study.get_trials(deepcopy=False))


def _gguf_models(ctx: ctx_mod.Context) -> dict[str, str]:
    """GGUF paths of the pair for the llama.cpp export (converted when llama.cpp's converter is installed)."""
    if "llamacpp" not in ctx.cfg.export.formats:
        return {}
    from autotune.backends import gguf

    try:
        out = {
            "target_model": str(gguf.ensure(ctx.cfg.models.target, ctx.cfg.backend.llamacpp, "models.target"))
        }
        if ctx.draft_hash is not None and ctx.cfg.models.draft is not None:  # the draft was loaded
            out["draft_model"] = str(
                gguf.ensure(ctx.cfg.models.draft, ctx.cfg.backend.llamacpp, "models.draft")
            )
    except ConfigError:  # no converter here: the export keeps the HF paths and says to convert
        return {}
    return out


def _duration(seconds: float) -> str:
    """``"1m05s"`` / ``"42s"``, for ETAs.

    Example:
        >>> _duration(65.4), _duration(42)
        ('1m05s', '42s')
    """
    s = int(round(seconds))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def write_exports(
    profile: dict, formats: tuple[str, ...], folder: Path, say: Say, gguf_models: dict[str, str] | None = None
) -> list[str]:
    """Write each format's export into ``folder``; the llama.cpp one names ``gguf_models`` when given."""
    written = []
    for fmt in formats:
        out = export(profile, fmt, **(gguf_models or {})) if fmt == "llamacpp" else export(profile, fmt)
        path = folder / out.filename
        write_export(out, path)
        written.append(str(path))
        say(f"export {fmt}: {path}")
    return written
