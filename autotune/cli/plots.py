"""The plots of ``autotune report``: one function per picture, each reading one typed profile.

Every function takes a :class:`profiles.schema.Profile` and a PNG path. The three the report always
draws (:func:`plot_pareto`, :func:`plot_throughput_by_batch`, :func:`plot_verify_cost`) need
sections every profile has; the others read sections a profile may lack (a stack's served table,
the per-level re-measurement, per-position acceptance), draw nothing and return False when it does.
Intervals are the stored ones (paired ratios as ``{"value", "ci95", "n"}``, re-measured tokens/s
as ``tokens_per_second_ci95``); nothing here recomputes a statistic. matplotlib is an optional
extra: :func:`pyplot` raises a one-line ConfigError without it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from autotune.errors import ConfigError
from autotune.records import Curves
from profiles.schema import MISSING, Profile

CHOSEN = "#d62728"
BASELINE = "#7f7f7f"
TABLE = "#1f77b4"
CONSTANT = "#ff7f0e"


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend; ConfigError naming the extra when matplotlib is absent."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("report: matplotlib is not installed (pip install 'spec-autotune[plot]')") from None
    return plt


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)


def _interval(ratio: Mapping[str, Any]) -> tuple[float, float, float]:
    """A stored paired ratio -> (value, distance down to its low bound, distance up to its high bound)."""
    low, high = ratio.get("ci95") or (ratio["value"], ratio["value"])  # no interval stored: a point
    return ratio["value"], ratio["value"] - low, high - ratio["value"]


def _chosen_by_level(profile: Profile) -> tuple[dict[int, Mapping[str, Any]], str]:
    """The chosen configuration's ratio over no speculation per load level, and how it was measured:
    the paired ratios (``metrics.per_level_speedup``), else the schedule's (``schedule[].ratio``),
    else the schedule's medians divided (a profile that stores no paired ratio per level)."""
    stored = (profile.metrics or {}).get("per_level_speedup")
    if stored:
        return {int(b): r for b, r in stored.items()}, "paired, 95% CI"
    entries = profile.schedule.entries if profile.schedule is not MISSING else ()
    if entries and all(e.ratio for e in entries):
        return {e.batch_size: e.ratio for e in entries}, "paired, 95% CI"
    medians: dict[int, Mapping[str, Any]] = {
        e.batch_size: {"value": e.tokens_per_second / e.baseline_tokens_per_second}
        for e in entries
        if e.tokens_per_second and e.baseline_tokens_per_second
    }
    return medians, "medians, no interval stored"


def _level_axis(ax: Any, levels: Sequence[int]) -> None:
    """A log2 x axis ticked at the measured load levels, written as plain numbers."""
    ax.set_xscale("log", base=2)
    ticks = sorted(set(levels))
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(b) for b in ticks])
    ax.minorticks_off()


def _knobs(params: Mapping[str, Any]) -> str:
    """A trial's params in the words the tuner's reasons use: ``gamma=5 thr=0.00 constant``."""
    gamma = int(params.get("gamma", 0))
    if gamma == 0:
        return "gamma=0 (no speculation)"
    words = [f"gamma={gamma}"]
    if "confidence_threshold" in params:
        words.append(f"thr={float(params['confidence_threshold']):.2f}")
    if "gamma_schedule" in params:
        words.append(str(params["gamma_schedule"]))
    if params.get("drafter") not in (None, "model"):
        words.append(str(params["drafter"]))
    return " ".join(words)


def plot_pareto(profile: Profile, path: Path) -> None:
    """Every trial's tokens/s against its latency, the Pareto front, the chosen point and the SLO."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.2))
    trials = profile.trials or []
    lat = profile.metrics["latency_metric"]
    ax.scatter(
        [t["latency_ms"] for t in trials],
        [t["tokens_per_second"] for t in trials],
        s=18,
        c="#bbbbbb",
        label="trials",
    )
    front = sorted(profile.pareto_front, key=lambda p: p["latency_ms"])
    ax.plot(
        [p["latency_ms"] for p in front],
        [p["tokens_per_second"] for p in front],
        "o-",
        c=TABLE,
        label="Pareto front",
    )
    m = profile.metrics
    ax.scatter(
        [m["latency_ms"]],
        [m["tokens_per_second"]],
        marker="*",
        s=220,
        c=CHOSEN,
        zorder=5,
        label=f"chosen (gamma={profile.chosen.gamma}), re-measured",
    )
    slo = profile.study.get("slo", {}).get(lat)
    if slo:
        ax.axvline(slo, ls="--", c=CHOSEN, lw=1, label=f"SLO {lat} <= {slo:g} ms")
    ax.set_xlabel(f"{lat} (ms, worst load level)")
    ax.set_ylabel("tokens/s (all load levels)")
    ax.set_title(f"Study on {profile.device['label']}")
    ax.legend(fontsize=8)
    _save(fig, path)


def plot_throughput_by_batch(profile: Profile, path: Path) -> None:
    """The best trial's tokens/s per batch size, one line per gamma."""
    plt = pyplot()
    best: dict[int, dict[int, float]] = defaultdict(dict)  # gamma -> batch -> best tok/s
    for t in profile.trials or []:
        g = int(t["params"].get("gamma", 0))
        for b, tps in t["per_batch_tokens_per_second"].items():
            best[g][int(b)] = max(best[g].get(int(b), 0.0), tps)
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for g in sorted(best):
        xs = sorted(best[g])
        ax.plot(xs, [best[g][x] for x in xs], "o-", label=f"gamma={g}" + (" (AR)" if g == 0 else ""))
    _level_axis(ax, [b for row in best.values() for b in row])
    ax.set_xlabel("batch size (concurrency)")
    ax.set_ylabel("tokens/s (best trial)")
    ax.set_title("Throughput vs batch size per gamma")
    ax.legend(fontsize=8)
    _save(fig, path)


def plot_verify_cost(profile: Profile, path: Path) -> None:
    """The profiler's verify cost per batch size and k, and the knee curve T(n) with n*."""
    plt = pyplot()
    curves = profile.curves
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for b, row in sorted(Curves.from_json(curves).t_verify.items()):
        ks = sorted(row)
        ax1.plot(ks, [1e3 * row[k] for k in ks], "o-", label=f"B={b}")
    ax1.set_xlabel("tokens per row verified (k)")
    ax1.set_ylabel("T_verify(B, k) ms")
    ax1.set_title("Verify cost")
    ax1.legend(fontsize=8)
    knee = curves["knee_curve"]
    ns = sorted(knee, key=int)
    ax2.plot([int(n) for n in ns], [1e3 * knee[n] for n in ns], "o-")
    if profile.knee_tokens:
        ax2.axvline(profile.knee_tokens, ls="--", c=CHOSEN, label=f"knee n* = {profile.knee_tokens}")
        ax2.legend(fontsize=8)
    ax2.set_xscale("log", base=2)
    ax2.xaxis.set_major_formatter(lambda value, _: f"{value:g}")
    ax2.set_xlabel("tokens in the verify pass (n = B*k)")
    ax2.set_ylabel("T(n) ms")
    ax2.set_title("Knee: where extra tokens start to cost")
    _save(fig, path)


def _ratio_series(
    ratios: Mapping[int, Mapping[str, Any]],
) -> tuple[list[int], list[float], list[list[float]]]:
    """Load level -> stored ratio, as matplotlib's errorbar wants it: levels, values, [downs, ups]."""
    levels = sorted(ratios)
    parts = [_interval(ratios[b]) for b in levels]
    return levels, [p[0] for p in parts], [[p[1] for p in parts], [p[2] for p in parts]]


def plot_speedup_by_level(profile: Profile, path: Path) -> bool:
    """Tokens/s over no speculation per load level with its 95% interval, and the finalists.

    Left: the chosen configuration's paired ratio over no speculation at each level
    (``metrics.per_level_speedup``), and where a table was served, the table's
    (``table_decision.per_level[].ratio_over_off``). Right: every re-measured finalist's tokens/s
    over all levels with its interval (``remeasured``). False (nothing written) when the profile
    holds neither.
    """
    chosen, how = _chosen_by_level(profile)
    decision = profile.table_decision
    table = {
        int(lv["batch_size"]): lv["ratio_over_off"]
        for lv in (decision.per_level if decision is not MISSING and decision.per_level else [])
        if lv.get("ratio_over_off")
    }
    finalists = list(profile.remeasured or [])
    if not chosen and not table and not finalists:
        return False
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1.1, 1]})
    ax1.axhline(1.0, c=BASELINE, lw=1, ls="--", label="no speculation")
    for ratios, colour, label, shift in (
        (chosen, CHOSEN, f"chosen (gamma={profile.chosen.gamma}), {how}", 0.97),
        (table, TABLE, "served table (gamma by level)", 1.03),
    ):
        if ratios:
            levels, values, err = _ratio_series(ratios)
            ax1.errorbar(
                [b * shift for b in levels], values, yerr=err, fmt="o-", c=colour, capsize=4, label=label
            )
    _level_axis(ax1, [*chosen, *table] or [1])
    ax1.set_xlabel("load level (concurrent requests)")
    ax1.set_ylabel("tokens/s / no speculation")
    ax1.set_title("Speedup per load level")
    ax1.legend(fontsize=8)
    _finalists(ax2, finalists, profile)
    _save(fig, path)
    return True


def _finalists(ax: Any, rows: Sequence[Mapping[str, Any]], profile: Profile) -> None:
    """Horizontal interval bars of the re-measured finalists, the chosen one in red."""
    if not rows:
        ax.set_axis_off()
        ax.set_title("No finalists re-measured")
        return
    chosen_trial = (profile.selection or {}).get("trial")
    rows = sorted(rows, key=lambda r: r["tokens_per_second"])
    for y, row in enumerate(rows):
        low, high = row.get("tokens_per_second_ci95") or (row["tokens_per_second"],) * 2
        tps = row["tokens_per_second"]
        gamma = int(row["params"].get("gamma", 0))
        colour = (
            CHOSEN
            if row["trial"] is not None and row["trial"] == chosen_trial
            else BASELINE
            if gamma == 0
            else TABLE
        )
        ax.errorbar([tps], [y], xerr=[[tps - low], [high - tps]], fmt="o", c=colour, capsize=4)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(
        [
            f"{_knobs(r['params'])}\n" + ("(baseline)" if r["trial"] is None else f"(trial {r['trial']})")
            for r in rows
        ],
        fontsize=8,
    )
    ax.set_xlabel("tokens/s, all load levels (median, 95% CI)")
    repeats = (profile.remeasure or {}).get("repeats")
    ax.set_title("Finalists, re-measured" + (f" ({repeats} paired rounds)" if repeats else ""))


def plot_acceptance(profile: Profile, path: Path) -> bool:
    """Per-position acceptance: the profiler's, a stack's counters', and the chosen run's per level.

    False (nothing written) when the profile stores none of them.
    """
    series: list[tuple[str, Sequence[float], dict[str, Any]]] = []
    offline = (profile.acceptance or {}).get("per_position_acceptance")
    if offline:
        drafter = profile.acceptance.get("drafter", "draft")
        series.append((f"profiler ({drafter}, threshold 0)", offline, {"c": "black", "lw": 2}))
    stack = (profile.stack_cost or {}).get("acceptance")
    if stack:
        series.append(
            (f"{profile.stack_cost.get('backend', 'stack')} counters", stack, {"c": "black", "ls": "--"})
        )
    per_level = (profile.metrics or {}).get("per_level") or {}
    loads: dict[tuple[float, ...], list[str]] = defaultdict(list)  # one line per distinct curve
    for b in sorted(per_level, key=int):
        if values := per_level[b].get("per_position_acceptance"):
            loads[tuple(values)].append(str(b))
    for values, bs in loads.items():
        where = "load " + ", ".join(bs) if len(bs) < len(per_level) else "every load level"
        series.append((f"chosen (gamma={profile.chosen.gamma}), {where}", values, {"alpha": 0.85}))
    if not series:
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for label, values, style in series:
        ax.plot(range(1, len(values) + 1), values, marker="o", label=label, **style)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("draft position i")
    ax.set_ylabel("fraction of steps whose first i drafts were accepted")
    ax.set_title("Acceptance per position")
    ax.legend(fontsize=8)
    _save(fig, path)
    return True


def plot_table_vs_constant(profile: Profile, path: Path) -> bool:
    """A served gamma-by-level table against the best constant and no speculation, per load level.

    Left: each one's tokens/s as served (``table_decision.per_level``); right: the table's paired
    ratio over the constant with its interval, marked where significantly better or worse. False
    (nothing written) when no table was served live.
    """
    decision = profile.table_decision
    if decision is MISSING or not decision.per_level:
        return False
    levels = sorted(decision.per_level, key=lambda lv: int(lv["batch_size"]))
    xs = [int(lv["batch_size"]) for lv in levels]
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    table_gammas = "/".join(str(lv["table_gamma"]) for lv in levels)
    for key, colour, label in (
        ("tokens_per_second", TABLE, f"table (gamma {table_gammas})"),
        ("constant_tokens_per_second", CONSTANT, f"best constant (gamma={levels[0]['constant_gamma']})"),
        ("off_tokens_per_second", BASELINE, "no speculation"),
    ):
        ax1.plot(xs, [lv.get(key) for lv in levels], "o-", c=colour, label=label)
    _level_axis(ax1, xs)
    ax1.set_xlabel("load level (concurrent requests)")
    ax1.set_ylabel("tokens/s as served")
    ax1.set_title("Served table, best constant, no speculation")
    ax1.legend(fontsize=8)
    ratios = {
        int(lv["batch_size"]): lv["ratio_over_constant"] for lv in levels if lv.get("ratio_over_constant")
    }
    if ratios:
        bs, values, err = _ratio_series(ratios)
        ax2.errorbar(bs, values, yerr=err, fmt="o", c=TABLE, capsize=4, label="table / constant (95% CI)")
        by_level = {int(lv["batch_size"]): lv for lv in levels}
        for key, colour, label in (
            ("significantly_worse_than_constant", CHOSEN, "significantly worse"),
            ("significant_over_constant", "#2ca02c", "significantly better"),
        ):
            marked = [(b, v) for b, v in zip(bs, values, strict=True) if by_level[b].get(key)]
            if marked:
                ax2.scatter(
                    *zip(*marked, strict=True),
                    s=140,
                    facecolors="none",
                    edgecolors=colour,
                    zorder=5,
                    label=label,
                )
    ax2.axhline(1.0, c=CONSTANT, lw=1, ls="--", label="best constant")
    _level_axis(ax2, xs)
    ax2.set_xlabel("load level (concurrent requests)")
    ax2.set_ylabel("tokens/s ratio, paired")
    verdict = {True: "won", False: "lost"}.get(decision.won) if decision.won is not MISSING else None
    ax2.set_title("Table over the best constant" + (f": the table {verdict}" if verdict else ""))
    ax2.legend(fontsize=8)
    _save(fig, path)
    return True
