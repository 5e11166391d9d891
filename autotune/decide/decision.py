"""From a finished study to a profile: finalists, re-measurement, the choice, the schedule, the record.

The study ranks configurations on single runs; what is chosen is decided on repeated ones:

1. :func:`finalists`: the ``budget.remeasure_top`` fastest Pareto points, the AR baseline, the
   best static gamma (what a stack's constant K is) and the best static gamma of each load level
   (on a backend that plans by cost, which serves few K on purpose: every static gamma it served);
2. :func:`remeasure`: each run ``budget.repeats`` times on the backend, with paired seeds;
3. :func:`decide`: the margin rule picks the configuration (one of a simpler structure is kept
   unless the interval of the paired ratio excludes 1). Where that kept a simpler configuration
   than the fastest measured one (the noise, not the measurement, decided), or a load level's
   choice is not the fastest measured there, every finalist gets more paired rounds, up to
   ``budget.max_repeats``, and the rule picks again on all of them (one second look:
   :func:`undecided`, :func:`levels_undecided`); at each load level the best constant stays
   unless another K (or speculation off) is significantly faster there
   (:func:`autotune.decide.selection.per_level_choices`). Where those K differ and the backend serves
   tables, the table they make is served live (:func:`serve_table`: the table, the best
   constant and no speculation re-measured together) and replaces the constant only when it is
   significantly better at one level at least and not worse at any
   (:func:`autotune.decide.selection.table_verdict`); the exported schedule is what won. The cost
   model's prediction is set beside the measurement;
4. :func:`build_profile`: the :class:`Decision` and the measurement become the stored
   :class:`profiles.schema.Profile`.

Pure over :class:`autotune.records.Point` records except :func:`remeasure`, which runs the
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
from autotune.cost.costmodel import predict, predict_tree, tree_rank_samples
from autotune.decide.selection import (
    Choice,
    LevelChoice,
    TablePlan,
    TableVerdict,
    at_level,
    choose,
    choose_with_margin,
    fallback_schedule,
    level_pool,
    pareto_front,
    plan_table,
    score_ratio,
    table_verdict,
)
from autotune.knobs import Knobs, table_text
from autotune.records import LevelMetrics, Measurement, Point, TrialResult
from autotune.search.budget import RunBudget
from autotune.search.study import Space, slo_violations
from autotune.stats import Estimate, estimate, paired_ratio, significant
from profiles.profile import SCHEMA_VERSION, TOOL_VERSION
from profiles.schema import (
    MISSING,
    BatchSchedule,
    Chosen,
    LevelDecision,
    PluginNeed,
    Profile,
    Ratio,
    ScheduleEntry,
    TableDecision,
)
from profiles.store import redact_url

Say = Callable[[str], None]


@dataclass(frozen=True)
class Finalists:
    """What is measured again: the top of the Pareto front, the AR baseline, the best static gamma
    and the best static gamma of each load level (the candidates of the per-level choices)."""

    candidates: list[Point]
    best_static: Point | None
    baseline: Knobs
    configs: list[tuple[Knobs, int | None]]  # (knobs, trial number), each configuration once
    level_best: list[Point] = dataclasses.field(default_factory=list)


def finalists(cfg: TuneConfig, points: list[Point], every_chain: bool = False) -> Finalists:
    """The ``budget.remeasure_top`` fastest Pareto points (SLO-feasible ones when any), gamma=0, the
    best static gamma overall and at each load level; with ``every_chain`` (a study that served
    few K on purpose: a backend that plans by cost) every static chain it measured, so that one
    noisy round per server does not drop a K before the paired rounds
    (docs/decisions.md#finalists-every-chain)."""
    pool = (
        [p for p in points if p.feasible]
        if cfg.objectives.slo and any(p.feasible for p in points)
        else points
    )
    candidates = sorted(pareto_front(pool), key=lambda p: -p.tokens_per_second)[: cfg.budget.remeasure_top]
    static = [p for p in points if p.knobs.is_static_chain]
    best_static = max(static, key=lambda p: p.tokens_per_second, default=None)
    level_best = [
        best
        for b in cfg.batch_sizes
        if (best := max((p for p in static if b in p.per_batch), key=lambda p: p.per_batch[b], default=None))
    ]
    baseline = candidates[0].knobs.without_speculation()
    configs: list[tuple[Knobs, int | None]] = []
    for knobs, number in [
        *((c.knobs, c.number) for c in candidates),
        (baseline, None),
        *([(best_static.knobs, best_static.number)] if best_static else []),
        *((p.knobs, p.number) for p in level_best),
        *((p.knobs, p.number) for p in (static if every_chain else [])),
    ]:
        if all(knobs != k for k, _ in configs):
            configs.append((knobs, number))
    return Finalists(candidates, best_static, baseline, configs, level_best)


@dataclass(frozen=True)
class Remeasured:
    """The finalists re-run ``budget.repeats`` times: one point (medians, paired rounds) and result each."""

    pairs: list[tuple[Point, TrialResult]]
    repeats: int
    order: str  # the backend's remeasure_order: "interleaved" or "back-to-back per server"
    rounds: list[list[TrialResult]] = dataclasses.field(default_factory=list)  # per config, per round
    first_repeats: int | None = None  # rounds before the second look (None: no second look)
    levels: tuple[int, ...] | None = None  # the batch sizes the second look ran (None: every level)

    @property
    def points(self) -> list[Point]:
        return [p for p, _ in self.pairs]

    def find(self, knobs: Knobs) -> tuple[Point, TrialResult]:
        return next((p, r) for p, r in self.pairs if p.knobs == knobs)

    def to_json(self) -> dict[str, Any]:
        """The profile's ``remeasure``: rounds (at the second look's levels, where it ran some only),
        order, the rounds before the second look and the levels it ran."""
        return {
            "repeats": self.repeats,
            "order": self.order,
            **({"first_repeats": self.first_repeats} if self.first_repeats else {}),
            **({"second_look_levels": list(self.levels)} if self.levels is not None else {}),
        }


def _remeasured_point(
    cfg: TuneConfig, knobs: Knobs, number: int | None, results: list[TrialResult]
) -> tuple[Point, TrialResult]:
    """A re-measured configuration's point (per-metric medians, its paired rounds) and median result."""
    result = TrialResult.median(results)
    viol = sum(max(v, 0.0) for v in slo_violations(cfg, result).values())
    per_batch = {b: _tps(lv) for b, lv in result.per_level.items()}
    per_batch_rounds = {
        b: tuple(_tps(r.per_level[b]) for r in results if b in r.per_level) for b in per_batch
    }
    sweeps = TrialResult.full_rounds(results)
    rounds = tuple((r.tokens_per_second, r.latency_ms) for r in sweeps)
    point = Point(
        knobs, result.tokens_per_second, result.latency_ms, viol, per_batch, number, rounds, per_batch_rounds
    )
    return point, result


def round_order(
    configs: int, rounds: int, interleaved: bool, start: int = 0, rotate: bool = False
) -> list[tuple[int, int]]:
    """The runs of a paired re-measurement in the order they are made: ``(configuration, round)``
    for rounds ``start`` to ``rounds - 1``. Interleaved, round r of every configuration runs before
    round r + 1 of any (A B C A B C), so drift hits each round's configurations alike; else each
    configuration's rounds run back to back (A A B B C C), as in one server kept for them. With
    ``rotate`` (interleaved), round r starts at configuration r mod ``configs`` (A B C B C A C A B),
    so each configuration runs in each place of a round equally often and no configuration is
    always the first or the last of its round. The caller gives round r of every configuration the
    same seed, which is what pairs the rounds.

    Example:
        >>> round_order(2, 2, True), round_order(2, 2, False), round_order(2, 3, True, start=2)
        ([(0, 0), (1, 0), (0, 1), (1, 1)], [(0, 0), (0, 1), (1, 0), (1, 1)], [(0, 2), (1, 2)])
        >>> round_order(3, 3, True, rotate=True)
        [(0, 0), (1, 0), (2, 0), (1, 1), (2, 1), (0, 1), (2, 2), (0, 2), (1, 2)]
    """
    step = 1 if rotate and interleaved else 0
    runs = [((i + step * r) % configs, r) for r in range(start, rounds) for i in range(configs)]
    return runs if interleaved else sorted(runs)


def remeasure(
    cfg: TuneConfig,
    backend: Backend,
    configs: list[tuple[Knobs, int | None]],
    say: Say,
    what: str,
    earlier: Remeasured | None = None,
    repeats: int | None = None,
    levels: tuple[int, ...] | None = None,
    budget: RunBudget | None = None,
) -> Remeasured:
    """Run each configuration ``repeats`` (default ``budget.repeats``) times on ``backend``; round r
    uses seed + 1 + r for all, so rounds are paired. With ``earlier`` (the same configurations,
    fewer rounds) only the missing rounds run, and the points are made from all of them; with
    ``levels`` those rounds run at these batch sizes only (a second look where only some levels are
    undecided: the sweep's aggregate keeps its earlier rounds, each of those levels gets more).

    Interleaved (A B C B C A ...: :func:`round_order` rotated, no configuration always first or
    last) where the backend allows it (the engine; a serving stack that keeps every configuration's
    server alive, all started before the first run), so drift hits every configuration alike; else a
    configuration's repeats run back to back in its server (alternating would restart a server
    every run). ``what`` names the configurations for the progress line.
    """
    repeats, order = repeats or cfg.budget.repeats, backend.remeasure_order(len(configs))
    done = earlier.repeats if earlier is not None else 0
    if budget is not None:  # budget.minutes: as many rounds as fit, one at least where none ran
        fit = budget.rounds(repeats - done, len(configs), at_least=0 if done else 1)
        if fit < repeats - done:
            say(budget.cut(f"{what}: {done + fit} of {repeats} rounds (the rest would pass budget.minutes)"))
            repeats = done + fit
    say(
        f"{what}: {len(configs)} configurations x {repeats - done} repeats"
        + (f" (rounds {done + 1}-{repeats})" if done else "")
        + (f" at batch size {', '.join(map(str, levels))} only" if levels is not None else "")
        + (" (interleaved)" if order == "interleaved" else " (back to back in each configuration's server)")
    )
    rounds: list[list[TrialResult]] = (
        [list(r) for r in earlier.rounds] if earlier is not None else [[] for _ in configs]
    )
    kw: dict[str, Any] = {"levels": levels} if levels is not None else {"with_trace": True}
    clock = budget if budget is not None else RunBudget(None)
    plan = round_order(len(configs), repeats, order == "interleaved", start=done, rotate=True)
    if order == "interleaved":  # every server up before the first run: each run has the same ones beside it
        for knobs, _ in configs:
            backend.prepare(knobs)
    started = clock.clock()
    for ran, (i, r) in enumerate(plan, start=1):
        rounds[i].append(backend.run(configs[i][0], cfg.budget.seed + 1 + r, **kw))
        left = (clock.clock() - started) / ran * (len(plan) - ran)  # one line per run, with the ETA
        say(f"  {what.split(':')[0]}: {ran}/{len(plan)} runs [{clock.eta(left)}]")
    pairs = [
        _remeasured_point(cfg, knobs, number, results)
        for (knobs, number), results in zip(configs, rounds, strict=True)
    ]
    return Remeasured(pairs, repeats, order, rounds, earlier.repeats if earlier is not None else None, levels)


def undecided(points: list[Point], choice: Choice, has_slo: bool, knee: bool) -> bool:
    """True when the margin rule kept a simpler configuration than the one the measurements rank
    first: the intervals, not the medians, decided, so more rounds can change the choice.

    Example:
        >>> ar = Point(Knobs("model", 0), 100, 10, rounds=((100, 10), (90, 10), (110, 10)))
        >>> k3 = Point(Knobs("model", 3), 125, 10, rounds=((140, 10), (100, 10), (135, 10)))
        >>> undecided([ar, k3], choose_with_margin([ar, k3], False), False, False)
        True
    """
    return choose(points, has_slo, knee).point is not choice.point


def levels_undecided(levels: list[LevelChoice], points: list[Point]) -> list[int]:
    """The load levels where the per-level rule kept a configuration that is not the fastest one
    measured there (:func:`autotune.decide.selection.per_level_choices`, whose candidates are
    :func:`autotune.decide.selection.level_pool`, on the medians): as with :func:`undecided`, the
    intervals, not the medians, decided, so more rounds can change that level's K.

    Example:
        >>> def pt(g, tps):
        ...     return Point(Knobs("model", g), 0, 0, per_batch={8: tps}, per_batch_rounds={8: (tps,)})
        >>> off, k7 = pt(0, 300.0), pt(7, 250.0)
        >>> levels_undecided([LevelChoice(8, at_level(k7, 8), "kept")], [off, k7])
        [8]
        >>> levels_undecided([LevelChoice(8, at_level(off, 8), "faster")], [off, k7])
        []
    """
    return [
        c.batch_size
        for c in levels
        if any(
            p.per_batch[c.batch_size] > c.point.tokens_per_second
            for p in level_pool(points, c.batch_size, c.point.knobs.drafter)
        )
    ]


def _tps(level: LevelMetrics) -> float:
    """A level's tokens/s: every backend measures it (other level metrics may be None)."""
    assert level.tokens_per_second is not None
    return level.tokens_per_second


@dataclass(frozen=True)
class TableContest:
    """The per-level choices, the table they make, and (where it was served) its verdict.

    ``served`` holds the table, the best constant and no speculation re-measured together
    (None when the table was not served: one K at every level, a chosen configuration no table
    expresses, or a backend that serves no table); ``note`` says why in one sentence.
    ``over_chosen``: by batch size, the paired ratio of that level's choice over the configuration
    the profile serves, measured there (:func:`level_ratios`); stored as each level's
    ``over_chosen`` (``autotune watch`` takes its interval where it has no live acceptance).
    :meth:`table_decision` is the profile's record of it.
    """

    levels: list[LevelChoice]
    table: tuple[tuple[int, int], ...]
    knobs: Knobs | None  # the table as served (None: not served)
    served: Remeasured | None
    verdict: TableVerdict | None
    note: str
    trace: dict[str, float | None] = dataclasses.field(default_factory=dict)  # workload.trace tokens/s
    over_chosen: dict[int, Estimate] = dataclasses.field(default_factory=dict)
    needs_plugin: PluginNeed | None = None  # the won table's "off" range needs the K=0 skip plugin

    def table_decision(self) -> TableDecision:
        """The profile's ``table_decision``; a level's ``over_chosen`` is absent where
        :func:`level_ratios` has none."""
        levels = tuple(
            LevelDecision(
                c.batch_size,
                c.gamma,
                c.point.tokens_per_second,
                c.reason,
                Ratio(e.value, e.low, e.high, e.n)
                if (e := self.over_chosen.get(c.batch_size)) is not None
                else MISSING,
            )
            for c in self.levels
        )
        return TableDecision(
            levels=levels,
            table=self.table,
            served=self.served is not None,
            won=bool(self.verdict and self.verdict.won),
            per_level=self.verdict.per_level if self.verdict else [],
            trace_tokens_per_second=self.trace if self.trace else MISSING,
            reason=self.note,
            needs_plugin=self.needs_plugin if self.needs_plugin is not None else MISSING,
        )


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
    table: TableContest


def decide(
    cfg: TuneConfig,
    backend: Backend,
    space: Space,
    measurement: dict,
    points: list[Point],
    say: Say,
    budget: RunBudget | None = None,
) -> Decision:
    """Re-measure the finalists, choose with a margin, contest the per-level table, check the prediction.

    Long because: it is the decision's script, each statement one named step.
    """
    final = finalists(cfg, points, every_chain=backend.plans_by_cost)
    statics = (
        ""
        if final.best_static is None
        else ", every constant K served (the study served few on purpose)"
        if backend.plans_by_cost
        else ", the best static gamma and each load level's"
    )
    remeasured = remeasure(
        cfg,
        backend,
        final.configs,
        say,
        f"re-measuring the top {len(final.candidates)} candidates of the Pareto front, the AR baseline{statics}",
        budget=budget,
    )
    has_slo, knee = bool(cfg.objectives.slo), cfg.objectives.knee
    choice = choose_with_margin(remeasured.points, has_slo, knee)  # must beat plain decoding by a margin
    why, open_levels = _second_look(cfg, final, remeasured, choice)
    if (
        cfg.budget.max_repeats > remeasured.repeats
        and why
        and budget is not None
        and budget.rounds(1, len(final.configs), 0) == 0
    ):
        say(budget.cut(f"no second look ({why}): one more round would pass budget.minutes"))
    elif cfg.budget.max_repeats > remeasured.repeats and why:
        say(f"undecided on {remeasured.repeats} rounds ({why}): a second look")
        remeasured = remeasure(
            cfg,
            backend,
            final.configs,
            say,
            "re-measuring",
            remeasured,
            cfg.budget.max_repeats,
            open_levels,
            budget=budget,
        )
        choice = choose_with_margin(remeasured.points, has_slo, knee)
    base_point, baseline = remeasured.find(final.baseline)
    static_point = remeasured.find(final.best_static.knobs)[0] if final.best_static is not None else None
    contest = serve_table(cfg, backend, remeasured, choice.point, base_point, static_point, say, budget)
    chosen_point, chosen_result = choice.point, remeasured.find(choice.point.knobs)[1]
    if contest.served is not None and contest.verdict is not None and contest.knobs is not None:
        table_knobs = contest.knobs
        base_point, baseline = contest.served.find(final.baseline)
        constant = contest.served.find(_constant(choice.point, static_point).knobs)[0]
        if contest.verdict.won:
            chosen_point, chosen_result = contest.served.find(table_knobs)
            choice = Choice(chosen_point, choice.met_slo, f"{choice.reason}; served live: {contest.note}")
        else:
            chosen_point, chosen_result = contest.served.find(chosen_point.knobs)
        static_point = constant
    chosen = _chosen(cfg, space, chosen_point.knobs)
    if chosen_point.knobs.is_tree:
        chosen = dataclasses.replace(
            chosen, best_chain=_best_chain(points, remeasured.points, chosen_point.knobs.drafter)
        )
    metrics = _chosen_metrics(
        cfg, space, chosen_point, chosen_result, base_point, static_point, final.best_static
    )
    return Decision(
        points,
        remeasured,
        choice,
        chosen,
        _schedule(cfg, chosen, chosen_point, base_point, contest),
        metrics,
        base_point,
        baseline,
        _prediction_check(measurement, chosen, chosen_result),
        contest,
    )


def _second_look(
    cfg: TuneConfig, final: Finalists, remeasured: Remeasured, choice: Choice
) -> tuple[str, tuple[int, ...] | None]:
    """Why the re-measured rounds leave the decision open ("" where they do not), and where to look
    again: every level (None) when the margin kept a simpler configuration over the sweep than the
    fastest measured (:func:`undecided`); else only the load levels whose choice is not the fastest
    measured there (:func:`levels_undecided`), the others' rounds being spent on what is decided."""
    has_slo, knee = bool(cfg.objectives.slo), cfg.objectives.knee
    why = []
    overall = undecided(remeasured.points, choice, has_slo, knee)
    if overall:
        why.append(f"kept {choice.reason.split('; kept ', 1)[-1]}")
    static = remeasured.find(final.best_static.knobs)[0] if final.best_static is not None else None
    constant = _constant(choice.point, static)
    plan = plan_table(remeasured.points, cfg.batch_sizes, constant, static, choice.point.knobs.drafter)
    if open_levels := levels_undecided(plan.levels, remeasured.points):
        why.append(
            "at batch size "
            + ", ".join(str(b) for b in open_levels)
            + " the per-level choice is not the fastest measured there"
        )
    return "; ".join(why), None if overall or not open_levels else tuple(open_levels)


def _constant(chosen: Point, best_static: Point | None) -> Point:
    """The best constant: the chosen configuration where it is one K (or none), else the best static gamma."""
    if chosen.knobs.gamma == 0 or chosen.knobs.is_static_chain or best_static is None:
        return chosen
    return best_static


def serve_table(
    cfg: TuneConfig,
    backend: Backend,
    remeasured: Remeasured,
    chosen: Point,
    off: Point,
    best_static: Point | None,
    say: Say,
    budget: RunBudget | None = None,
) -> TableContest:
    """The per-level choices and the table they make (:func:`autotune.decide.selection.plan_table`,
    told whether ``backend`` skips the drafter at a table's K=0); where its K differ by level and
    the constants do not already rule it out, the table served live beside the best constant and
    no speculation (:func:`remeasure`), and its :func:`autotune.decide.selection.table_verdict`.

    A table with an "off" range (``backend.skips_drafter_at_k0``: vLLM with the plugin) is served
    with its K >= 1 plan's table beside it, where that one is worth serving and the budget holds it
    (:func:`_k_positive_table`); where the table wins, the fallback for a server without the skip
    is chosen from what was served (:func:`_plugin_need`).

    Long because: the contest in its order (the plan, why it is not served, what is served within
    the budget, the verdict, the plugin's need, the record), each step a few lines.
    """
    constant = _constant(chosen, best_static)
    skips = backend.skips_drafter_at_k0
    plan = plan_table(remeasured.points, cfg.batch_sizes, constant, best_static, chosen.knobs.drafter, skips)
    levels, table = plan.levels, plan.table
    per_level = ", ".join(f"{c.batch_size}: {c.gamma}" for c in levels)

    def unserved(note: str) -> TableContest:
        over = level_ratios(levels, remeasured.points, chosen)
        return TableContest(levels, table, None, None, None, note, over_chosen=over)

    if not (constant is chosen or chosen.knobs.is_static_chain or chosen.knobs.gamma == 0):
        return unserved(f"the chosen {chosen.knobs.label} is no K a table holds; per-level K {per_level}")
    if not backend.serves_table and len({c.gamma for c in levels}) > 1:
        return unserved(
            f"{backend.name} takes one K for every batch size; the per-level choices were {per_level}"
        )
    if plan.unserved:
        return unserved(plan.unserved)
    knobs = Knobs.for_table(plan.drafter, table, chosen.knobs.max_batch_size)
    configs = [(off.knobs, None), (constant.knobs, constant.number), (knobs, None)]
    if constant.knobs == off.knobs:
        configs = [configs[0], configs[2]]
    if budget is not None and budget.rounds(cfg.budget.repeats, len(configs), 0) < cfg.budget.repeats:
        say(budget.cut(f"the per-level {knobs.label} not served live (its rounds would pass budget.minutes)"))
        return unserved(f"not served live within budget.minutes; per-level K {per_level}")
    k_positive, why_not = _k_positive_table(cfg, plan, chosen, len(configs), say, budget)
    if k_positive is not None:
        configs.append((k_positive, None))
    served = remeasure(
        cfg, backend, configs, say, f"serving the per-level {knobs.label} live beside the best constant"
    )
    verdict = table_verdict(
        served.find(knobs)[0], served.find(constant.knobs)[0], served.find(off.knobs)[0], cfg.batch_sizes
    )
    say(("table chosen: " if verdict.won else "table not chosen: ") + verdict.reason)
    need = None
    if verdict.won and plan.fallback is not None:  # its "off" range is off only where K=0 skips the drafter
        need = _plugin_need(backend, served, k_positive, constant, off, cfg.batch_sizes, why_not, say)
    trace = {
        name: result.trace.tokens_per_second
        for name, k in (("off", off.knobs), ("constant", constant.knobs), ("table", knobs))
        if (result := served.find(k)[1]).trace is not None
    }
    # the profile serves the table where it won (measured beside the constant and off), else `chosen`
    over = (
        level_ratios(levels, served.points, served.find(knobs)[0])
        if verdict.won
        else level_ratios(levels, remeasured.points, chosen)
    )
    return TableContest(levels, table, knobs, served, verdict, verdict.reason, trace, over, need)


def _k_positive_table(
    cfg: TuneConfig, plan: TablePlan, chosen: Point, n_configs: int, say: Say, budget: RunBudget | None
) -> tuple[Knobs | None, str]:
    """The K >= 1 table served beside a table with an "off" range (``plan.fallback``'s), or None and
    why not: no such range, that plan not worth serving, or its rounds would pass budget.minutes."""
    k_positive = plan.fallback
    if k_positive is None:
        return None, ""
    if k_positive.unserved:
        return None, f"no K >= 1 table served: {k_positive.unserved}"
    knobs = Knobs.for_table(k_positive.drafter, k_positive.table, chosen.knobs.max_batch_size)
    if budget is not None and budget.rounds(cfg.budget.repeats, n_configs + 1, 0) < cfg.budget.repeats:
        say(budget.cut(f"the K >= 1 {knobs.label} not served beside the table (its rounds would pass it)"))
        return None, "the K >= 1 table was not served live within budget.minutes"
    return knobs, ""


def _plugin_need(
    backend: Backend,
    served: Remeasured,
    k_positive: Knobs | None,
    constant: Point,
    off: Point,
    batch_sizes: tuple[int, ...],
    why_not: str,
    say: Say,
) -> PluginNeed:
    """What the served table with an "off" range needs: the plugin ``backend`` names
    (``describe()["k0_skip"]``), the stack's version, and the fallback for a server without it
    (:func:`autotune.decide.selection.fallback_schedule`, from the points served beside the table)."""
    described = backend.describe()
    names = described["k0_skip"]
    point = served.find(k_positive)[0] if k_positive is not None else None
    pairs, why = fallback_schedule(
        point, served.find(constant.knobs)[0], served.find(off.knobs)[0], batch_sizes, why_not
    )
    need = PluginNeed(names["plugin"], names["env"], pairs, described.get("version"), why)
    say(
        f"the table's K=0 range is speculation off only with the {need.plugin} ({need.env}=1, vLLM "
        f"{need.vllm_version}); without it serve {table_text(need.fallback)}: {need.fallback_reason}"
    )
    return need


def level_ratios(levels: list[LevelChoice], pool: list[Point], chosen: Point) -> dict[int, Estimate]:
    """By batch size, the paired ratio of each level's choice over ``chosen`` (the configuration the
    profile serves) at that level: :func:`autotune.decide.selection.score_ratio` of the two
    :func:`autotune.decide.selection.at_level` views, as the per-level rule compares them.

    Only where both were measured in one paired re-measurement (``pool``, which holds ``chosen``)
    with equally many rounds there, and the choice is another configuration than ``chosen`` (its
    ratio over itself is 1 by construction, so it is left out rather than written as 1 (1-1)); and
    only when ``chosen`` is what a stack serves as K (a constant chain, speculation off, or a
    table), since that is what ``autotune watch`` compares the choice with.

    Example:
        >>> def pt(g, rounds):
        ...     return Point(Knobs("model", g), 0, 0, per_batch={4: rounds[0]}, per_batch_rounds={4: rounds})
        >>> off, k3 = pt(0, (100.0, 104.0, 98.0)), pt(3, (150.0, 160.0, 155.0))
        >>> r = level_ratios([LevelChoice(4, at_level(k3, 4), "")], [off, k3], off)[4]
        >>> round(r.value, 3), round(r.low, 3), round(r.high, 3), r.n
        (1.54, 1.442, 1.644, 3)
        >>> level_ratios([LevelChoice(4, at_level(off, 4), "")], [off, k3], off)
        {}
    """
    k = chosen.knobs
    if not (k.gamma == 0 or k.is_static_chain or k.is_table):
        return {}
    out: dict[int, Estimate] = {}
    for c in levels:
        b = c.batch_size
        p = next((q for q in pool if q.knobs == c.point.knobs), None)
        if p is None or p.knobs == k or b not in p.per_batch or b not in chosen.per_batch:
            continue
        mine, theirs = p.per_batch_rounds.get(b, ()), chosen.per_batch_rounds.get(b, ())
        if mine and len(mine) == len(theirs):
            out[b] = score_ratio(at_level(p, b), at_level(chosen, b))
    return out


def _schedule(
    cfg: TuneConfig, chosen: Chosen, point: Point, off: Point, contest: TableContest
) -> BatchSchedule:
    """What the stacks are given per batch size: the served table where it won, else the chosen K at
    every level; each entry with the chosen configuration's measurement there, its paired ratio
    over no speculation, and the K the per-level rule chose there (``level_gamma``)."""
    level_gamma = {c.batch_size: c.gamma for c in contest.levels}
    gamma = chosen.gamma
    if chosen.best_chain is not MISSING and chosen.best_chain is not None:
        gamma = int(chosen.best_chain["gamma"])  # a tree was chosen: chain-only stacks get the best chain
    entries = []
    for b in cfg.batch_sizes:
        entry: dict[str, Any] = {
            "batch_size": b,
            "gamma": point.knobs.gamma_at(b) if point.knobs.is_table else gamma,
        }
        if b in point.per_batch:
            entry["tokens_per_second"] = point.per_batch[b]
        if b in off.per_batch:
            entry["baseline_tokens_per_second"] = off.per_batch[b]
        mine, base = point.per_batch_rounds.get(b, ()), off.per_batch_rounds.get(b, ())
        if mine and len(mine) == len(base) and point.knobs != off.knobs:
            ratio = paired_ratio(mine, base)
            entry.update(ratio=ratio.as_dict(), significant=significant(ratio))
        extra = {"level_gamma": level_gamma[b]} if b in level_gamma else {}
        entries.append(ScheduleEntry(**{k: entry[k] for k in ScheduleEntry.KEYS if k in entry}, extra=extra))
    crossover = None
    for e in reversed(entries):
        if e.gamma != 0:
            break
        crossover = e.batch_size
    return BatchSchedule(tuple(entries), crossover)


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


def _best_chain(points: list[Point], remeasured: list[Point], drafter: str) -> dict[str, Any] | None:
    """The fastest measured chain of the chosen tree's drafter (re-measured medians first): what
    chain-only stacks get."""
    for pool in (remeasured, points):
        chains = [p for p in pool if not p.knobs.is_tree and p.knobs.drafter == drafter and p.knobs.gamma > 0]
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
    m = Measurement.from_json(measurement)
    if not m.has_engine:
        return []  # no engine prior to predict with
    if chosen.tree_nodes or (chosen.drafter == "eagle3" and m.acceptance.get("drafter") != "eagle3"):
        return []  # an EAGLE-3 head searched beside the draft model: the profiler timed the draft model
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
        # the sweep rounds its medians are of (a second look at every level: more; at some: per level)
        "repeats": len(chosen_point.rounds),
        "acceptance_rate": _mean([lv.acceptance_rate for lv in chosen_result.per_level.values()]),
    }


def build_profile(
    ctx: Context, space: Space, measurement: dict, study: optuna.Study, decision: Decision
) -> Profile:
    """The profile (the study's budget, host noise, backend and id are added when it is stored).

    Long because: it assembles the profile's sections in their stored order.
    """
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
            "draft": str(cfg.draft_folder) if ctx.draft_hash else None,  # the draft model or EAGLE-3 head
            "drafter": ctx.pair_drafter,
            "target_hash": ctx.target_hash,
            "draft_hash": ctx.draft_hash,
            **(
                {"eagle3": str(cfg.head_beside), "eagle3_hash": ctx.head_hash}
                if cfg.head_beside is not None
                else {}
            ),
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
        selection={
            "rule": "knee" if cfg.objectives.knee else "throughput",
            "met_slo": d.choice.met_slo,
            "reason": d.choice.reason,
            "trial": d.choice.point.number,
        },
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
        remeasure=d.remeasured.to_json(),
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
        table_decision=d.table.table_decision(),
    )


def _ci(xs: list[float]) -> list[float]:
    e = estimate(xs)
    return [e.low, e.high]


def _mean(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None
