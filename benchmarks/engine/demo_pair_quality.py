"""The demo pair's quality bar: acceptance and speedup at gamma 4, B=1, on the held-out prompts.

Per drafter (``--drafters``, default the draft model; ``ngram`` and ``eagle3``, the demo target's
EAGLE-3 head in ``engine/demo/eagle3`` or ``--eagle3``, beside it), the same figures.

The figures ``autotune bench --json`` reports (``autotune.workload.runner.compare``: a speculative run and
the same engine's autoregressive run on the same requests, closed loop, one row), measured on
every held-out prompt by default rather than the first few, in two modes:

- greedy (temperature 0): acceptance_rate (bar >= 0.60), speedup (bar >= 1.3), greedy_match;
- temperature 1.0: acceptance_rate (bar >= 0.50), speedup.

Also the draft_cost_ratio (bar <= 0.2: one draft forward inside the engine over one decode step),
per-position acceptance, and the target's greedy continuations of two held-out prompts (is it
Python?). Each request generates up to ``--max-new-tokens`` tokens; end-of-sequence ends it early.

Example:
    python -m benchmarks.engine.demo_pair_quality                     # all 237 prompts, ~10 min on 2 cores
    python -m benchmarks.engine.demo_pair_quality --num-prompts 24 --modes greedy
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from autotune.workload.runner import LoadSpec, compare
from benchmarks import _common
from engine.demo import DEMO_EAGLE3
from engine.generate import generate
from engine.speculative import SpecConfig

NAME = "demo_pair_quality"
BARS = {"greedy": {"acceptance_rate": 0.60, "speedup": 1.3}, "t1": {"acceptance_rate": 0.50}}
TEMPERATURE = {"greedy": 0.0, "t1": 1.0}
SAMPLES = 2
KEEP = (
    "acceptance_rate",
    "per_position_acceptance",
    "mean_acceptance_length",
    "speedup",
    "draft_cost_ratio",
    "tokens_per_second",
    "baseline_tokens_per_second",
    "generated_tokens",
    "draft_forward_ms",
    "verify_step_ms",
    "baseline_verify_step_ms",
    "greedy_match",
)
COLUMNS = [
    "drafter",
    "mode",
    "acceptance",
    "per position",
    "mean accepted length",
    "speedup",
    "draft cost ratio",
    "spec tok/s",
    "AR tok/s",
    "greedy match",
]


def judged(m: dict, drafter: str, mode: str) -> dict:
    """The JSON entry of one (drafter, mode) comparison: its metrics and each bar met or missed."""
    entry = {k: m.get(k) for k in KEEP} | {
        "drafter": drafter,
        "bars": {k: {"bar": v, "met": bool(m[k] >= v)} for k, v in BARS[mode].items()},
    }
    ratio = m.get("draft_cost_ratio")
    entry["bars"]["draft_cost_ratio"] = {"bar": 0.2, "met": ratio is not None and ratio <= 0.2}
    return entry


def row(m: dict, drafter: str, mode: str) -> tuple:
    """The table row of one (drafter, mode) comparison."""
    return (
        drafter,
        mode,
        m["acceptance_rate"],
        ", ".join("-" if a is None else f"{a:.2f}" for a in m["per_position_acceptance"]),
        m["mean_acceptance_length"],
        m["speedup"],
        m.get("draft_cost_ratio"),
        m["tokens_per_second"],
        m["baseline_tokens_per_second"],
        m.get("greedy_match", "-"),
    )


def main() -> None:
    p = _common.parser(__doc__.split("\n\n")[0], num_prompts=0)
    p.add_argument("--gamma", type=int, default=4, help="draft tokens per step (default 4)")
    p.add_argument("--modes", default="greedy,t1", help="greedy and/or t1 (default both)")
    p.add_argument("--drafters", default="model", help="model, ngram and/or eagle3 (default model)")
    p.add_argument("--eagle3", type=Path, default=DEMO_EAGLE3, help="EAGLE-3 head folder (drafter eagle3)")
    p.add_argument("--name", default=NAME, help=f"result file name (default {NAME})")
    args = p.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    drafters = [d.strip() for d in args.drafters.split(",") if d.strip()]
    if not modes or any(m not in TEMPERATURE for m in modes) or args.gamma < 1:
        _common.fail("--modes takes greedy and/or t1, --gamma must be >= 1")
    if not drafters or any(d not in ("model", "ngram", "eagle3") for d in drafters):
        _common.fail(f"--drafters takes model, ngram and/or eagle3 (got {args.drafters!r})")
    bench = _common.start(args.name, args)
    pair, requests = _common.load(bench, eagle3=args.eagle3 if "eagle3" in drafters else None)
    load = LoadSpec(max_batch_size=1, concurrency=1, num_requests=len(requests))
    results, rows = {}, []
    for mode, drafter in [(m, d) for d in drafters for m in modes]:
        reqs = [dataclasses.replace(r, temperature=TEMPERATURE[mode]) for r in requests]
        print(f"{drafter}, {mode}: {len(reqs)} prompts, gamma {args.gamma}, B=1 ...", flush=True)
        m = compare(pair, reqs, SpecConfig(gamma=args.gamma), drafter, load, args.seed)
        key = mode if drafter == "model" else f"{drafter}_{mode}"  # the draft model's keys as before
        results[key] = judged(m, drafter, mode)
        rows.append(row(m, drafter, mode))
    _common.print_table(
        f"demo pair, gamma {args.gamma}, B=1, {len(requests)} held-out prompts, "
        f"up to {args.max_new_tokens} new tokens",
        COLUMNS,
        rows,
    )
    for key, res in list(results.items()):
        bars = ", ".join(
            f"{k} {'met' if v['met'] else 'MISSED'} (bar {v['bar']})" for k, v in res["bars"].items()
        )
        print(f"{key}: {bars}")

    tok = pair.tokenizer
    picks = [requests[i * len(requests) // SAMPLES] for i in range(SAMPLES)]
    out = generate(
        pair,
        [dataclasses.replace(r, temperature=0.0, id=i) for i, r in enumerate(picks)],
        SpecConfig(gamma=args.gamma),
    )
    samples = []
    print("\ntarget greedy continuations (prompt tail | continuation):")
    for r, toks in zip(picks, out.tokens, strict=True):
        tail, cont = tok.decode(r.prompt_ids)[-160:], tok.decode(toks)
        samples.append({"prompt_tail": tail, "continuation": cont})
        print(f"--- ...{tail!r}\n  | {cont!r}")
    results["continuations"] = samples
    _common.write_json(bench, results)


if __name__ == "__main__":
    main()
