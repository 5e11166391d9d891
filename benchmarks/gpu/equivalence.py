"""Greedy speculative output equals greedy autoregressive output, on this device, per dtype.

The engine tests (tests/engine) build their tiny models on the CPU and take no device, so on a
GPU host this check covers the output contract instead: for each dtype and batch size B
(closed loop, concurrency = max_batch_size = B), the same requests run speculatively (draft
model, gamma, threshold 0) and autoregressively (gamma 0) through ``autotune.workload.runner.run_load``,
and the outputs are compared request by request.

The contract (docs/architecture.md) is token-for-token equality in fp32: a float32 mismatch is a failure
(exit code 1). In bf16/fp16 a verify pass over gamma + 1 tokens and a one-token decode round
differently, so near-tied argmaxes may flip and the outputs part ways; those rows are reported
(matches, first divergence), not failed. Speedup is AR wall / speculative wall of the same pair of runs.

Example:
    python -m benchmarks.gpu.equivalence --device cuda               # fp32 and bf16, B = 1 and 8
    python -m benchmarks.gpu.equivalence --device cpu --dtypes float32 --num-prompts 2 --max-new-tokens 8
"""

from __future__ import annotations

import argparse
import sys

from autotune.workload.runner import LoadSpec, run_load
from benchmarks import _common
from engine.loader import ModelPair
from engine.metrics import speedup
from engine.speculative import Request, SpecConfig

NAME = "gpu_equivalence"
HEADERS = ["dtype", "B", "gamma", "identical", "first divergence (min)", "acceptance", "speedup", "contract"]


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (None when identical)."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def measure_cell(
    pair: ModelPair, requests: list[Request], dtype: str, b: int, args: argparse.Namespace
) -> dict:
    """Speculative and autoregressive runs of ``requests`` at batch size ``b``: outputs compared."""
    load = LoadSpec(max_batch_size=b, concurrency=b, num_requests=len(requests))
    spec = run_load(pair, requests, SpecConfig(gamma=args.gamma), "model", load, args.seed)
    base = run_load(pair, requests, SpecConfig(gamma=0), "none", load, args.seed)
    div = [first_divergence(s, a) for s, a in zip(_common.outputs(spec), _common.outputs(base), strict=True)]
    same = sum(d is None for d in div)
    return {
        "dtype": dtype,
        "batch_size": b,
        "gamma": args.gamma,
        "num_requests": len(requests),
        "identical": same,
        "first_divergence": div,
        "acceptance_rate": spec.metrics["acceptance_rate"],
        "speedup": speedup(base.metrics["wall_s"], spec.metrics["wall_s"]),
        "spec_tokens_per_second": spec.metrics["tokens_per_second"],
        "ar_tokens_per_second": base.metrics["tokens_per_second"],
        "contract": "pass" if same == len(div) else ("FAIL" if dtype == "float32" else "informational"),
    }


def main() -> None:
    p = _common.parser(__doc__.split("\n\n")[0], dtype=False)
    p.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated (default float32,bfloat16)")
    p.add_argument("--batch-sizes", type=_common.int_list, default=[1, 8], help="default 1,8")
    p.add_argument("--gamma", type=int, default=4, help="default 4")
    args = p.parse_args()
    dtypes = [d for d in args.dtypes.split(",") if d]
    if any(d not in _common.DTYPES for d in dtypes) or args.gamma < 1 or 0 in args.batch_sizes:
        _common.fail(f"--dtypes must be among {', '.join(_common.DTYPES)}; --gamma and --batch-sizes >= 1")
    bench = _common.start(NAME, args)
    cells = []
    for dtype in dtypes:
        pair, requests = _common.load(bench, dtype=dtype)
        for b in args.batch_sizes:
            cells.append(measure_cell(pair, requests, dtype, b, args))
            print(f"  {dtype} B={b}: {cells[-1]['identical']}/{len(requests)} identical", flush=True)
        del pair
    rows = [
        (
            c["dtype"],
            c["batch_size"],
            c["gamma"],
            f"{c['identical']}/{c['num_requests']}",
            min((d for d in c["first_divergence"] if d is not None), default=None),
            c["acceptance_rate"],
            c["speedup"],
            c["contract"],
        )
        for c in cells
    ]
    _common.print_table(
        f"greedy speculative vs autoregressive on {bench.device} ({args.max_new_tokens} new tokens)",
        HEADERS,
        rows,
    )
    failed = any(c["contract"] == "FAIL" for c in cells)
    print("fp32 contract: " + ("FAILED" if failed else "holds") + " (bf16/fp16 rows are informational)")
    _common.write_json(bench, {"cells": cells, "fp32_contract_holds": not failed}, dtype=dtypes[0])
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
