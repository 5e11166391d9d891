"""The demo pair in llama-server at f32, q8_0 and q4_k_m: does the best n-max move with quantization?

Quantization changes the drafter's cost relative to the target's, so the n-max tuned on one GGUF
type need not be the best on another. For each ``--quantizations`` type the pair is converted (and
quantized by llama-quantize, ``backend.llamacpp.quantization``) once, then every configuration --
no speculation and ``--spec-draft-n-max`` over ``--n-max`` (p-min 0) for each type -- gets its own
llama-server (the llamacpp backend's launcher and deployment flags), all kept alive together, and
``--rounds`` rounds run every configuration in turn (A B C ... A B C: ``benchmarks/_transfer.py``
``measure_plan`` interleaved), so a drift of the host hits each round's configurations alike and
ratios are paired by round (:func:`autotune.stats.paired_ratio`, 95% interval).

The workload is the bundled tune.yaml's (``--config``): its prompts and load levels, cut to
``--concurrency``, ``--num-requests`` per level and ``--max-new-tokens`` so the whole run stays
within about ten minutes on two cores. Reported: each type's best configuration and its ratio to
that type's no speculation; the f32 best n-max served at q4_k_m against the q4_k_m best (the
transfer ratio of an f32-tuned choice); the q4_k_m best against the f32 best. Usage::

    python -m benchmarks.stacks.quantized_llamacpp [--rounds 3] [--n-max 1,2,3,4] [--concurrency 1,4,16]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from pathlib import Path

from autotune import context
from autotune.backends.llamacpp import LlamacppBackend
from autotune.config import load_config
from autotune.errors import USER_ERRORS
from autotune.knobs import Knobs
from autotune.stats import Estimate, paired_ratio
from benchmarks._common import Bench, fail, int_list, print_table, write_json
from benchmarks._transfer import measure_plan

ROOT = Path(__file__).resolve().parents[2]

BASE, SERVED = "f32", "q4_k_m"


def arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=ROOT / "tune.yaml")
    p.add_argument("--quantizations", default="f32,q8_0,q4_k_m", help="GGUF types (f32 and q4_k_m required)")
    p.add_argument("--n-max", type=int_list, default=[1, 2, 3, 4], help="--spec-draft-n-max grid")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (paired intervals need >= 2)")
    p.add_argument("--concurrency", type=int_list, default=[1, 4, 16], help="load levels of the sweep")
    p.add_argument("--num-requests", type=int, default=8, help="requests per level")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=Path, default=None)
    args = p.parse_args()
    types = args.quantizations.split(",")
    if BASE not in types or SERVED not in types or args.rounds < 2:
        p.error(f"--quantizations must include {BASE} and {SERVED}, --rounds must be >= 2")
    return args


def backends(args: argparse.Namespace) -> tuple[context.Context, dict[str, LlamacppBackend]]:
    """One context (the workload is tokenized once) and a backend per GGUF type (each converts,
    quantizes and checks the tokenizer on its own files)."""
    cfg = load_config(args.config).with_overrides(
        {
            "backend.name": "llamacpp",
            "search.drafter": ["model"],
            "workload.concurrency": args.concurrency,
            "workload.num_requests": args.num_requests,
            "workload.min_batches": 1,
            "workload.max_new_tokens": args.max_new_tokens,
        }
    )
    ctx = context.build(cfg)
    out = {}
    for qtype in args.quantizations.split(","):
        typed = cfg.with_overrides({"backend.llamacpp.quantization": None if qtype == BASE else qtype})
        out[qtype] = LlamacppBackend(dataclasses.replace(ctx, cfg=typed))
    return ctx, out


def label(qtype: str, n_max: int) -> str:
    return f"{qtype} n-max {n_max}" if n_max else f"{qtype} no speculation"


def runs(row: dict, level: int | None) -> list[float]:
    """A row's tokens/s per round: over the whole sweep (``level`` None) or at one load level."""
    values: list[float] = (
        row["tokens_per_second_runs"] if level is None else row["per_level_runs"][str(level)]
    )
    return values


def ratio(rows: dict[str, dict], a: str, b: str, level: int | None = None) -> Estimate:
    """``a``'s tokens/s over ``b``'s, paired by round."""
    return paired_ratio(runs(rows[a], level), runs(rows[b], level))


def summarize(rows: dict[str, dict], types: list[str], grid: list[int], level: int | None = None) -> dict:
    """Each type's best configuration (by median tokens/s over the sweep, or at ``level``), and the
    f32-tuned n-max served at q4_k_m against q4_k_m's best."""
    best: dict[str, dict] = {}
    for qtype in types:
        mine = [label(qtype, n) for n in [0, *grid] if label(qtype, n) in rows]
        top = max(mine, key=lambda name: statistics.median(runs(rows[name], level)))
        best[qtype] = {
            "config": top,
            "n_max": int(top.rsplit(" ", 1)[1]) if "n-max" in top else 0,
            "tokens_per_second": statistics.median(runs(rows[top], level)),
            "over_no_speculation": ratio(rows, top, label(qtype, 0), level).as_dict(),
        }
    carried = label(SERVED, best[BASE]["n_max"])
    return {
        "best": best,
        "f32_choice_at_q4_k_m": carried,
        "f32_choice_at_q4_k_m_over_q4_k_m_best": ratio(
            rows, carried, best[SERVED]["config"], level
        ).as_dict(),
        "q4_k_m_best_over_f32_best": ratio(
            rows, best[SERVED]["config"], best[BASE]["config"], level
        ).as_dict(),
    }


def text(est: dict) -> str:
    return Estimate(est["value"], *est["ci95"], est["n"]).text(unit="x")


def print_summary(summary: dict, types: list[str]) -> None:
    """One line per scope (the sweep, then each load level): each type's best and the transfer ratio."""
    scopes = [("sweep", summary["sweep"])] + [
        (f"concurrency {c}", s) for c, s in summary["per_level"].items()
    ]
    print_table(
        "best per GGUF type (x its no speculation), and the f32 choice served at q4_k_m",
        [
            "scope",
            *(f"best {q}" for q in types),
            "f32 choice at q4_k_m / q4_k_m best",
            "q4_k_m best / f32 best",
        ],
        [
            (
                scope,
                *(
                    f"n-max {s['best'][q]['n_max']} ({s['best'][q]['over_no_speculation']['value']:.2f}x)"
                    for q in types
                ),
                text(s["f32_choice_at_q4_k_m_over_q4_k_m_best"]),
                text(s["q4_k_m_best_over_f32_best"]),
            )
            for scope, s in scopes
        ],
    )


def print_rows(header: str, rows: list[dict]) -> None:
    """One line per server: tokens/s over the rounds, the ratio to its type's no speculation, acceptance."""
    print_table(
        header,
        ["configuration", "tok/s (median)", "min", "max", "x no-spec (95% CI)", "acceptance"],
        [
            (
                r["config"],
                r.get("tokens_per_second"),
                r.get("min"),
                r.get("max"),
                text(r["over_no_speculation"]) if "over_no_speculation" in r else r.get("error", "")[:60],
                r.get("acceptance_rate"),
            )
            for r in rows
        ],
    )


def main() -> None:
    args = arguments()
    bench = Bench("quantized_llamacpp", args)
    types = args.quantizations.split(",")
    try:
        ctx, by_type = backends(args)
    except USER_ERRORS as exc:
        fail(" ".join(str(exc).split()))
    batch = max(ctx.cfg.search.max_batch_size)
    plan = [
        (label(q, n), by_type[q].command(Knobs("model" if n else "none", n, 0.0, max_batch_size=batch)))
        for q in types
        for n in [0, *args.n_max]
    ]
    runner = by_type[BASE]
    runner.keep_servers = len(plan)  # every server alive at once: rounds interleaved
    try:
        rows = measure_plan(runner, plan, batch, args.rounds, args.seed, interleaved=True)
    finally:
        for backend in by_type.values():
            backend.close()
        ctx.store.close()
    measured = {r["config"]: r for r in rows if "error" not in r}
    for r in rows:
        base = label(r["config"].split()[0], 0)
        if "error" not in r and base in measured:
            r["over_no_speculation"] = ratio(measured, r["config"], base).as_dict()
    w = ctx.cfg.workload
    summary = {
        "sweep": summarize(measured, types, args.n_max),
        "per_level": {str(c): summarize(measured, types, args.n_max, c) for c in w.concurrency},
    }
    header = (
        f"llama-server {runner.version} on {ctx.fingerprint['label']}, -t {runner.deployment.threads}, "
        f"-np {batch}; demo pair; {w.prompts.name}, concurrency {list(w.concurrency)}, {w.num_requests} "
        f"requests x {w.max_new_tokens} tokens per level; {args.rounds} interleaved rounds"
    )
    print_rows(header, rows)
    print_summary(summary, types)
    gguf = {q: {"target": str(b.target_gguf), "draft": str(b.draft_gguf)} for q, b in by_type.items()}
    write_json(
        bench,
        {
            "llama_server_version": runner.version,
            "workload": ctx.workload,
            "gguf": gguf,
            "summary": summary,
            "rows": rows,
        },
        dtype="float32",
    )


if __name__ == "__main__":
    main()
