"""What the watch says per window: one human line, or one ``--json`` object (docs/watch.md lists the keys)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from autotune.cost.acceptance import extend
from autotune.watch.profile_model import ProfileModel
from autotune.watch.staleness import Verdict


def _k(k: int) -> str:
    return "K=0 (speculation off)" if k == 0 else f"K={k}"


def _plural(n: float, word: str) -> str:
    return f"{n:.0f} {word}" + ("" if round(n) == 1 else "s")


def profile_acceptance_at(model: ProfileModel, k: int) -> float | None:
    """The profile's acceptance rate at K: the mean of its first K per-position acceptances."""
    if k <= 0:
        return None
    acc = extend(model.acceptance, k)
    return sum(acc[:k]) / k


def render_line(v: Verdict, model: ProfileModel) -> str:
    """One human line per window.

    ``acceptance 0.41 (profile 0.65) at ~3 requests running: predicted K=2 1.18x over the served
    K=5 (95% CI 1.09-1.27) for 6 windows: profile stale``
    """
    a, w = v.assessment, v.assessment.window
    state = "profile stale" if v.stale else "fresh"
    if v.idle:
        busy = f" with ~{_plural(w.running, 'request')} running" if w.running else ""
        return f"idle: no tokens counted in {w.seconds:.0f} s{busy}: no verdict ({state})"
    prof = profile_acceptance_at(model, a.served_k)
    prof_text = f"profile {prof:.2f}" if prof is not None else "profile: speculation off here"
    if a.acceptance_source == "live" and w.acceptance_rate is not None:
        acc = f"acceptance {w.acceptance_rate:.2f} ({prof_text})"
    else:
        why = "speculation off" if a.served_k == 0 else f"{w.drafts or 0:.0f} drafts"
        acc = f"acceptance n/a ({why}; the profile's assumed)"
    load = f"at ~{_plural(w.running or 0, 'request')} running"
    if w.waiting:
        load += f", {w.waiting:.0f} waiting"
    g = v.gain
    head = f"{acc} {load}: predicted {_k(v.alternative)} {g.value:.2f}x over the served {_k(a.served_k)}"
    if v.better:
        by = ", measured by the tune" if v.interval_from == "tune" else ""
        ci = f" (95% CI {g.low:.2f}-{g.high:.2f}{by})" if g.n >= 2 else ""
        head += f"{ci} for {_plural(v.streak, 'window')}"
        if not v.stale and v.alarm:
            state = f"fresh ({min(v.streak, v.windows_to_stale)} of {v.windows_to_stale} windows to stale)"
    elif v.stale:
        state = f"profile stale (fresh after {_plural(v.windows_to_stale - v.streak, 'more calm window')})"
    return f"{head}: {state}"


def _round(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


def verdict_json(v: Verdict, model: ProfileModel, stack: str) -> dict[str, Any]:
    """The ``--json`` object of one window (docs/watch.md lists the keys)."""
    a, w = v.assessment, v.assessment.window
    near = model.nearest_level(a.batch)
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "backend": stack,
        "profile_id": model.profile_id,
        "window_s": _round(w.seconds, 3),
        "idle": v.idle,
        "requests_running": _round(w.running, 3),
        "requests_waiting": _round(w.waiting, 3),
        "generated_tokens_per_second": _round(w.tokens_per_second, 3),
        "drafts_per_second": _round(w.drafts_per_second, 3),
        "mean_accepted_length": _round(w.mean_accepted_length),
        "mean_draft_length": _round(w.mean_draft_length),
        "acceptance_rate": _round(w.acceptance_rate),
        "live_acceptance": [round(x, 4) for x in w.per_position_acceptance],
        "acceptance_source": a.acceptance_source,
        "profile_acceptance": [round(x, 4) for x in model.acceptance],
        "profile_acceptance_rate": _round(profile_acceptance_at(model, a.served_k)),
        "profile_levels": list(model.levels),
        "nearest_level": near,
        "level_choice_k": model.level_choices.get(near) if near is not None else None,
        "outside_tuned_levels": bool(model.levels) and not min(model.levels) <= a.batch <= max(model.levels),
        "served_k": a.served_k,
        "served_k_from": a.served_from,
        "predicted_tokens_per_second": {str(k): round(t, 3) for k, t in enumerate(a.tps)},
        "predicted_with": a.costs,
        "calibrated_at_level": a.calibrated_at,
        "calibration": [round(c, 4) for c in a.calibration] or None,
        "extrapolated_from_position": a.observed_positions + 1 if a.acceptance_source == "live" else None,
        "alternative_k": v.alternative,
        "predicted_gain": round(v.gain.value, 4),
        "gain_ci95": [round(v.gain.low, 4), round(v.gain.high, 4)] if v.gain.n >= 2 else None,
        "gain_ci95_from": v.interval_from if v.gain.n >= 2 else None,
        "gain_windows": v.gain.n
        if v.interval_from == "windows"
        else min(v.streak, 2 * v.windows_to_stale)
        if v.better
        else 1,
        "alarm": v.alarm,
        "better": v.better,
        "streak": v.streak,
        "windows_to_stale": v.windows_to_stale,
        "stale": v.stale,
        "changed": v.changed,
    }


def json_line(obj: Mapping[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"))
