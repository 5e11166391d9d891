"""Human views of command results: tables and one-line summaries. Pure functions of plain data."""

from __future__ import annotations

from autotune.table import table

BENCH_ROWS = [
    ("tokens_per_second", "tokens/s"), ("requests_per_second", "requests/s"), ("speedup", "speedup (x)"),
    ("acceptance_rate", "acceptance rate"), ("mean_acceptance_length", "mean acceptance length"),
    ("per_position_acceptance", "per-position acceptance"), ("rollback_frequency", "rollback frequency"),
    ("verification_efficiency", "verification efficiency"), ("draft_cost_ratio", "draft cost ratio"),
    ("batch_utilization", "batch utilization"), ("mean_batch_size", "mean batch size"),
    ("ttft_ms_p50", "ttft ms p50"), ("ttft_ms_p95", "ttft ms p95"), ("tpot_ms_p50", "tpot ms p50"),
    ("tpot_ms_p95", "tpot ms p95"), ("e2e_ms_p50", "e2e ms p50"), ("e2e_ms_p95", "e2e ms p95"),
]


def render_bench(result: dict, drafter: str, gamma: int, threshold: float, batch_size: int, num_requests: int) -> str:
    """``autotune bench``'s table: each metric for the speculative and the autoregressive run."""
    rows = [(label, result.get(key), result.get(f"baseline_{key}")) for key, label in BENCH_ROWS]
    lines = [f"drafter={drafter} gamma={gamma} threshold={threshold} batch={batch_size} "
             f"requests={num_requests} device={result['device']}",
             table(["metric", "speculative", "autoregressive"], rows)]
    if "greedy_match" in result:
        lines.append(f"greedy_match: {str(result['greedy_match']).lower()}")
    return "\n".join(lines)


def render_profile(data: dict) -> str:
    """Human view of a profiler measurement: identity, ceilings, knee, batch-size table."""
    fp, ce = data["fingerprint"], data["ceilings"]
    theo = fp.get("theoretical") or {}
    lines = [f"device      {fp['label']}  [{fp['key']}]",
             f"bandwidth   measured {ce['copy_bandwidth']['median_bytes_per_s'] / 1e9:.1f} GB/s"
             + (f", theoretical {theo['bandwidth_bytes_per_s'] / 1e9:.0f} GB/s" if theo.get("bandwidth_bytes_per_s") else ""),
             f"matmul      measured {ce['matmul']['median_flops'] / 1e12:.3f} TFLOP/s"
             + (f", theoretical {theo['dense_bf16_flops'] / 1e12:.0f} TFLOP/s" if theo.get("dense_bf16_flops") else ""),
             f"ridge       {ce['ridge_flops_per_byte']:.1f} FLOP/byte",
             f"knee n*     {data['knee_tokens'] or '> ' + str(max(int(n) for n in data['curves']['knee_curve']))} tokens per verify pass",
             f"acceptance  {data['acceptance']['acceptance_rate'] or 0:.3f} at gamma {data['acceptance']['gamma_max']} "
             f"(per position: {', '.join(f'{a:.2f}' for a in data['acceptance']['per_position_acceptance'])})", ""]
    cl = data["classification"]
    rows = [(r["batch_size"], r["verify_cost"], "-".join(f"{x:.2f}" for x in r.get("verify_cost_ci95") or []) or "n/a",
             r["label"] + ("" if r.get("separable", True) else " (not separable at this noise)"),
             r["best_gamma"], r["best_threshold"], r["predicted_speedup"]) for r in cl["batch_sizes"]]
    lines.append(table(["batch", f"verify cost (gamma={cl['gamma_max']}+1 vs 1)", "95% CI", "label", "best gamma",
                        "best threshold", "predicted speedup"], rows))
    if cl.get("knee_tokens_ci95"):
        lines.append(f"knee n* 95% CI: {_knee_ci(cl['knee_tokens_ci95'])} tokens (bootstrap of the repeated timings)")
    return "\n".join(lines)


def _ratio(value: float | None, ci: list | None, unit: str = "x") -> str:
    """``1.62x (95% CI 1.51-1.70)``; without an interval (old profiles, one repeat) just the value."""
    if value is None:
        return "n/a"
    if not ci or ci[0] == ci[1] == value:
        return f"{value:.2f}{unit}"
    return f"{value:.2f}{unit} (95% CI {ci[0]:.2f}-{ci[1]:.2f})"


def _with_ci(value: float, ci: list | None, fmt: str = ".1f") -> str:
    return f"{value:{fmt}}" + (f" (95% CI {ci[0]:{fmt}}-{ci[1]:{fmt}})" if ci and ci[0] != ci[1] else "")


def _class_text(r: dict) -> str:
    ci = r.get("verify_cost_ci95")
    if not ci:
        return f"B={r['batch_size']}: {r['label']}"
    sep = "" if r.get("separable", True) else " (not separable at this noise)"
    return f"B={r['batch_size']}: {r['label']}{sep} [cost {r['verify_cost']:.2f}, 95% CI {ci[0]:.2f}-{ci[1]:.2f}]"


def _knee_ci(ci: list) -> str:
    return "-".join("not bent" if n is None else str(n) for n in ci)


def _schedule_text(e: dict) -> str:
    text = f"B={e['batch_size']}: gamma {e['gamma']}"
    if "ratio" not in e:
        return text
    from autotune.stats import Estimate, describe_difference

    r = e["ratio"]
    return text + f" (speculation vs gamma 0: {describe_difference(Estimate(r['value'], *r['ci95'], r.get('n', 2)))})"


def render_tune(p: dict) -> str:
    m, c = p["metrics"], p["chosen"]
    lat = m["latency_metric"]
    backend = p.get("backend") or {"name": "engine"}
    measured_by = backend["name"] + (f" {backend['version']}" if backend.get("version") else "")
    lines = [
        f"profile #{p.get('id')} for {p['device']['label']} ({p['study']['n_trials']} trials on {measured_by}, "
        f"study {p['study']['name']})",
        f"chosen      drafter={c['drafter']} gamma={c['gamma']} threshold={c['confidence_threshold']:.2f} "
        f"schedule={c['gamma_schedule']} max_batch_size={c['max_batch_size']}  ({p['selection']['reason']})",
        "",
    ]
    rows = []
    for b, lv in sorted(m["per_level"].items(), key=lambda kv: int(kv[0])):
        base = p["baseline"]["per_level"].get(b) or p["baseline"]["per_level"].get(str(b)) or {}
        ratio = (m.get("per_level_speedup") or {}).get(b) or (m.get("per_level_speedup") or {}).get(str(b))
        rows.append((b, lv["tokens_per_second"], base.get("tokens_per_second"),
                     _ratio(ratio["value"], ratio["ci95"]) if ratio else
                     lv["tokens_per_second"] / base["tokens_per_second"] if base.get("tokens_per_second") else None,
                     lv["tpot_ms_p50"], lv["tpot_ms_p95"], lv["ttft_ms_p95"], lv["e2e_ms_p95"], lv["acceptance_rate"]))
    lines.append(table(["load", "tok/s", "AR tok/s", "speedup", "tpot p50", "tpot p95", "ttft p95", "e2e p95",
                        "acceptance"], rows))
    lines += ["",
              f"overall     {_with_ci(m['tokens_per_second'], m.get('tokens_per_second_ci95'))} tok/s, "
              f"{lat} {_with_ci(m['latency_ms'], m.get('latency_ms_ci95'))} ms"
              + (f"; medians of {m['repeats']} repeats ({(p.get('remeasure') or {}).get('order', 'interleaved')})"
                 if m.get("repeats") else ""),
              f"speedup     {_ratio(m['speedup'], m.get('speedup_ci95'))} over AR"
              + ("; it is the best static-gamma configuration" if m.get("chosen_is_best_static")
                 else f", {_ratio(m['speedup_over_best_static'], m.get('speedup_over_best_static_ci95'))} over the "
                      "best static-gamma configuration (paired re-measurements)"
                 if m.get("speedup_over_best_static") else ""),
              "classes     " + ", ".join(_class_text(r) for r in p["classification"]["batch_sizes"])
              + f"; knee n* = {p['knee_tokens']}"
              + (f" (95% CI {_knee_ci(p['classification']['knee_tokens_ci95'])})"
                 if p["classification"].get("knee_tokens_ci95") else ""),
              "schedule    " + ", ".join(_schedule_text(e) for e in p["schedule"])
              + (f"; speculation off from batch size {p['crossover_batch_size']}" if p["crossover_batch_size"] else
                 "; speculation pays at every measured batch size"),
              f"stored      profile #{p.get('id')} in {p['study']['storage']}"]
    if p["study"].get("provisional"):
        lines.insert(-1, f"budget      PROVISIONAL: budget.timeout_s stopped the study after {p['study']['trials_run']} of "
                         f"{p['study']['trials_planned']} trials; more trials (`autotune tune --resume`) may change it")
    noise = p.get("host_noise")
    if noise:
        worst = max((n for n in (noise.get("before"), noise.get("after")) if n), key=lambda n: n["cv"], default=None)
        if worst is not None:
            lines.insert(-1, "host        " + ("BUSY: " + "; ".join(worst["reasons"]) if noise["busy"] else
                                                 f"quiet (reference CV up to {worst['cv']:.1%})"))
    if p.get("exports"):
        lines.append("exports     " + ", ".join(p["exports"]))
    return "\n".join(lines)


def render_show(prof: dict) -> str:
    """``autotune profiles show``: the tune summary, then classification, Pareto front, predicted vs measured."""
    cl = prof["classification"]
    return "\n".join([
        render_tune(prof),
        "\nclassification (verify cost of gamma_max+1 tokens vs one decode)",
        table(["batch", "verify cost", "label", "best gamma", "predicted speedup"],
              [(r["batch_size"], r["verify_cost"], r["label"], r["best_gamma"], r["predicted_speedup"])
               for r in cl["batch_sizes"]]),
        "\npareto front",
        table(["trial", "gamma", "threshold", "schedule", "tok/s", "latency ms"],
              [(p["trial"], p["params"].get("gamma"), p["params"].get("confidence_threshold"),
                p["params"].get("gamma_schedule"), p["tokens_per_second"], p["latency_ms"])
               for p in prof["pareto_front"]]),
        "\npredicted vs measured (chosen config)",
        table(["batch", "gamma", "predicted tok/s", "measured tok/s"],
              [(r["batch_size"], r["gamma"], r["predicted_tokens_per_second"], r["measured_tokens_per_second"])
               for r in prof["predicted_vs_measured"]]),
    ])


def render_profile_list(rows: list[dict]) -> str:
    """``autotune profiles list``: one line per stored profile, newest first."""
    if not rows:
        return "no profiles stored yet (run `autotune tune`)"
    return table(["id", "device", "pair", "workload", "backend", "gamma", "tok/s", "created"],
                 [(r["id"], r["device"], r["pair"], r["workload_hash"][:8], r["backend"], r["gamma"],
                   r["tokens_per_second"], r["created_at"]) for r in rows])
