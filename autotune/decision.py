"""From a finished study to a profile: finalists, re-measurement, the choice, the schedule, the record.

The study ranks configurations on single runs; what is chosen is decided on repeated ones:

1. :func:`finalists`: the ``budget.remeasure_top`` fastest Pareto points, the AR baseline and the
   best static gamma (what a stack's constant K is);
2. :func:`remeasure`: each run ``budget.repeats`` times on the backend, with paired seeds;
3. :func:`decide`: the margin rule picks the configuration (a simpler one is kept unless the
   interval of the paired ratio excludes 1), the gamma-by-batch-size schedule follows from the
   per-level measurements, the cost model's prediction is set beside the measurement;
4. :func:`build_profile`: the :class:`Decision` and the measurement become the stored
   :class:`profiles.schema.Profile`.

Pure over :class:`autotune.selection.Point` records except :func:`remeasure`, which runs the
backend.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import optuna

from autotune.backends.base import Backend
from autotune.config import TuneConfig
from autotune.context import Context
from autotune.costmodel import predict, predict_tree, tree_rank_samples
from autotune.knobs import Knobs
from autotune.records import LevelMetrics, Measurement, TrialResult
from autotune.selection import Choice, Point, batch_schedule, choose_with_margin, pareto_front
from autotune.stats import estimate, paired_ratio, significant
from autotune.study import Space, slo_violations
from profiles.profile import SCHEMA_VERSION, TOOL_VERSION
from profiles.schema import BatchSchedule, Chosen, Profile, ScheduleEntry
from profiles.store import redact_url

Say = Callable[[str], None]


@dataclass(frozen=True)
class Finalists:
    """What is measured again: the top of the Pareto front, the AR baseline and the best static gamma."""

    candidates: list[Point]
    best_static: Point | None
    baseline: Knobs
    configs: list[tuple[Knobs, int | None]]  # (knobs, trial number), each configuration once


def finalists(cfg: TuneConfig, points: list[Point]) -> Finalists:
    """The ``budget.remeasure_top`` fastest Pareto points (SLO-feasible ones when any), gamma=0, best static gamma."""
    pool = (
        [p for p in points if p.feasible]
        if cfg.objectives.slo and any(p.feasible for p in points)
        else points
    )
    candidates = sorted(pareto_front(pool), key=lambda p: -p.tokens_per_second)[: cfg.budget.remeasure_top]
    static = [p for p in points if p.knobs.is_static_chain]
    best_static = max(static, key=lambda p: p.tokens_per_second, default=None)
    baseline = candidates[0].knobs.without_speculation()
    configs: list[tuple[Knobs, int | None]] = []
    for knobs, number in [
        *((c.knobs, c.number) for c in candidates),
        (baseline, None),
        *([(best_static.knobs, best_static.number)] if best_static else []),
    ]:
        if all(knobs != k for k, _ in configs):
            configs.append((knobs, number))
    return Finalists(candidates, best_static, baseline, configs)


@dataclass(frozen=True)
class Remeasured:
    """The finalists re-run ``budget.repeats`` times: one point (medians, paired rounds) and result each."""

    pairs: list[tuple[Point, TrialResult]]
    repeats: int
    order: str  # the backend's remeasure_order: "interleaved" or "back-to-back per server"

    @property
    def points(self) -> list[Point]:
        return [p for p, _ in self.pairs]

    def find(self, knobs: Knobs) -> tuple[Point, TrialResult]:
        return next((p, r) for p, r in self.pairs if p.knobs == knobs)


def remeasure(cfg: TuneConfig, backend: Backend, chosen_from: Finalists, say: Say) -> Remeasured:
    """Run each finalist ``budget.repeats`` times on ``backend``; round r uses seed + 1 + r for all, so
    rounds are paired.

    Interleaved (A B C A B C ...) where the backend allows it, so drift hits every configuration
    alike; on a serving stack a configuration's repeats run back to back in its server
    (alternating would restart a server every run).
    """
    configs, repeats, order = chosen_from.configs, cfg.budget.repeats, backend.remeasure_order
    say(
        f"re-measuring the top {len(chosen_from.candidates)} candidates of the Pareto front, the AR baseline"
        + (" and the best static gamma" if chosen_from.best_static is not None else "")
        + f": {len(configs)} configurations x {repeats} repeats"
        + (" (interleaved)" if order == "interleaved" else " (back to back in each configuration's server)")
    )
    seed = cfg.budget.seed + 1
    rounds: list[list[TrialResult]] = [[] for _ in configs]
    if order == "interleaved":
        for r in range(repeats):
            for i, (knobs, _) in enumerate(configs):
                rounds[i].append(backend.run(knobs, seed + r))
    else:
        for i, (knobs, _) in enumerate(configs):
            rounds[i].extend(backend.run(knobs, seed + r) for r in range(repeats))
    pairs: list[tuple[Point, TrialResult]] = []
    for (knobs, number), results in zip(configs, rounds, strict=True):
        result = TrialResult.median(results)
        viol = sum(max(v, 0.0) for v in slo_violations(cfg, result).values())
        per_batch = {b: _tps(lv) for b, lv in result.per_level.items()}
        per_batch_rounds = {b: tuple(_tps(r.per_level[b]) for r in results) for b in per_batch}
        point = Point(
            knobs,
            result.tokens_per_second,
            result.latency_ms,
            viol,
            per_batch,
            number,
            tuple((r.tokens_per_second, r.latency_ms) for r in results),
            per_batch_rounds,
        )
        pairs.append((point, result))
    return Remeasured(pairs, repeats, order)


def _tps(level: LevelMetrics) -> float:
    """A level's tokens/s: every backend measures it (other level metrics may be None)."""
    assert level.tokens_per_second is not None
    return level.tokens_per_second


@dataclass(frozen=True)
class Decision:
    """What the study decided, with everything the profile records about how."""

    points: list[Point]  # every finished trial
    remeasured: Remeasured
    choice: Choice
    chosen: Chosen
    schedule: BatchSchedule
    metrics: dict[str, Any]
    baseline_point: Point
    baseline: TrialResult
    predicted_vs_measured: list[dict[str, Any]]


def decide(
    cfg: TuneConfig, backend: Backend, space: Space, measurement: dict, points: list[Point], say: Say
) -> Decision:
    """Re-measure the finalists, choose with a margin, build the batch schedule and the prediction check."""
    final = finalists(cfg, points)
    remeasured = remeasure(cfg, backend, final, say)
    base_point, baseline = remeasured.find(final.baseline)
    choice = choose_with_margin(
        remeasured.points, bool(cfg.objectives.slo)
    )  # must beat plain decoding by a margin
    chosen_result = remeasured.find(choice.point.knobs)[1]
    chosen = _chosen(cfg, space, choice.point.knobs)
    static_point = remeasured.find(final.best_static.knobs)[0] if final.best_static is not None else None
    # gamma by batch size is a chain table (stacks take it for chains); a tree is the chosen configuration's
    schedule, crossover = batch_schedule(
        [p for p in points + remeasured.points if not p.knobs.is_tree],
        list(cfg.batch_sizes),
        prefer=choice.point,
    )  # the table follows the choice unless the data says not
    if choice.point.knobs.is_tree:
        chosen = dataclasses.replace(chosen, best_chain=_best_chain(points, remeasured.points))
    entries = tuple(ScheduleEntry(**{k: e[k] for k in ScheduleEntry.KEYS if k in e}) for e in schedule)
    metrics = _chosen_metrics(
        cfg, space, choice.point, chosen_result, base_point, static_point, final.best_static
    )
    return Decision(
        points,
        remeasured,
        choice,
        chosen,
        BatchSchedule(entries, crossover),
        metrics,
        base_point,
        baseline,
        _prediction_check(measurement, chosen, chosen_result),
    )


def _chosen(cfg: TuneConfig, space: Space, knobs: Knobs) -> Chosen:
    """The profile's ``chosen``: the knobs plus the n-gram window the study ran with (``tree_topk``
    only when trees were searched: ``"chain"`` or the chosen shape)."""
    chosen = Chosen(
        drafter=knobs.drafter,
        gamma=knobs.gamma,
        confidence_threshold=knobs.confidence_threshold,
        gamma_schedule=knobs.gamma_policy,
        max_batch_size=knobs.max_batch_size,
        prompt_lookup_min=cfg.search.ngram_min,
        prompt_lookup_max=cfg.search.ngram_max,
    )
    return dataclasses.replace(chosen, tree_topk=knobs.tree_name) if space.trees else chosen


def _best_chain(points: list[Point], remeasured: list[Point]) -> dict[str, Any] | None:
    """The fastest measured chain of the draft model (re-measured medians first): what chain-only stacks get."""
    for pool in (remeasured, points):
        chains = [p for p in pool if not p.knobs.is_tree and p.knobs.drafter == "model" and p.knobs.gamma > 0]
        if chains:
            best = max(chains, key=lambda p: p.tokens_per_second)
            return {
                "gamma": best.knobs.gamma,
                "confidence_threshold": best.knobs.confidence_threshold,
                "gamma_schedule": best.knobs.gamma_policy,
                "tokens_per_second": best.tokens_per_second,
            }
    return None


def _prediction_check(measurement: dict, chosen: Chosen, chosen_result: TrialResult) -> list[dict[str, Any]]:
    """The cost model's throughput for the chosen configuration beside the measured one, per load level
    (none for a dynamic tree: its shape follows the draft's confidence, which the profiler's rank
    samples do not hold)."""
    if chosen.tree_nodes:
        return []
    m = Measurement.from_json(measurement)
    curves, samples, gmax = m.cost_curves(), m.samples(), m.gamma_max
    max_rows = chosen.max_batch_size
    assert max_rows is not None  # _chosen sets it from the knobs
    pvm = []
    ranks = tree_rank_samples(m.acceptance)
    if chosen.tree_shape and ranks:
        for b, lv in chosen_result.per_level.items():
            tree_pred = predict_tree(curves, ranks, chosen.tree_shape, min(int(b), max_rows))
            pvm.append(
                {
                    "batch_size": int(b),
                    "gamma": int(chosen.gamma),
                    "tree_topk": chosen.tree_topk,
                    "predicted_tokens_per_second": tree_pred.tokens_per_second,
                    "measured_tokens_per_second": lv.tokens_per_second,
                }
            )
        return pvm
    for b, lv in chosen_result.per_level.items():
        g = min(int(chosen.gamma), gmax)
        pred = predict(curves, samples, g, float(chosen.confidence_threshold), min(int(b), max_rows))
        pvm.append(
            {
                "batch_size": int(b),
                "gamma": g,
                "predicted_tokens_per_second": pred.tokens_per_second,
                "measured_tokens_per_second": lv.tokens_per_second,
            }
        )
    return pvm


def _chosen_metrics(
    cfg: TuneConfig,
    space: Space,
    chosen_point: Point,
    chosen_result: TrialResult,
    base_point: Point,
    static_point: Point | None,
    best_static: Point | None,
) -> dict[str, Any]:
    """The profile's ``metrics``: the chosen configuration's medians and intervals, and its paired speedups."""
    tps = [t for t, _ in chosen_point.rounds]
    speedup = paired_ratio(tps, [t for t, _ in base_point.rounds])
    over_static = paired_ratio(tps, [t for t, _ in static_point.rounds]) if static_point is not None else None
    per_level_speedup = {
        b: paired_ratio(chosen_point.per_batch_rounds[b], base_point.per_batch_rounds[b]).as_dict()
        for b in chosen_point.per_batch_rounds
        if b in base_point.per_batch_rounds
    }
    per_level = chosen_result.to_json()["per_level"]
    return {
        "tokens_per_second": chosen_result.tokens_per_second,
        "latency_ms": chosen_result.latency_ms,
        "tokens_per_second_ci95": _ci(tps),
        "latency_ms_ci95": _ci([lat for _, lat in chosen_point.rounds]),
        "latency_metric": cfg.objectives.latency,
        "per_level": per_level,
        "speedup": speedup.value,
        "speedup_ci95": [speedup.low, speedup.high],
        "speedup_significant": significant(speedup),
        "per_level_speedup": per_level_speedup,
        "speedup_over_best_static": over_static.value if over_static else None,
        "speedup_over_best_static_ci95": [over_static.low, over_static.high] if over_static else None,
        "best_static": space.params(best_static.knobs) if best_static else None,
        "chosen_is_best_static": best_static is not None and best_static.knobs == chosen_point.knobs,
        "repeats": cfg.budget.repeats,
        "acceptance_rate": _mean([lv.acceptance_rate for lv in chosen_result.per_level.values()]),
    }


def build_profile(
    ctx: Context, space: Space, measurement: dict, study: optuna.Study, decision: Decision
) -> Profile:
    """The profile (the study's budget, host noise, backend and id are added when it is stored)."""
    cfg, d = ctx.cfg, decision

    def row(p: Point) -> dict[str, Any]:
        return {
            "trial": p.number,
            "params": space.params(p.knobs),
            "tokens_per_second": p.tokens_per_second,
            "latency_ms": p.latency_ms,
            "feasible": p.feasible,
        }

    return Profile(
        schema_version=SCHEMA_VERSION,
        tool_version=TOOL_VERSION,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        device=ctx.fingerprint,
        pair={
            "target": str(cfg.models.target),
            "draft": str(cfg.models.draft) if ctx.draft_hash else None,
            "drafter": ctx.pair_drafter,
            "target_hash": ctx.target_hash,
            "draft_hash": ctx.draft_hash,
        },
        workload={**ctx.workload, "hash": ctx.workload_hash},
        study={
            "name": study.study_name,
            "storage": redact_url(cfg.storage.url),
            "n_trials": len(d.points),
            "failed_trials": sum(
                t.state == optuna.trial.TrialState.FAIL for t in study.get_trials(deepcopy=False)
            ),
            "space": space.to_json(),
            "slo": cfg.objectives.slo,
            "objectives": ["tokens_per_second", cfg.objectives.latency],
        },
        chosen=d.chosen,
        selection={"met_slo": d.choice.met_slo, "reason": d.choice.reason, "trial": d.choice.point.number},
        schedule=d.schedule,
        metrics=d.metrics,
        baseline={
            "tokens_per_second": d.baseline.tokens_per_second,
            "latency_ms": d.baseline.latency_ms,
            "tokens_per_second_ci95": _ci([t for t, _ in d.baseline_point.rounds]),
            "latency_ms_ci95": _ci([lat for _, lat in d.baseline_point.rounds]),
            "per_level": d.baseline.to_json()["per_level"],
        },
        trials=[{**row(p), "per_batch_tokens_per_second": dict(p.per_batch)} for p in d.points],
        pareto_front=[row(p) for p in pareto_front(d.points)],
        remeasure={"repeats": d.remeasured.repeats, "order": d.remeasured.order},
        remeasured=[
            {
                **row(p),
                "tokens_per_second_ci95": _ci([t for t, _ in p.rounds]),
                "latency_ms_ci95": _ci([lat for _, lat in p.rounds]),
                "rounds": [{"tokens_per_second": t, "latency_ms": lat} for t, lat in p.rounds],
            }
            for p in d.remeasured.points
        ],
        classification=measurement["classification"],
        ceilings=measurement["ceilings"],
        knee_tokens=measurement["knee_tokens"],
        curves=measurement["curves"],
        acceptance={k: v for k, v in measurement["acceptance"].items() if k != "samples"},
        predicted_vs_measured=d.predicted_vs_measured,
    )


def _ci(xs: list[float]) -> list[float]:
    e = estimate(xs)
    return [e.low, e.high]


def _mean(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None
