"""Small statistics for decisions on a noisy host: medians, 95% intervals, paired ratios.

Pure functions over lists of repeated measurements (no numpy, no scipy):

- :func:`estimate`: median of repeats with a Student-t 95% interval of their mean;
- :func:`paired_ratio`: A/B from paired rounds (A and B measured in the same round, so drift
  hits both): one ratio per round, then the geometric mean of the ratios with the t interval of
  their logarithms (exponentiated), which keeps the interval of A/B the reciprocal of B/A's;
- :func:`bridged_ratio`: A/B measured in two groups, each beside one bridge configuration;
- :func:`pairable`: whether series can be paired round by round at all;
- :func:`paired_half_width`: the interval a paired ratio will have, from the noise and the rounds;
- :func:`significant`: whether an interval of a ratio excludes 1 in A's favour;
- :func:`significantly_below`: whether it lies wholly below a bar (1: A is worse);
- :func:`bootstrap_interval`: a seeded percentile bootstrap of any statistic, for quantities
  that are not means (the profiler's verify cost and knee).

With one repeat there is no spread to estimate: the interval collapses onto the value and the
caller decides on the point (as a single run always did).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

CONFIDENCE = 0.95

# two-sided 95% Student-t quantiles t_{0.975, df} for df = 1..30; beyond, the normal 1.96
_T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


def t975(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom (1.96 beyond 30).

    Example:
        >>> t975(2), t975(100)
        (4.303, 1.96)
    """
    if df < 1:
        raise ValueError(f"t975: need df >= 1, got {df}")
    return _T975[df - 1] if df <= len(_T975) else 1.96


@dataclass(frozen=True)
class Estimate:
    """A repeated quantity: its point value, 95% interval and number of repeats."""

    value: float
    low: float
    high: float
    n: int

    def as_dict(self) -> dict:
        return {"value": self.value, "ci95": [self.low, self.high], "n": self.n}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Estimate:
        """The estimate :meth:`as_dict` stored (extra keys, such as a benchmark's ``across``, ignored).

        Example:
            >>> Estimate.from_dict({"value": 1.2, "ci95": [1.1, 1.3], "n": 3, "across": "bridge"})
            Estimate(value=1.2, low=1.1, high=1.3, n=3)
        """
        low, high = d["ci95"]
        return cls(float(d["value"]), float(low), float(high), int(d["n"]))

    def cell(self, fmt: str = ".2f") -> str:
        """A table cell: ``1.23 (1.10-1.35)``; a single repeat, which has no interval, just ``1.23``.

        Example:
            >>> Estimate(1.234, 1.1, 1.35, 4).cell(), Estimate(1.234, 1.234, 1.234, 1).cell()
            ('1.23 (1.10-1.35)', '1.23')
        """
        if self.n < 2:
            return f"{self.value:{fmt}}"
        return f"{self.value:{fmt}} ({self.low:{fmt}}-{self.high:{fmt}})"

    def text(self, fmt: str = ".2f", unit: str = "") -> str:
        """``1.62x (95% CI 1.51-1.70)``; a single repeat says ``(1 run, no interval)``.

        Example:
            >>> Estimate(1.62, 1.512, 1.70, 5).text(unit="x")
            '1.62x (95% CI 1.51-1.70)'
        """
        if self.n < 2:
            return f"{self.value:{fmt}}{unit} (1 run, no interval)"
        return f"{self.value:{fmt}}{unit} (95% CI {self.low:{fmt}}-{self.high:{fmt}})"


def _t_interval(xs: Sequence[float]) -> tuple[float, float]:
    mean = statistics.fmean(xs)
    if len(xs) < 2:
        return mean, mean
    half = t975(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
    return mean - half, mean + half


def estimate(xs: Sequence[float]) -> Estimate:
    """Median of the repeats and the t 95% interval of their mean.

    Example:
        >>> e = estimate([100.0, 104.0, 96.0])
        >>> e.value, round(e.low, 1), round(e.high, 1), e.n
        (100.0, 90.1, 109.9, 3)
    """
    if not xs:
        raise ValueError("estimate: no values")
    low, high = _t_interval([float(x) for x in xs])
    return Estimate(float(statistics.median(xs)), low, high, len(xs))


def _log_ratios(a: Sequence[float], b: Sequence[float], who: str) -> list[float]:
    """log(a_r / b_r) per round; ValueError (naming ``who``) on unequal rounds or values <= 0."""
    if len(a) != len(b) or not a:
        raise ValueError(f"{who}: need equally many rounds (got {len(a)} and {len(b)})")
    if any(x <= 0 for x in (*a, *b)):
        raise ValueError(f"{who}: values must be positive")
    return [math.log(x / y) for x, y in zip(a, b, strict=True)]


def pairable(*series: Sequence[float | None]) -> bool:
    """True when the series can be paired round by round (:func:`paired_ratio`,
    :func:`bridged_ratio`): equally many rounds, at least one, every value a positive number (a
    round that measured nothing is None in a stored record).

    Example:
        >>> pairable([1.0, 2.0], [3.0, 4.0]), pairable([1.0], [3.0, 4.0]), pairable([1.0, None], [3.0, 4.0])
        (True, False, False)
    """
    n = len(series[0]) if series else 0
    return n > 0 and all(len(s) == n and all(x is not None and x > 0 for x in s) for s in series)


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> Estimate:
    """A/B from paired rounds: geometric mean of the per-round ratios, t interval on their logs.

    Example:
        >>> r = paired_ratio([150.0, 160.0, 155.0], [100.0, 104.0, 98.0])
        >>> round(r.value, 3), round(r.low, 3), round(r.high, 3)
        (1.54, 1.442, 1.644)
        >>> paired_ratio([2.0], [1.0]).text(unit="x")
        '2.00x (1 run, no interval)'
    """
    logs = _log_ratios(a, b, "paired_ratio")
    low, high = _t_interval(logs)
    return Estimate(math.exp(statistics.fmean(logs)), math.exp(low), math.exp(high), len(logs))


def bridged_ratio(
    a: Sequence[float], a_bridge: Sequence[float], b_bridge: Sequence[float], b: Sequence[float]
) -> Estimate:
    """A/B where A and B were measured apart (two interleaved groups), each beside the same bridge
    configuration: (A/bridge in A's group) x (bridge/B in B's group), each a :func:`paired_ratio`.

    The two log ratios are independent, so their variances add; the interval is Student's t with
    Welch-Satterthwaite degrees of freedom. Drift between the groups cancels (the bridge moved with
    it); the price is the bridge's own round-to-round noise, counted twice.

    Example:
        >>> r = bridged_ratio([150.0, 160.0, 155.0], [100.0, 104.0, 98.0], [90.0, 95.0], [60.0, 64.0])
        >>> round(r.value, 3), r.n, r.low < r.value < r.high
        (2.297, 2, True)
        >>> bridged_ratio([2.0], [1.0], [1.0], [1.0]).text(unit="x")
        '2.00x (1 run, no interval)'
    """
    parts = [_log_ratios(a, a_bridge, "bridged_ratio"), _log_ratios(b_bridge, b, "bridged_ratio")]
    mean = sum(statistics.fmean(logs) for logs in parts)
    n = min(len(logs) for logs in parts)
    if n < 2:
        return Estimate(math.exp(mean), math.exp(mean), math.exp(mean), 1)
    var = [statistics.variance(logs) / len(logs) for logs in parts]
    se = math.sqrt(sum(var))
    if se == 0.0:
        return Estimate(math.exp(mean), math.exp(mean), math.exp(mean), n)
    df = sum(var) ** 2 / sum(v * v / (len(logs) - 1) for v, logs in zip(var, parts, strict=True))
    half = t975(max(1, math.floor(df))) * se
    return Estimate(math.exp(mean), math.exp(mean - half), math.exp(mean + half), n)


def paired_half_width(cv: float, rounds: int) -> float:
    """The half-width of the 95% interval (relative) that a :func:`paired_ratio` of two
    configurations, each with round-to-round coefficient of variation ``cv``, is expected to have
    over ``rounds`` rounds: the log ratio's spread is about cv x sqrt 2 (two independent noises),
    its interval Student's t. For sizing a measurement: how many rounds (or requests per round) a
    wanted interval needs.

    Example:
        >>> round(paired_half_width(0.05, 4), 3), round(paired_half_width(0.05, 16), 3)
        (0.113, 0.038)
    """
    if rounds < 2:
        raise ValueError(f"paired_half_width: need rounds >= 2, got {rounds}")
    return t975(rounds - 1) * cv * math.sqrt(2.0) / math.sqrt(rounds)


def significant(ratio: Estimate) -> bool:
    """True when the ratio's interval excludes 1 in A's favour (A is better).

    With one round there is no interval: the point decides (> 1), as a single run always did.

    Example:
        >>> significant(Estimate(1.03, 0.95, 1.11, 5)), significant(Estimate(1.2, 1.05, 1.4, 5))
        (False, True)
    """
    return ratio.value > 1.0 if ratio.n < 2 else ratio.low > 1.0


def significantly_below(ratio: Estimate, bar: float = 1.0) -> bool:
    """True when the ratio's interval lies wholly below ``bar``: A is significantly worse than
    ``bar`` x B (with the default bar, worse than B). One round: the point decides (< ``bar``).

    Example:
        >>> significantly_below(Estimate(0.9, 0.85, 0.96, 5)), significantly_below(Estimate(0.9, 0.85, 0.96, 5), 0.8)
        (True, False)
        >>> significantly_below(Estimate(0.96, 0.9, 1.02, 5), 0.97)
        False
    """
    return ratio.value < bar if ratio.n < 2 else ratio.high < bar


def describe_difference(ratio: Estimate, what: str = "ratio") -> str:
    """The one-phrase verdict on a ratio A/B: significantly better / worse, or no significant difference.

    Example:
        >>> describe_difference(Estimate(1.03, 0.95, 1.11, 5))
        'no significant difference (ratio 1.03, 95% CI 0.95-1.11)'
        >>> describe_difference(Estimate(1.4, 1.2, 1.6, 5), "tokens/s")
        'significantly better (tokens/s 1.40, 95% CI 1.20-1.60)'
        >>> describe_difference(Estimate(0.7, 0.6, 0.8, 5))
        'significantly worse (ratio 0.70, 95% CI 0.60-0.80)'
        >>> describe_difference(Estimate(1.9, 1.9, 1.9, 1))
        'better on one round (ratio 1.90, no interval: the noise is not measured)'
    """
    if ratio.n < 2:  # one round: the point decides, and the text does not claim a test it did not run
        verdict = "better" if ratio.value > 1.0 else "worse" if ratio.value < 1.0 else "no different"
        return f"{verdict} on one round ({what} {ratio.value:.2f}, no interval: the noise is not measured)"
    body = f"{what} {ratio.value:.2f}, 95% CI {ratio.low:.2f}-{ratio.high:.2f}"
    verdict = (
        "significantly better"
        if significant(ratio)
        else "significantly worse"
        if significantly_below(ratio)
        else "no significant difference"
    )
    return f"{verdict} ({body})"


def bootstrap_interval(
    samples: Sequence[Sequence[float]], statistic: Callable[..., float], n_boot: int = 1000, seed: int = 0
) -> tuple[float, float]:
    """Seeded percentile-bootstrap 95% interval of ``statistic(*resampled)``.

    Each sequence in ``samples`` is resampled independently (with replacement, same length).

    Example:
        >>> lo, hi = bootstrap_interval([[1.0, 1.1, 0.9, 1.0]], lambda xs: statistics.median(xs))
        >>> 0.9 <= lo <= 1.0 <= hi <= 1.1
        True
    """
    rng = random.Random(seed)
    values = sorted(statistic(*[[rng.choice(s) for _ in s] for s in samples]) for _ in range(n_boot))
    return _percentile(values, 0.025), _percentile(values, 0.975)


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)
