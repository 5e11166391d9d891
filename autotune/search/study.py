"""The Optuna study: every trial is a real run of the workload under load, on the context's backend.

Knobs (each searched or fixed by tune.yaml): drafter, gamma (0 = speculation off),
confidence_threshold, gamma_schedule, max_batch_size, and (``search.tree_topk``) the token-tree
shape. A tree fixes gamma to its depth, threshold 0 and the constant policy, and needs a drafter
that drafts trees (the draft model or an EAGLE-3 head): the space is constrained so that such a
trial is never sampled with settings the engine refuses (the tree knob is suggested only for the
``model`` and ``eagle3`` drafters; the chain's knobs only for the chain). A trial runs the configuration at every
load level of the workload (closed-loop concurrency levels, or one open-loop rate) and reports
two objectives: throughput (generated tokens / wall time over all levels; maximised) and the
chosen latency percentile (worst level; minimised). SLOs become Optuna constraints via
``trial.set_constraint`` (value <= 0 is feasible). Every metric of every level is stored as a
user attribute, so nothing measured is lost, and the schedule is computed from them. A trial runs
through :class:`autotune.search.guard.TrialGuard`: a run another process disturbed is re-run, or the
trial is pruned, and never becomes the trial's values.

The study lives in Optuna's RDB storage in the same database as the profiles, so
``optuna-dashboard sqlite:///autotune.db`` shows it and several hosts can share a PostgreSQL URL.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

import optuna
import torch

from autotune.config import TuneConfig
from autotune.context import Context
from autotune.cost import stackcost
from autotune.cost.costmodel import best_gamma, best_tree, tree_rank_samples
from autotune.knobs import TREE_DRAFTERS, Knobs, Tree, parse_tree, tree_name
from autotune.records import LevelMetrics, Measurement, Point, TrialResult
from autotune.search.guard import Expectation, TrialGuard
from engine.tree import tree_depth
from profiles.schema import MISSING

THRESHOLD_STEP = 0.01  # confidence thresholds are searched on a 0.01 grid (exports stay readable)


class OnTrial(Protocol):
    """Called after each trial: its number, knobs, result (None when it failed or was pruned) and the
    failure's or pruning's reason."""

    def __call__(
        self, number: int, knobs: Knobs, result: TrialResult | None, error: str | None, pruned: bool = False
    ) -> None: ...


@dataclass(frozen=True)
class Space:
    """The searched knobs after the profiler shaped them; fixed knobs hold one value."""

    drafters: tuple[str, ...]
    gamma_low: int
    gamma_high: int
    threshold_low: float
    threshold_high: float
    gamma_policies: tuple[str, ...]  # per-row gamma policy: constant / heuristic (the key gamma_schedule)
    max_batch_sizes: tuple[int, ...]
    search_gamma_cap: int | None  # the study's largest gamma from the profiler (None = not applied)
    tree_shapes: tuple[Tree, ...] = ((),)  # search.tree_topk; () = the chain

    @property
    def trees(self) -> bool:
        """Whether tree shapes are searched (then every trial's params carry ``tree_topk``)."""
        return any(self.tree_shapes)

    @property
    def tree_names(self) -> tuple[str, ...]:
        return tuple(tree_name(t) for t in self.tree_shapes)

    def to_json(self) -> dict:
        """The profile's ``study.space`` (its stored keys predate the field names: ``schedules``, ``gamma_cap``).
        ``tree_topk`` is written only when trees are searched."""
        out = {
            "drafters": self.drafters,
            "gamma_low": self.gamma_low,
            "gamma_high": self.gamma_high,
            "threshold_low": self.threshold_low,
            "threshold_high": self.threshold_high,
            "schedules": self.gamma_policies,
            "max_batch_sizes": self.max_batch_sizes,
            "gamma_cap": self.search_gamma_cap,
        }
        if self.trees:
            out["tree_topk"] = self.tree_names
        return out

    def suggest(self, trial: optuna.Trial) -> Knobs:
        """One configuration, from a conditional space: with trees searched, the shape is suggested
        for the drafters that draft trees (``model``, ``eagle3``) only, and a tree fixes gamma (its
        depth), threshold 0 and the constant policy; where nothing drafts (gamma 0, drafter ``none``)
        threshold and policy do nothing, so they are not suggested and every such trial is one
        configuration (:func:`make_objective` answers its repeats from the study's record)."""
        drafter = (
            trial.suggest_categorical("drafter", self.drafters)
            if len(self.drafters) > 1
            else self.drafters[0]
        )
        tree: Tree = ()
        if self.trees and drafter in TREE_DRAFTERS:
            names = self.tree_names
            tree = parse_tree(trial.suggest_categorical("tree_topk", names) if len(names) > 1 else names[0])
        if tree:
            gamma, threshold, policy = tree_depth(tree), 0.0, "constant"
        else:
            gamma = (
                trial.suggest_int("gamma", self.gamma_low, self.gamma_high)
                if self.gamma_high > self.gamma_low and drafter != "none"
                else self.gamma_low
            )
        if not tree and (gamma == 0 or drafter == "none"):  # nothing drafts: threshold and policy do nothing
            threshold, policy = self.threshold_low, self.gamma_policies[0]
        elif not tree:
            threshold = round(
                trial.suggest_float(
                    "confidence_threshold", self.threshold_low, self.threshold_high, step=THRESHOLD_STEP
                )
                if self.threshold_high > self.threshold_low
                else self.threshold_low,
                4,
            )
            policy = (
                trial.suggest_categorical("gamma_schedule", self.gamma_policies)
                if len(self.gamma_policies) > 1
                else self.gamma_policies[0]
            )
        max_batch_size = (
            trial.suggest_categorical("max_batch_size", self.max_batch_sizes)
            if len(self.max_batch_sizes) > 1
            else self.max_batch_sizes[0]
        )
        return Knobs(drafter, 0 if drafter == "none" else gamma, threshold, policy, max_batch_size, tree)

    def params(self, knobs: Knobs) -> dict[str, Any]:
        """The flat params this study stores for ``knobs`` (``tree_topk`` when trees are searched)."""
        return knobs.to_params(with_tree=self.trees)

    def searched(self) -> set[str]:
        names = set()
        if len(self.drafters) > 1:
            names.add("drafter")
        if self.gamma_high > self.gamma_low:
            names.add("gamma")
        if self.threshold_high > self.threshold_low:
            names.add("confidence_threshold")
        if len(self.gamma_policies) > 1:
            names.add("gamma_schedule")
        if len(self.max_batch_sizes) > 1:
            names.add("max_batch_size")
        if self.trees and len(self.tree_shapes) > 1:
            names.add("tree_topk")
        return names

    def clip(self, knobs: Knobs) -> dict[str, Any]:
        """A warm-start point moved inside the space, as the searched knobs' params (what Optuna enqueues).

        With trees searched: a tree point keeps only the tree's own knobs (drafter, shape, batch
        size; its gamma, threshold and policy follow from the shape), a chain point names the chain
        when the chain is searched, else the first searched shape (for a drafter that drafts trees)."""
        searched = self.searched()
        max_batch_size = (
            knobs.max_batch_size if knobs.max_batch_size in self.max_batch_sizes else self.max_batch_sizes[0]
        )
        drafter = knobs.drafter if knobs.drafter in self.drafters else self.drafters[0]
        if self.trees and drafter in TREE_DRAFTERS:
            shape = knobs.tree if knobs.drafter in TREE_DRAFTERS else ()
            if shape not in self.tree_shapes:
                shape = () if () in self.tree_shapes else self.tree_shapes[0]
            if shape:
                tree = Knobs.for_tree(shape, max_batch_size, drafter)
                keep = searched & {"drafter", "tree_topk", "max_batch_size"}
                return {k: v for k, v in self.params(tree).items() if k in keep}
        clipped = Knobs(
            drafter=drafter,
            gamma=min(max(knobs.gamma, self.gamma_low), self.gamma_high),
            confidence_threshold=min(
                max(knobs.confidence_threshold, self.threshold_low), self.threshold_high
            ),
            gamma_policy=knobs.gamma_policy
            if knobs.gamma_policy in self.gamma_policies
            else self.gamma_policies[0],
            max_batch_size=max_batch_size,
        )
        if drafter not in TREE_DRAFTERS:  # only the draft model and the head draft trees
            searched.discard("tree_topk")
        return {k: v for k, v in self.params(clipped).items() if k in searched}


def shape_space(cfg: TuneConfig, measurement: dict, fixed: Mapping[str, Any] | None = None) -> Space:
    """Search space from tune.yaml, with gamma capped where the cost model says it stops paying.

    The automatic cap is 2 above the largest predicted-best gamma over the workload's batch
    sizes (at least 1), so the study does not spend trials where verification is no longer
    nearly free. ``search.gamma_cap`` overrides it (an integer, or ``off``). ``fixed`` pins
    knobs a serving-stack backend cannot express (``confidence_threshold``, ``gamma_schedule``).
    """
    cap: int | None = None
    m = Measurement.from_json(measurement) if cfg.search.gamma_cap == "auto" else None
    if m is not None and m.has_engine:  # gamma_cap auto, and the engine measured the pair
        curves, samples, gmax = m.cost_curves(), m.samples(), m.gamma_max
        best = [best_gamma(curves, samples, b, gmax).gamma for b in cfg.batch_sizes]
        cap = max(max(best) + 2, 1)
    elif isinstance(cap_value := cfg.search.gamma_cap, int):
        cap = cap_value
    high = (
        cfg.search.gamma.high if cap is None else max(min(cfg.search.gamma.high, cap), cfg.search.gamma.low)
    )
    fixed = fixed or {}
    thr_low = thr_high = fixed.get("confidence_threshold")
    if thr_low is None or thr_high is None:  # one value: both None or neither
        thr_low, thr_high = cfg.search.confidence_threshold.low, cfg.search.confidence_threshold.high
    schedules = (fixed["gamma_schedule"],) if "gamma_schedule" in fixed else cfg.search.gamma_schedule
    return Space(
        cfg.search.drafter,
        int(cfg.search.gamma.low),
        int(high),
        thr_low,
        thr_high,
        schedules,
        cfg.search.max_batch_size,
        cap,
        cfg.search.tree_topk,
    )


def slo_violations(cfg: TuneConfig, result: TrialResult) -> dict[str, float]:
    """Constraint values (<= 0 feasible): the worst level's metric minus its SLO bound."""
    out = {}
    for key, bound in cfg.objectives.slo.items():
        if key == "min_tokens_per_second":
            out[key] = bound - result.tokens_per_second
        else:
            out[key] = max((getattr(lv, key) or 0.0) for lv in result.per_level.values()) - bound
    return out


def point_from_trial(trial: optuna.trial.FrozenTrial) -> Point:
    """A finished trial as a selection point (its params: the stored ones, Optuna's suggestions on top)."""
    attrs = trial.user_attrs
    knobs = trial_knobs(trial)
    per_batch = {int(b): lv["tokens_per_second"] for b, lv in attrs.get("per_level", {}).items()}
    violation = sum(max(v, 0.0) for v in trial.constraints.values()) if trial.constraints else 0.0
    assert trial.values is not None  # finished() keeps complete trials only
    return Point(knobs, trial.values[0], trial.values[1], violation, per_batch, trial.number)


def make_objective(
    cfg: TuneConfig, guard: TrialGuard, space: Space, on_trial: OnTrial | None
) -> Callable[[optuna.Trial], tuple[float, float]]:
    """The study's objective: suggest knobs, run them through ``guard`` on its backend (expected to take
    what the finished trials took), record every level's metrics."""

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        knobs = space.suggest(trial)
        params = space.params(knobs)
        trial.set_user_attr("params", params)
        twin = None if "warm_start" in trial.user_attrs else measured_twin(trial.study, params)
        if twin is not None:  # measured already: the study's record answers (an enqueued repeat runs)
            trial.set_user_attr("repeat_of", twin.number)
            trial.set_user_attr("per_level", twin.user_attrs["per_level"])
            for key, value in twin.constraints.items():
                trial.set_constraint(key, value)
            if on_trial:
                values = {"tokens_per_second": twin.values[0], "latency_ms": twin.values[1]}
                on_trial(
                    trial.number,
                    knobs,
                    TrialResult.from_json({**values, "per_level": twin.user_attrs["per_level"]}),
                    None,
                )
            return twin.values[0], twin.values[1]
        try:
            result = guard.run(trial, knobs, cfg.budget.seed, Expectation.of(finished(trial.study)))
        except optuna.TrialPruned as exc:  # every run disturbed: no measurement for the front or TPE
            if on_trial:
                on_trial(trial.number, knobs, None, str(exc), pruned=True)
            raise
        except Exception as exc:  # a crash, time-out or OOM fails this trial, never the study
            if isinstance(exc, torch.OutOfMemoryError) and torch.cuda.is_available():
                torch.cuda.empty_cache()
            reason = f"{type(exc).__name__}: {exc}"
            trial.set_user_attr("error", reason)
            trial.set_user_attr("traceback", traceback.format_exc(limit=5))
            if on_trial:
                on_trial(trial.number, knobs, None, reason)
            raise
        trial.set_user_attr("per_level", result.to_json()["per_level"])
        if result.startup_s is not MISSING:  # a serving-stack backend: server start-up, apart from the trial
            trial.set_user_attr("startup_s", result.startup_s)
        for key, value in slo_violations(cfg, result).items():
            trial.set_constraint(key, value)
        if on_trial:
            on_trial(trial.number, knobs, result, None)
        return result.tokens_per_second, result.latency_ms

    return objective


def measured_twin(study: optuna.Study, params: Mapping[str, Any]) -> optuna.trial.FrozenTrial | None:
    """A finished trial of ``study`` that ran exactly ``params`` (the first), else None."""
    for t in finished(study):
        if t.user_attrs.get("params") == dict(params) and "per_level" in t.user_attrs and t.values:
            return t
    return None


def warm_starts(
    ctx: Context, space: Space, measurement: dict, nearest: dict | None, in_stack: bool = False
) -> list[tuple[str, dict[str, Any]]]:
    """Enqueued first trials: the AR baseline, the cost model's best points (chains, and with trees searched
    the best tree at the smallest and largest batch size), every other searched drafter (``ngram``,
    ``eagle3`` beside the draft model, which the profiler did not time) at the cost model's gamma for
    the smallest batch size, the nearest profile's choice; each as the searched knobs' params
    (:meth:`Space.clip`).

    ``in_stack`` (a backend that plans by cost): the chains are the stack-cost calibration's two K
    (:func:`autotune.cost.stackcost.first_ks`), placed over the cost model's best K, not those K: the
    engine's costs are another stack's, and the fit needs its span more than their guess. And the
    baseline runs twice, back to back in its one server (no second start): the two rounds give the
    host's round-to-round noise (:func:`autotune.cost.stackcost.replicate_noise`), which sets how large
    a predicted gain must be to earn a server start."""
    cfg = ctx.cfg
    base = Knobs(
        space.drafters[0], 0, space.threshold_low, space.gamma_policies[0], max(space.max_batch_sizes)
    )
    points = [("baseline (gamma=0)", base)]
    m = Measurement.from_json(measurement)
    if not m.has_engine:  # no engine prior: the stack's own calibration K, or the middle of the range
        return _warm_starts_without_engine(ctx, space, base, in_stack, points, nearest)
    drafter = ctx.profile_drafter if ctx.profile_drafter in space.drafters else space.drafters[0]
    chains = _cost_model_chains(ctx, space, m, replace(base, drafter=drafter))
    first = chains[0][1]  # the cost model's best at the smallest batch size
    if in_stack:
        ks = stackcost.first_ks(space.gamma_low, space.gamma_high, [k.gamma for _, k in chains])
        chains = [(f"stack cost calibration K={k} of {list(ks)}", replace(first, gamma=k)) for k in ks]
    points += chains
    for other in [d for d in space.drafters if d not in ("none", drafter, "hybrid")]:
        # each other drafter measured once early (the profiler timed only the first): same gamma
        points.append(
            (f"{other} at the cost model's gamma", replace(first, drafter=other, confidence_threshold=0.0))
        )
    points += _cost_model_trees(cfg, space, m, base.max_batch_size)
    return _as_params(space, base, points, nearest, in_stack)


def _cost_model_chains(ctx: Context, space: Space, m: Measurement, base: Knobs) -> list[tuple[str, Knobs]]:
    """The cost model's best chain (gamma and threshold, drafted by ``base``'s drafter) at the smallest
    and the largest batch size, the smallest's first."""
    cfg = ctx.cfg
    curves, samples = m.cost_curves(), m.samples()
    thresholds = tuple(
        sorted({space.threshold_low, space.threshold_high, (space.threshold_low + space.threshold_high) / 2})
    )
    chains = []
    for b in sorted({min(cfg.batch_sizes), max(cfg.batch_sizes)}):
        best = best_gamma(
            curves,
            samples,
            b,
            min(m.gamma_max, space.gamma_high),
            thresholds,
            cfg.workload.max_new_tokens,
            max(cfg.workload.requests_at(b), b),
            [len(r.prompt_ids) for r in ctx.requests],
        )
        knobs = replace(base, gamma=max(best.gamma, 1), confidence_threshold=best.confidence_threshold)
        chains.append((f"cost model best at batch {b}", knobs))
    return chains


def _cost_model_trees(
    cfg: TuneConfig, space: Space, m: Measurement, max_batch_size: int
) -> list[tuple[str, Knobs]]:
    """The cost model's best static tree at the smallest and the largest batch size, when trees are searched
    (it predicts static trees of the draft model: the profiler's ranks are the draft model's)."""
    ranks = tree_rank_samples(m.acceptance) if space.trees else None
    trees = [t for t in space.tree_shapes if isinstance(t, tuple) and t]
    if not (ranks and trees):
        return []
    curves = m.cost_curves()
    out = []
    for b in sorted({min(cfg.batch_sizes), max(cfg.batch_sizes)}):
        shape, _ = best_tree(curves, ranks, trees, b)
        out.append((f"cost model best tree at batch {b}", Knobs.for_tree(shape, max_batch_size)))
    return out


def _as_params(
    space: Space,
    base: Knobs,
    points: list[tuple[str, Knobs]],
    nearest: dict | None,
    in_stack: bool,
) -> list[tuple[str, dict[str, Any]]]:
    """``points`` and the nearest stored profile's choice as the searched knobs' params
    (:meth:`Space.clip`), each configuration once; in a stack, the baseline twice (first and second)."""
    if nearest is not None and isinstance(nearest.get("chosen"), dict):
        stored = Knobs.from_params({**space.params(base), **nearest["chosen"]})
        points = [*points, (f"nearest stored profile #{nearest.get('id')}", stored)]
    out, seen = [], set()
    for label, knobs in points:
        clipped = space.clip(knobs)
        key = tuple(sorted(clipped.items()))
        if clipped and key not in seen:
            seen.add(key)
            out.append((label, clipped))
    if in_stack:
        out.insert(1, ("baseline again, same server (the host's round-to-round noise)", out[0][1]))
    return out


def _warm_starts_without_engine(
    ctx: Context,
    space: Space,
    base: Knobs,
    in_stack: bool,
    points: list[tuple[str, Knobs]],
    nearest: dict | None,
) -> list[tuple[str, dict[str, Any]]]:
    """Warm starts when the engine measured nothing: the calibration K spread over the searched range
    (:func:`autotune.cost.stackcost.first_ks` with no hint), each searched drafter once."""
    drafter = ctx.profile_drafter if ctx.profile_drafter in space.drafters else space.drafters[0]
    ks = stackcost.first_ks(space.gamma_low, space.gamma_high, [])
    if not in_stack:
        ks = ks[:1]
    first = replace(base, drafter=drafter, gamma=ks[0] if ks else 0)
    points += [(f"calibration K={k} of {list(ks)} (no engine prior)", replace(first, gamma=k)) for k in ks]
    for other in [d for d in space.drafters if d not in ("none", drafter, "hybrid")] if ks else []:
        points.append(
            (f"{other} at K={first.gamma}", replace(first, drafter=other, confidence_threshold=0.0))
        )
    return _as_params(space, base, points, nearest, in_stack)


def trial_knobs(trial: optuna.trial.FrozenTrial) -> Knobs:
    """The knobs a trial ran (its stored params over Optuna's suggested ones)."""
    return Knobs.from_params({**trial.user_attrs.get("params", {}), **trial.params})


def measured_chains(trials: list[optuna.trial.FrozenTrial]) -> list[tuple[Knobs, dict[int, LevelMetrics]]]:
    """Each finished trial's knobs and per-level metrics (batch size -> :class:`LevelMetrics`)."""
    return [
        (
            trial_knobs(t),
            {int(b): LevelMetrics.from_json(lv) for b, lv in t.user_attrs.get("per_level", {}).items()},
        )
        for t in trials
    ]


def stack_observations(
    trials: list[optuna.trial.FrozenTrial],
) -> tuple[str, list[stackcost.Observation]] | None:
    """The best measured drafter (by its fastest constant chain) and its stack-cost observations
    (:func:`autotune.cost.stackcost.observations`) among these trials; None without a constant chain."""
    runs = measured_chains(trials)
    chains = [(k, t) for (k, _), t in zip(runs, trials, strict=True) if k.speculates and k.is_static_chain]
    if not chains:
        return None
    drafter = max(chains, key=lambda c: c[1].values[0] if c[1].values else 0.0)[0].drafter
    return drafter, stackcost.observations(runs, drafter)


def fit_stack_cost(trials: list[optuna.trial.FrozenTrial]) -> stackcost.StackCost | None:
    """The stack cost of the best measured drafter, from these trials; None without no speculation
    and one constant chain measured."""
    found = stack_observations(trials)
    return stackcost.calibrate(found[1], found[0]) if found is not None else None


def stack_planner(
    space: Space, say: Callable[[str], None], tables: bool = False
) -> Callable[[optuna.Study, Any], None]:
    """An Optuna callback for a backend that plans by cost (``Backend.plans_by_cost``): once the warm
    starts have run, fit the stack cost (:mod:`autotune.cost.stackcost`) from the finished trials, enqueue
    the unserved K predicted most faster than every served K at some level (:func:`stackcost.next_k`:
    by more than ``SERVE_MARGIN`` plus ``SERVE_Z`` standard errors of the prediction, else a level's
    predicted best K more than one step from every measured K where one round can settle it; with
    ``tables``, a backend that serves a by-batch-size table, also the best K >= 1 of a level against
    the served K >= 1, since a table holds no K=0), and stop the study once there is none (a failed
    K is not served again). Until the fit exists, TPE goes on."""

    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:  # noqa: ARG001
        if study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
            return  # warm starts still queued
        cost = fit_stack_cost(finished(study))
        if cost is None:
            return
        ran = [trial_knobs(t) for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
        tried = {k.gamma if k.speculates else 0 for k in ran if not k.speculates or k.drafter == cost.drafter}
        k, best = stackcost.next_k(cost, range(space.gamma_low, space.gamma_high + 1), tried, tables=tables)
        plan = ", ".join(f"{b}:{g}" for b, g in best.items())
        noise = (
            f"one round's noise {cost.noise:.1%} carried through the fit"
            if cost.noise is not None
            else "noise unmeasured"
        )
        if k is None:
            say(
                f"  stack cost ({cost.fit} fit, K measured {list(cost.measured_k)}, {noise}): predicted best K "
                f"per level {plan}; no unserved K predicted > {stackcost.SERVE_MARGIN:.0%} faster than the served "
                f"ones beyond {stackcost.SERVE_Z:g} standard error of the prediction at any level, nor a level's "
                "best K more than one step from a measured one that one round can settle: the study stops"
            )
            study.stop()
            return
        knobs = Knobs(cost.drafter, k, 0.0, "constant", max(space.max_batch_sizes))
        study.enqueue_trial(space.clip(knobs), user_attrs={"warm_start": f"stack cost: predicted best K={k}"})
        say(
            f"  stack cost ({cost.fit} fit, K measured {list(cost.measured_k)}, {noise}): predicted best K per "
            f"level {plan}; serving K={k} next"
        )

    return callback


def open_study(ctx: Context, name: str, resume: bool) -> optuna.Study:
    """Create (or, with ``resume``, load) the study in the profiles database."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(
        ctx.cfg.storage.url,
        engine_kwargs={"connect_args": {"timeout": 30}} if ctx.cfg.storage.url.startswith("sqlite") else {},
    )
    sampler = optuna.samplers.TPESampler(seed=ctx.cfg.budget.seed, multivariate=True, n_startup_trials=6)
    return optuna.create_study(
        study_name=name,
        storage=storage,
        sampler=sampler,
        directions=["maximize", "minimize"],
        load_if_exists=resume,
    )


def finished(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [
        t
        for t in study.get_trials(deepcopy=False)
        if t.state == optuna.trial.TrialState.COMPLETE
        and t.values is not None
        and all(math.isfinite(v) for v in t.values)
    ]
