"""``autotune report``: PNG plots of a profile and a short Markdown summary linking them.

matplotlib is an optional extra (``pip install 'spec-autotune[plot]'``); without it the
command stops with a one-line message saying so. The profile arrives typed
(:class:`profiles.schema.Profile`; the stored JSON of one is read with ``Profile.from_json``);
the verify curves are read as the cost model reads them (:class:`autotune.records.Curves`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.errors import ConfigError
from autotune.records import Curves
from profiles.schema import MISSING, Profile


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("report: matplotlib is not installed (pip install 'spec-autotune[plot]')") from None
    return plt


def _profile(profile: Profile | Mapping[str, Any]) -> Profile:
    return profile if isinstance(profile, Profile) else Profile.from_json(profile)


def plot_pareto(profile: Profile | Mapping[str, Any], path: Path) -> None:
    profile = _profile(profile)
    plt = _pyplot()
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
        c="#1f77b4",
        label="Pareto front",
    )
    m = profile.metrics
    ax.scatter(
        [m["latency_ms"]],
        [m["tokens_per_second"]],
        marker="*",
        s=220,
        c="#d62728",
        zorder=5,
        label=f"chosen (gamma={profile.chosen.gamma}), re-measured",
    )
    slo = profile.study.get("slo", {}).get(lat)
    if slo:
        ax.axvline(slo, ls="--", c="#d62728", lw=1, label=f"SLO {lat} <= {slo:g} ms")
    ax.set_xlabel(f"{lat} (ms, worst load level)")
    ax.set_ylabel("tokens/s (all load levels)")
    ax.set_title(f"Study on {profile.device['label']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_throughput_by_batch(profile: Profile | Mapping[str, Any], path: Path) -> None:
    profile = _profile(profile)
    plt = _pyplot()
    best: dict[int, dict[int, float]] = defaultdict(dict)  # gamma -> batch -> best tok/s
    for t in profile.trials or []:
        g = int(t["params"].get("gamma", 0))
        for b, tps in t["per_batch_tokens_per_second"].items():
            best[g][int(b)] = max(best[g].get(int(b), 0.0), tps)
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for g in sorted(best):
        xs = sorted(best[g])
        ax.plot(xs, [best[g][x] for x in xs], "o-", label=f"gamma={g}" + (" (AR)" if g == 0 else ""))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size (concurrency)")
    ax.set_ylabel("tokens/s (best trial)")
    ax.set_title("Throughput vs batch size per gamma")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_verify_cost(profile: Profile | Mapping[str, Any], path: Path) -> None:
    profile = _profile(profile)
    plt = _pyplot()
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
        ax2.axvline(profile.knee_tokens, ls="--", c="#d62728", label=f"knee n* = {profile.knee_tokens}")
        ax2.legend(fontsize=8)
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("tokens in the verify pass (n = B*k)")
    ax2.set_ylabel("T(n) ms")
    ax2.set_title("Knee: where extra tokens start to cost")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(profile: Profile | Mapping[str, Any], folder: Path) -> Path:
    """Write pareto.png, throughput_by_batch.png, verify_cost.png and report.md into ``folder``."""
    profile = _profile(profile)
    folder.mkdir(parents=True, exist_ok=True)
    plot_pareto(profile, folder / "pareto.png")
    plot_throughput_by_batch(profile, folder / "throughput_by_batch.png")
    plot_verify_cost(profile, folder / "verify_cost.png")
    c, m = profile.chosen, profile.metrics
    sched = ", ".join(f"B={e.batch_size}: {e.gamma}" for e in profile.schedule.entries)
    crossover = profile.schedule.crossover_batch_size
    md = folder / "report.md"
    md.write_text(
        f"# spec-autotune profile #{None if profile.id is MISSING else profile.id}: {profile.device['label']}\n\n"
        f"- Chosen: drafter `{c.drafter}`, gamma **{c.gamma}**, confidence threshold "
        f"{c.confidence_threshold:.2f}, schedule `{c.gamma_schedule}`, max batch size {c.max_batch_size}"
        f" ({profile.selection['reason']}).\n"
        f"- Throughput {m['tokens_per_second']:.1f} tokens/s, {m['latency_metric']} {m['latency_ms']:.1f} ms; "
        f"speedup {m['speedup']:.2f}x over autoregressive decoding on the same engine and load.\n"
        f"- Gamma by batch size: {sched}"
        + (f"; speculation off from batch size {crossover}.\n" if crossover else ".\n")
        + f"- Knee n* = {None if profile.knee_tokens is MISSING else profile.knee_tokens} tokens per verify pass.\n\n"
        "![Pareto front](pareto.png)\n\n![Throughput by batch size](throughput_by_batch.png)\n\n"
        "![Verify cost and knee](verify_cost.png)\n"
    )
    return md
