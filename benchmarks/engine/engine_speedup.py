"""Measured speculative speedup next to the cost model's predictions: from the profile, and from the runs.

For each batch size B (closed loop: concurrency = max_batch_size = B; greedy; the same
requests) and each gamma, the engine runs the requests twice back to back through
``autotune.workload.runner.run_load``: speculative (draft model, constant gamma, confidence threshold 0)
and autoregressive (gamma 0, same engine). Two predictions sit beside the measurement:

*profile-predicted* (the goal's measure): ``autotune.cost.costmodel.predict`` from a profile taken
before any cell, as ``autotune profile`` takes it (``_common.profile_pair``: T_verify(B, k),
T_draft(B), T_prefill(B), the engine's overhead, per-position acceptance at the largest gamma),
replaying the same closed-loop run (prefills as requests arrive, rows finishing at different
steps, the batch draining), speedup = predicted spec tokens/s / predicted AR tokens/s. Each
engine gets its own profile. The *step formula* uses only what that pair of runs measured and
leaves prefill and ragged batches out (docs/metrics.md, cost model):

    a_i        per_position_acceptance[i] of the speculative run (token i accepted, all before it too)
    E(gamma)   = 1 + sum_{i=1..gamma} a_i                      expected tokens per row per step
    T_draft    draft_forward_ms: one batched draft forward (speculative run)
    T_verify   verify_step_ms: one target pass over B x (gamma + 1) tokens (speculative run)
    T_decode   verify_step_ms of the autoregressive run: one target pass over B x 1 tokens
    n_draft    draft forwards per step (= gamma: constant gamma, threshold 0)

    predicted speedup = E(gamma) * T_decode / (n_draft * T_draft + T_verify)
    measured speedup  = AR wall time / speculative wall time   (same requests, same tokens)
    decode speedup    = AR decode time / speculative decode time, decode time = sum over
                        requests of (finish - first token): the measured speedup without prefill

Each cell runs on both engines, back to back: ``compiled`` (decode/verify through torch.compile,
what ``autotune tune`` runs by default) and ``eager``; a second table puts their per-forward
times side by side (draft_cost_ratio = T_draft / T_decode, the draft's cost in target decodes).

measured/predicted is the share of the profile-predicted gain the engine delivers (goal >= 0.95
at B=1, >= 0.85 at B=8). measured/step formula is the older measure: its gap is what the formula
leaves out (prefill, the scheduler's work between steps, ragged retirement at B > 1);
decode/predicted in the JSON takes prefill out of that gap.

Example:
    python -m benchmarks.engine.engine_speedup                        # the demo pair, ~3 min on 2 cores
    python -m benchmarks.engine.engine_speedup --batch-sizes 1 --gammas 2,4 --num-prompts 4
"""

from __future__ import annotations

import argparse
import statistics

from autotune.cost.costmodel import predict
from autotune.workload.runner import LoadSpec, run_load
from benchmarks import _common
from engine.loader import ModelPair
from engine.metrics import speedup
from engine.speculative import Request, SpecConfig

NAME = "engine_speedup"
HEADERS = [
    "engine",
    "B",
    "gamma",
    "acceptance",
    "E[tokens/step]",
    "T_draft ms",
    "T_verify ms",
    "T_decode ms",
    "profile-predicted",
    "step formula",
    "measured speedup",
    "measured/predicted",
    "measured/step formula",
    "greedy_match",
]


def predicted_speedup(
    e_tokens: float, t_decode: float, n_draft: float, t_draft: float, t_verify: float
) -> float:
    """E(gamma) * T_decode / (n_draft * T_draft + T_verify)."""
    return e_tokens * t_decode / (n_draft * t_draft + t_verify)


def measure_cell(
    pair,
    requests,
    batch: int,
    gamma: int,
    num_requests: int,
    seed: int,
    prof: _common.PairProfile,
    new_tokens: int,
) -> dict:
    """Speculative then autoregressive run of the same requests at batch size ``batch``, and the
    profile's prediction of that speedup."""
    load = LoadSpec(max_batch_size=batch, concurrency=batch, num_requests=num_requests)
    spec = run_load(pair, requests, SpecConfig(gamma=gamma), "model", load, seed)
    base = run_load(pair, requests, SpecConfig(gamma=0), "none", load, seed)
    sm, bm = spec.metrics, base.metrics
    ppa = sm["per_position_acceptance"]
    e_tokens = 1.0 + sum(a or 0.0 for a in ppa[:gamma])
    n_draft = float(gamma)
    pred = predicted_speedup(
        e_tokens, bm["verify_step_ms"], n_draft, sm["draft_forward_ms"], sm["verify_step_ms"]
    )
    meas = speedup(bm["wall_s"], sm["wall_s"])
    dec = speedup(_common.decode_seconds(base), _common.decode_seconds(spec))
    model = predict(
        prof.curves,
        prof.samples,
        gamma,
        0.0,
        batch,
        new_tokens,
        num_requests,
        [len(r.prompt_ids) for r in requests],
    ).speedup
    return {
        "engine": "compiled" if pair.target.compiled else "eager",
        **cell_figures(spec, base, batch, gamma, num_requests, e_tokens, n_draft, model, pred, meas, dec),
    }


def cell_figures(
    spec,
    base,
    batch: int,
    gamma: int,
    num_requests: int,
    e_tokens: float,
    n_draft: float,
    model: float,
    pred: float,
    meas: float,
    dec: float,
) -> dict:
    """A cell's JSON past its engine: the speculative (``spec``) and autoregressive (``base``) runs'
    metrics, the speedups measured and the two predictions, and their ratios."""
    sm, bm = spec.metrics, base.metrics
    return {
        "batch_size": batch,
        "gamma": gamma,
        "num_requests": num_requests,
        "acceptance_rate": sm["acceptance_rate"],
        "per_position_acceptance": sm["per_position_acceptance"],
        "expected_tokens_per_step": e_tokens,
        "mean_acceptance_length": sm["mean_acceptance_length"],
        "draft_forwards_per_step": n_draft,
        "t_draft_ms": sm["draft_forward_ms"],
        "t_verify_ms": sm["verify_step_ms"],
        "t_decode_ms": bm["verify_step_ms"],
        "profile_predicted_speedup": model,
        "predicted_speedup": pred,
        "measured_speedup": meas,
        "decode_speedup": dec,
        "measured_over_profile_predicted": meas / model,
        "measured_over_predicted": meas / pred,
        "decode_over_predicted": dec / pred,
        "greedy_match": _common.outputs(spec) == _common.outputs(base),
        "spec_wall_s": sm["wall_s"],
        "ar_wall_s": bm["wall_s"],
        "spec_steps": sm["steps"],
        "ar_steps": bm["steps"],
        "spec_decode_s": _common.decode_seconds(spec),
        "ar_decode_s": _common.decode_seconds(base),
        "spec_mean_batch_size": sm["mean_batch_size"],
        "ar_mean_batch_size": bm["mean_batch_size"],
        "generated_tokens": sm["generated_tokens"],
        "spec_tokens_per_second": sm["tokens_per_second"],
        "ar_tokens_per_second": bm["tokens_per_second"],
    }


def per_forward(cells: list[dict], batch_sizes: list[int]) -> list[dict]:
    """Median T_draft, T_verify, T_decode and draft_cost_ratio per batch size, eager next to compiled."""
    out = []
    for b in batch_sizes:
        mine = {
            e: [c for c in cells if c["batch_size"] == b and c["engine"] == e] for e in ("eager", "compiled")
        }
        if not all(mine.values()):
            continue
        for forward, value in (
            ("T_draft", lambda c: c["t_draft_ms"]),
            ("T_verify", lambda c: c["t_verify_ms"]),
            ("T_decode", lambda c: c["t_decode_ms"]),
            ("draft_cost_ratio", lambda c: c["t_draft_ms"] / c["t_decode_ms"]),
        ):
            e, k = (statistics.median(value(c) for c in mine[name]) for name in ("eager", "compiled"))
            out.append(
                {
                    "batch_size": b,
                    "forward": forward,
                    "eager_ms": e,
                    "compiled_ms": k,
                    "compiled_over_eager": k / e,
                }
            )
    return out


def print_cells(cells: list[dict], title: str) -> None:
    """One row per (engine, B, gamma): acceptance, forward times, predicted and measured speedups."""
    rows = [
        (
            c["engine"],
            c["batch_size"],
            c["gamma"],
            c["acceptance_rate"],
            c["expected_tokens_per_step"],
            c["t_draft_ms"],
            c["t_verify_ms"],
            c["t_decode_ms"],
            c["profile_predicted_speedup"],
            c["predicted_speedup"],
            c["measured_speedup"],
            c["measured_over_profile_predicted"],
            c["measured_over_predicted"],
            c["greedy_match"],
        )
        for c in cells
    ]
    _common.print_table(title, HEADERS, rows)


def summarize(cells: list[dict], engines: list[str], batch_sizes: list[int]) -> dict[str, dict]:
    """Per engine and batch size: the median measured/predicted ratios, the best gamma, greedy match
    (printed against the goals)."""
    summary = {}
    for name, b in [(name, b) for name in engines for b in batch_sizes]:
        mine = [c for c in cells if c["batch_size"] == b and c["engine"] == name]
        best = max(mine, key=lambda c: c["measured_speedup"])
        summary[f"{name}/{b}"] = {
            "median_measured_over_profile_predicted": statistics.median(
                c["measured_over_profile_predicted"] for c in mine
            ),
            "median_measured_over_predicted": statistics.median(c["measured_over_predicted"] for c in mine),
            "median_decode_over_predicted": statistics.median(c["decode_over_predicted"] for c in mine),
            "best_gamma": best["gamma"],
            "best_measured_speedup": best["measured_speedup"],
            "all_greedy_match": all(c["greedy_match"] for c in mine),
        }
        s = summary[f"{name}/{b}"]
        goal = " (goal >= 0.95)" if b == 1 else " (goal >= 0.85)" if b == 8 else ""
        print(
            f"{name} B={b}: measured/profile-predicted median "
            f"{s['median_measured_over_profile_predicted']:.3f}{goal}; "
            f"measured/step formula {s['median_measured_over_predicted']:.3f}, "
            f"decode/step formula {s['median_decode_over_predicted']:.3f}; best gamma {s['best_gamma']} "
            f"({s['best_measured_speedup']:.2f}x); "
            f"greedy match {'all' if s['all_greedy_match'] else 'NOT all'}"
        )
    return summary


def arguments() -> argparse.Namespace:
    """The shared benchmark flags plus the grid (batch sizes x gammas) and which engines run."""
    p = _common.parser(__doc__.split("\n\n")[0], num_prompts=12)
    p.add_argument("--batch-sizes", type=_common.int_list, default=[1, 8], help="default 1,8")
    p.add_argument("--gammas", type=_common.int_list, default=list(range(1, 9)), help="default 1..8")
    p.add_argument(
        "--engine",
        choices=("both", "compiled", "eager"),
        default="both",
        help="decode/verify compiled, eager, or both interleaved per cell (default both)",
    )
    p.add_argument(
        "--num-requests",
        type=int,
        default=None,
        help="requests per run (default: max(number of prompts, 2*B))",
    )
    args = p.parse_args()
    if 0 in args.gammas or 0 in args.batch_sizes:
        _common.fail("--gammas and --batch-sizes must be >= 1")
    return args


def profiled_engines(
    eager: ModelPair, requests: list[Request], args: argparse.Namespace
) -> tuple[dict[str, ModelPair], dict]:
    """The engines ``--engine`` asks for (the compiled twin compiled once, outside every timing),
    each profiled on the requests as ``autotune profile`` would."""
    engines: dict[str, ModelPair] = {}
    if args.engine in ("both", "compiled"):
        engines["compiled"] = _common.compiled_twin(eager)
        print(f"compiled decode/verify in {engines['compiled'].compile_s:.1f} s (excluded from every timing)")
    if args.engine in ("both", "eager"):
        engines["eager"] = eager
    profiles = {}
    for name, pair in engines.items():
        print(
            f"profiling the {name} engine: B in {args.batch_sizes}, k = 1..{max(args.gammas) + 1}", flush=True
        )
        profiles[name] = _common.profile_pair(
            pair, requests, args.batch_sizes, max(args.gammas), args.max_new_tokens, seed=args.seed
        )
    return engines, profiles


def main() -> None:
    args = arguments()
    bench = _common.start(NAME, args)
    eager, requests = _common.load(bench)
    engines, profiles = profiled_engines(eager, requests, args)
    cells = []
    for b in args.batch_sizes:
        n = args.num_requests or max(len(requests), 2 * b)
        for g in args.gammas:
            for name, pair in engines.items():
                cell = measure_cell(pair, requests, b, g, n, args.seed, profiles[name], args.max_new_tokens)
                cells.append(cell)
                print(
                    f"  {name} B={b} gamma={g}: measured {cell['measured_speedup']:.2f}x, "
                    f"profile-predicted {cell['profile_predicted_speedup']:.2f}x, "
                    f"step formula {cell['predicted_speedup']:.2f}x",
                    flush=True,
                )
    print_cells(
        cells,
        f"speculative vs autoregressive on {bench.device} ({len(requests)} prompts, "
        f"{args.max_new_tokens} new tokens, greedy)",
    )
    forwards = per_forward(cells, args.batch_sizes)
    if len(engines) == 2:
        _common.print_table(
            "per-forward times, compiled vs eager (medians over the gammas; draft_cost_ratio = "
            "T_draft / T_decode)",
            ["B", "forward", "eager ms", "compiled ms", "compiled/eager"],
            [
                (r["batch_size"], r["forward"], r["eager_ms"], r["compiled_ms"], r["compiled_over_eager"])
                for r in forwards
            ],
        )
    summary = summarize(cells, list(engines), args.batch_sizes)
    _common.write_json(
        bench,
        {
            "cells": cells,
            "summary": summary,
            "per_forward": forwards,
            "formula": "profile-predicted = autotune.cost.costmodel.predict(profile, closed loop).speedup; "
            "step formula = E(gamma) * T_decode / (n_draft * T_draft + T_verify)",
            "profiles": {
                name: {
                    "curves": prof.raw_curves,
                    "acceptance": prof.acceptance,
                    "context_tokens": prof.context,
                }
                for name, prof in profiles.items()
            },
        },
    )


if __name__ == "__main__":
    main()
