"""Choosing the result of a study: Pareto front, SLO-feasible winner, per-load-level choices, the table's verdict.

Pure functions over :class:`Point` records (one per trial or re-measurement), so the rules are
tested on synthetic fronts without running anything.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from autotune.knobs import Knobs, table_text
from autotune.records import Point
from autotune.stats import Estimate, describe_difference, paired_ratio, significant


def pareto_front(points: Sequence[Point]) -> list[Point]:
    """Non-dominated points (max tokens/s, min latency), sorted by tokens/s descending.

    Example:
        >>> k = Knobs("model", 2)
        >>> a, b, c = Point(k, 10, 5), Point(k, 8, 3), Point(k, 7, 6)
        >>> [p.tokens_per_second for p in pareto_front([a, b, c])]
        [10, 8]
    """
    front = [
        p
        for p in points
        if not any(
            q.tokens_per_second >= p.tokens_per_second
            and q.latency_ms <= p.latency_ms
            and (q.tokens_per_second > p.tokens_per_second or q.latency_ms < p.latency_ms)
            for q in points
        )
    ]
    return sorted(front, key=lambda p: (-p.tokens_per_second, p.latency_ms))


def knee_point(front: Sequence[Point]) -> Point:
    """The front's balanced point: the best tokens/s per ms of latency.

    Relative gains trade one for one (10% more throughput is worth 10% more latency), so the
    rule is scale-free and, unlike a distance to the front's corners, never ties on a front of
    two points. Ties go to the higher throughput.
    """
    return max(
        front,
        key=lambda p: (
            math.log(max(p.tokens_per_second, 1e-12)) - math.log(max(p.latency_ms, 1e-12)),
            p.tokens_per_second,
        ),
    )


@dataclass(frozen=True)
class Choice:
    point: Point
    met_slo: bool
    reason: str


def choose(points: Sequence[Point], has_slo: bool, knee: bool = False) -> Choice:
    """Highest tokens/s (meeting every SLO when there are SLOs); ``knee`` (without SLOs only): the
    knee of the Pareto front instead.

    Throughput is the default because the knee trades it one for one against a p95 latency of a
    few requests, and chose no speculation where a drafter was significantly faster at every load
    level (docs/decisions.md#throughput-not-knee). A latency bound is an SLO.

    When nothing meets the SLOs, the point with the smallest violation is returned with
    ``met_slo=False`` so the caller can say what came closest.
    """
    if not points:
        raise ValueError("choose: no measured points")
    if has_slo:
        feasible = [p for p in points if p.feasible]
        if feasible:
            best = max(feasible, key=lambda p: (p.tokens_per_second, -p.latency_ms))
            return Choice(best, True, "highest throughput meeting every SLO")
        closest = min(points, key=lambda p: (p.violation, -p.tokens_per_second))
        return Choice(closest, False, "no configuration met the SLOs; this one came closest")
    if knee:
        return Choice(knee_point(pareto_front(points)), True, "knee of the Pareto front (no SLOs set)")
    best = max(points, key=lambda p: (p.tokens_per_second, -p.latency_ms))
    return Choice(best, True, "highest throughput (no SLOs set)")


def score_ratio(a: Point, b: Point) -> Estimate:
    """A over B in tokens/s (the throughput objective), from paired rounds when both have them.

    The rule *ranks* by tokens/s or (``objectives.choose: knee``) tokens/s per ms of latency, but a
    configuration *replaces* a simpler one only on throughput: the knee score divides by a
    p95 latency of a few requests, whose round-to-round noise hid a throughput gain that every
    batch size's own ratio showed (docs/decisions.md#replace-on-throughput). Points without
    (equally many) rounds compare as one run each.
    """

    def scores(p: Point) -> list[float]:
        rounds = p.rounds or ((p.tokens_per_second, p.latency_ms),)
        return [t for t, _ in rounds]

    sa, sb = scores(a), scores(b)
    if len(sa) != len(sb):
        sa, sb = (
            scores(Point(a.knobs, a.tokens_per_second, a.latency_ms)),
            scores(Point(b.knobs, b.tokens_per_second, b.latency_ms)),
        )
    return paired_ratio([max(x, 1e-12) for x in sa], [max(x, 1e-12) for x in sb])


def choose_with_margin(points: Sequence[Point], has_slo: bool, knee: bool = False) -> Choice:
    """:func:`choose`, except that a configuration replaces a simpler one only by a margin.

    The rule's winner must beat every eligible point of a simpler structure (no speculation, then a
    constant chain without threshold, ...: :attr:`Knobs.structure`; with SLOs only feasible ones)
    with a ratio interval excluding 1 (:func:`autotune.stats.significant`). Otherwise it leaves the
    pool, the rule picks again, and the reason says which comparison was not significant. Between
    two K of one structure the faster wins on its measurement: a smaller K is no safer a choice, and
    demanding a margin there kept a K that then ran slower (docs/decisions.md#no-margin-between-k).
    When nothing meets the SLOs, the closest point is returned as before.

    Example:
        >>> ar = Point(Knobs("model", 0), 100, 10, rounds=((100, 10), (104, 10), (96, 10)))
        >>> g4 = Point(Knobs("model", 4), 103, 10, rounds=((103, 10), (99, 10), (106, 10)))
        >>> c = choose_with_margin([ar, g4], has_slo=False)
        >>> c.point is ar, c.reason.split(";")[1].strip()[:45]
        (True, 'kept gamma=0 (no speculation): gamma=4 thr=0.')
    """
    pool = list(points)
    notes: list[str] = []
    while True:
        choice = choose(pool, has_slo, knee)
        winner = choice.point
        if not choice.met_slo:
            return choice
        simpler = sorted(
            (
                p
                for p in pool
                if p is not winner
                and (p.feasible or not has_slo)
                and p.knobs.structure < winner.knobs.structure
            ),
            key=lambda p: p.knobs.simplicity,
        )
        blocked = None
        for s in simpler:
            ratio = score_ratio(winner, s)
            if not significant(ratio):
                blocked = (s, ratio)
                break
        if blocked is None:
            reason = choice.reason
            if notes:
                reason += "; kept " + winner.knobs.label + ": " + "; ".join(notes)
            elif simpler:
                ratio = score_ratio(winner, simpler[0])
                reason += f"; over {simpler[0].knobs.label}: {describe_difference(ratio)}"
            else:  # the simplest won outright: say how the runner-up compared
                others = [p for p in pool if p is not winner and (p.feasible or not has_slo)]
                if others:
                    runner_up = choose(others, has_slo, knee).point
                    ratio = score_ratio(runner_up, winner)
                    reason += f"; {runner_up.knobs.label} vs it: {describe_difference(ratio)}"
            return Choice(winner, choice.met_slo, reason)
        s, ratio = blocked
        notes.append(f"{winner.knobs.label} vs {s.knobs.label}: {describe_difference(ratio)}")
        pool = [p for p in pool if p is not winner]


@dataclass(frozen=True)
class LevelChoice:
    """The configuration chosen at one load level (``point`` is its view at that level:
    :func:`at_level`), and why."""

    batch_size: int
    point: Point
    reason: str

    @property
    def gamma(self) -> int:
        return self.point.knobs.gamma


def at_level(p: Point, b: int) -> Point:
    """``p`` as measured at load level ``b``: its tokens/s and paired rounds there (latency not kept)."""
    rounds = tuple((t, 0.0) for t in p.per_batch_rounds.get(b, ()))
    return Point(p.knobs, p.per_batch[b], 0.0, number=p.number, rounds=rounds)


def level_pool(points: Sequence[Point], b: int, drafter: str, with_off: bool = True) -> list[Point]:
    """The candidates of load level ``b``: speculation off (unless ``with_off`` is False) and every
    constant K of ``drafter`` (static chains: what a stack's K and a table's entries are), each with
    paired rounds at ``b``."""
    return [
        p
        for p in points
        if b in p.per_batch
        and p.per_batch_rounds.get(b)
        and ((p.knobs.gamma == 0 and with_off) or (p.knobs.is_static_chain and p.knobs.drafter == drafter))
    ]


def per_level_choices(
    points: Sequence[Point],
    batch_sizes: Sequence[int],
    drafter: str,
    anchor: Knobs,
    with_off: bool = True,
) -> list[LevelChoice]:
    """At each load level, the best K there: the best constant (``anchor``: the configuration chosen
    over the whole workload, or its best constant K) unless another K is significantly faster at
    that level.

    The pool at level ``b`` is :func:`level_pool`. A table's K=0 range is not speculation off:
    the drafter still reads every new token there (the engine's ``Drafter.catch_up``, vLLM's
    proposer keeping the draft's KV cache in sync), so the K a table holds are chosen with
    ``with_off=False``. The fastest of the
    pool that beats the anchor there with a paired-ratio interval excluding 1 replaces it at that
    level; otherwise the anchor stays and the reason gives the comparison. Anchoring on the
    constant, rather than on the simplest K, means a table departs from the constant only where
    the measurement says it must: on noisy rounds the table *is* the constant, and a stack is given
    one K.

    Example:
        >>> def pt(g, *tps):
        ...     return Point(Knobs("model", g), 0, 0, per_batch={1: tps[0], 8: tps[-1]},
        ...                  per_batch_rounds={1: tps[:3], 8: tps[3:]})
        >>> pts = [pt(0, 50, 52, 51, 200, 204, 198), pt(2, 80, 82, 79, 190, 196, 191),
        ...        pt(5, 99, 103, 100, 170, 172, 171)]
        >>> [(c.batch_size, c.gamma) for c in per_level_choices(pts, [1, 8], "model", pts[2].knobs)]
        [(1, 5), (8, 0)]
        >>> [(c.batch_size, c.gamma) for c in per_level_choices(pts, [1, 8], "model", pts[2].knobs, False)]
        [(1, 5), (8, 2)]

    Long because: one rule and its cases, kept together so it reads as docs/architecture.md states it.
    """
    out = []
    for b in batch_sizes:
        pool = [at_level(p, b) for p in level_pool(points, b, drafter, with_off)]
        sizes = {len(p.rounds) for p in pool}
        base = next((p for p in pool if p.knobs == anchor), None)
        if base is None or len(sizes) != 1:
            continue
        faster = []
        for p in pool:
            if p is base or p.tokens_per_second <= base.tokens_per_second:
                continue
            ratio = score_ratio(p, base)
            faster.append((p, ratio))
        better = [(p, r) for p, r in faster if significant(r)]
        if better:
            p, ratio = max(better, key=lambda pr: pr[0].tokens_per_second)
            reason = f"{p.knobs.label} over the constant {base.knobs.label}: {describe_difference(ratio)}"
            out.append(LevelChoice(b, p, reason))
            continue
        if faster:
            p, ratio = max(faster, key=lambda pr: pr[0].tokens_per_second)
            reason = (
                f"kept the constant {base.knobs.label}: the fastest here, {p.knobs.label}, "
                f"{describe_difference(ratio)}"
            )
        else:
            reason = f"the constant {base.knobs.label} is the fastest here"
        out.append(LevelChoice(b, base, reason))
    return out


def table_of(choices: Sequence[LevelChoice]) -> tuple[tuple[int, int], ...]:
    """The by-batch-size table the per-level choices make: ``((batch_size, K), ...)``."""
    return tuple(sorted((c.batch_size, c.gamma) for c in choices))


@dataclass(frozen=True)
class TablePlan:
    """What the per-level choices say and the table they make.

    ``levels``: the best K at each load level, speculation off included (the measurement's word,
    stored); ``holds``: the K a table holds there: where the stack runs the drafter at a table's K=0,
    chosen with ``with_off=False`` and anchored on the best constant K (such a K=0 range is not
    "off"), where it skips the drafter there, the ``levels`` themselves;
    ``table``: ``table_of(holds)``; ``unserved``: why serving it would tell nothing (one K at every
    level, or a level where the constants already show it would lose), "" when it is worth serving;
    ``fallback``: where the table holds a K=0 range only a stack that skips the drafter serves as
    off, the K >= 1 plan, for a stack without the skip (None otherwise).
    """

    levels: list[LevelChoice]
    holds: list[LevelChoice]
    table: tuple[tuple[int, int], ...]
    drafter: str
    unserved: str
    fallback: TablePlan | None = None


def plan_table(
    points: Sequence[Point],
    batch_sizes: Sequence[int],
    constant: Point,
    best_static: Point | None,
    drafter: str,
    skips_drafter_at_k0: bool = False,
) -> TablePlan:
    """The per-level choices anchored on ``constant`` (the best constant over the workload: one K, or
    none), and the table to serve.

    Where a table's K=0 range still runs the drafter (``skips_drafter_at_k0`` False: the engine,
    vLLM as shipped), the table holds K >= 1 at every level (:func:`k_positive_plan`). Where the
    stack skips the drafter at K=0 (vLLM with the spec-autotune plugin), a K=0 range is speculation
    off, so a table whose per-level choices say "off" somewhere holds those choices themselves: they
    depart from the constant only where significantly faster than it, so whenever they differ by
    level the table is worth serving; its ``fallback`` is the K >= 1 plan, what a stack without the
    skip serves instead. Per-level choices without "off" make the same table either way.

    Example:
        >>> def pt(g, r1, r8):
        ...     return Point(Knobs("model", g), 0, 0, per_batch={1: r1[0], 8: r8[0]},
        ...                  per_batch_rounds={1: r1, 8: r8})
        >>> off = pt(0, (50, 52, 51), (200, 204, 198))
        >>> k2, k5 = pt(2, (80, 82, 79), (190, 196, 191)), pt(5, (99, 103, 100), (170, 172, 171))
        >>> plan_table([off, k2, k5], [1, 8], k5, k5, "model").table
        ((1, 5), (8, 2))
        >>> plan = plan_table([off, k2, k5], [1, 8], k5, k5, "model", skips_drafter_at_k0=True)
        >>> plan.table, plan.unserved, plan.fallback.table
        (((1, 5), (8, 0)), '', ((1, 5), (8, 2)))
    """
    plan = k_positive_plan(points, batch_sizes, constant, best_static, drafter)
    choices = [c.gamma for c in plan.levels]
    off_somewhere = len(choices) == len(batch_sizes) and 0 in choices and len(set(choices)) > 1
    if not (skips_drafter_at_k0 and off_somewhere):
        return plan
    return TablePlan(plan.levels, plan.levels, table_of(plan.levels), plan.drafter, "", fallback=plan)


def k_positive_plan(
    points: Sequence[Point],
    batch_sizes: Sequence[int],
    constant: Point,
    best_static: Point | None,
    drafter: str,
) -> TablePlan:
    """The per-level choices anchored on ``constant`` (the best constant over the workload: one K, or
    none), and the table to serve where a table's K=0 range still runs the drafter: K >= 1 at every
    level, anchored on ``constant`` where it is a K,
    else on ``best_static``; ``drafter`` is the chosen configuration's, used where neither is a K.

    The table is not worth serving when it holds one K at every level (it is that constant), when
    at some level the constant is significantly faster than the K the table holds there, or when at
    no level that K is significantly faster than the constant: a table serves each level at that
    level's K, whose constant was measured there, so it would lose :func:`table_verdict` (a stack's
    table bookkeeping only adds cost).

    Example:
        >>> def pt(g, r1, r8):
        ...     return Point(Knobs("model", g), 0, 0, per_batch={1: r1[0], 8: r8[0]},
        ...                  per_batch_rounds={1: r1, 8: r8})
        >>> off = pt(0, (50, 52, 51), (200, 204, 198))
        >>> k2, k5 = pt(2, (80, 82, 79), (190, 196, 191)), pt(5, (99, 103, 100), (170, 172, 171))
        >>> plan = k_positive_plan([off, k2, k5], [1, 8], k5, k5, "model")
        >>> [c.gamma for c in plan.levels], plan.table, plan.unserved
        ([5, 0], ((1, 5), (8, 2)), '')
        >>> k_positive_plan([off, k2, k5], [1, 8], off, k5, "model").unserved[-47:]
        'the table cannot win there, so it is not served'

    Long because: one rule and its cases, kept together so it reads as docs/architecture.md states it.
    """
    if constant.knobs.gamma > 0:
        drafter = constant.knobs.drafter
    elif best_static is not None:
        drafter = best_static.knobs.drafter
    levels = per_level_choices(points, batch_sizes, drafter, constant.knobs)
    per_level = ", ".join(f"{c.batch_size}: {c.gamma}" for c in levels)
    spec = constant if constant.knobs.gamma > 0 else best_static
    holds = []
    if spec is not None and spec.knobs.gamma > 0:
        holds = per_level_choices(points, batch_sizes, drafter, spec.knobs, with_off=False)
    table = table_of(holds)

    def plan(unserved: str) -> TablePlan:
        return TablePlan(levels, holds, table, drafter, unserved)

    if len(levels) < len(batch_sizes):
        return plan("not every load level has paired per-level measurements")
    if len({c.gamma for c in levels}) == 1:
        return plan(f"the per-level choices agree on K={levels[0].gamma} at every load level ({per_level})")
    if spec is None or spec.knobs.gamma == 0:
        return plan(
            f"per-level choices {per_level}; no constant K was re-measured: a table has nothing to hold"
        )
    if len(holds) < len(batch_sizes):
        return plan("not every load level has paired per-level measurements")
    if len({g for _, g in table}) == 1:
        return plan(
            f"per-level choices {per_level}; a table holds K >= 1 (its K=0 range still runs the "
            f"drafter), here K={table[0][1]} at every level: one K, no table"
        )
    gains = False
    for c in holds:
        const = at_level(constant, c.batch_size)
        if c.point.knobs == const.knobs:
            continue
        if const.tokens_per_second < c.point.tokens_per_second:
            gains = gains or significant(score_ratio(c.point, const))
            continue
        ratio = score_ratio(const, c.point)
        if significant(ratio):
            return plan(
                f"per-level choices {per_level}; the table {table_text(table)} holds K={c.gamma} at "
                f"batch {c.batch_size}, where the constant {constant.knobs.label} measured "
                f"{describe_difference(ratio)} over it: the table cannot win there, so it is not served"
            )
    if not gains:
        return plan(
            f"per-level choices {per_level}; the table {table_text(table)} holds no K significantly "
            f"faster than the constant {constant.knobs.label} at any level, so it cannot win: not served"
        )
    return plan("")


@dataclass(frozen=True)
class TableVerdict:
    """Whether a served table replaces the best constant: per level, its paired ratios over the
    constant and over no speculation; ``won`` and the reason in one sentence with the numbers."""

    won: bool
    per_level: list[dict]
    reason: str


def table_verdict(table: Point, constant: Point, off: Point, batch_sizes: Sequence[int]) -> TableVerdict:
    """The table wins when, served live, it beats the best constant significantly at one load level at
    least and is not significantly worse than it at any (the interval of the paired per-level ratio).

    All three points come from the same interleaved re-measurement (paired rounds per level), so
    the table's own serving cost (a stack's dynamic-K bookkeeping) is in what is compared.

    Example:
        >>> def pt(k, r1, r8):
        ...     return Point(k, 0, 0, per_batch={1: r1[0], 8: r8[0]}, per_batch_rounds={1: r1, 8: r8})
        >>> off = pt(Knobs("model", 0), (50, 52, 51), (200, 204, 198))
        >>> k5 = pt(Knobs("model", 5), (99, 103, 100), (170, 172, 171))
        >>> tab = pt(Knobs.for_table("model", ((1, 5), (8, 0)), 8), (98, 104, 100), (199, 203, 197))
        >>> v = table_verdict(tab, k5, off, [1, 8])
        >>> v.won, [lv["significant_over_constant"] for lv in v.per_level]
        (True, [False, True])
    """
    rows: list[dict] = []
    better: list[tuple[int, Estimate]] = []
    worse: list[tuple[int, Estimate]] = []
    for b in batch_sizes:
        t, c, o = (p.per_batch_rounds.get(b, ()) for p in (table, constant, off))
        if not t or len(t) != len(c) or len(t) != len(o):
            continue
        over_c, over_o = paired_ratio(t, c), paired_ratio(t, o)
        is_better = significant(over_c)
        is_worse = (over_c.value < 1.0) if over_c.n < 2 else over_c.high < 1.0
        rows.append(
            {
                "batch_size": b,
                "table_gamma": table.knobs.gamma_at(b),
                "constant_gamma": constant.knobs.gamma,
                "tokens_per_second": table.per_batch[b],
                "constant_tokens_per_second": constant.per_batch[b],
                "off_tokens_per_second": off.per_batch[b],
                "ratio_over_constant": over_c.as_dict(),
                "ratio_over_off": over_o.as_dict(),
                "significant_over_constant": is_better,
                "significantly_worse_than_constant": is_worse,
            }
        )
        (better if is_better else worse if is_worse else []).append((b, over_c))

    def where(found: list[tuple[int, Estimate]]) -> str:
        return ", ".join(f"batch {b}: {describe_difference(r)}" for b, r in found)

    name = f"{table.knobs.label} vs the best constant ({constant.knobs.label})"
    if not rows:
        return TableVerdict(False, rows, f"{name}: no paired per-level measurements")
    if worse:
        return TableVerdict(False, rows, f"{name}: worse at {where(worse)}")
    if not better:
        return TableVerdict(
            False, rows, f"{name}: not significantly better at any load level, so the constant stays"
        )
    return TableVerdict(True, rows, f"{name}: better at {where(better)}, not worse anywhere")


def fallback_schedule(
    k_positive: Point | None, constant: Point, off: Point, batch_sizes: Sequence[int], why_not: str
) -> tuple[tuple[tuple[int, int], ...], str]:
    """What a stack without the K=0 skip serves in place of a table with an "off" range, as
    ``(batch_size, K)`` pairs, and why: the K >= 1 table (``k_positive``, served live beside the
    table, the constant and off) where it wins :func:`table_verdict` there, else the best constant's
    K at every batch size (0: no speculation); ``why_not`` says why no K >= 1 table was served.

    Both were measured in the same re-measurement as the table, so the fallback is never a
    configuration the tool did not serve.

    Example:
        >>> def pt(k, r1, r8):
        ...     return Point(k, 0, 0, per_batch={1: r1[0], 8: r8[0]}, per_batch_rounds={1: r1, 8: r8})
        >>> off = pt(Knobs("model", 0), (50, 52, 51), (200, 204, 198))
        >>> k5 = pt(Knobs("model", 5), (99, 103, 100), (170, 172, 171))
        >>> k_pos = pt(Knobs.for_table("model", ((1, 5), (8, 2)), 8), (98, 104, 100), (190, 195, 191))
        >>> fallback_schedule(k_pos, k5, off, [1, 8], "")[0]
        ((1, 5), (8, 2))
        >>> pairs, why = fallback_schedule(None, k5, off, [1, 8], "one K at every level")
        >>> pairs, why[:36]
        (((1, 5), (8, 5)), 'the best constant gamma=5 thr=0.00 c')
    """
    if k_positive is not None:
        verdict = table_verdict(k_positive, constant, off, batch_sizes)
        if verdict.won:
            return tuple((b, k_positive.knobs.gamma_at(b)) for b in batch_sizes), verdict.reason
        why_not = verdict.reason
    pairs = tuple((b, constant.knobs.gamma) for b in batch_sizes)
    return pairs, f"the best constant {constant.knobs.label}, served live beside the table ({why_not})"
