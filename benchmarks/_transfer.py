"""Shared body of the transfer benchmarks: configurations measured inside one serving stack.

``transfer_vllm.py`` and ``transfer_llamacpp.py`` each build a plan of ``(label, launch command)``
and call :func:`measure_plan`: every configuration gets a fresh server (the backend's launcher,
the same host flags), the workload's load levels run ``repeats`` times after a warm-up, round r of
every configuration with seed + r, so rounds pair across configurations (measured by the schedule
benchmarks' :class:`benchmarks._schedule.Plan`, in the tuner's
:func:`autotune.decide.decision.round_order`). :func:`summarize` gives each row the paired ratio to no
speculation and to the grid's best (:func:`autotune.stats.paired_ratio`: geometric mean of the
per-round ratios, 95% interval, as the tuner compares configurations) beside its median tokens/s
with min-max over repeats, its acceptance, and whether its greedy outputs equal the
no-speculation server's token for token (where the stack streams token ids: vLLM does,
llama-server's OpenAI stream does not, and the column stays empty;
tests/autotune/test_backend_llamacpp_real.py checks its ids instead). Commands already measured
are not run twice (their row says ``same_as``), except the no-speculation baseline, which runs
first and again last (the drift check).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from autotune import context
from autotune.cli.text import columns, fmt
from autotune.config import load_config
from autotune.errors import USER_ERRORS
from autotune.stats import Estimate, describe_difference, pairable, paired_ratio, significant
from benchmarks._common import claim_dir
from benchmarks._schedule import Plan, ratio_text, summary_text, write_json

ROOT = Path(__file__).resolve().parents[1]


def arguments(doc: str, stack: str, extra: list[tuple[str, str, str]]) -> argparse.Namespace:
    """The flags every transfer benchmark shares, plus ``extra`` ``(flag, default, help)`` string flags."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=ROOT / "tune.yaml")
    p.add_argument("--repeats", type=int, default=3)
    for flag, default, text in extra:
        p.add_argument(flag, default=default, help=text)
    p.add_argument(
        "--engine-profile",
        metavar="ID",
        type=int,
        default=None,
        help="profile id (default: newest engine-backend one)",
    )
    p.add_argument(
        f"--{stack}-profile",
        dest="stack_profile",
        metavar="ID",
        type=int,
        default=None,
        help=f"profile id (default: newest {stack}-backend one)",
    )
    p.add_argument("--out", type=Path, default=claim_dir(f"transfer_{stack}") / f"transfer_{stack}.json")
    return p.parse_args()


def open_stack(args: argparse.Namespace, stack: str, backend_cls) -> tuple:
    """``(cfg, ctx, backend, engine profile, stack profile)``; a user error is one line and exit 2."""
    try:
        cfg = load_config(args.config)
        ctx = context.build(cfg)
        backend = backend_cls(ctx)
        return (
            cfg,
            ctx,
            backend,
            newest_profile(ctx, "engine", args.engine_profile),
            newest_profile(ctx, stack, args.stack_profile),
        )
    except USER_ERRORS as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        sys.exit(2)


def newest_profile(ctx, backend: str, profile_id: int | None) -> dict | None:
    """The given profile, or the newest one for this host and pair that ``backend`` measured."""
    if profile_id is not None:
        return ctx.store.get_profile(profile_id)
    for row in ctx.store.list_profiles():
        if row["backend"] != backend:
            continue
        prof = ctx.store.get_profile(row["id"])
        if (
            prof["device"]["key"] == ctx.device_key
            and prof["pair"]["target_hash"] == ctx.target_hash
            and prof["pair"].get("draft_hash") == ctx.draft_hash
        ):
            return prof
    return None


def measure_plan(
    backend,
    plan: list[tuple[str, list[str]]],
    batch: int,
    repeats: int,
    seed: int,
    host_flag: str = "--host",
    interleaved: bool = False,
) -> list[dict]:
    """Every configuration of ``plan`` in a fresh server; one row per entry (see the module docstring),
    measured by the schedule benchmarks' :class:`benchmarks._schedule.Plan` (no bridge).

    ``interleaved``: the servers stay up together and round r runs every configuration before round
    r+1 (a host's drift then hits each round's pairs alike); where the backend would not interleave
    them (its ``remeasure_order``, as in the tuner's re-measurement: it keeps fewer servers than the
    plan has configurations, ``keep_servers``, sized by memory), back to back instead. A command
    already measured is the earlier row's (``same_as``), except a label starting with "no
    speculation", measured again each time (the drift check)."""
    distinct = {json.dumps(c) for _, c in plan}
    if interleaved and backend.remeasure_order(len(distinct)) != "interleaved":
        print(
            f"interleaving {len(distinct)} servers needs keep_servers >= {len(distinct)} "
            f"(this host keeps {backend.keep_servers}): back to back per server",
            file=sys.stderr,
        )
        interleaved = False
    together = len(plan) if interleaved else 1
    runner = Plan(
        backend, batch, (), repeats, seed, False, host_flag=host_flag, interleave=together, bridge=False
    )
    runner.keep_outputs = True
    with runner.together():  # one group of every server interleaved, else one group per server
        for label, command in plan:
            spec = not label.startswith("no speculation")
            again = not spec and any(r["kind"] == "off" for r in runner.rows)
            runner.run(label, command, "config" if spec else "off-again" if again else "off")
    return [_row(r, "interleaved" if interleaved else "back to back") for r in runner.rows]


def _row(row: dict, order: str) -> dict:
    """A :class:`Plan` row as the transfer benchmarks store it: median tokens/s with min-max over
    the rounds, the last round's per-level metrics and acceptance at the first level, every
    round's tokens/s at each level (for paired ratios per level), the first level's outputs."""
    kept = {k: row[k] for k in ("config", "same_as", "error", "args") if k in row}
    if "error" in row:
        return kept
    tps, levels = row["tokens_per_second_runs"], row["per_level_rounds"]
    last = {b: {k: v[-1] for k, v in lv.items()} for b, lv in levels.items()}
    return {
        **kept,
        "startup_s": row["startup_s"],
        "order": order,
        "tokens_per_second_runs": tps,
        "tokens_per_second": statistics.median(tps),
        "min": min(tps),
        "max": max(tps),
        "acceptance_rate": last[min(last)]["acceptance_rate"],
        "per_level": last,
        "per_level_runs": {str(b): lv["tokens_per_second"] for b, lv in levels.items()},
        "outputs": row["outputs"],
    }


def _over(row: dict, ref: dict | None) -> Estimate | None:
    """``row``'s tokens/s over ``ref``'s, paired round by round; None where they cannot be paired."""
    if ref is None:
        return None
    a, b = row["tokens_per_second_runs"], ref["tokens_per_second_runs"]
    return paired_ratio(a, b) if pairable(a, b) else None


def summarize(rows: list[dict], greedy: bool, chosen_prefix: str) -> dict:
    """Ratios per row (in place) and the summary figures of a transfer benchmark.

    Each measured row gets its paired ratio (:meth:`Estimate.as_dict`) over no speculation (the
    first) and over the grid's best (its highest median tokens/s). The summary gives them for the
    engine's export and the stack's choice, the tuner's verdict on each against the grid's best
    (:func:`autotune.stats.describe_difference`), the grid rows the best is not significantly
    faster than (:func:`autotune.stats.significant`: what this run cannot tell from the best), and
    the drift (no speculation last over first).

    Example:
        >>> def row(name, *tps):
        ...     return {"config": name, "tokens_per_second_runs": list(tps),
        ...             "tokens_per_second": sorted(tps)[1], "outputs": [[1, 2]]}
        >>> rows = [row("no speculation", 100, 104, 96), row("grid K=2", 150, 158, 142),
        ...         row("grid K=3", 148, 160, 152), row("grid K=5", 120, 126, 118)]
        >>> s = summarize(rows, True, "choice")
        >>> s["grid_best"], s["grid_within_noise_of_best"], round(rows[3]["over_grid_best"]["value"], 2)
        ('grid K=3', ['grid K=2'], 0.79)
    """
    base = next((r for r in rows if r["config"] == "no speculation" and "error" not in r), None)
    grid = [r for r in rows if "error" not in r and r["config"].startswith("grid")]
    best = max(grid, key=lambda r: r["tokens_per_second"], default=None)
    add_ratios(rows, base, best, greedy)

    def first(prefix: str, key: str):
        return next((r[key] for r in rows if r["config"].startswith(prefix) and "error" not in r), None)

    last = rows[-1] if rows and rows[-1]["config"].startswith("no speculation (again") else None
    drift = _over(last, base) if last and "error" not in last else None
    return {
        "grid_best": best["config"] if best else None,
        "grid_best_tokens_per_second": best["tokens_per_second"] if best else None,
        "grid_within_noise_of_best": _within_noise(grid, best),
        "engine_export_over_grid_best": first("engine-backend export", "over_grid_best"),
        "engine_export_vs_grid_best": _verdict(rows, "engine-backend export", best),
        "engine_export_over_no_speculation": first("engine-backend export", "over_no_speculation"),
        "choice_over_grid_best": first(chosen_prefix, "over_grid_best"),
        "choice_vs_grid_best": _verdict(rows, chosen_prefix, best),
        "choice_over_no_speculation": first(chosen_prefix, "over_no_speculation"),
        "drift_no_speculation_last_over_first": drift and drift.as_dict(),
    }


def add_ratios(rows: list[dict], base: dict | None, best: dict | None, greedy: bool) -> None:
    """Each measured row's paired ratios over no speculation (``base``) and over the grid's best
    (``best``), and, greedy, whether its tokens equal no speculation's (in place)."""
    for r in rows:
        if "error" in r:
            continue
        for key, ref in (("over_no_speculation", base), ("over_grid_best", best)):
            est = _over(r, ref)
            r[key] = est and est.as_dict()
        ids = all(-1 not in out for out in r["outputs"])  # llama-server's OpenAI stream carries no ids
        if base and greedy and ids:
            r["greedy_identical"] = r["outputs"] == base["outputs"]


def _within_noise(grid: list[dict], best: dict | None) -> list[str]:
    """The grid rows the best is not significantly faster than (paired over rounds)."""
    if not best:
        return []
    return [
        r["config"]
        for r in grid
        if r["tokens_per_second_runs"] != best["tokens_per_second_runs"]
        and (over := _over(best, r)) is not None
        and not significant(over)
    ]


def _verdict(rows: list[dict], prefix: str, best: dict | None) -> str | None:
    """The tuner's words for the first measured row named ``prefix`` against the grid's best."""
    row = next((r for r in rows if r["config"].startswith(prefix) and "error" not in r), None)
    if row is None or best is None or row["over_grid_best"] is None:
        return None
    if row["tokens_per_second_runs"] == best["tokens_per_second_runs"]:
        return f"the grid's best ({best['config']})"
    return describe_difference(Estimate.from_dict(row["over_grid_best"]))


def report(out: Path, header: str, result: dict) -> None:
    """Write the JSON atomically (machine paths made portable) and print the table and summary."""
    write_json(out, result)
    print(f"\n{header}\n")
    print(
        columns(
            [
                "configuration",
                "tok/s (median)",
                "min-max",
                "x no-spec (95% CI)",
                "x grid best (95% CI)",
                "acceptance",
                "greedy = no-spec",
                "start-up s",
            ],
            [
                (
                    r["config"],
                    r.get("tokens_per_second"),
                    f"{fmt(r['min'])}-{fmt(r['max'])}" if "min" in r else None,
                    ratio_text(r.get("over_no_speculation")),
                    ratio_text(r.get("over_grid_best")),
                    r.get("acceptance_rate"),
                    r.get("greedy_identical"),
                    r.get("startup_s"),
                )
                for r in result["rows"]
            ],
        )
    )
    print("\n" + "\n".join(summary_text(k, v) for k, v in result["summary"].items()))
    print(f"\nwrote {out}")
