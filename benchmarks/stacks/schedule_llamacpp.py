"""Inside llama.cpp: one n-max across a load sweep, against the best n-max at each load level.

One run, one llama-server per configuration (the llamacpp backend's launcher and GGUF files, the
same host flags), the workload of ``--config`` (default the bundled tune.yaml; for the issue a
sweep config, e.g. ``workload.concurrency: [1, 2, 4, 8, 16]`` and ``search.max_batch_size:
[16]``). Each configuration runs every load level ``--repeats`` times, round r with the same seed
in every configuration (paired rounds); with ``--interleave N`` (N servers up at once; default 1:
back to back, a fresh server each) items 1-2, then 4 and the drift check, run their rounds
interleaved (``benchmarks/_schedule.py``; every later group measures no speculation again, so
ratios across groups go through it: the bridge, ``--no-bridge``). In this order:

1. llama-server without speculation (measured again at the end: the drift check);
2. a grid of ``--spec-draft-n-max`` with the draft model and ``--spec-draft-p-min 0``
   (``--grid``, default 1,2,3,5);
3. the n-max that maximises the traffic-weighted tokens/s of the sweep, chosen from the grid
   (a row pointing at that grid row, not run again): what one n-max can do for all levels (the
   tool's margin rule, ``choose_with_margin`` on the sweep's tokens/s, is printed beside it: it keeps
   speculation off unless an n-max is significantly faster, and takes the fastest n-max);
4. the config exported by ``autotune tune --backend engine`` (through the llama.cpp exporter with
   the GGUF paths) and the one chosen by ``autotune tune --backend llamacpp`` (the newest profiles
   for this host and pair), when present.

llama.cpp takes one n-max for every batch size (no table): the per-level n-max (the tool's
per-level rule, ``autotune.decide.selection.per_level_choices``: the sweep's constant unless another
n-max, or none, is significantly faster at that level) is printed as what a table would have held.
Tables and JSON as in ``schedule_vllm.py`` (``benchmarks/_schedule.py``): one table per load level,
one aggregate row per configuration (traffic-weighted tokens/s, the trace's, goodput under
``--slo-tpot-ms``); JSON
``benchmarks/results/schedule_llamacpp/schedule_llamacpp.json``.

Goals of the issue: at every level the tool's served choice >= 0.97x the best constant at that
level and >= 0.98x no speculation (where the per-level best n-max differ, one n-max cannot reach
every level's best: the table goal of 1.05x is vLLM's). Usage::

    python -m benchmarks.stacks.schedule_llamacpp [--config sweep.yaml] [--repeats 3] [--grid 1,2,3,5] \
[--slo-tpot-ms 50] [--out benchmarks/results/schedule_llamacpp/schedule_llamacpp.json] \
[--resume JSON [--measured-only]]
"""

from __future__ import annotations

import shlex
import statistics
import sys
from pathlib import Path

from autotune.backends.llamacpp import LlamacppBackend
from autotune.decide.selection import LevelChoice
from autotune.knobs import Knobs
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
    level_choice_text,
    new_plan,
    profile_brief,
    report,
    resume_rows,
    run_profiles,
)
from benchmarks._transfer import open_stack
from profiles.profile import export_inputs
from profiles.schema import Profile

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    args = arguments(__doc__, "llamacpp", "--spec-draft-n-max values of the grid (draft model, p-min 0)")
    bench = Bench("llamacpp", args, grid_values(args.grid), *open_stack(args, "llamacpp", LlamacppBackend))
    result = opening(bench)
    plan = new_plan(bench, checkpointer(bench, result))
    resume_rows(bench, plan, result, "llama_server_version")
    try:
        sweep_label, profile_labels = measure(bench, plan)
    finally:
        bench.backend.close()
    refs = analyse(plan.rows, bench.levels, args.slo_tpot_ms)
    choices = plan.level_choices("model")
    summary, extra, goal_labels = summarize(plan, refs, choices, sweep_label)
    version = ("llama_server_version", bench.backend.version)
    finish(bench, plan, result, version, choices, summary, extra, [*goal_labels, *profile_labels])
    stack_text = (
        f"llama-server {result['llama_server_version']} on {result['device']}, "
        f"-t {bench.cfg.backend.llamacpp.threads}"
    )
    report(bench, stack_text, "-np", result, extra)


def constant(bench: Bench, n_max: int) -> Knobs:
    """``--spec-draft-n-max`` n with the draft model and p-min 0 (n=0: no speculation)."""
    return Knobs("model" if n_max else "none", n_max, 0.0, max_batch_size=bench.batch)


def opening(bench: Bench) -> dict:
    """The JSON before anything is measured: the run's identity, flags, GGUF files and profiles."""
    ctx, args, backend, w = bench.ctx, bench.args, bench.backend, bench.workload
    return {
        "command": shlex.join([sys.executable, *sys.argv]),
        **stamp(ctx.fingerprint["label"]),
        "device": ctx.fingerprint["label"],
        "config": str(args.config),
        "llama_server_version": backend.version,
        "workload": ctx.workload,
        "trace": None if w.trace is None else str(w.trace),
        "levels": bench.levels,
        "parallel": bench.batch,
        "threads": bench.cfg.backend.llamacpp.threads,
        "repeats": args.repeats,
        "rounds_per_server": args.rounds_per_server,
        "grid": bench.grid,
        "slo_tpot_ms": args.slo_tpot_ms,
        "gguf": backend.describe()["gguf"],
        "engine_profile": profile_brief(bench.engine_profile),
        "llamacpp_profile": profile_brief(bench.stack_profile),
        "complete": False,
        "rows": [],
    }


def measure(bench: Bench, plan: Plan) -> tuple[str | None, list[str]]:
    """Items 1-4 and the drift check; the sweep-best n-max's label and the stored profiles' labels."""
    command = bench.backend.command
    with plan.together():
        plan.run("no speculation", command(constant(bench, 0)), "off", constant(bench, 0))
        grid_rows = {
            n: plan.run(f"grid n-max {n}", command(constant(bench, n)), "constant", constant(bench, n))
            for n in bench.grid
        }
    ok = [(n, r) for n, r in grid_rows.items() if "error" not in r]
    sweep_label = None
    if ok:  # the one n-max for every level: the grid's best traffic-weighted tokens/s over the sweep
        n = max(ok, key=lambda nr: statistics.median(nr[1]["tokens_per_second_runs"]))[0]
        sweep_label = f"sweep-best n-max {n} (from the grid)"
        plan.run(sweep_label, command(constant(bench, n)), "alias", constant(bench, n))

    with plan.together():
        profile_labels = run_profiles(bench, plan, lambda profile: serve_profile(bench, profile))
        plan.run("no speculation (again, last)", command(constant(bench, 0)), "off-again", constant(bench, 0))
    return sweep_label, profile_labels


def serve_profile(bench: Bench, profile: Profile) -> tuple[list[str], dict[int, int]]:
    """A stored profile's exported llama-server command on this run's GGUF files, and its n-max
    at every level (one n-max for all)."""
    backend = bench.backend
    inputs = export_inputs(
        profile, str(backend.target_gguf), str(backend.draft_gguf) if backend.draft_gguf else None
    )
    n = 0 if inputs.drafter == "none" else inputs.gamma
    return backend.profile_command(inputs), {b: n for b in bench.levels}


def summarize(
    plan: Plan, refs: dict, choices: list[LevelChoice], sweep_label: str | None
) -> tuple[dict, list[str], list[str | None]]:
    """The summary and the report's lines on the one n-max against the per-level ones (``refs``:
    what :func:`analyse` compared against), and the margin rule's choice; the labels of the rows
    whose per-level goals are reported."""
    rows = plan.rows
    summary = common_summary(plan, refs, choices)
    summary["sweep_best_n_max"] = sweep_label
    differ = len({c.gamma for c in choices}) > 1
    per_level = level_choice_text(choices).replace("K=", "n-max ")
    line = f"llama.cpp takes one n-max; per-level best would be {per_level}"
    if not differ:
        line += " (the per-level rule keeps one n-max: no other is significantly faster at any level)"
    summary["per_level_best_differ"] = differ
    extra = [
        line,
        "per-level n-max (the tool's per-level rule: the sweep's constant unless another n-max is "
        "significantly faster there, this run):",
    ]
    extra += [x.replace("K=", "n-max ") for x in choice_lines(choices)]
    margin, why = plan.constant_choice()
    sweep_of = next((r.get("same_as") for r in rows if r["config"] == sweep_label), None)
    summary["margin_rule_choice"] = margin
    extra.append(
        f"the tool's margin rule over no speculation and the grid (sweep tokens/s): {margin} ({why})"
    )
    return summary, extra, [sweep_label, None if margin == sweep_of else margin]


if __name__ == "__main__":
    main()
