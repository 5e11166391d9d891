"""One window held against the profile: the predicted tokens/s of every K at the live load and acceptance.

:func:`assess` predicts each K (speculation off included) with the cost model's steady state
(:func:`autotune.cost.costmodel.steady_tokens_per_second`) or, for the stack that measured the
profile, its fitted step costs (:meth:`autotune.cost.stackcost.StackCost.predict_at_load`), under
the window's per-position acceptance extended by :func:`autotune.cost.acceptance.extend`, and
names the served K and the best alternative. Where the tune measured the choice at the live load,
the prediction is calibrated on that measurement (:func:`measured_level`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autotune.cost.acceptance import extend
from autotune.cost.costmodel import chain_stats, steady_tokens_per_second
from autotune.records import Curves
from autotune.stats import Estimate
from autotune.watch.profile_model import ProfileModel
from autotune.watch.windows import Window

MIN_DRAFTS = 10  # fewer drafts in a window: its acceptance is too thin, the profile's is used


@dataclass(frozen=True)
class Assessment:
    """One window held against the profile: the predicted tokens/s of every K at the live state."""

    window: Window
    batch: float  # requests running the prediction used (>= 1)
    served_k: int
    acceptance: tuple[float, ...]  # per position, what the prediction used
    acceptance_source: str  # "live" (this window's counters) or "profile"
    observed_positions: int  # positions measured live; beyond them extrapolated
    tps: tuple[float, ...]  # predicted tokens/s for K = 0..len-1
    alternative: int  # the best K other than the served one
    gain: float  # tps[alternative] / tps[served_k]
    served_from: str = "profile"  # "server": the server's counted positions overrode the profile's K
    costs: str = "engine"  # "stack": the profile's stack cost fit for this stack; "engine": its curves
    calibrated_at: int | None = None  # the tuned level whose measured choice calibrated tps (see assess)
    calibration: tuple[float, ...] = ()  # per K: what tps[k] was divided by there (1: unchanged)
    # the tune's paired ratio of the alternative over the served K at calibrated_at, where the gain
    # rests on the profile alone (see assess and tune_measured); None: the windows are the repeats
    measured: Estimate | None = None

    @property
    def idle(self) -> bool:
        return self.window.idle


def engine_tokens_per_second(curves: Curves, acceptance: Sequence[float], k: int, batch: float) -> float:
    """The engine cost model's steady-state tokens/s of a constant K at ``batch`` rows (at least one).

    Example:
        >>> c = Curves({1: {1: 0.010, 2: 0.011, 3: 0.012}}, {1: 0.001})
        >>> round(engine_tokens_per_second(c, [0.8, 0.6], 2, 1), 1), engine_tokens_per_second(c, [], 0, 1)
        (171.4, 100.0)
    """
    return steady_tokens_per_second(curves, max(float(batch), 1.0), chain_stats(acceptance, k))


def predicted(
    model: ProfileModel, stack: str, batch: float, acceptance: Sequence[float], top: int
) -> tuple[float, ...]:
    """Predicted tokens/s of K = 0..``top`` at ``batch`` requests under ``acceptance`` (``top`` positions):
    the stack's own step costs where it measured the profile, else the engine's curves."""
    costs = model.costs_for(stack)
    if costs is not None:
        return tuple(costs.predict_at_load(batch, k, acceptance) for k in range(top + 1))
    return tuple(engine_tokens_per_second(model.curves, acceptance, k, batch) for k in range(top + 1))


def assess(model: ProfileModel, win: Window, stack: str) -> Assessment:
    """Predicted tokens/s of every K (speculation off included) under the window's acceptance and load.

    The live per-position acceptance is used when the window has at least :data:`MIN_DRAFTS`
    drafts and per-position counts; otherwise (speculation off, a quiet window) the profile's.
    The served K is the profile's at the live load, except where the server shows it runs
    another one (:func:`served_by`).

    ``measured``: where the window used the profile's acceptance at a tuned level
    (:func:`measured_level`), the alternative is that level's measured choice and the served K is
    the profile's chosen K there, the tune's ratio of the one over the other there
    (``table_decision.levels[].over_chosen``), when the profile has it.
    """
    batch = max(win.running or 0.0, 1.0)
    live = win.per_position_acceptance
    live_ok = bool(live) and (win.drafts or 0) >= MIN_DRAFTS
    served, served_from = served_by(model, win, stack, batch, live if live_ok else [])
    top = max(model.gamma_max, served, len(live))
    if live_ok:
        acceptance, source, observed = extend(live, top), "live", len(live)
    else:
        acceptance, source, observed = extend(model.acceptance, top), "profile", 0
    tps = predicted(model, stack, batch, acceptance, top)
    level = measured_level(model, batch)
    calibration = calibrate(model, stack, batch, level, top) if level is not None else ()
    tps = tuple(t / c for t, c in zip(tps, calibration, strict=True)) if calibration else tps
    alternative = max((k for k in range(top + 1) if k != served), key=lambda k: (tps[k], -k))
    measured = None
    if (
        source == "profile"
        and level is not None
        and alternative == model.level_choices[level]
        and served == model.chosen_k_at(level)
    ):
        measured = model.level_ratios.get(level)
    costs = "stack" if model.costs_for(stack) is not None else "engine"
    return Assessment(
        win,
        batch,
        served,
        acceptance,
        source,
        observed,
        tps,
        alternative,
        tps[alternative] / tps[served],
        served_from,
        costs,
        level,
        calibration,
        measured,
    )


def served_by(
    model: ProfileModel, win: Window, stack: str, batch: float, live: Sequence[float]
) -> tuple[int, str]:
    """The K the server runs and where that was read (``"profile"`` or ``"server"``).

    The profile's K at the live load (:meth:`ProfileModel.served_k`), except where the window's
    live acceptance (``live``; empty: not usable) shows another: fewer counted positions than
    that K (it cannot draft more), or drafts on a one-K stack whose profile turns speculation
    off; then the server's positions are its K. vLLM drafts the K it serves for every running
    request, so there the window's draft tokens per draft are that K (a table's, at the window's
    loads), whatever the profile exported.
    """
    served = model.served_k(stack, batch)
    if live and (served > len(live) or (served == 0 and stack == "llamacpp")):
        return len(live), "server"
    if live and stack == "vllm" and win.mean_draft_length is not None:
        k = round(win.mean_draft_length)
        if 1 <= k <= len(live) and k != served:
            return k, "server"
    return served, "profile"


def calibrate(model: ProfileModel, stack: str, batch: float, level: int, top: int) -> tuple[float, ...]:
    """Per K, what its predicted tokens/s is divided by at tuned level ``level`` (1: unchanged).

    The tune measured which K is best there: what the model claims beyond it, at the profile's own
    acceptance, is the model's error, not a change of the traffic. Every K the model claims at
    least as good as the measured choice is brought to its level, and a hair below it (1e-9), so
    the measured K wins the tie here and over a streak. Speculation off, where the tune measured
    the level's K faster than it (ratio r > 1, ``schedule[].ratio``), is held at 1/r of that K at
    the profile's acceptance, not at a hair below it, so only a live change of acceptance moves it
    (at the model's parity an acceptance a little under the profile's read as stale where the
    tune measured speculation off slower: docs/decisions.md#watch-off-held-at-measured-ratio).
    """
    best = min(model.level_choices[level], top)
    base = predicted(model, stack, batch, extend(model.acceptance, top), top)
    out = [
        base[k] / base[best] * (1 + 1e-9) if k != best and base[k] >= base[best] else 1.0
        for k in range(top + 1)
    ]
    r = model.off_ratios.get(level, 0.0)
    if best > 0 and r > 1.0 and model.chosen_k_at(level) == best and base[0] * r > base[best]:
        out[0] = base[0] * r / base[best]
    return tuple(out)


def measured_level(model: ProfileModel, batch: float) -> int | None:
    """The tuned load level the live load sits at (nearest, inside the tuned range) where the
    profile holds a measured per-level choice; else None.

    There the tune measured the K it served against each other under the profile's acceptance and
    chose one (``table_decision.levels``); a cost model that predicts another K better at that
    acceptance is wrong by that much, so :func:`assess` divides each K's predicted gain by what the
    model claims over the measured choice at the profile's own acceptance (when it claims a gain).
    Where the served K is the measured choice, only a change of acceptance alarms; where it is not
    (one K for a whole sweep, e.g. a llama-server profile that is off while the live load sits at a
    level where the tune measured K=2 faster), the measured choice is what the watch names.

    Example:
        >>> m = ProfileModel(None, Curves({1: {1: 1.0}}, {}), (0.5,), ((16, 3),), 3, True, (1, 4, 16),
        ...                  {1: 3, 4: 3, 16: 3})
        >>> measured_level(m, 13.0), measured_level(m, 2.0), measured_level(m, 40.0)
        (16, 1, None)
    """
    if not model.levels or not model.level_choices:
        return None
    if not min(model.levels) <= batch <= max(model.levels):
        return None
    near = model.nearest_level(batch)
    if near is None or near not in model.level_choices:
        return None
    return near
