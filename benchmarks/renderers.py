"""The figures of each claim's latest run: one renderer per step of benchmarks/claims.py.

A renderer reads a step's JSON and returns its headline :class:`Table`: the figures its results
page cites, computed with the scripts' own statistics (:func:`benchmarks._transfer.summarize`,
:func:`benchmarks._schedule.analyse`, :class:`autotune.stats.Estimate`, the scripts' report
helpers). It reads keys and lets a missing one raise :class:`KeyError`: benchmarks/pages.py turns
that into one line naming the key. :data:`RENDERERS` maps each step to its renderer.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.cli.text import fmt
from autotune.stats import Estimate
from benchmarks import _schedule, _transfer
from benchmarks.stacks import deployment_scale, quantized_llamacpp
from benchmarks.stacks import vllm_plugin as vllm_plugin_bench


@dataclass(frozen=True)
class Table:
    """A step's headline figures: one Markdown table and the lines under it."""

    headers: Sequence[str]
    rows: Sequence[Sequence[object]]
    notes: Sequence[str] = ()


def _est(d: dict[str, Any] | None) -> str | None:
    return _schedule.ratio_text(d)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def demo_pair_quality(d: dict[str, Any]) -> Table:
    rows = [
        (
            label,
            f"{m['speedup']:.2f}x",
            m["acceptance_rate"],
            m["mean_acceptance_length"],
            f"{fmt(m['tokens_per_second'])} ({fmt(m['baseline_tokens_per_second'])})",
            m["draft_cost_ratio"],
            m.get("greedy_match"),
        )
        for label, m in (("greedy", d["greedy"]), ("T=1", d["t1"]))
    ]
    head = ["mode", "speedup", "acceptance", "mean accepted length", "tok/s (AR)", "draft cost / AR step"]
    return Table([*head, "outputs = AR"], rows)


def vs_transformers(d: dict[str, Any]) -> Table:
    n, same = d["num_prompts"], d["identical_outputs"]
    rows = [
        (
            name.replace("/", " / "),
            Estimate(iv["ratio"], iv["ci95"][0], iv["ci95"][1], n).cell(),
            f"{iv['per_prompt_median']:.2f}",
            f"{same[name.replace('/', '==')]}/{n}" if name.replace("/", "==") in same else None,
        )
        for name, iv in d["ratio_intervals"].items()
    ]
    return Table(["tokens/s ratio", "value (95% CI)", "per-prompt median", "identical outputs"], rows)


def engine_speedup(d: dict[str, Any]) -> Table:
    rows = [
        (
            key.replace("/", ", B="),
            s["best_gamma"],
            f"{s['best_measured_speedup']:.2f}x",
            s["median_measured_over_profile_predicted"],
            s["all_greedy_match"],
        )
        for key, s in d["summary"].items()
    ]
    head = ["engine", "best gamma", "best speedup", "measured / profile-predicted (median)", "outputs = AR"]
    return Table(head, rows)


def load_sweep(d: dict[str, Any]) -> Table:
    rows = [
        (c, b["gamma"], b["tokens_per_second"], f"{b['speedup']:.2f}x")
        for c, b in d["best_gamma_per_concurrency"].items()
    ]
    stops = d["stops_paying_at_concurrency"]
    note = (
        f"Speculation stops paying at concurrency {stops}." if stops else "Speculation pays at every level."
    )
    return Table(["concurrency", "best gamma", "tok/s", "x gamma 0"], rows, [note])


def costmodel_accuracy(d: dict[str, Any]) -> Table:
    by_batch: dict[int, list[dict[str, Any]]] = {}
    for c in d["cells"]:
        by_batch.setdefault(c["batch_size"], []).append(c)
    rows: list[tuple[object, ...]] = [
        (
            b,
            len(cs),
            _pct(statistics.median(c["abs_rel_error"] for c in cs)),
            _pct(statistics.median(c["step_phase_abs_rel_error"] for c in cs)),
        )
        for b, cs in sorted(by_batch.items())
    ]
    rows.append(
        ("all", len(d["cells"]), _pct(d["median_abs_rel_error"]), _pct(d["median_step_phase_abs_rel_error"]))
    )
    head = ["batch size", "cells (gammas)", "median error (closed loop)", "median error (step phase)"]
    return Table(head, rows)


def trees(d: dict[str, Any]) -> Table:
    rows = [
        (
            s["batch_size"],
            s["mode"],
            s["ar_tokens_per_second"],
            f"{s['best_chain']} ({s['chain_x_ar']:.2f}x)",
            f"{s['best_tree']} ({s['tree_x_ar']:.2f}x)",
            s["tree_over_chain_paired"],
            f"{s['best_hybrid']} ({s['hybrid_x_ar']:.2f}x)" if s.get("best_hybrid") else None,
        )
        for s in d["summary"]
    ]
    head = ["B", "mode", "AR tok/s", "best chain (x AR)", "best tree (x AR)", "tree / chain (paired)"]
    return Table([*head, "best hybrid (x AR)"], rows)


def draft_after_verify(d: dict[str, Any]) -> Table:
    rows = [
        (
            c["draft_dtype"],
            " ".join(f"{a / b:.2f}" for a, b in zip(c["after_verify_s"], c["draft_only_s"], strict=True)),
            c["mean_ratio"],
        )
        for c in d["cells"]
    ]
    return Table(["draft dtype", "after verify / draft only, per position", "mean"], rows)


def tuner_vs_grid(d: dict[str, Any]) -> Table:
    chosen = d["chosen"]
    rows: list[tuple[object, ...]] = [
        ("study's best / grid's best", d["study_best_over_grid_best"]),
        (
            "evaluations: study / grid",
            f"{d['study_trials']} / {d['grid_evaluations']} ({d['study_evaluations_fraction']:.0%})",
        ),
        (
            "chosen",
            f"{chosen['drafter']} gamma {chosen['gamma']}, {fmt(d['chosen_tokens_per_second'])} tok/s",
        ),
    ]
    rows += [(f"tuned / {r['config']}", f"{r['tuned_over_default']:.2f}x") for r in d["defaults"]]
    return Table(["figure", "value"], rows)


def acceptance_tail(d: dict[str, Any]) -> Table:
    rows = [
        (
            name,
            s["cases"],
            _pct(s["mean_rate_abs"]),
            _pct(s["last_rate_abs"]),
            f"{100 * s['mean_rate_closer']:.0f}%",
        )
        for name, s in d["groups"].items()
    ]
    head = ["group", "cases", "mean rate: abs. error", "last rate: abs. error", "mean rate closer"]
    return Table(head, rows)


def noise_robustness(d: dict[str, Any]) -> Table:
    rows = []
    for condition, runs in d["runs"].items():
        for i, r in enumerate(runs, 1):
            ci = r["speedup_ci95"] or [r["speedup"], r["speedup"]]
            speedup = f"{r['speedup']:.2f} ({ci[0]:.2f}-{ci[1]:.2f})"
            seen = "busy" if r["host_busy"] else "quiet"
            rows.append((condition, i, r["chosen_gamma"], speedup, seen, f"{r['wall_s']:.0f}"))
    s = d["summary"]
    note = (
        f"Quiet majority: gamma {s['quiet_majority']['chosen_gamma']}; busy runs deciding alike: "
        f"{s['decision_agreement']:.0%}; goal {'met' if s['goal_met'] else 'not met'}."
    )
    return Table(["condition", "run", "gamma", "speedup (95% CI)", "host seen", "wall s"], rows, [note])


def budget(d: dict[str, Any]) -> Table:
    rows = [
        (
            r["backend"],
            f"{r['budget_min']:g} min",
            f"{r['wall_min']:.1f} min ({r['wall_over_budget']:.2f})",
            r["exit_code"],
            r["cut"],
            r["chosen"],
        )
        for r in d["runs"]
    ]
    notes = [f"Each run tunes {d['config']} from an empty store."] if "config" in d else []
    return Table(["backend", "budget", "wall (x budget)", "exit", "cut", "chosen"], rows, notes)


def _transfer_table(d: dict[str, Any], chosen_prefix: str) -> Table:
    """Each configuration's paired ratios, recomputed from its rounds by the benchmark's own summary."""
    rows = copy.deepcopy(d["rows"])
    summary = _transfer.summarize(rows, d["workload"]["temperature"] == 0, chosen_prefix)
    body = [
        (r["config"], "error: " + str(r["error"])[:60], None, None, None)
        if "error" in r
        else (
            r["config"],
            f"{fmt(r['tokens_per_second'])} ({fmt(r['min'])}-{fmt(r['max'])})",
            _est(r["over_no_speculation"]),
            _est(r["over_grid_best"]),
            r.get("greedy_identical"),
        )
        for r in rows
    ]
    drift = _est(summary["drift_no_speculation_last_over_first"])
    notes = [
        f"The grid's best: {summary['grid_best']}; no speculation last over first (drift): {drift or '-'}."
    ]
    head = ["configuration", "tok/s median (min-max)", "x no speculation (95% CI)", "x grid's best (95% CI)"]
    return Table([*head, "greedy = no speculation"], body, notes)


def transfer_vllm(d: dict[str, Any]) -> Table:
    return _transfer_table(d, "vllm-backend choice")


def transfer_llamacpp(d: dict[str, Any]) -> Table:
    return _transfer_table(d, "llamacpp-backend choice")


def _analysed(rows: list[dict[str, Any]], levels: list[int], slo: float) -> list[dict[str, Any]]:
    """The rows with their per-level and sweep ratios recomputed (:func:`benchmarks._schedule.analyse`)."""
    rows = copy.deepcopy(rows)
    for row in rows:
        row["per_level_rounds"] = {int(b): v for b, v in row.get("per_level_rounds", {}).items()}
        row["k_per_level"] = {int(b): k for b, k in (row.get("k_per_level") or {}).items()}
    _schedule.analyse(rows, levels, slo)
    return rows


def _level_table(rows: list[dict[str, Any]], levels: list[int], notes: Sequence[str] = ()) -> Table:
    """Per configuration: median tok/s (x no speculation) per level, and the sweep with its interval."""

    def at(r: dict[str, Any], b: int) -> str:
        lv = r["levels"][b]
        ratio = lv["over_no_speculation"]
        return f"{fmt(lv['tokens_per_second']['median'])} ({fmt(ratio and round(ratio['value'], 2))})"

    body = [
        (
            r["config"],
            *(at(r, b) for b in levels),
            r["aggregate"]["tokens_per_second"]["median"],
            _est(r["aggregate"]["over_no_speculation"]),
        )
        if "levels" in r
        else (r["config"], *(["error"] * len(levels)), None, None)
        for r in rows
    ]
    head = ["tok/s (x no speculation)", *(f"concurrency {b}" for b in levels), "sweep tok/s"]
    head += ["sweep x no speculation (95% CI)"]
    return Table(head, body, notes)


def _schedule_table(d: dict[str, Any]) -> Table:
    levels = [int(b) for b in d["levels"]]
    s = d["summary"]
    notes = [f"Best constant over the sweep: {s['best_constant']}."]
    for key in ("served_by_rule", "margin_rule_choice"):
        if s.get(key):
            notes.append(f"The tool's rule serves: {s[key]}.")
    if s.get("drift_no_speculation_last_over_first"):
        notes.append(
            f"No speculation last over first (drift): {_est(s['drift_no_speculation_last_over_first'])}."
        )
    if d.get("complete") is False:
        notes.append("The run is marked incomplete (`complete: false`): some configurations were skipped.")
    return _level_table(_analysed(d["rows"], levels, d["slo_tpot_ms"]), levels, notes)


schedule_vllm = _schedule_table
schedule_llamacpp = _schedule_table


def vllm_plugin(d: dict[str, Any]) -> Table:
    levels = [int(b) for b in d["levels"]]
    met = d["summary"].get("goal_met_on_point_ratios")
    notes = [f"Goal ({d['summary']['goal']}): {'met' if met else 'not met'} on the point ratios."]
    rows = _analysed(d["rows"], levels, d["slo_tpot_ms"])
    for r in rows:
        a = r.get("aggregate") or {}
        if a.get("trace_tokens_per_second"):
            notes.append(
                f"Phase trace (low, burst, low), {r['config']}: "
                f"{fmt(a['trace_tokens_per_second']['median'])} tok/s, "
                f"x no speculation {_est(a['trace_over_no_speculation'])}, "
                f"x the best constant {_est(a['trace_over_best_constant'])}."
            )
    for label, c in d["summary"].get("catch_ups", {}).items():
        notes.append(f"Catch-ups: {vllm_plugin_bench.catch_up_text(label, c).strip()}.")
    return _level_table(rows, levels, notes)


def chat_workload(d: dict[str, Any]) -> Table:
    levels = [int(b) for b in d["levels"]]
    rows, notes = [], []
    for name, side in d["vllm"].items():
        rows += _analysed(side["rows"], levels, float("inf"))
        acc = " ".join(f"{p:.2f}" for p in d["engine"][name]["per_position_acceptance"][:5])
        notes.append(
            f"{name}: engine acceptance p1-p5 {acc}; the tool's K per level {side['level_choice_text']}."
        )
    return _level_table(rows, levels, notes)


def stack_cost_vllm(d: dict[str, Any]) -> Table:
    a = d["analysis"]
    plan = a["planner"]
    held = [abs(x["ratio"] - 1) for x in a["predicted_vs_measured"] if not x["calibration"]]
    rows = [(p["level"], p["grid_best_k"], p["planner_k"], p["ratio"]) for p in plan["picks"]]
    notes = [
        f"Fit from K={', '.join(map(str, a['calibration']))}: the {len(held)} held-out (level, K) predicted "
        f"within a median {_pct(statistics.median(held))} (max {_pct(max(held))}); the planner serves "
        f"{plan['starts']} of the grid's {plan['grid_starts']} servers."
    ]
    return Table(["concurrency", "grid's best K", "planner's K", "planner's / grid's best"], rows, notes)


def _best_text(best: dict[str, Any]) -> str:
    """``n-max 3 (1.05x)``: a GGUF type's best configuration and its ratio over its no speculation."""
    return f"{best['config'].split(' ', 1)[1]} ({best['over_no_speculation']['value']:.2f}x)"


def quantized_llamacpp_table(d: dict[str, Any]) -> Table:
    s = d["summary"]
    types = list(s["sweep"]["best"])
    scopes = [("the sweep", s["sweep"]), *((f"concurrency {c}", x) for c, x in s["per_level"].items())]
    rows = [
        (
            scope,
            *(_best_text(x["best"][q]) for q in types),
            quantized_llamacpp.text(x["f32_choice_at_q4_k_m_over_q4_k_m_best"]),
            quantized_llamacpp.text(x["q4_k_m_best_over_f32_best"]),
        )
        for scope, x in scopes
    ]
    head = ["scope", *(f"best {q} (x no spec.)" for q in types), "f32's choice at q4_k_m / q4_k_m's best"]
    return Table([*head, "q4_k_m best / f32 best"], rows)


def drafters(d: dict[str, Any]) -> Table:
    rows = [
        (
            key.replace("@", ", concurrency "),
            b["gamma"],
            _est(b["over_no_speculation"]),
            b["mean_acceptance_length"],
            b["draft_cost_ratio"],
        )
        for key, b in d["engine"]["best"].items()
    ]
    notes = [
        f"Inside vLLM at concurrency {c}: {x['eagle3']} over {x['model']} {_est(x)}."
        for c, x in ((d.get("vllm") or {}).get("best_eagle3_over_best_model") or {}).items()
    ]
    head = [
        "engine: drafter",
        "best gamma",
        "x no speculation (95% CI)",
        "accepted length",
        "draft cost / AR step",
    ]
    return Table(head, rows, notes)


def deployment_scale_table(d: dict[str, Any]) -> Table:
    refusal = d["refusal"]
    rows: list[list[object]] = [
        ["target", f"Llama-3.2-1B's shapes, {d.get('target_layers', 16)} layers"],
        *deployment_scale.summary(d["tune"]),
        ["a checkpoint too large to fit", f"exit {refusal['exit_code']} in {refusal['seconds']:.1f} s"],
    ]
    return Table(["quantity", "value"], rows)


def watch_drift(d: dict[str, Any]) -> Table:
    rows = []
    for p in d["phases"]:
        first, conf = p.get("first_stale") or {}, p.get("confirm")
        rows.append(
            (
                p["phase"],
                p["concurrency"],
                p.get("acceptance_rate"),
                p.get("windows"),
                p.get("stale_windows"),
                f"{first['after_s']:.0f} s (window {first['window']})" if first else "-",
                f"K={first['alternative_k']}" if first else "-",
                f"{first['predicted_gain']:.2f}x" if first else "-",
                conf["measured_gain_text"] if conf else "-",
            )
        )
    rt = d.get("retune")
    notes = (
        [f"Re-tune of the {rt['phase']} phase: K={rt['chosen_k']} (the watch named K={rt['named_k']})."]
        if rt
        else []
    )
    head = ["phase", "concurrency", "acceptance", "windows", "stale", "first stale", "named", "predicted"]
    return Table([*head, "measured (paired)"], rows, notes)


RENDERERS: dict[str, Callable[[dict[str, Any]], Table]] = {
    "demo_pair_quality": demo_pair_quality,
    "vs_transformers": vs_transformers,
    "engine_speedup": engine_speedup,
    "load_sweep": load_sweep,
    "costmodel_accuracy": costmodel_accuracy,
    "trees": trees,
    "draft_after_verify": draft_after_verify,
    "tuner_vs_grid": tuner_vs_grid,
    "acceptance_tail": acceptance_tail,
    "noise_robustness": noise_robustness,
    "budget": budget,
    "transfer_vllm": transfer_vllm,
    "schedule_vllm": schedule_vllm,
    "stack_cost_vllm": stack_cost_vllm,
    "vllm_plugin": vllm_plugin,
    "transfer_llamacpp": transfer_llamacpp,
    "schedule_llamacpp": schedule_llamacpp,
    "quantized_llamacpp": quantized_llamacpp_table,
    "chat_workload": chat_workload,
    "drafters": drafters,
    "deployment_scale": deployment_scale_table,
    "watch_drift_vllm": watch_drift,
    "watch_drift_llamacpp": watch_drift,
}
"""Step name -> the function that reads its JSON and returns its headline :class:`Table`."""
