"""How well the cost model predicts throughput under load.

Profiles the pair once, as ``autotune profile`` does: ``autotune.device.profiler.measure_curves``
(T_verify(B, k) for k = 1 .. gamma_max + 1 and T_draft(B), at the workload's context: median
prompt length + max_new_tokens / 2) and ``measure_acceptance`` (B=1, gamma_max, threshold 0).
Then, for each (gamma, B) of the grid, puts the prediction of ``autotune.cost.costmodel.predict``
next to a real engine run (``autotune.workload.runner.run_load``, closed loop, concurrency =
max_batch_size = B, greedy, the same requests):

    error = |predicted tokens/s - measured tokens/s| / measured tokens/s

and reports the median error over the grid (goal <= 10%). The model, with N = max_new_tokens:

    T_step   = draft_forwards * (T_draft(B) + draft_overhead(B)) + T_verify(B, gamma + 1) + overhead(B)
    tokens/s = the closed-loop replay of ``autotune.cost.costmodel.simulate_closed_loop``: the run's
               requests through B slots, prefills as requests arrive (padded to the longest
               prompt admitted together), each row drawing its profiled per-step outcome, the
               batch draining at the end

(``overhead`` and ``draft_overhead`` are the engine's own work around the forwards, measured by
``measure_overhead``). To tell the step model apart from the run around it (the scheduler's
work between steps, prefills), each cell also has a *step-phase* throughput: the
tokens the steps emitted (generated - one per request, which prefill emits) over the time
inside steps, and its error.

Example:
    python -m benchmarks.engine.costmodel_accuracy                   # the demo pair, ~2 min on 2 cores
    python -m benchmarks.engine.costmodel_accuracy --gammas 0,2 --batch-sizes 1,2 --num-prompts 4 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics

from autotune.cost.costmodel import Prediction, predict
from autotune.workload.runner import LoadSpec, run_load
from benchmarks import _common
from engine.speculative import SpecConfig

NAME = "costmodel_accuracy"
HEADERS = [
    "B",
    "gamma",
    "predicted tok/s",
    "measured tok/s",
    "error",
    "step-phase tok/s",
    "step error",
    "predicted E",
    "measured E",
    "mean batch",
]


def step_phase_tps(metrics: dict, gamma: int) -> float:
    """Tokens emitted by steps / time inside steps (verify passes and draft forwards)."""
    steps = metrics["steps"]
    seconds = steps * metrics["verify_step_ms"] / 1e3
    if gamma and metrics["draft_forward_ms"]:
        seconds += steps * metrics["draft_forwards_per_step"] * metrics["draft_forward_ms"] / 1e3
    return (metrics["generated_tokens"] - metrics["num_requests"]) / seconds


def cell(pred: Prediction, m: dict, b: int, g: int, num_requests: int) -> dict:
    """One (batch size, gamma) cell: the cost model's prediction beside the run's metrics ``m``."""
    step_tps = step_phase_tps(m, g)
    return {
        "batch_size": b,
        "gamma": g,
        "num_requests": num_requests,
        "predicted_tokens_per_second": pred.tokens_per_second,
        "measured_tokens_per_second": m["tokens_per_second"],
        "abs_rel_error": abs(pred.tokens_per_second - m["tokens_per_second"]) / m["tokens_per_second"],
        "step_phase_tokens_per_second": step_tps,
        "step_phase_abs_rel_error": abs(pred.tokens_per_second - step_tps) / step_tps,
        "predicted_tokens_per_step": pred.tokens_per_step,
        "measured_tokens_per_step": m["mean_acceptance_length"],
        "predicted_step_ms": 1e3 * pred.step_time_s,
        "measured_step_ms": m["verify_step_ms"] + g * (m["draft_forward_ms"] or 0.0),
        "predicted_tpot_ms": pred.tpot_ms,
        "measured_tpot_ms_p50": m["tpot_ms_p50"],
        "mean_batch_size": m["mean_batch_size"],
        "wall_s": m["wall_s"],
    }


def print_cells(cells: list[dict], title: str) -> None:
    """One row per cell: predicted and measured tokens/s with the error, end to end and in steps."""
    rows = [
        (
            c["batch_size"],
            c["gamma"],
            c["predicted_tokens_per_second"],
            c["measured_tokens_per_second"],
            f"{100 * c['abs_rel_error']:.1f}%",
            c["step_phase_tokens_per_second"],
            f"{100 * c['step_phase_abs_rel_error']:.1f}%",
            c["predicted_tokens_per_step"],
            c["measured_tokens_per_step"],
            c["mean_batch_size"],
        )
        for c in cells
    ]
    _common.print_table(title, HEADERS, rows)


def arguments() -> argparse.Namespace:
    """The shared benchmark flags plus the grid (gammas x batch sizes) and the profile's size."""
    p = _common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--gammas", type=_common.int_list, default=[0, 1, 2, 4, 6, 8], help="default 0,1,2,4,6,8")
    p.add_argument("--batch-sizes", type=_common.int_list, default=[1, 2, 4, 8], help="default 1,2,4,8")
    p.add_argument(
        "--gamma-max", type=int, default=8, help="profiled positions and verify widths (default 8)"
    )
    p.add_argument(
        "--repeats", type=int, default=7, help="timed repeats per curve point (default 7, the profiler's)"
    )
    p.add_argument("--num-requests", type=int, default=None, help="requests per run (default: max(2*B, 8))")
    args = p.parse_args()
    if max(args.gammas) > args.gamma_max or 0 in args.batch_sizes:
        _common.fail("--gammas must be <= --gamma-max and --batch-sizes >= 1")
    return args


def main() -> None:
    args = arguments()
    bench = _common.start(NAME, args)
    pair, requests = _common.load(bench)
    batch_sizes = sorted(set(args.batch_sizes))
    print(f"profiling: curves for B in {batch_sizes}, k = 1..{args.gamma_max + 1}", flush=True)
    prof = _common.profile_pair(
        pair, requests, batch_sizes, args.gamma_max, args.max_new_tokens, args.repeats, args.seed
    )
    cv, samples, context = prof.curves, prof.samples, prof.context
    print(
        f"profiling: acceptance {prof.acceptance['acceptance_rate'] or 0:.3f} at gamma {args.gamma_max} "
        f"({len(samples)} step samples), context {context}",
        flush=True,
    )
    prompt_lens = [len(r.prompt_ids) for r in requests]
    cells = []
    for b in batch_sizes:
        load = LoadSpec(max_batch_size=b, concurrency=b, num_requests=args.num_requests or max(2 * b, 8))
        for g in args.gammas:
            pred = predict(cv, samples, g, 0.0, b, args.max_new_tokens, load.num_requests, prompt_lens)
            m = run_load(
                pair, requests, SpecConfig(gamma=g), "model" if g else "none", load, args.seed
            ).metrics
            cells.append(cell(pred, m, b, g, load.num_requests))
            print(
                f"  B={b} gamma={g}: predicted {pred.tokens_per_second:.1f}, measured "
                f"{m['tokens_per_second']:.1f} tok/s",
                flush=True,
            )
    print_cells(
        cells,
        f"cost model vs measured on {bench.device} ({len(requests)} prompts, {args.max_new_tokens} "
        f"new tokens, greedy, context {context})",
    )
    median_err = statistics.median(c["abs_rel_error"] for c in cells)
    median_step = statistics.median(c["step_phase_abs_rel_error"] for c in cells)
    print(f"median |error|: {100 * median_err:.1f}% (goal <= 10%); step-phase: {100 * median_step:.1f}%")
    _common.write_json(
        bench,
        {
            "cells": cells,
            "median_abs_rel_error": median_err,
            "median_step_phase_abs_rel_error": median_step,
            "context_tokens": context,
            "curves": prof.raw_curves,
            "acceptance": prof.acceptance,
        },
    )


if __name__ == "__main__":
    main()
