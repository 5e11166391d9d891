"""What a draft forward costs inside a speculative step, against the same forward in a loop of its own.

A speculative step runs the target's verify pass and then gamma draft forwards; the profiler's
T_draft is measured in a draft-only loop. This script times, at B=1 with a KV cache at the
workload's context:

- *draft only*: gamma single-token draft forwards, repeated;
- *after verify*: one target forward of gamma + 1 tokens, then the same gamma draft forwards
  (only those are timed), repeated;

per draft position, medians over ``--repeats``, for each ``--dtypes`` of the draft (the target
stays in ``--dtype``). The gap is the engine's ``draft_overhead`` that no Python change removes:
on a CPU, the target's weights pass through the caches between two draft forwards.

Example:
    python -m benchmarks.engine.draft_after_verify                   # the demo pair, ~20 s
"""

from __future__ import annotations

import statistics
import time

import torch

from benchmarks import _common
from engine.loader import load_model

NAME = "draft_after_verify"


def timed_positions(target, draft, gamma: int, context: int, repeats: int, verify: bool) -> list[float]:
    """Median seconds of each of the ``gamma`` draft forwards, with or without a verify pass before."""
    device = draft.lm_head.weight.device
    t_cache, d_cache = (
        target.new_cache(1, context + 2 * gamma + 4),
        draft.new_cache(1, context + 2 * gamma + 4),
    )
    prompt = torch.randint(1, draft.config.vocab_size, (1, context), device=device)
    pos = torch.tensor([context], device=device)
    times: list[list[float]] = [[] for _ in range(gamma)]
    with torch.inference_mode():
        target(prompt, cache=t_cache, start=torch.zeros(1, dtype=torch.long, device=device), kv_len=context)
        draft(prompt, cache=d_cache, start=torch.zeros(1, dtype=torch.long, device=device), kv_len=context)
        block = prompt[:, : gamma + 1]
        tok = prompt[:, :1]
        for r in range(repeats + 2):
            if verify:
                target(block, cache=t_cache, start=pos, kv_len=context + gamma + 1)
            for j in range(gamma):
                _common.sync(device)
                t0 = time.perf_counter()
                draft(tok, cache=d_cache, start=pos + j, kv_len=context + j + 1)
                _common.sync(device)
                if r >= 2:
                    times[j].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def main() -> None:
    p = _common.parser(__doc__.split("\n\n")[0], num_prompts=0)
    p.add_argument("--gamma", type=int, default=4, help="draft forwards per step (default 4)")
    p.add_argument("--context", type=int, default=200, help="tokens already in the caches (default 200)")
    p.add_argument("--repeats", type=int, default=40, help="timed steps per cell (default 40)")
    p.add_argument(
        "--dtypes", default="float32,bfloat16", help="draft dtypes to compare (default float32,bfloat16)"
    )
    args = p.parse_args()
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if args.gamma < 1 or args.context < args.gamma + 1 or any(d not in _common.DTYPES for d in dtypes):
        _common.fail(f"--gamma >= 1, --context > --gamma, --dtypes from {', '.join(_common.DTYPES)}")
    bench = _common.start(NAME, args)
    target = load_model(args.target, args.dtype, args.device)
    bench.device = str(target.lm_head.weight.device)
    rows, cells = [], []
    for dtype in dtypes:
        draft = load_model(args.draft, dtype, args.device)
        alone = timed_positions(target, draft, args.gamma, args.context, args.repeats, verify=False)
        after = timed_positions(target, draft, args.gamma, args.context, args.repeats, verify=True)
        cells.append(
            {
                "draft_dtype": dtype,
                "draft_only_s": alone,
                "after_verify_s": after,
                "mean_ratio": statistics.fmean(after) / statistics.fmean(alone),
            }
        )
        for label, t in (("draft only", alone), ("after verify", after)):
            rows.append((dtype, label, *(f"{1e3 * x:.2f}" for x in t), f"{1e3 * statistics.fmean(t):.2f}"))
    _common.print_table(
        f"draft forward ms by position in the step "
        f"(B=1, context {args.context}, target {args.dtype}, {bench.device})",
        ["draft dtype", "loop", *(f"pos {j + 1}" for j in range(args.gamma)), "mean"],
        rows,
    )
    for c in cells:
        print(
            f"{c['draft_dtype']}: a draft forward after a verify pass costs {c['mean_ratio']:.2f}x "
            "one in a draft-only loop"
        )
    _common.write_json(bench, {"cells": cells})


if __name__ == "__main__":
    main()
