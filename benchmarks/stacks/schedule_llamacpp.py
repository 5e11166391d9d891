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

import json
import shlex
import statistics
import sys
import time
from pathlib import Path

from autotune.backends.llamacpp import LlamacppBackend
from autotune.knobs import Knobs
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
    level_choice_text,
    level_requests,
    noise_by_level,
    noise_lines,
    print_report,
    requests_text,
    write_json,
)
from benchmarks._transfer import open_stack
from profiles.profile import export_inputs
from profiles.schema import Profile

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    args = arguments(__doc__, "llamacpp", "--spec-draft-n-max values of the grid (draft model, p-min 0)")
    grid = grid_values(args.grid)
    cfg, ctx, backend, engine_prof, chosen_prof = open_stack(args, "llamacpp", LlamacppBackend)
    batch = max(cfg.search.max_batch_size)
    levels = list(cfg.batch_sizes)
    w = cfg.workload
    t0 = time.perf_counter()

    def constant(n_max: int) -> Knobs:
        return Knobs("model" if n_max else "none", n_max, 0.0, max_batch_size=batch)

    result: dict = {
        "command": shlex.join([sys.executable, *sys.argv]),
        **stamp(ctx.fingerprint["label"]),
        "device": ctx.fingerprint["label"],
        "config": str(args.config),
        "llama_server_version": backend.version,
        "workload": ctx.workload,
        "trace": None if w.trace is None else str(w.trace),
        "levels": levels,
        "parallel": batch,
        "threads": cfg.backend.llamacpp.threads,
        "repeats": args.repeats,
        "grid": grid,
        "slo_tpot_ms": args.slo_tpot_ms,
        "gguf": backend.describe()["gguf"],
        "engine_profile": engine_prof and {k: engine_prof[k] for k in ("id", "chosen", "schedule")},
        "llamacpp_profile": chosen_prof and {k: chosen_prof[k] for k in ("id", "chosen", "schedule")},
        "complete": False,
        "rows": [],
    }

    def checkpoint(rows: list[dict]) -> None:
        result.update(rows=rows, wall_s=time.perf_counter() - t0)
        write_json(args.out, result)

    interleave = args.interleave or backend.keep_servers
    greedy = w.temperature == 0
    plan = Plan(
        backend,
        batch,
        levels,
        args.repeats,
        cfg.budget.seed,
        greedy,
        checkpoint,
        interleave=interleave,
        bridge=args.bridge,
    )
    if args.resume is not None:  # the rows (and the host they were measured on) of an earlier run
        plan.resume(args.resume, measure_new=not args.measured_only)
        earlier = json.loads(args.resume.read_text())
        result.update(
            device=earlier.get("device", result["device"]),
            llama_server_version=earlier.get("llama_server_version", result["llama_server_version"]),
            resumed_from=str(args.resume),
        )
        if earlier.get("device") != ctx.fingerprint["label"]:
            print(f"note: the resumed rows were measured on {earlier.get('device')}", file=sys.stderr)
    try:
        with plan.together():
            plan.run("no speculation", backend.command(constant(0)), "off", constant(0))
            grid_rows = {
                n: plan.run(f"grid n-max {n}", backend.command(constant(n)), "constant", constant(n))
                for n in grid
            }
        ok = [(n, r) for n, r in grid_rows.items() if "error" not in r]
        sweep_label = None
        if ok:  # the one n-max for every level: the grid's best traffic-weighted tokens/s over the sweep
            n = max(ok, key=lambda nr: statistics.median(nr[1]["tokens_per_second_runs"]))[0]
            sweep_label = f"sweep-best n-max {n} (from the grid)"
            plan.run(sweep_label, backend.command(constant(n)), "alias", constant(n))

        profile_labels = []
        with plan.together():
            wanted = (
                ("engine-backend export", engine_prof, "autotune tune"),
                ("llamacpp-backend choice", chosen_prof, "autotune tune --backend llamacpp"),
            )
            for label, prof in plan.profiles(wanted, profile_labels):
                inputs = export_inputs(
                    Profile.from_json(prof),
                    str(backend.target_gguf),
                    str(backend.draft_gguf) if backend.draft_gguf else None,
                )
                n = 0 if inputs.drafter == "none" else inputs.gamma
                plan.run(
                    label,
                    backend.profile_command(inputs),
                    "profile",
                    k_per_level={b: n for b in levels},
                )
            plan.run("no speculation (again, last)", backend.command(constant(0)), "off-again", constant(0))
    finally:
        backend.close()

    rows = plan.rows
    refs = analyse(rows, levels, args.slo_tpot_ms)
    choices = plan.level_choices("model")
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
    found, lines = goal_lines(rows, [sweep_label, None if margin == sweep_of else margin, *profile_labels])
    summary["goals"] = found
    extra += lines
    summary["noise"] = noise_by_level(rows, levels, level_requests(w, batch))
    extra += noise_lines(summary["noise"])

    result.update(
        llama_server_version=backend.version or result["llama_server_version"],
        wall_s=time.perf_counter() - t0,
        complete=not plan.skipped,
        skipped=plan.skipped,
        per_level_choices=choices_json(choices),
        summary=summary,
        rows=rows,
    )
    write_json(args.out, result)
    print_report(
        f"llama-server {result['llama_server_version']} on {result['device']}, "
        f"-t {cfg.backend.llamacpp.threads}; "
        f"workload {w.prompts.name}, concurrency {list(w.concurrency)}, "
        f"{requests_text(level_requests(w, batch))} x "
        f"{w.max_new_tokens} tokens per level"
        + (f", trace {w.trace}" if w.trace is not None else "")
        + f"; {args.repeats} rounds per server; -np {batch}",
        result,
        levels,
        w.rate is None,
        extra,
    )
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
