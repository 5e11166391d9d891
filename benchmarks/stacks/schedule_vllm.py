"""Inside vLLM: K per load level (a by-batch-size table) against every constant K, across a load sweep.

One run, one vLLM server per configuration (the vllm backend's launcher, the same host flags), the
workload of ``--config`` (default the bundled tune.yaml; for the issue a sweep config, e.g.
``workload.concurrency: [1, 2, 4, 8, 16]`` and ``search.max_batch_size: [16]``). Each
configuration runs every load level ``--repeats`` times, round r with the same seed in every
configuration (paired rounds), interleaved in two phases (items 1-3, then 4-6 and the drift
check), in groups of as many servers as are up at once (``--interleave``, default what the host's
memory holds; ``benchmarks/_schedule.py``), every later group measuring no speculation again so
ratios across groups go through it (the bridge; ``--no-bridge``), in this order:

1. vLLM without speculation (measured again at the end: the drift check);
2. a grid of constant K with the draft model (``--grid``, default 1,2,3,5), and any table asked
   for with ``--table`` (e.g. ``1-16:2``: one K everywhere, so over grid K=2 it is what the table
   mechanism alone costs; each asked table's cost per level is printed like item 5's);
3. the table with K=0 at every batch size (``num_speculative_tokens`` 1,
   ``num_speculative_tokens_per_batch_size [[1, max_num_seqs, 0]]``): what merely enabling the
   table costs against no speculation (vLLM #49548);
4. the table the tool's per-level rule makes from this run's grid (``autotune.decide.selection.plan_table``,
   the one the tune serves: the margin rule's constant over the sweep unless another K, or none,
   is significantly faster at a level; the table holds K >= 1, its K=0 ranges still running the
   draft), served live as vLLM's ``num_speculative_tokens_per_batch_size``; not served, with the
   tool's note, when it holds one K at every level or the constants already show it would lose
   at some level;
5. the table the point estimates name (``Plan.fastest_table``: per level the grid's fastest K >= 1
   this run, no margin), when it holds more than one K and is not the tuned table: served whatever
   the noise says, it shows what a K >= 1 table costs inside vLLM beside the constants it is made
   of (``table_cost``, per level) and what it gains over the best constant;
6. the config exported by ``autotune tune --backend engine`` and the one chosen by
   ``autotune tune --backend vllm`` (the newest profiles for this host and pair), when present.

Printed: one table per load level (tokens/s median and min-max over rounds, TPOT p95, the paired
ratio over no speculation and over the best constant at that level, with 95% intervals), then one
aggregate row per configuration (traffic-weighted tokens/s of the sweep, the trace's tokens/s when
the workload has ``workload.trace``, goodput under ``--slo-tpot-ms``, see ``benchmarks/_schedule.py``),
and ``table_verdict(tuned table, best constant overall, no speculation)`` with its paired
per-level ratios. The tool's served choice from this run is the tuned table where it wins that
verdict, else the margin rule (``choose_with_margin`` on the sweep's tokens/s) over no speculation
and the grid. JSON: ``benchmarks/results/schedule_vllm/schedule_vllm.json`` (every round of every level of
every configuration; rewritten after each configuration, ``complete`` false until the end).

Goals of the issue: at every level the tool's served choice >= 0.97x the best constant at that
level and >= 0.98x no speculation; where the per-level best K differ, the tuned table's aggregate
>= 1.05x the best single constant's. Usage::

    python -m benchmarks.stacks.schedule_vllm [--config sweep.yaml] [--repeats 3] [--grid 1,2,3,5] \
[--interleave N] [--no-bridge] [--slo-tpot-ms 50] [--table 1-16:2 ...] \
[--out benchmarks/results/schedule_vllm/schedule_vllm.json] [--resume JSON [--measured-only]]
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from autotune.backends.vllm import VllmBackend, serve_command
from autotune.decide.selection import table_verdict
from autotune.knobs import Knobs, table_text
from benchmarks._common import stamp
from benchmarks._schedule import (
    Plan,
    analyse,
    arguments,
    choice_lines,
    choices_json,
    common_summary,
    goal_lines,
    grid_values,
    identity,
    k_at,
    level_choice_text,
    level_requests,
    noise_by_level,
    noise_lines,
    parse_table,
    print_report,
    ratio_text,
    requests_text,
    table_cost,
    write_json,
)
from benchmarks._transfer import open_stack
from profiles.exporters._common import batch_ranges
from profiles.profile import export_inputs
from profiles.schema import Profile

ROOT = Path(__file__).resolve().parents[2]

TABLE_KEY = "num_speculative_tokens_per_batch_size"


def main() -> None:
    args = arguments(__doc__, "vllm", "constant K values of the grid (draft model)", tables=True)
    grid = grid_values(args.grid)
    cfg, ctx, backend, engine_prof, vllm_prof = open_stack(args, "vllm", VllmBackend)
    batch = max(cfg.search.max_batch_size)
    levels = list(cfg.batch_sizes)
    w = cfg.workload
    t0 = time.perf_counter()

    def constant(k: int) -> Knobs:
        return Knobs("model" if k else "none", k, max_batch_size=batch)

    def command(knobs: Knobs) -> list[str]:
        return backend.command(knobs)

    def as_table(knobs: Knobs, ranges: list[list[int]]) -> list[str]:
        """The server command of chain ``knobs`` with vLLM's table set to ``ranges`` as given."""
        cmd = command(knobs)
        at = cmd.index("--speculative-config") + 1
        cmd[at] = json.dumps({**json.loads(cmd[at]), TABLE_KEY: ranges})
        return cmd

    result: dict = {
        **identity(ctx, args.config),
        **stamp(ctx.fingerprint["label"]),
        "vllm_version": None,
        "trace": None if w.trace is None else str(w.trace),
        "levels": levels,
        "max_num_seqs": batch,
        "repeats": args.repeats,
        "grid": grid,
        "slo_tpot_ms": args.slo_tpot_ms,
        "engine_profile": engine_prof and {k: engine_prof[k] for k in ("id", "chosen", "schedule")},
        "vllm_profile": vllm_prof and {k: vllm_prof[k] for k in ("id", "chosen", "schedule")},
        "complete": False,
        "rows": [],
    }

    def checkpoint(rows: list[dict]) -> None:
        result.update(
            rows=rows, wall_s=time.perf_counter() - t0, vllm_version=backend.version or result["vllm_version"]
        )
        write_json(args.out, result)

    interleave = args.interleave or backend.keep_servers
    plan = Plan(
        backend,
        batch,
        levels,
        args.repeats,
        cfg.budget.seed,
        w.temperature == 0,
        checkpoint,
        interleave=interleave,
        bridge=args.bridge,
    )
    if args.resume is not None:  # the rows (and the host they were measured on) of an earlier run
        plan.resume(args.resume, measure_new=not args.measured_only)
        earlier = json.loads(args.resume.read_text())
        result.update(
            device=earlier.get("device", result["device"]),
            vllm_version=earlier.get("vllm_version"),
            resumed_from=str(args.resume),
        )
        if earlier.get("device") != ctx.fingerprint["label"]:
            print(f"note: the resumed rows were measured on {earlier.get('device')}", file=sys.stderr)
    asked = [Knobs.for_table("model", parse_table(t), batch) for t in args.tables]
    try:
        with plan.together():  # what the table is made of, interleaved
            plan.run("no speculation", command(constant(0)), "off", constant(0))
            for k in grid:
                plan.run(f"grid K={k}", command(constant(k)), "constant", constant(k))
            for knobs in asked:  # written as a table even where it holds one K (the export would not)
                ranges = [[lo, hi, k] for lo, hi, k in batch_ranges(knobs.table)]
                cmd = as_table(constant(knobs.gamma), ranges)
                plan.run(f"asked {knobs.label}", cmd, "table-asked", knobs)
            zero = as_table(constant(1), [[1, batch, 0]])  # K=1 chain, its table K=0 everywhere
            plan.run(
                f"table 1-{batch}:0 (K=0 everywhere)", zero, "table-zero", k_per_level={b: 0 for b in levels}
            )

        planned = plan.table_plan("model")
        choices = planned.levels if planned is not None else []
        tuned = planned.table if planned is not None else ()
        table_label, table_row = None, None
        if planned is None:
            note = "nothing measured: no table served"
        elif planned.unserved:
            note = f"{planned.unserved} ({level_choice_text(choices)})"
        else:
            table_label = f"tuned table {table_text(tuned)}"
            note = f"per-level best K {level_choice_text(choices)}: served as {table_label}"

        # the table the point estimates name, served whatever the noise says: what a K >= 1 table
        # costs inside vLLM beside the constants it is made of, and what it gains where they differ
        fastest, fastest_label = plan.fastest_table(), None
        if len({k for _, k in fastest}) > 1 and fastest != tuned:
            fastest_label = f"fastest-per-level table {table_text(fastest)}"

        profile_labels = []
        with plan.together():  # the tables, the tuned profiles and the drift check, interleaved
            if table_label is not None:
                knobs = Knobs.for_table("model", tuned, batch)
                table_row = plan.run(table_label, command(knobs), "table", knobs)
            if fastest_label is not None:
                knobs = Knobs.for_table("model", fastest, batch)
                plan.run(fastest_label, command(knobs), "table-fastest", knobs)
            wanted = (
                ("engine-backend export", engine_prof, "autotune tune"),
                ("vllm-backend choice", vllm_prof, "autotune tune --backend vllm"),
            )
            for label, prof in plan.profiles(wanted, profile_labels):
                inputs = export_inputs(Profile.from_json(prof))
                ks = {b: 0 if inputs.drafter == "none" else k_at(inputs.schedule, b) for b in levels}
                plan.run(
                    label,
                    serve_command(backend.python, replace(inputs, deployment=backend.deployment)),
                    "profile",
                    k_per_level=ks,
                )
            plan.run("no speculation (again, last)", command(constant(0)), "off-again", constant(0))
        if table_row is not None and "error" in table_row:
            note += " (not measured: the run failed or stopped before it)"
        print(f"note: {note}", file=sys.stderr)
    finally:
        backend.close()

    rows = plan.rows
    refs = analyse(rows, levels, args.slo_tpot_ms)
    summary = common_summary(plan, refs, choices)
    summary["tuned_table"] = table_text(tuned) if table_label else None
    summary["table_note"] = note
    extra = [
        "per-level K (the tool's per-level rule: the sweep's constant unless another K is significantly "
        "faster there, this run):"
    ]
    extra += choice_lines(choices)
    extra.append(f"table: {note}")

    by_label = {r["config"]: r for r in rows if "aggregate" in r}
    tab = by_label.get(table_label or "")
    best, off = by_label.get(refs["best_constant"] or ""), by_label.get(refs["no_speculation"] or "")
    verdict = None
    if tab and best and off:
        verdict = table_verdict(plan.point(tab), plan.point(best), plan.point(off), levels)
        result["table_verdict"] = {
            "won": verdict.won,
            "reason": verdict.reason,
            "per_level": verdict.per_level,
        }
        summary["table_won"] = verdict.won
        summary["tuned_table_aggregate_over_best_constant"] = tab["aggregate"]["over_best_constant"]
        extra.append(f"verdict: {verdict.reason}")
        extra += [
            f"  batch {lv['batch_size']}: table K={lv['table_gamma']} vs constant K={lv['constant_gamma']}: "
            f"x constant {ratio_text(lv['ratio_over_constant'])}, "
            f"x no-spec {ratio_text(lv['ratio_over_off'])}"
            for lv in verdict.per_level
        ]
        extra.append(
            "goal (per-level best K differ): tuned table's aggregate >= 1.05x the best constant's: "
            f"{ratio_text(tab['aggregate']['over_best_constant'])}"
        )
    if verdict and verdict.won:
        served, why = table_label, "the tuned table won table_verdict"
    else:
        served, why = plan.constant_choice()
        why = "the margin rule over no speculation and the grid on the sweep's tokens/s: " + why
    summary["served_by_rule"] = served
    extra.append(f"served by the tool's rule from this run: {served} ({why})")
    zero_row = next((r for r in rows if r["kind"] == "table-zero" and "aggregate" in r), None)
    if zero_row:
        summary["table_zero_over_no_speculation"] = zero_row["aggregate"]["over_no_speculation"]
        extra.append(
            "cost of enabling the table (K=0 everywhere over no speculation, per level): "
            + ", ".join(f"{b}: {ratio_text(zero_row['levels'][b]['over_no_speculation'])}" for b in levels)
        )
    cost = table_cost(rows, fastest_label, levels) if fastest_label else None
    if cost:
        fast = by_label.get(fastest_label)
        summary["fastest_table"] = {
            "table": table_text(fastest),
            "over_constant_same_k": {b: c["over_constant_same_k"] for b, c in cost.items()},
            "over_best_constant": fast and fast["aggregate"]["over_best_constant"],
        }
        extra.append(
            f"{fastest_label} (served whatever the noise says): aggregate x the best constant "
            f"{ratio_text(fast and fast['aggregate']['over_best_constant'])}; what serving it as a table "
            "costs (x the constant of the K it holds there, per level): "
            + ", ".join(f"{b} (K={c['k']}): {ratio_text(c['over_constant_same_k'])}" for b, c in cost.items())
        )
    for knobs in asked:
        label = f"asked {knobs.label}"
        if cost := table_cost(rows, label, levels):
            summary.setdefault("asked_tables", {})[knobs.label] = {
                "over_constant_same_k": {b: c["over_constant_same_k"] for b, c in cost.items()}
            }
            per_level = (
                f"{b} (K={c['k']}): {ratio_text(c['over_constant_same_k'])}" for b, c in cost.items()
            )
            extra.append(
                f"{label}: what serving it as a table costs (x the constant of the K it holds there, "
                "per level): " + ", ".join(per_level)
            )
    found, lines = goal_lines(
        rows, [table_label, served if served != table_label else None, fastest_label, *profile_labels]
    )
    summary["goals"] = found
    extra += lines
    summary["noise"] = noise_by_level(rows, levels, level_requests(w, batch))
    extra += noise_lines(summary["noise"])

    result.update(
        vllm_version=backend.version or result["vllm_version"],
        wall_s=time.perf_counter() - t0,
        complete=not plan.skipped,
        skipped=plan.skipped,
        per_level_choices=choices_json(choices),
        summary=summary,
        rows=rows,
    )
    write_json(args.out, result)
    print_report(
        f"vLLM {result['vllm_version']} on {result['device']}; workload {w.prompts.name}, concurrency "
        f"{list(w.concurrency)}, {requests_text(level_requests(w, batch))} x {w.max_new_tokens} tokens "
        "per level"
        + (f", trace {w.trace}" if w.trace is not None else "")
        + f"; {args.repeats} rounds per server; --max-num-seqs {batch}",
        result,
        levels,
        w.rate is None,
        extra,
    )
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
