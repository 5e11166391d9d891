"""Human views of command results: tables and one-line summaries. Pure functions of their inputs.

Profiles arrive typed (:class:`profiles.schema.Profile`, read at the boundary by
``Store.load_profile`` / ``Profile.from_json``), a profiler measurement as
:class:`autotune.records.Measurement` and per-level metrics as :class:`autotune.records.LevelMetrics`.
A caller that still holds the stored JSON (``autotune tune`` and ``autotune profile`` get dicts
from ``run_tune`` / ``context.ensure_profile``) may pass it: it is read with ``from_json`` first.
``autotune bench`` and ``profiles list`` render plain rows (a run's metrics, the store's summary).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from autotune.cli.text import columns
from autotune.records import LevelMetrics, Measurement
from profiles.schema import MISSING, Profile, ScheduleEntry, TableDecision

BENCH_ROWS = [
    ("tokens_per_second", "tokens/s"),
    ("requests_per_second", "requests/s"),
    ("speedup", "speedup (x)"),
    ("acceptance_rate", "acceptance rate"),
    ("mean_acceptance_length", "mean acceptance length"),
    ("per_position_acceptance", "per-position acceptance"),
    ("rollback_frequency", "rollback frequency"),
    ("verification_efficiency", "verification efficiency"),
    ("draft_cost_ratio", "draft cost ratio"),
    ("batch_utilization", "batch utilization"),
    ("mean_batch_size", "mean batch size"),
    ("ttft_ms_p50", "ttft ms p50"),
    ("ttft_ms_p95", "ttft ms p95"),
    ("tpot_ms_p50", "tpot ms p50"),
    ("tpot_ms_p95", "tpot ms p95"),
    ("e2e_ms_p50", "e2e ms p50"),
    ("e2e_ms_p95", "e2e ms p95"),
]


def render_bench(
    result: dict, drafter: str, gamma: int, threshold: float, batch_size: int, num_requests: int
) -> str:
    """``autotune bench``'s table: each metric for the speculative and the autoregressive run."""
    rows = [(label, result.get(key), result.get(f"baseline_{key}")) for key, label in BENCH_ROWS]
    lines = [
        f"drafter={drafter} gamma={gamma} threshold={threshold} batch={batch_size} "
        f"requests={num_requests} device={result['device']}",
        columns(["metric", "speculative", "autoregressive"], rows),
    ]
    if "greedy_match" in result:
        lines.append(f"greedy_match: {str(result['greedy_match']).lower()}")
    return "\n".join(lines)


def render_profile(measurement: Measurement | Mapping[str, Any]) -> str:
    """Human view of a profiler measurement: identity, ceilings, knee, batch-size table."""
    m = measurement if isinstance(measurement, Measurement) else Measurement.from_json(measurement)
    fp, ce, acc = m.fingerprint, m.ceilings, m.acceptance
    theo = fp.get("theoretical") or {}
    lines = [
        f"device      {fp['label']}  [{fp['key']}]",
        f"bandwidth   measured {ce['copy_bandwidth']['median_bytes_per_s'] / 1e9:.1f} GB/s"
        + (
            f", theoretical {theo['bandwidth_bytes_per_s'] / 1e9:.0f} GB/s"
            if theo.get("bandwidth_bytes_per_s")
            else ""
        ),
        f"matmul      measured {ce['matmul']['median_flops'] / 1e12:.3f} TFLOP/s"
        + (
            f", theoretical {theo['dense_bf16_flops'] / 1e12:.0f} TFLOP/s"
            if theo.get("dense_bf16_flops")
            else ""
        ),
        f"ridge       {ce['ridge_flops_per_byte']:.1f} FLOP/byte",
        f"knee n*     {m.knee_tokens or '> ' + str(max(int(n) for n in m.curves['knee_curve']))} tokens per verify pass",
        f"acceptance  {acc['acceptance_rate'] or 0:.3f} at gamma {m.gamma_max} "
        f"(per position: {', '.join(f'{a:.2f}' for a in acc['per_position_acceptance'])})",
        "",
    ]
    cl = m.classification
    rows = [
        (
            r["batch_size"],
            r["verify_cost"],
            "-".join(f"{x:.2f}" for x in r.get("verify_cost_ci95") or []) or "n/a",
            r["label"] + ("" if r.get("separable", True) else " (not separable at this noise)"),
            r["best_gamma"],
            r["best_threshold"],
            r["predicted_speedup"],
        )
        for r in cl["batch_sizes"]
    ]
    lines.append(
        columns(
            [
                "batch",
                f"verify cost (gamma={cl['gamma_max']}+1 vs 1)",
                "95% CI",
                "label",
                "best gamma",
                "best threshold",
                "predicted speedup",
            ],
            rows,
        )
    )
    if cl.get("knee_tokens_ci95"):
        lines.append(
            f"knee n* 95% CI: {_knee_ci(cl['knee_tokens_ci95'])} tokens (bootstrap of the repeated timings)"
        )
    return "\n".join(lines)


def _ratio(value: float | None, ci: list | None, unit: str = "x") -> str:
    """``1.62x (95% CI 1.51-1.70)``; without an interval (a profile that stored none, one repeat) just the value."""
    if value is None:
        return "n/a"
    if not ci or ci[0] == ci[1] == value:
        return f"{value:.2f}{unit}"
    return f"{value:.2f}{unit} (95% CI {ci[0]:.2f}-{ci[1]:.2f})"


def _with_ci(value: float, ci: list | None, fmt: str = ".1f") -> str:
    return f"{value:{fmt}}" + (f" (95% CI {ci[0]:{fmt}}-{ci[1]:{fmt}})" if ci and ci[0] != ci[1] else "")


def _speculation_on_text(entries: Sequence[ScheduleEntry]) -> str:
    """What a schedule with no crossover says: speculation pays at every measured batch size, unless
    some batch size's gamma is kept where it was measured no significantly faster than gamma 0.

    Example:
        >>> r = {"value": 1.2, "ci95": [1.1, 1.3], "n": 3}
        >>> _speculation_on_text([ScheduleEntry(1, 7, ratio=r, significant=True), ScheduleEntry(4, 7)])
        '; speculation pays at every measured batch size'
        >>> _speculation_on_text([ScheduleEntry(1, 7, ratio=r, significant=True),
        ...                       ScheduleEntry(8, 7, ratio=r, significant=False)])
        '; speculation on at every measured batch size, not significantly faster than gamma 0 at 8'
    """
    unproven = [
        str(e.batch_size)
        for e in entries
        if e.gamma > 0 and isinstance(e.ratio, Mapping) and e.ratio and e.significant is not True
    ]
    if not unproven:
        return "; speculation pays at every measured batch size"
    return (
        "; speculation on at every measured batch size, not significantly faster than gamma 0 at "
        + ", ".join(unproven)
    )


def _class_text(r: dict) -> str:
    ci = r.get("verify_cost_ci95")
    if not ci:
        return f"B={r['batch_size']}: {r['label']}"
    sep = "" if r.get("separable", True) else " (not separable at this noise)"
    return f"B={r['batch_size']}: {r['label']}{sep} [cost {r['verify_cost']:.2f}, 95% CI {ci[0]:.2f}-{ci[1]:.2f}]"


def _knee_ci(ci: list) -> str:
    return "-".join("not bent" if n is None else str(n) for n in ci)


def _schedule_text(e: ScheduleEntry | Mapping[str, Any]) -> str:
    if not isinstance(e, ScheduleEntry):
        e = ScheduleEntry.from_json(e)
    text = f"B={e.batch_size}: gamma {e.gamma}"
    if e.ratio is MISSING:  # decided without paired repeats
        return text
    from autotune.stats import Estimate, describe_difference

    r = e.ratio
    low, high = r["ci95"]
    estimate = Estimate(r["value"], low, high, r.get("n", 2))
    return text + f" (speculation vs gamma 0: {describe_difference(estimate)})"


def _table_lines(decision: TableDecision) -> list[str]:
    """The per-level choices and the table's verdict (a profile without a table decision has none)."""
    if decision is MISSING or not decision.to_json():
        return []
    levels = ", ".join(f"B={lv.batch_size}: {lv.gamma}" for lv in decision.levels or ())
    verdict = "served live and chosen" if decision.won else "served live, not chosen"
    lines = [
        f"per level   K chosen per load level: {levels or 'none'}",
        f"table       {verdict if decision.served else 'not served'}: {decision.reason or ''}",
    ]
    need = decision.needs_plugin
    if need is not MISSING:  # its K=0 range is off only with the plugin (profiles.schema.PluginNeed)
        fallback = ", ".join(f"B={b}: {k}" for b, k in need.fallback)
        lines.append(
            f"needs       the {need.plugin} ({need.env}=1, vLLM {need.vllm_version or 'unknown'}); "
            f"without it: {fallback}"
        )
    return lines


def _profile(p: Profile | Mapping[str, Any]) -> Profile:
    """The typed profile; the stored JSON of one (with its ``id``) is read with :meth:`Profile.from_json`."""
    return p if isinstance(p, Profile) else Profile.from_json(p)


def _level(levels: Mapping[str, Any], b: Any) -> LevelMetrics | None:
    """``levels[b]`` typed, looked up as stored (string) or as given; None where the level is absent."""
    lv = levels.get(b) or levels.get(str(b))
    return LevelMetrics.from_json(lv) if lv else None


def render_tune(p: Profile | Mapping[str, Any]) -> str:
    """``autotune tune``'s summary of a stored profile: chosen knobs, per-level table, speedups, schedule.

    Sections in print order, each a function of the profile that returns its lines.
    """
    p = _profile(p)
    return "\n".join(
        [
            *_tune_header(p),
            "",
            _levels_table(p),
            "",
            _overall_line(p),
            _speedup_line(p),
            _classes_line(p),
            _schedule_line(p),
            *_table_lines(p.table_decision),
            *_budget_lines(p.study),
            *_host_lines(p.host_noise),
            f"stored      profile #{_profile_id(p)} in {p.study['storage']}",
            *(["exports     " + ", ".join(p.exports)] if p.exports else []),
        ]
    )


def _profile_id(p: Profile) -> int | None:
    """The stored profile's id; None before it is stored."""
    return p.id if p.id is not MISSING else None


def _tune_header(p: Profile) -> list[str]:
    """Which profile, measured by what, and the chosen knobs with the selection's reason."""
    c, study = p.chosen, p.study
    backend = p.backend or {"name": "engine"}
    measured_by = backend["name"] + (f" {backend['version']}" if backend.get("version") else "")
    return [
        f"profile #{_profile_id(p)} for {p.device['label']} ({study['n_trials']} trials on {measured_by}, "
        f"study {study['name']})",
        f"chosen      drafter={c.drafter} gamma={c.gamma} threshold={c.confidence_threshold:.2f} "
        f"schedule={c.gamma_schedule} max_batch_size={c.max_batch_size}"
        + (f" tree_topk={c.tree_topk}" if isinstance(c.tree_topk, str) and c.tree_topk != "chain" else "")
        + f"  ({p.selection['reason']})",
        *_workload_lines(p.workload),
    ]


def _workload_lines(workload: Mapping[str, Any]) -> list[str]:
    """A chat-formatted workload says so (plain prompts, the default, print nothing).

    Example:
        >>> _workload_lines({"prompts": "chat.jsonl", "format": "chat", "chat_template_sha256": "ab" * 32})
        ["workload    chat: chat.jsonl's messages in the target's chat template (sha256 abababababab)"]
    """
    if not isinstance(workload, Mapping) or workload.get("format") != "chat":
        return []
    sha = str(workload.get("chat_template_sha256", ""))[:12]
    return [
        f"workload    chat: {workload.get('prompts')}'s messages in the target's chat template (sha256 {sha})"
    ]


LEVEL_COLUMNS = [
    "load",
    "tok/s",
    "AR tok/s",
    "speedup",
    "tpot p50",
    "tpot p95",
    "ttft p95",
    "e2e p95",
    "acceptance",
]


def _levels_table(p: Profile) -> str:
    """One row per load level: the chosen configuration's throughput and latencies next to AR's."""
    m = p.metrics
    speedups = m.get("per_level_speedup") or {}
    rows = []
    for b, stored in sorted(m["per_level"].items(), key=lambda kv: int(kv[0])):
        lv, base = LevelMetrics.from_json(stored), _level(p.baseline["per_level"], b)
        base_tps = base.tokens_per_second if base else None
        speedup = _level_speedup(speedups.get(b) or speedups.get(str(b)), lv, base_tps)
        rows.append(
            (b, lv.tokens_per_second, base_tps, speedup)
            + (lv.tpot_ms_p50, lv.tpot_ms_p95, lv.ttft_ms_p95, lv.e2e_ms_p95, lv.acceptance_rate)
        )
    return columns(LEVEL_COLUMNS, rows)


def _level_speedup(ratio: Mapping[str, Any] | None, lv: LevelMetrics, base_tps: float | None) -> Any:
    """A level's speedup: the stored paired ratio with its CI, else the ratio of the two throughputs."""
    if ratio:
        return _ratio(ratio["value"], ratio["ci95"])
    if base_tps and lv.tokens_per_second is not None:
        return lv.tokens_per_second / base_tps
    return None


def _overall_line(p: Profile) -> str:
    """Throughput and latency over the levels, and how they were re-measured."""
    m, remeasure = p.metrics, p.remeasure or {}
    line = (
        f"overall     {_with_ci(m['tokens_per_second'], m.get('tokens_per_second_ci95'))} tok/s, "
        f"{m['latency_metric']} {_with_ci(m['latency_ms'], m.get('latency_ms_ci95'))} ms"
    )
    if m.get("repeats"):
        line += f"; medians of {m['repeats']} repeats ({remeasure.get('order', 'interleaved')})"
    if looked := remeasure.get("second_look_levels"):
        line += (
            f"; a second look at batch size {', '.join(map(str, looked))}: "
            f"{remeasure.get('repeats')} rounds there"
        )
    return line


def _speedup_line(p: Profile) -> str:
    """The speedup over AR, and over the best static-gamma configuration when it is another one."""
    m = p.metrics
    line = f"speedup     {_ratio(m['speedup'], m.get('speedup_ci95'))} over AR"
    if m.get("chosen_is_best_static"):
        return line + "; it is the best static-gamma configuration"
    if m.get("speedup_over_best_static"):
        return (
            line
            + f", {_ratio(m['speedup_over_best_static'], m.get('speedup_over_best_static_ci95'))} over the "
            "best static-gamma configuration (paired re-measurements)"
        )
    return line


NOT_PROFILED = "not measured: the engine did not profile this pair (a serving-stack run without the prior)"


def _classes_line(p: Profile) -> str:
    """Each batch size's class and the knee."""
    cl = p.classification
    if not cl.get("batch_sizes"):
        return f"classes     {NOT_PROFILED}"
    return (
        "classes     "
        + ", ".join(_class_text(r) for r in cl["batch_sizes"])
        + f"; knee n* = {p.knee_tokens}"
        + (f" (95% CI {_knee_ci(cl['knee_tokens_ci95'])})" if cl.get("knee_tokens_ci95") else "")
    )


def _schedule_line(p: Profile) -> str:
    """The gamma schedule, and where speculation turns off."""
    crossover = p.schedule.crossover_batch_size
    return (
        "schedule    "
        + ", ".join(_schedule_text(e) for e in p.schedule.entries)
        + (
            f"; speculation off from batch size {crossover}"
            if crossover
            else _speculation_on_text(p.schedule.entries)
        )
    )


def _budget_lines(study: Mapping[str, Any]) -> list[str]:
    """A warning when the time budget stopped the study early; nothing otherwise."""
    if not study.get("provisional"):
        return []
    return [
        f"budget      PROVISIONAL: budget.timeout_s stopped the study after {study['trials_run']} of "
        f"{study['trials_planned']} trials; more trials (`autotune tune --resume`) may change it"
    ]


def _host_lines(noise: Mapping[str, Any] | None) -> list[str]:
    """The host's noise around the study: busy with its reasons, or quiet with the worst CV."""
    if not noise:
        return []
    checks = (n for n in (noise.get("before"), noise.get("after")) if n)
    worst = max(checks, key=lambda n: n["cv"], default=None)
    if worst is None:
        return []
    if noise["busy"]:
        return ["host        BUSY: " + "; ".join(worst["reasons"])]
    return [f"host        quiet (reference CV up to {worst['cv']:.1%})"]


def render_show(prof: Profile | Mapping[str, Any]) -> str:
    """``autotune profiles show``: the tune summary, then classification, Pareto front, predicted vs measured."""
    prof = _profile(prof)
    cl = prof.classification
    return "\n".join(
        [
            render_tune(prof),
            "\nclassification (verify cost of gamma_max+1 tokens vs one decode)",
            columns(
                ["batch", "verify cost", "label", "best gamma", "predicted speedup"],
                [
                    (r["batch_size"], r["verify_cost"], r["label"], r["best_gamma"], r["predicted_speedup"])
                    for r in cl.get("batch_sizes", ())
                ],
            )
            if cl.get("batch_sizes")
            else NOT_PROFILED,
            "\npareto front",
            columns(
                ["trial", "gamma", "threshold", "schedule", "tok/s", "latency ms"],
                [
                    (
                        p["trial"],
                        p["params"].get("gamma"),
                        p["params"].get("confidence_threshold"),
                        p["params"].get("gamma_schedule"),
                        p["tokens_per_second"],
                        p["latency_ms"],
                    )
                    for p in prof.pareto_front
                ],
            ),
            "\npredicted vs measured (chosen config)",
            columns(
                ["batch", "gamma", "predicted tok/s", "measured tok/s"],
                [
                    (
                        r["batch_size"],
                        r["gamma"],
                        r["predicted_tokens_per_second"],
                        r["measured_tokens_per_second"],
                    )
                    for r in prof.predicted_vs_measured
                ],
            ),
        ]
    )


def render_profile_list(rows: list[dict]) -> str:
    """``autotune profiles list``: one line per stored profile, newest first."""
    if not rows:
        return "no profiles stored yet (run `autotune tune`)"
    return columns(
        ["id", "device", "pair", "workload", "backend", "gamma", "tok/s", "created"],
        [
            (
                r["id"],
                r["device"],
                r["pair"],
                r["workload_hash"][:8],
                r["backend"],
                r["gamma"],
                r["tokens_per_second"],
                r["created_at"],
            )
            for r in rows
        ],
    )
