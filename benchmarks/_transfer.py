"""Shared body of the transfer benchmarks: configurations measured inside one serving stack.

``transfer_vllm.py`` and ``transfer_llamacpp.py`` each build a plan of ``(label, launch command)``
and call :func:`measure_plan`: every configuration gets a fresh server (the backend's launcher,
the same host flags), the workload's load levels run ``repeats`` times after a warm-up, and the
rows carry median tokens/s with min-max over repeats, the ratio to no speculation and to the
grid's best, acceptance, and whether greedy outputs equal the no-speculation server's token for
token (where the stack streams token ids: vLLM does, llama-server's OpenAI stream does not, and
the column stays empty; tests/autotune/test_backend_llamacpp_real.py checks its ids instead).
Commands already measured are not run twice (their row says ``same_as``), except the
no-speculation baseline, which runs first and again last (the drift check).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

from autotune import context
from autotune.backends.server import ServerError
from autotune.cli.text import columns
from autotune.config import load_config
from autotune.errors import USER_ERRORS
from benchmarks._common import portable

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
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / f"transfer_{stack}.json")
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
    """Every configuration of ``plan`` in a fresh server; one row per entry (see the module docstring).

    ``interleaved``: the servers stay up together and round r runs every configuration before round
    r+1 (a host's drift then hits each round's pairs alike); where the backend keeps fewer servers
    than the plan has configurations (``keep_servers``, sized by memory), back to back instead."""
    distinct = {json.dumps(c) for _, c in plan}
    if interleaved and getattr(backend, "keep_servers", 1) < len(distinct):
        print(
            f"interleaving {len(distinct)} servers needs keep_servers >= {len(distinct)} "
            f"(this host keeps {backend.keep_servers}): back to back per server",
            file=sys.stderr,
        )
        interleaved = False
    order: list[tuple[str, list[str]]] = []
    labels: dict[str, str] = {}  # command key -> the label of its first (measured) entry
    for label, command in plan:
        key = json.dumps(command)
        if key not in labels or label.startswith("no speculation"):
            labels.setdefault(key, label)
            order.append((label, command))
    runs: dict[str, list[dict]] = {label: [] for label, _ in order}
    records: dict[str, dict] = {label: {} for label, _ in order}
    startup: dict[str, float] = {}
    failed: dict[str, str] = {}

    def one(label: str, command: list[str], r: int) -> None:
        if label in failed:
            return
        try:
            res = backend.run_command(command, batch, seed + r, records[label] if r == 0 else None).to_json()
        except ServerError as exc:
            print(f"{label}: failed: {exc}", file=sys.stderr)
            failed[label] = str(exc)[:2000]
            return
        startup.setdefault(label, backend.server.startup_s)
        runs[label].append(res)

    if interleaved:
        backend.close()
        for r in range(repeats):
            for label, command in order:
                one(label, command, r)
    else:
        for label, command in order:
            backend.close()  # a fresh server for every configuration
            for r in range(repeats):
                one(label, command, r)
    backend.close()
    rows, measured = [], {}
    for label, command in plan:
        key = json.dumps(command)
        own = label if label in runs else labels[key]
        if own in failed:
            rows.append({"config": label, "error": failed[own], "args": shlex.join(command)})
            continue
        if own != label:
            rows.append({**measured[own], "config": label, "same_as": own})
            continue
        mine = runs[label]
        tps = [run["tokens_per_second"] for run in mine]
        first_level = min(records[label])
        entry = {
            "config": label,
            "args": shlex.join(command[1 : command.index(host_flag)]),
            "startup_s": startup[label],
            "order": "interleaved" if interleaved else "back to back",
            "tokens_per_second_runs": tps,
            "tokens_per_second": statistics.median(tps),
            "min": min(tps),
            "max": max(tps),
            "acceptance_rate": mine[-1]["per_level"][first_level]["acceptance_rate"],
            "per_level": mine[-1]["per_level"],
            "per_level_runs": {  # tokens/s of every round at each level (paired ratios per level)
                str(b): [run["per_level"][b]["tokens_per_second"] for run in mine]
                for b in mine[-1]["per_level"]
            },
            "outputs": [rec.output_tokens for rec in records[label][first_level]],
        }
        measured[label] = entry
        rows.append(entry)
        print(
            f"{label}: {entry['tokens_per_second']:.1f} tok/s ({entry['min']:.1f}-{entry['max']:.1f}), "
            f"start-up {entry['startup_s']:.1f} s",
            file=sys.stderr,
        )
    return rows


def summarize(rows: list[dict], greedy: bool, chosen_prefix: str) -> dict:
    """Ratios per row (in place) and the summary figures of a transfer benchmark."""
    base = next((r for r in rows if r["config"] == "no speculation" and "error" not in r), None)
    grid = [r for r in rows if "error" not in r and r["config"].startswith("grid")]
    best = max(grid, key=lambda r: r["tokens_per_second"], default=None)
    for r in rows:
        if "error" in r:
            continue
        r["over_no_speculation"] = r["tokens_per_second"] / base["tokens_per_second"] if base else None
        r["over_grid_best"] = r["tokens_per_second"] / best["tokens_per_second"] if best else None
        ids = all(-1 not in out for out in r["outputs"])  # llama-server's OpenAI stream carries no ids
        if base and greedy and ids:
            r["greedy_identical"] = r["outputs"] == base["outputs"]

    def first(prefix: str, key: str):
        return next((r[key] for r in rows if r["config"].startswith(prefix) and "error" not in r), None)

    last = rows[-1] if rows and rows[-1]["config"].startswith("no speculation (again") else None
    return {
        "grid_best": best["config"] if best else None,
        "grid_best_tokens_per_second": best["tokens_per_second"] if best else None,
        "engine_export_over_grid_best": first("engine-backend export", "over_grid_best"),
        "engine_export_over_no_speculation": first("engine-backend export", "over_no_speculation"),
        "choice_over_grid_best": first(chosen_prefix, "over_grid_best"),
        "choice_over_no_speculation": first(chosen_prefix, "over_no_speculation"),
        "drift_no_speculation_last_over_first": (
            last["tokens_per_second"] / base["tokens_per_second"]
            if base and last and "error" not in last
            else None
        ),
    }


def report(out: Path, header: str, result: dict) -> None:
    """Write the JSON atomically and print the table and summary."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(portable(json.dumps(result, indent=2)) + "\n")  # <repo>/..., ~/...: no machine paths
    tmp.replace(out)
    rows = result["rows"]
    print(f"\n{header}\n")
    print(
        columns(
            [
                "configuration",
                "tok/s (median)",
                "min",
                "max",
                "x no-spec",
                "x grid best",
                "acceptance",
                "greedy = no-spec",
                "start-up s",
            ],
            [
                (
                    r["config"],
                    r.get("tokens_per_second"),
                    r.get("min"),
                    r.get("max"),
                    r.get("over_no_speculation"),
                    r.get("over_grid_best"),
                    r.get("acceptance_rate"),
                    r.get("greedy_identical"),
                    r.get("startup_s"),
                )
                for r in rows
            ],
        )
    )
    print(
        "\n"
        + "\n".join(
            f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}" for k, v in result["summary"].items()
        )
    )
    print(f"\nwrote {out}")
