"""The staleness rule: windows' assessments -> a verdict per window, fresh or stale, with hysteresis.

A window is *better* when it predicts some K above the served one; :class:`Staleness` turns the
profile stale once enough better windows run in a row and their pooled gain clears the margin
with an interval above 1, and fresh again after as many calm windows (docs/watch.md, the rule).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from autotune.errors import ConfigError
from autotune.stats import Estimate, paired_ratio
from autotune.watch.predict import Assessment


@dataclass(frozen=True)
class Verdict:
    """One window's verdict: the alternative, its gain over the served K (with an interval), the state."""

    assessment: Assessment
    alarm: bool  # this window predicts an alternative better than the served K by more than the margin
    streak: int  # consecutive better windows (when better) or calm ones (otherwise): Staleness
    alternative: int
    gain: Estimate  # pooled over the better run's last windows (Staleness; one window: a point)
    stale: bool
    changed: bool  # the state flipped at this window
    windows_to_stale: int
    idle: bool = False
    better: bool = False  # this window predicts an alternative better than the served K (gain > 1)
    interval_from: str = "windows"  # "tune": the gain's interval is the tune's measurement (tune_measured)


def tune_measured(assessments: Sequence[Assessment], k: int) -> Estimate | None:
    """The tune's measured ratio that gives the interval of these windows' gain of K=``k``, or None.

    Where a window has no live acceptance (speculation off, a quiet window), sits at a tuned level
    and names that level's measured choice over the profile's chosen K there, its prediction is a
    function of the profile alone: every such window is the same number, so the windows' spread
    (:func:`autotune.stats.paired_ratio` over them) is a zero-width interval that says nothing.
    The uncertainty there is the tune's own measurement of those two K at that level
    (``Assessment.measured``), so that is the interval, when every window carries the same one
    and names ``k``. Else None: the windows are the repeats.
    """
    found = {a.measured for a in assessments}
    measured = found.pop() if len(found) == 1 else None
    if measured is None or any(a.alternative != k for a in assessments):
        return None
    return measured


def scaled_to(gain: float, measured: Estimate) -> Estimate:
    """``measured``'s 95% interval scaled to the predicted ``gain``, with its rounds as n.

    Example:
        >>> e = scaled_to(1.14, Estimate(1.2, 1.08, 1.32, 3))
        >>> round(e.low, 3), round(e.high, 3), e.n
        (1.026, 1.254, 3)
    """
    return Estimate(
        gain, gain * measured.low / measured.value, gain * measured.high / measured.value, measured.n
    )


def streak_gain(assessments: Sequence[Assessment]) -> tuple[int, Estimate]:
    """The one K best over these windows and its gain over each window's served K, with a 95% interval.

    The K maximising the geometric mean of the per-window ratios; the interval is
    :func:`autotune.stats.paired_ratio` of the windows' predicted tokens/s (the windows are the
    repeats: their spread in acceptance and load is the noise), except where the gain rests on the
    profile alone: then it is the tune's measured one, scaled to the gain (:func:`tune_measured`).
    """
    n = min(len(a.tps) for a in assessments)

    def score(k: int) -> float:
        return sum(math.log(a.tps[k] / a.tps[a.served_k]) for a in assessments)

    best = max(range(n), key=lambda k: (score(k), -k))
    est = paired_ratio([a.tps[best] for a in assessments], [a.tps[a.served_k] for a in assessments])
    measured = tune_measured(assessments, best)
    return best, est if measured is None else scaled_to(est.value, measured)


class Staleness:
    """The hysteresis. A window is *better* when it predicts some K above the served one (gain > 1);
    the profile turns stale once ``windows_to_stale`` better windows run in a row and, pooled over
    the last of them (at most ``2 x windows_to_stale``: recent enough to follow a change), their
    common alternative's gain exceeds ``margin`` with the interval's lower bound above 1. It turns
    fresh again after as many *calm* windows in a row, whose gain is at most half the margin
    (1.025 for 1.05). Idle windows change nothing.

    The margin is held by the pooled gain, not by each window: where the true gain sits near the
    margin, single windows scatter to both sides of it and a rule that wanted every window above
    it never fired (docs/decisions.md#watch-pooled-gain); the band between half the margin and the
    margin keeps a stale verdict from flapping there.

    Example:
        >>> s = Staleness(windows_to_stale=1, margin=1.05)
        >>> s.stale, s.calm_below
        (False, 1.025)
    """

    def __init__(self, windows_to_stale: int = 3, margin: float = 1.05) -> None:
        if windows_to_stale < 1:
            raise ConfigError(f"--windows-to-stale: must be >= 1 (got {windows_to_stale})")
        if margin < 1.0:
            raise ConfigError(f"--margin: must be >= 1.0 (got {margin})")
        self.windows_to_stale, self.margin = windows_to_stale, margin
        self.calm_below = 1.0 + (margin - 1.0) / 2
        self.recent: deque[Assessment] = deque(maxlen=2 * windows_to_stale)  # the pool
        self.stale = False
        self.better = 0  # current run of windows predicting an alternative better (gain > 1)
        self.calm = 0  # current run of calm windows (gain <= calm_below)

    def update(self, a: Assessment) -> Verdict:
        n_needed = self.windows_to_stale
        if a.idle:
            point = Estimate(a.gain, a.gain, a.gain, 1)
            return Verdict(a, False, 0, a.alternative, point, self.stale, False, n_needed, idle=True)
        better = a.gain > 1.0
        self.recent.append(a)
        self.better = self.better + 1 if better else 0
        self.calm = self.calm + 1 if a.gain <= self.calm_below else 0
        if better:
            pooled = list(self.recent)[-min(self.better, 2 * n_needed) :]
            alternative, gain = streak_gain(pooled)
            measured = tune_measured(pooled, alternative)
        else:
            alternative, measured = a.alternative, tune_measured([a], a.alternative)
            gain = Estimate(a.gain, a.gain, a.gain, 1) if measured is None else scaled_to(a.gain, measured)
        interval_from = "windows" if measured is None else "tune"
        was = self.stale
        if not self.stale and self.better >= n_needed:
            confident = gain.low > 1.0 if gain.n >= 2 else True
            self.stale = gain.value > self.margin and confident
        elif self.stale and self.calm >= n_needed:
            self.stale = False
        return Verdict(
            a,
            a.gain > self.margin,
            self.better if better else self.calm,
            alternative,
            gain,
            self.stale,
            self.stale != was,
            n_needed,
            better=better,
            interval_from=interval_from,
        )
