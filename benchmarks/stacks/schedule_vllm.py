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
from dataclasses import dataclass, field, replace
from pathlib import Path

from autotune.backends.vllm import VllmBackend, serve_command
from autotune.decide.selection import LevelChoice, TableVerdict, table_verdict
from autotune.knobs import Knobs, table_text
from benchmarks._common import stamp
from benchmarks._schedule import (
    Bench,
    Plan,
    analyse,
    arguments,
    checkpointer,
    choice_lines,
    common_summary,
    finish,
    grid_values,
    identity,
    k_at,
    level_choice_text,
    new_plan,
    parse_table,
    profile_brief,
    ratio_text,
    report,
    resume_rows,
    run_profiles,
    table_cost,
)
from benchmarks._transfer import open_stack
from profiles.exporters._common import batch_ranges
from profiles.profile import export_inputs
from profiles.schema import Profile

ROOT = Path(__file__).resolve().parents[2]

TABLE_KEY = "num_speculative_tokens_per_batch_size"


@dataclass
class Tables:
    """The tables this run serves beside the constants (items 4 and 5), and the profiles' rows."""

    choices: list[LevelChoice]  # the tool's per-level rule over the grid
    tuned: tuple[tuple[int, int], ...]  # the table that rule makes (() when nothing was measured)
    table_label: str | None  # the tuned table's row; None where it is not served
    note: str  # why it is served or not
    fastest: tuple[tuple[int, int], ...]  # per level, the grid's fastest K >= 1
    fastest_label: str | None  # its row; None where it is not served
    profile_labels: list[str] = field(default_factory=list)  # the stored profiles' rows (item 6)


def main() -> None:
    args = arguments(__doc__, "vllm", "constant K values of the grid (draft model)", tables=True)
    bench = Bench("vllm", args, grid_values(args.grid), *open_stack(args, "vllm", VllmBackend))
    result = opening(bench)
    plan = new_plan(bench, checkpointer(bench, result, "vllm_version"))
    resume_rows(bench, plan, result, "vllm_version")
    asked = [Knobs.for_table("model", parse_table(t), bench.batch) for t in args.tables]
    try:
        measure_grid(bench, plan, asked)
        tables = decide_tables(plan)
        measure_tables(bench, plan, tables)
    finally:
        bench.backend.close()
    summary, extra, goal_labels = summarize(bench, plan, result, tables, asked)
    version = ("vllm_version", bench.backend.version)
    finish(bench, plan, result, version, tables.choices, summary, extra, goal_labels)
    report(bench, f"vLLM {result['vllm_version']} on {result['device']}", "--max-num-seqs", result, extra)


def constant(bench: Bench, k: int) -> Knobs:
    """Chain K with the draft model at every batch size (K=0: no speculation)."""
    return Knobs("model" if k else "none", k, max_batch_size=bench.batch)


def as_table(bench: Bench, knobs: Knobs, ranges: list[list[int]]) -> list[str]:
    """The server command of chain ``knobs`` with vLLM's table set to ``ranges`` as given."""
    cmd = bench.backend.command(knobs)
    at = cmd.index("--speculative-config") + 1
    cmd[at] = json.dumps({**json.loads(cmd[at]), TABLE_KEY: ranges})
    return cmd


def opening(bench: Bench) -> dict:
    """The JSON before anything is measured: the run's identity, flags and stored profiles."""
    w = bench.workload
    return {
        **identity(bench.ctx, bench.args.config),
        **stamp(bench.ctx.fingerprint["label"]),
        "vllm_version": None,
        "trace": None if w.trace is None else str(w.trace),
        "levels": bench.levels,
        "max_num_seqs": bench.batch,
        "repeats": bench.args.repeats,
        "rounds_per_server": bench.args.rounds_per_server,
        "grid": bench.grid,
        "slo_tpot_ms": bench.args.slo_tpot_ms,
        "engine_profile": profile_brief(bench.engine_profile),
        "vllm_profile": profile_brief(bench.stack_profile),
        "complete": False,
        "rows": [],
    }


def measure_grid(bench: Bench, plan: Plan, asked: list[Knobs]) -> None:
    """Items 1-3, interleaved: no speculation, the grid, the asked tables, the table with K=0."""
    command, batch = bench.backend.command, bench.batch
    with plan.together():  # what the table is made of, interleaved
        plan.run("no speculation", command(constant(bench, 0)), "off", constant(bench, 0))
        for k in bench.grid:
            plan.run(f"grid K={k}", command(constant(bench, k)), "constant", constant(bench, k))
        for knobs in asked:  # written as a table even where it holds one K (the export would not)
            ranges = [[lo, hi, k] for lo, hi, k in batch_ranges(knobs.table)]
            cmd = as_table(bench, constant(bench, knobs.gamma), ranges)
            plan.run(f"asked {knobs.label}", cmd, "table-asked", knobs)
        zero = as_table(bench, constant(bench, 1), [[1, batch, 0]])  # K=1 chain, its table K=0 everywhere
        plan.run(
            f"table 1-{batch}:0 (K=0 everywhere)",
            zero,
            "table-zero",
            k_per_level={b: 0 for b in bench.levels},
        )


def decide_tables(plan: Plan) -> Tables:
    """The tables the grid names: the tool's per-level rule's (item 4) and the point estimates' (5)."""
    planned = plan.table_plan("model")
    choices = planned.levels if planned is not None else []
    tuned = planned.table if planned is not None else ()
    table_label = None
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
    return Tables(choices, tuned, table_label, note, fastest, fastest_label)


def measure_tables(bench: Bench, plan: Plan, tables: Tables) -> None:
    """Items 4-6 and the drift check, interleaved: the tables, the stored profiles, no speculation
    again; the note, printed, says where the tuned table was not measured."""
    command, table_row = bench.backend.command, None
    with plan.together():  # the tables, the tuned profiles and the drift check, interleaved
        if tables.table_label is not None:
            knobs = Knobs.for_table("model", tables.tuned, bench.batch)
            table_row = plan.run(tables.table_label, command(knobs), "table", knobs)
        if tables.fastest_label is not None:
            knobs = Knobs.for_table("model", tables.fastest, bench.batch)
            plan.run(tables.fastest_label, command(knobs), "table-fastest", knobs)
        tables.profile_labels = run_profiles(bench, plan, lambda profile: serve_profile(bench, profile))
        plan.run("no speculation (again, last)", command(constant(bench, 0)), "off-again", constant(bench, 0))
    if table_row is not None and "error" in table_row:
        tables.note += " (not measured: the run failed or stopped before it)"
    print(f"note: {tables.note}", file=sys.stderr)


def serve_profile(bench: Bench, profile: Profile) -> tuple[list[str], dict[int, int]]:
    """A stored profile's exported vLLM command on this host's deployment, and its K per level."""
    inputs = export_inputs(profile)
    ks = {b: 0 if inputs.drafter == "none" else k_at(inputs.schedule, b) for b in bench.levels}
    return serve_command(bench.backend.python, replace(inputs, deployment=bench.backend.deployment)), ks


def summarize(
    bench: Bench, plan: Plan, result: dict, tables: Tables, asked: list[Knobs]
) -> tuple[dict, list[str], list[str | None]]:
    """The summary and the report's lines on the tables (verdict, served choice, costs); the labels
    of the rows whose per-level goals are reported."""
    refs = analyse(plan.rows, bench.levels, bench.args.slo_tpot_ms)
    summary = common_summary(plan, refs, tables.choices)
    summary["tuned_table"] = table_text(tables.tuned) if tables.table_label else None
    summary["table_note"] = tables.note
    extra = [
        "per-level K (the tool's per-level rule: the sweep's constant unless another K is significantly "
        "faster there, this run):",
        *choice_lines(tables.choices),
        f"table: {tables.note}",
    ]
    served = served_choice(bench, plan, refs, tables, result, summary, extra)
    extra += cost_lines(plan.rows, bench.levels, tables, summary)
    extra += asked_lines(plan.rows, bench.levels, asked, summary)
    return (
        summary,
        extra,
        [
            tables.table_label,
            served if served != tables.table_label else None,
            tables.fastest_label,
            *tables.profile_labels,
        ],
    )


def served_choice(
    bench: Bench, plan: Plan, refs: dict, tables: Tables, result: dict, summary: dict, extra: list[str]
) -> str | None:
    """``table_verdict(tuned table, best constant overall, no speculation)`` into the JSON and the
    report, where all three were measured; the tool's served choice from this run: the tuned table
    where it won that verdict, else the margin rule over no speculation and the grid."""
    by_label = {r["config"]: r for r in plan.rows if "aggregate" in r}
    tab = by_label.get(tables.table_label or "")
    best, off = by_label.get(refs["best_constant"] or ""), by_label.get(refs["no_speculation"] or "")
    verdict = None
    if tab and best and off:
        verdict = table_verdict(plan.point(tab), plan.point(best), plan.point(off), bench.levels)
        result["table_verdict"] = {
            "won": verdict.won,
            "reason": verdict.reason,
            "per_level": verdict.per_level,
        }
        summary["table_won"] = verdict.won
        summary["tuned_table_aggregate_over_best_constant"] = tab["aggregate"]["over_best_constant"]
        extra += verdict_lines(verdict, tab)
    if verdict and verdict.won:
        served, why = tables.table_label, "the tuned table won table_verdict"
    else:
        served, why = plan.constant_choice()
        why = "the margin rule over no speculation and the grid on the sweep's tokens/s: " + why
    summary["served_by_rule"] = served
    extra.append(f"served by the tool's rule from this run: {served} ({why})")
    return served


def verdict_lines(verdict: TableVerdict, tab: dict) -> list[str]:
    """The report's lines on the verdict: its reason, its paired ratios per level, the table's goal."""
    return [
        f"verdict: {verdict.reason}",
        *(
            f"  batch {lv['batch_size']}: table K={lv['table_gamma']} vs constant K={lv['constant_gamma']}: "
            f"x constant {ratio_text(lv['ratio_over_constant'])}, "
            f"x no-spec {ratio_text(lv['ratio_over_off'])}"
            for lv in verdict.per_level
        ),
        "goal (per-level best K differ): tuned table's aggregate >= 1.05x the best constant's: "
        f"{ratio_text(tab['aggregate']['over_best_constant'])}",
    ]


def cost_lines(rows: list[dict], levels: list[int], tables: Tables, summary: dict) -> list[str]:
    """What enabling the table costs (K=0 everywhere over no speculation) and what serving the
    fastest-per-level table costs and gains, per level, into ``summary`` and as the report's lines."""
    lines = []
    zero_row = next((r for r in rows if r["kind"] == "table-zero" and "aggregate" in r), None)
    if zero_row:
        summary["table_zero_over_no_speculation"] = zero_row["aggregate"]["over_no_speculation"]
        lines.append(
            "cost of enabling the table (K=0 everywhere over no speculation, per level): "
            + ", ".join(f"{b}: {ratio_text(zero_row['levels'][b]['over_no_speculation'])}" for b in levels)
        )
    label = tables.fastest_label
    cost = table_cost(rows, label, levels) if label else None
    if cost:
        fast = {r["config"]: r for r in rows if "aggregate" in r}.get(label)
        summary["fastest_table"] = {
            "table": table_text(tables.fastest),
            "over_constant_same_k": {b: c["over_constant_same_k"] for b, c in cost.items()},
            "over_best_constant": fast and fast["aggregate"]["over_best_constant"],
        }
        lines.append(
            f"{label} (served whatever the noise says): aggregate x the best constant "
            f"{ratio_text(fast and fast['aggregate']['over_best_constant'])}; what serving it as a table "
            "costs (x the constant of the K it holds there, per level): "
            + ", ".join(f"{b} (K={c['k']}): {ratio_text(c['over_constant_same_k'])}" for b, c in cost.items())
        )
    return lines


def asked_lines(rows: list[dict], levels: list[int], asked: list[Knobs], summary: dict) -> list[str]:
    """What serving each ``--table`` as a table costs, per level, into ``summary`` and as lines."""
    lines = []
    for knobs in asked:
        label = f"asked {knobs.label}"
        if cost := table_cost(rows, label, levels):
            summary.setdefault("asked_tables", {})[knobs.label] = {
                "over_constant_same_k": {b: c["over_constant_same_k"] for b, c in cost.items()}
            }
            per_level = (
                f"{b} (K={c['k']}): {ratio_text(c['over_constant_same_k'])}" for b, c in cost.items()
            )
            lines.append(
                f"{label}: what serving it as a table costs (x the constant of the K it holds there, "
                "per level): " + ", ".join(per_level)
            )
    return lines


if __name__ == "__main__":
    main()
