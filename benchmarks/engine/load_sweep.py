"""Throughput and tail latency under closed-loop load: where speculation stops paying.

For each concurrency level C (closed loop, max_batch_size = C, greedy, the same requests) the
engine runs the workload once per gamma (0 = autoregressive, same engine; the others with the
draft model, constant gamma, threshold 0), back to back, through ``autotune.workload.runner.run_load``.
Each run reports tokens_per_second (generated tokens / wall time) and tpot_ms p95; speedup is
AR wall time / speculative wall time at the same C (docs/metrics.md).

"Speculation stops paying" at the smallest measured C where no gamma > 0 has a speedup above
1 + ``--margin``; none when some gamma beats AR at every level.

Writes ``load_sweep.json`` into ``--out-dir``; ``--plot FILE`` also draws tokens/s vs concurrency
(log2 x axis, one line per gamma) there.

Example:
    python -m benchmarks.engine.load_sweep                           # the demo pair, ~4 min on 2 cores
    python -m benchmarks.engine.load_sweep --concurrency 1,4 --gammas 0,4 --num-requests 4 --max-new-tokens 16
"""

from __future__ import annotations

from pathlib import Path

from autotune.workload.runner import LoadSpec, run_load
from benchmarks import _common
from engine.loader import ModelPair
from engine.metrics import speedup
from engine.speculative import Request, SpecConfig

NAME = "load_sweep"
HEADERS = [
    "concurrency",
    "gamma",
    "requests",
    "tokens/s",
    "tpot p95 ms",
    "speedup",
    "acceptance",
    "mean batch",
    "greedy_match",
]


def stops_paying(cells: list[dict], margin: float) -> int | None:
    """Smallest concurrency at which no gamma > 0 beats autoregressive decoding by more than ``margin``."""
    for c in sorted({cell["concurrency"] for cell in cells}):
        spec = [cell for cell in cells if cell["concurrency"] == c and cell["gamma"] > 0]
        if spec and all(cell["speedup"] <= 1.0 + margin for cell in spec):
            return c
    return None


def plot(cells: list[dict], path, title: str) -> bool:
    """Tokens/s vs concurrency, one line per gamma; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for g in sorted({c["gamma"] for c in cells}):
        pts = sorted((c["concurrency"], c["tokens_per_second"]) for c in cells if c["gamma"] == g)
        ax.plot(
            [x for x, _ in pts],
            [y for _, y in pts],
            marker="o",
            label="autoregressive (gamma 0)" if g == 0 else f"gamma {g}",
        )
    ax.set_xscale("log", base=2)
    levels = sorted({c["concurrency"] for c in cells})
    ax.set_xticks(levels, [str(x) for x in levels])
    ax.set_xlabel("concurrency (closed loop, = max_batch_size)")
    ax.set_ylabel("tokens/s")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def measure_level(
    pair: ModelPair, requests: list[Request], c: int, n: int, gammas: list[int], seed: int
) -> list[dict]:
    """Every gamma at concurrency ``c`` (``n`` requests, closed loop), gamma 0 first: its baseline."""
    cells = []
    load = LoadSpec(max_batch_size=c, concurrency=c, num_requests=n)
    for g in gammas:
        run = run_load(pair, requests, SpecConfig(gamma=g), "model" if g else "none", load, seed)
        m = run.metrics
        if g == 0:
            base = run
        cells.append(
            {
                "concurrency": c,
                "gamma": g,
                "num_requests": n,
                "tokens_per_second": m["tokens_per_second"],
                "tpot_ms_p50": m["tpot_ms_p50"],
                "tpot_ms_p95": m["tpot_ms_p95"],
                "ttft_ms_p95": m["ttft_ms_p95"],
                "e2e_ms_p95": m["e2e_ms_p95"],
                "wall_s": m["wall_s"],
                "generated_tokens": m["generated_tokens"],
                "speedup": speedup(base.metrics["wall_s"], m["wall_s"]),
                "acceptance_rate": m["acceptance_rate"],
                "mean_acceptance_length": m["mean_acceptance_length"],
                "mean_batch_size": m["mean_batch_size"],
                "verify_step_ms": m["verify_step_ms"],
                "draft_forward_ms": m["draft_forward_ms"],
                "greedy_match": _common.outputs(run) == _common.outputs(base),
            }
        )
        print(f"  C={c} gamma={g}: {m['tokens_per_second']:.1f} tok/s", flush=True)
    return cells


def print_cells(cells: list[dict], title: str) -> None:
    """One row per (concurrency, gamma): throughput, TPOT, speedup, acceptance, batch, greedy match."""
    rows = [
        (
            c["concurrency"],
            c["gamma"],
            c["num_requests"],
            c["tokens_per_second"],
            c["tpot_ms_p95"],
            c["speedup"],
            c["acceptance_rate"],
            c["mean_batch_size"],
            c["greedy_match"],
        )
        for c in cells
    ]
    _common.print_table(title, HEADERS, rows)


def best_per_concurrency(cells: list[dict], concurrency: list[int]) -> dict[str, dict]:
    """The fastest gamma at each level (ties to the smaller gamma), its tokens/s and speedup."""
    best = {}
    for c in concurrency:
        top = max(
            (x for x in cells if x["concurrency"] == c), key=lambda x: (x["tokens_per_second"], -x["gamma"])
        )
        best[str(c)] = {
            "gamma": top["gamma"],
            "tokens_per_second": top["tokens_per_second"],
            "speedup": top["speedup"],
        }
    return best


def main() -> None:
    p = _common.parser(__doc__.split("\n\n")[0])
    p.add_argument(
        "--concurrency", type=_common.int_list, default=[1, 2, 4, 8, 16, 32], help="default 1,2,4,8,16,32"
    )
    p.add_argument(
        "--gammas", type=_common.int_list, default=[0, 2, 4, 8], help="default 0,2,4,8 (0 is always run)"
    )
    p.add_argument("--num-requests", type=int, default=None, help="requests per run (default: max(2*C, 8))")
    p.add_argument(
        "--margin",
        type=float,
        default=0.0,
        help="a gamma 'beats' AR when its speedup exceeds 1 + margin (default 0)",
    )
    p.add_argument("--plot", type=Path, default=None, help="also draw tokens/s vs concurrency into this PNG")
    args = p.parse_args()
    if 0 in args.concurrency:
        _common.fail("--concurrency levels must be >= 1")
    gammas = sorted(set(args.gammas) | {0})
    bench = _common.start(NAME, args)
    pair, requests = _common.load(bench)
    cells = []
    for c in args.concurrency:
        cells += measure_level(pair, requests, c, args.num_requests or max(2 * c, 8), gammas, args.seed)
    print_cells(
        cells,
        f"closed-loop load on {bench.device} ({len(requests)} prompts, {args.max_new_tokens} new "
        f"tokens, greedy; speedup = AR wall / speculative wall)",
    )
    stop = stops_paying(cells, args.margin)
    best = best_per_concurrency(cells, args.concurrency)
    print(
        "best gamma per concurrency: "
        + ", ".join(f"C={c}: {b['gamma']} ({b['speedup']:.2f}x)" for c, b in best.items())
    )
    print(
        f"speculation stops paying at concurrency {stop}"
        if stop is not None
        else "speculation pays at every measured concurrency"
    )
    png, plotted = args.plot, False
    if png is not None:
        title = f"load sweep: {args.target.parent.name}/{args.target.name} on {bench.device} ({args.dtype})"
        plotted = plot(cells, png, title)
        print(f"wrote {png}" if plotted else "matplotlib not installed: no plot")
    _common.write_json(
        bench,
        {
            "cells": cells,
            "best_gamma_per_concurrency": best,
            "stops_paying_at_concurrency": stop,
            "margin": args.margin,
            "plot": str(png) if plotted else None,
        },
    )


if __name__ == "__main__":
    main()
