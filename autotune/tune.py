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
import re
import signal
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import optuna
import torch

from autotune import context as ctx_mod
from autotune import hostnoise
from autotune import study as study_mod
from autotune.backends import open_backend
from autotune.config import TuneConfig, tree_name
from autotune.costmodel import predict, predict_tree, tree_rank_samples
from autotune.errors import BusyHostError, ConfigError
from autotune.records import Measurement
from autotune.selection import Choice, Point, batch_schedule, choose_with_margin, pareto_front
from autotune.stats import estimate, paired_ratio, significant
from profiles.exporters import export, write_export
from profiles.profile import SCHEMA_VERSION, TOOL_VERSION
from profiles.schema import BatchSchedule, Chosen, Profile, ScheduleEntry
from profiles.store import redact_url

Say = Callable[[str], None]
CHOSEN_KNOBS = ("drafter", "gamma", "confidence_threshold", "gamma_schedule", "max_batch_size")
TREE_KNOB = "tree_topk"  # in a trial's params only when search.tree_topk names a tree


class Interrupted(Exception):
    """The study was stopped by the user; finished trials are kept in the storage."""


def default_study_name(ctx: ctx_mod.Context) -> str:
    """``autotune-<device>-<target>-<workload>``, with ``-<backend>`` for a serving-stack backend."""
    suffix = "" if ctx.cfg.backend == "engine" else f"-{ctx.cfg.backend}"
    return f"autotune-{ctx.device_key[:8]}-{ctx.target_hash[:6]}-{ctx.workload_hash[:8]}{suffix}"


def _resolve_study_name(ctx: ctx_mod.Context, resume: bool) -> str:
    base = ctx.cfg.study_name or default_study_name(ctx)
    runs = {}
    for summary in optuna.get_all_study_summaries(ctx.cfg.storage, include_best_trial=False):
        m = re.fullmatch(re.escape(base) + r"(?:-run(\d+))?", summary.study_name)
        if m:
            runs[int(m.group(1) or 1)] = summary.study_name
    family = [runs[k] for k in sorted(runs)]
    if resume:
        if not family:
            raise ConfigError(f"--resume: no study named {base!r} in {redact_url(ctx.cfg.storage)} to resume")
        return family[-1]
    if not family:
        return base
    return f"{base}-run{max(runs) + 1}"


def _sigterm_as_interrupt(signum, frame):  # noqa: ARG001
    raise KeyboardInterrupt


def run_tune(
    cfg: TuneConfig, resume: bool = False, reprofile: bool = False, say: Say = print, strict: bool = False
) -> dict:
    """The whole main job for one host; returns the stored profile (with its id).

    1. Context: load the pair and workload, fingerprint the device (:func:`autotune.context.build`).
    2. Host noise before, then open the backend: the engine in process, or a serving stack (one
       real server per configuration), so a missing stack fails in seconds.
    3. Profile the device, or reuse the stored measurement (:func:`autotune.context.ensure_profile`).
    4. Study: shape the space, warm-start it from the cost model and the nearest stored profile,
       run the trials (:func:`_run_study`).
    5. Re-measure and select, batch schedule, prediction check, build the profile
       (:func:`_select_and_build`).
    6. Host noise after, store the profile (:func:`_store`), write the exports (:func:`write_exports`).

    The host's noise is measured before profiling and again after the study
    (:mod:`autotune.hostnoise`), warned about in one line when busy and recorded in
    ``profile["host_noise"]``; with ``strict`` a busy host raises :class:`BusyHostError` and no
    profile is stored. See docs/architecture.md (data flow of ``autotune tune``).
    """
    _check_backend_knobs(cfg)
    ctx = ctx_mod.build(cfg)
    say(f"device: {ctx.fingerprint['label']} [{ctx.device_key}]")
    say(ctx.compile_note)
    noise_before = _host_noise(say, strict, "before tuning")
    threads = torch.get_num_threads()
    _size_threads(ctx, noise_before, say)
    ctx.backend = open_backend(ctx, cfg.backend)  # before profiling: a missing stack fails in seconds
    old = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)  # servers are stopped on SIGTERM too
    try:
        measurement, reused = ctx_mod.ensure_profile(
            ctx, reprofile, progress=lambda s: say(f"  profiling: {s}")
        )
        say(
            "profile: "
            + (
                "reused stored measurement (--reprofile to measure again)"
                if reused
                else "measured and stored"
            )
        )
        measurement = ctx_mod.extend_for_trees(ctx, measurement, say)
        run = _run_study(ctx, measurement, resume, say)
        profile = _select_and_build(ctx, run.space, measurement, run.study, run.trials, say)
        noise_after = _host_noise(say, strict, "after the study")
        profile = _store(ctx, profile, run, noise_before, noise_after, say)
        profile["exports"] = write_exports(
            profile, cfg.export_formats, cfg.export_dir, say, _gguf_models(ctx)
        )
        return profile
    finally:
        signal.signal(signal.SIGTERM, old)
        torch.set_num_threads(threads)
        if ctx.backend is not None:
            ctx.backend.close()


def _check_backend_knobs(cfg: TuneConfig) -> None:
    """A serving-stack backend runs chains of the model, ngram or no drafter: a token tree trial would
    run there as a chain of the tree's depth, a hybrid one as an n-gram without its window, each under
    its own name. Refused in one line before anything loads."""
    if cfg.backend == "engine":
        return
    if cfg.trees_searched:
        raise ConfigError(
            f"search.tree_topk: the {cfg.backend} backend runs chains only (no token trees); list "
            f"only 'chain' with it (got {[tree_name(t) for t in cfg.tree_shapes]})"
        )
    if "hybrid" in cfg.drafters:
        raise ConfigError(
            f"search.drafter: the {cfg.backend} backend has no 'hybrid' drafter (no per-row switch "
            f"between n-grams and the draft model); drop it (got {list(cfg.drafters)})"
        )


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


def _host_noise(say: Say, strict: bool, when: str) -> dict:
    noise = hostnoise.measure()
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
    trials: list
    trials_planned: int
    trials_run: int
    provisional: bool  # budget.timeout_s stopped the study before trials_planned


def _run_study(ctx: ctx_mod.Context, measurement: dict, resume: bool, say: Say) -> _StudyRun:
    """Shape the space, open (or resume) the study, enqueue warm starts, run the remaining trials."""
    cfg, backend = ctx.cfg, ctx.backend
    space = study_mod.shape_space(cfg, measurement, backend.fixed_knobs if backend else None)
    if backend is not None:
        say(
            f"backend: {backend.name}, a real server per configuration; fixed (the stack has no such knob): "
            + ", ".join(f"{k}={v}" for k, v in backend.fixed_knobs.items())
        )
    n_trials, timeout = (
        (cfg.server_trials or backend.default_trials, cfg.server_timeout_s)
        if backend
        else (cfg.n_trials, cfg.timeout_s)
    )
    name = _resolve_study_name(ctx, resume)
    study = study_mod.open_study(ctx, name, resume)
    done_before = len(study_mod.finished(study))
    if not resume:
        nearest = ctx.store.nearest_profile(
            ctx.fingerprint["label"], target_hash=ctx.target_hash, draft_hash=ctx.draft_hash
        )
        for label, params in study_mod.warm_starts(ctx, space, measurement, nearest):
            study.enqueue_trial(params, user_attrs={"warm_start": label}, skip_if_exists=True)
    remaining = max(n_trials - done_before, 0)
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
    old = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        if remaining:
            study.optimize(
                study_mod.make_objective(ctx, space, _trial_logger(cfg, remaining, say)),
                n_trials=remaining,
                timeout=timeout,
                catch=(Exception,),
                gc_after_trial=False,
            )
    except KeyboardInterrupt:
        n = len(study_mod.finished(study))
        raise Interrupted(
            f"interrupted: {n} finished trials are kept in study {name!r}; "
            f"continue with `autotune tune --resume`"
        ) from None
    finally:
        signal.signal(signal.SIGTERM, old)
    ran = _n_finished(study) - started_before
    provisional = timeout is not None and ran < remaining
    if provisional:
        say(
            f"warning: the {'backend.' if backend else 'budget.'}timeout_s={timeout:g} s budget stopped the study after "
            f"{ran} of {remaining} trials; the choice is provisional (`autotune tune --resume` runs the rest)"
        )
    trials = study_mod.finished(study)
    if not trials:
        raise RuntimeError(f"study {name!r}: no trial finished (see failed trials' 'error' attribute)")
    return _StudyRun(space, study, trials, remaining, ran, provisional)


def _trial_logger(
    cfg: TuneConfig, remaining: int, say: Say, clock: Callable[[], float] = time.monotonic
) -> Callable[[int, dict, dict | None], None]:
    """One line per finished trial: its objectives, knobs, the best so far and ``[done/planned, ETA]``."""
    best = {"tps": 0.0}
    progress = {"done": 0, "t0": clock()}

    def on_trial(number: int, params: dict, result: dict | None) -> None:
        progress["done"] += 1
        done, elapsed = progress["done"], clock() - progress["t0"]
        eta = f"[{done}/{remaining}, ETA {_duration(elapsed / done * (remaining - done))}]"
        if result is None:
            say(f"  trial {number}: failed ({params}) {eta}")
            return
        best["tps"] = max(best["tps"], result["tokens_per_second"])
        startup = f" (server start {result['startup_s']:.0f} s)" if result.get("startup_s") else ""
        say(
            f"  trial {number}: {result['tokens_per_second']:.1f} tok/s, {cfg.latency} {result['latency_ms']:.1f} ms "
            f"| gamma={params['gamma']} thr={params['confidence_threshold']:.2f} {params['gamma_schedule']} "
            f"B={params['max_batch_size']} {params['drafter']}"
            + (f" tree={params['tree_topk']}" if _is_tree(params) else "")
            + f" | best so far {best['tps']:.1f} tok/s{startup} {eta}"
        )

    return on_trial


def _store(
    ctx: ctx_mod.Context,
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
        backend=ctx.backend.describe() if ctx.backend else {"name": "engine"},
    )
    profile = json.loads(json.dumps(typed.to_json()))
    profile_id = ctx.store.save_profile(profile)
    profile["id"] = profile_id
    say(f"profile #{profile_id} stored in {redact_url(ctx.cfg.storage)}")
    return profile


def _n_finished(study: optuna.Study) -> int:
    """Trials that ran to an end (complete, failed, pruned); enqueued warm starts are not counted until they run."""
    return sum(t.state.is_finished() for t in study.get_trials(deepcopy=False))


def _gguf_models(ctx: ctx_mod.Context) -> dict[str, str]:
    """GGUF paths of the pair for the llama.cpp export (converted when llama.cpp's converter is installed)."""
    if "llamacpp" not in ctx.cfg.export_formats:
        return {}
    from autotune.backends import gguf

    try:
        out = {"target_model": str(gguf.ensure(ctx.cfg.target, ctx.cfg.llamacpp, "models.target"))}
        if ctx.draft_hash is not None:
            out["draft_model"] = str(gguf.ensure(ctx.cfg.draft, ctx.cfg.llamacpp, "models.draft"))
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


def _remeasure(ctx, configs: list[dict], repeats: int) -> tuple[list[list[dict]], str]:
    """Run each configuration ``repeats`` times; ``results[i][r]`` is config i in round r.

    On the engine the rounds are interleaved (A B C A B C ...), so drift hits every
    configuration alike; on a serving-stack backend a configuration's repeats run back to back
    in its server (alternating would restart a server every run). Round r uses seed + 1 + r for
    every configuration, so rounds are paired.
    """
    seed = ctx.cfg.seed + 1
    results: list[list[dict]] = [[] for _ in configs]
    if ctx.backend is None:
        for r in range(repeats):
            for i, params in enumerate(configs):
                results[i].append(study_mod.evaluate(ctx, {**params}, seed + r))
        return results, "interleaved"
    for i, params in enumerate(configs):
        for r in range(repeats):
            results[i].append(study_mod.evaluate(ctx, {**params}, seed + r))
    return results, "back-to-back per server"


def _median_result(rounds: list[dict]) -> dict:
    """One result from repeated ones: the median of every numeric metric (top level and per level)."""

    def med(values: list) -> object:
        nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        return statistics.median(nums) if nums and len(nums) == len(values) else values[0]

    per_level = {}
    for b in rounds[0]["per_level"]:
        keys = rounds[0]["per_level"][b]
        per_level[b] = {k: med([r["per_level"][b].get(k) for r in rounds]) for k in keys}
    out = {k: med([r.get(k) for r in rounds]) for k in rounds[0] if k != "per_level"}
    out["per_level"] = per_level
    return out


def _knobs(params: dict) -> tuple:
    return tuple(params.get(k) for k in (*CHOSEN_KNOBS, TREE_KNOB))


def _is_tree(params: Mapping) -> bool:
    return (
        params.get(TREE_KNOB, "chain") != "chain"
        and params.get("drafter") == "model"
        and params.get("gamma", 0) > 0
    )


def _chain_points(points: list[Point]) -> list[Point]:
    """The points without a token tree (all of them when trees were not searched)."""
    return [p for p in points if not _is_tree(p.params)]


def _select_and_build(ctx, space, measurement, study, trials, say: Say) -> Profile:
    """Re-measure, baseline, best static, choose, batch schedule, prediction check, build the profile."""
    cfg = ctx.cfg
    points = [study_mod.point_from_trial(t, space) for t in trials]
    finalists = _finalists(cfg, points)
    remeasured = _remeasure_finalists(ctx, finalists, say)
    base_point, baseline = remeasured.find(finalists.baseline_params)
    choice = choose_with_margin(remeasured.points, bool(cfg.slo))  # must beat plain decoding by a margin
    chosen_result = remeasured.find(choice.point.params)[1]
    chosen = _chosen_knobs(cfg, choice.point)
    static_point = (
        remeasured.find(finalists.best_static.params)[0] if finalists.best_static is not None else None
    )
    # gamma by batch size is a chain table (stacks take it for chains); a tree is the chosen configuration's
    schedule, crossover = batch_schedule(
        _chain_points(points + remeasured.points), list(cfg.batch_sizes), prefer=choice.point
    )  # the table follows the choice unless the data says not
    if _is_tree(choice.point.params):
        chosen = dataclasses.replace(chosen, best_chain=_best_chain(points, remeasured.points))
    pvm = _prediction_check(measurement, chosen, chosen_result)
    metrics = _chosen_metrics(
        cfg, choice.point, chosen_result, chosen, base_point, static_point, finalists.best_static
    )
    return _build_profile(
        ctx,
        space,
        measurement,
        study,
        trials,
        points,
        remeasured,
        choice,
        chosen,
        schedule,
        crossover,
        metrics,
        base_point,
        baseline,
        pvm,
    )


@dataclass
class _Finalists:
    """What is measured again: the top of the Pareto front, the AR baseline and the best static gamma."""

    candidates: list[Point]
    best_static: Point | None
    baseline_params: dict
    configs: list[tuple[dict, int | None]]  # (params, trial number), each configuration once


def _finalists(cfg: TuneConfig, points: list[Point]) -> _Finalists:
    """The ``budget.remeasure_top`` fastest Pareto points (SLO-feasible ones when any), gamma=0, best static gamma."""
    pool = [p for p in points if p.feasible] if cfg.slo and any(p.feasible for p in points) else points
    candidates = sorted(pareto_front(pool), key=lambda p: -p.tokens_per_second)[: cfg.remeasure_top]
    static = [
        p
        for p in _chain_points(points)
        if p.params.get("gamma", 0) > 0
        and p.params.get("gamma_schedule") == "constant"
        and float(p.params.get("confidence_threshold", 0.0)) == 0.0
    ]
    best_static = max(static, key=lambda p: p.tokens_per_second, default=None)
    base_params = {
        **candidates[0].params,
        "gamma": 0,
        "confidence_threshold": 0.0,
        "gamma_schedule": "constant",
    }
    if TREE_KNOB in base_params:
        base_params[TREE_KNOB] = "chain"
    configs: list[tuple[dict, int | None]] = []
    for params, number in [
        *((c.params, c.number) for c in candidates),
        (base_params, None),
        *([(best_static.params, best_static.number)] if best_static else []),
    ]:
        if all(_knobs(params) != _knobs(p) for p, _ in configs):
            configs.append(({**params}, number))
    return _Finalists(candidates, best_static, base_params, configs)


@dataclass
class _Remeasured:
    """The finalists re-run ``budget.repeats`` times: one point (medians, paired rounds) and result each."""

    pairs: list[tuple[Point, dict]]
    repeats: int
    order: str  # "interleaved" (engine) or "back-to-back per server"

    @property
    def points(self) -> list[Point]:
        return [p for p, _ in self.pairs]

    def find(self, params: Mapping) -> tuple[Point, dict]:
        return next((p, r) for p, r in self.pairs if _knobs(p.params) == _knobs(params))


def _remeasure_finalists(ctx, finalists: _Finalists, say: Say) -> _Remeasured:
    cfg = ctx.cfg
    configs, repeats = finalists.configs, cfg.repeats
    say(
        f"re-measuring the top {len(finalists.candidates)} candidates of the Pareto front, the AR baseline"
        + (" and the best static gamma" if finalists.best_static is not None else "")
        + f": {len(configs)} configurations x {repeats} repeats"
        + (" (interleaved)" if ctx.backend is None else " (back to back in each configuration's server)")
    )
    rounds, order = _remeasure(ctx, [p for p, _ in configs], repeats)
    pairs: list[tuple[Point, dict]] = []
    for (params, number), results in zip(configs, rounds, strict=True):
        result = _median_result(results)
        viol = sum(max(v, 0.0) for v in study_mod.slo_violations(cfg, result).values())
        per_batch = {b: lv["tokens_per_second"] for b, lv in result["per_level"].items()}
        per_batch_rounds = {
            b: tuple(r["per_level"][b]["tokens_per_second"] for r in results) for b in per_batch
        }
        point = Point(
            params,
            result["tokens_per_second"],
            result["latency_ms"],
            viol,
            per_batch,
            number,
            tuple((r["tokens_per_second"], r["latency_ms"]) for r in results),
            per_batch_rounds,
        )
        pairs.append((point, result))
    return _Remeasured(pairs, repeats, order)


def _chosen_knobs(cfg: TuneConfig, point: Point) -> Chosen:
    """The profile's ``chosen``: the point's knobs plus the n-gram window the study ran with."""
    chosen = Chosen(
        **{k: point.params[k] for k in CHOSEN_KNOBS},
        prompt_lookup_min=cfg.ngram_min,
        prompt_lookup_max=cfg.ngram_max,
    )
    if TREE_KNOB in point.params:  # trees were searched: "chain" or the chosen shape
        chosen = dataclasses.replace(
            chosen, tree_topk=point.params[TREE_KNOB] if _is_tree(point.params) else "chain"
        )
    return chosen


def _best_chain(points: list[Point], remeasured: list[Point]) -> dict | None:
    """The fastest measured chain of the draft model (re-measured medians first): what chain-only stacks get."""
    for pool in (remeasured, points):
        chains = [
            p
            for p in _chain_points(pool)
            if p.params.get("drafter") == "model" and p.params.get("gamma", 0) > 0
        ]
        if chains:
            best = max(chains, key=lambda p: p.tokens_per_second)
            return {
                "gamma": int(best.params["gamma"]),
                "confidence_threshold": float(best.params.get("confidence_threshold", 0.0)),
                "gamma_schedule": best.params.get("gamma_schedule", "constant"),
                "tokens_per_second": best.tokens_per_second,
            }
    return None


def _prediction_check(measurement: dict, chosen: Chosen, chosen_result: dict) -> list[dict]:
    """The cost model's throughput for the chosen configuration beside the measured one, per load level
    (none for a dynamic tree: its shape follows the draft's confidence, which the profiler's rank
    samples do not hold)."""
    if chosen.tree_nodes:
        return []
    m = Measurement.from_json(measurement)
    curves, samples, gmax = m.cost_curves(), m.samples(), m.gamma_max
    pvm = []
    ranks = tree_rank_samples(m.acceptance)
    if chosen.tree_shape and ranks:
        for b, lv in chosen_result["per_level"].items():
            pred = predict_tree(curves, ranks, chosen.tree_shape, min(int(b), int(chosen.max_batch_size)))
            pvm.append(
                {
                    "batch_size": int(b),
                    "gamma": int(chosen.gamma),
                    "tree_topk": chosen.tree_topk,
                    "predicted_tokens_per_second": pred.tokens_per_second,
                    "measured_tokens_per_second": lv["tokens_per_second"],
                }
            )
        return pvm
    for b, lv in chosen_result["per_level"].items():
        g = min(int(chosen.gamma), gmax)
        pred = predict(
            curves, samples, g, float(chosen.confidence_threshold), min(int(b), int(chosen.max_batch_size))
        )
        pvm.append(
            {
                "batch_size": int(b),
                "gamma": g,
                "predicted_tokens_per_second": pred.tokens_per_second,
                "measured_tokens_per_second": lv["tokens_per_second"],
            }
        )
    return pvm


def _chosen_metrics(
    cfg: TuneConfig,
    chosen_point: Point,
    chosen_result: dict,
    chosen: Chosen,
    base_point: Point,
    static_point: Point | None,
    best_static: Point | None,
) -> dict:
    """The profile's ``metrics``: the chosen configuration's medians and intervals, and its paired speedups."""
    static_is_chosen = (
        best_static is not None
        and chosen.tree_shape == ()
        and all(best_static.params.get(k) == getattr(chosen, k) for k in CHOSEN_KNOBS)
    )
    tps = [t for t, _ in chosen_point.rounds]
    speedup = paired_ratio(tps, [t for t, _ in base_point.rounds])
    over_static = paired_ratio(tps, [t for t, _ in static_point.rounds]) if static_point is not None else None
    per_level_speedup = {
        b: paired_ratio(chosen_point.per_batch_rounds[b], base_point.per_batch_rounds[b]).as_dict()
        for b in chosen_point.per_batch_rounds
        if b in base_point.per_batch_rounds
    }
    return {
        "tokens_per_second": chosen_result["tokens_per_second"],
        "latency_ms": chosen_result["latency_ms"],
        "tokens_per_second_ci95": _ci(tps),
        "latency_ms_ci95": _ci([lat for _, lat in chosen_point.rounds]),
        "latency_metric": cfg.latency,
        "per_level": chosen_result["per_level"],
        "speedup": speedup.value,
        "speedup_ci95": [speedup.low, speedup.high],
        "speedup_significant": significant(speedup),
        "per_level_speedup": per_level_speedup,
        "speedup_over_best_static": over_static.value if over_static else None,
        "speedup_over_best_static_ci95": [over_static.low, over_static.high] if over_static else None,
        "best_static": dict(best_static.params) if best_static else None,
        "chosen_is_best_static": static_is_chosen,
        "repeats": cfg.repeats,
        "acceptance_rate": _mean([lv["acceptance_rate"] for lv in chosen_result["per_level"].values()]),
    }


def _build_profile(
    ctx,
    space,
    measurement: dict,
    study,
    trials,
    points: list[Point],
    remeasured: _Remeasured,
    choice: Choice,
    chosen: Chosen,
    schedule: list[dict],
    crossover: int | None,
    metrics: dict,
    base_point: Point,
    baseline: dict,
    pvm: list[dict],
) -> Profile:
    """The profile (host noise, backend and id are added when it is stored)."""
    cfg = ctx.cfg
    entries = tuple(ScheduleEntry(**{k: e[k] for k in ScheduleEntry.KEYS if k in e}) for e in schedule)
    return Profile(
        schema_version=SCHEMA_VERSION,
        tool_version=TOOL_VERSION,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        device=ctx.fingerprint,
        pair={
            "target": str(cfg.target),
            "draft": str(cfg.draft) if ctx.draft_hash else None,
            "drafter": ctx.pair_drafter,
            "target_hash": ctx.target_hash,
            "draft_hash": ctx.draft_hash,
        },
        workload={**ctx.workload, "hash": ctx.workload_hash},
        study={
            "name": study.study_name,
            "storage": redact_url(cfg.storage),
            "n_trials": len(trials),
            "failed_trials": sum(
                t.state == optuna.trial.TrialState.FAIL for t in study.get_trials(deepcopy=False)
            ),
            "space": space.to_json(),
            "slo": cfg.slo,
            "objectives": ["tokens_per_second", cfg.latency],
        },
        chosen=chosen,
        selection={"met_slo": choice.met_slo, "reason": choice.reason, "trial": choice.point.number},
        schedule=BatchSchedule(entries, crossover),
        metrics=metrics,
        baseline={
            "tokens_per_second": baseline["tokens_per_second"],
            "latency_ms": baseline["latency_ms"],
            "tokens_per_second_ci95": _ci([t for t, _ in base_point.rounds]),
            "latency_ms_ci95": _ci([lat for _, lat in base_point.rounds]),
            "per_level": baseline["per_level"],
        },
        trials=[
            {
                "trial": p.number,
                "params": dict(p.params),
                "tokens_per_second": p.tokens_per_second,
                "latency_ms": p.latency_ms,
                "feasible": p.feasible,
                "per_batch_tokens_per_second": dict(p.per_batch),
            }
            for p in points
        ],
        pareto_front=[
            {
                "trial": p.number,
                "params": dict(p.params),
                "tokens_per_second": p.tokens_per_second,
                "latency_ms": p.latency_ms,
                "feasible": p.feasible,
            }
            for p in pareto_front(points)
        ],
        remeasure={"repeats": remeasured.repeats, "order": remeasured.order},
        remeasured=[
            {
                "trial": p.number,
                "params": dict(p.params),
                "tokens_per_second": p.tokens_per_second,
                "latency_ms": p.latency_ms,
                "feasible": p.feasible,
                "tokens_per_second_ci95": _ci([t for t, _ in p.rounds]),
                "latency_ms_ci95": _ci([lat for _, lat in p.rounds]),
                "rounds": [{"tokens_per_second": t, "latency_ms": lat} for t, lat in p.rounds],
            }
            for p in remeasured.points
        ],
        classification=measurement["classification"],
        ceilings=measurement["ceilings"],
        knee_tokens=measurement["knee_tokens"],
        curves=measurement["curves"],
        acceptance={k: v for k, v in measurement["acceptance"].items() if k != "samples"},
        predicted_vs_measured=pvm,
    )


def _ci(xs: list[float]) -> list[float]:
    e = estimate(xs)
    return [e.low, e.high]


def _mean(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None
