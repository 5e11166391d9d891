"""The chat workload against the plain one on the demo pair: acceptance and the best K per level,
in the engine and in vLLM.

Two workloads, the same pair and the same load (``--config``'s, default the bundled tune.yaml, cut
to ``--levels``, ``--requests`` per level, every request ``--max-new-tokens``, greedy; ``--prompts``
of each workload, evenly spread over its file):

- **plain**: the config's prompts (the demo code prompts), sent to vLLM as token ids;
- **chat**: ``engine/demo/chat.jsonl`` (``--chat``), each conversation rendered with the target's
  chat template for the engine (``engine/chat.py``) and sent to vLLM's ``/v1/chat/completions``
  as its turns (vLLM applies the same template: tests/autotune/test_backend_vllm_real.py holds the
  ids equal).

**Engine** (the profiler's helpers, as ``autotune profile`` measures: ``_common.profile_pair``):
the draft model's per-position acceptance at ``--gamma-max`` (B=1), the mean accepted length
E(K) = 1 + the sum of the first K positions, and the cost model's best K at each level
(``autotune.cost.costmodel.best_gamma`` on that workload's own curves and samples).

**vLLM** (``benchmarks/_schedule.Plan``): no speculation and the draft model at each K of
``--grid``, one server per configuration serving both workloads (the command's last word, the
workload's name, picks the requests), every configuration's rounds interleaved (round r of each,
then r + 1: paired rounds, as the schedule benchmarks). Per workload: the paired ratios over no
speculation at each level (``_schedule.analyse``), the tool's per-level K (``Plan.level_choices``:
``autotune.decide.selection.plan_table``) and the per-position acceptance the server counted at the
grid's largest K. JSON and the printed text: ``benchmarks/results/chat_workload.{json,txt}``. Usage::

    python -m benchmarks.stacks.chat_workload [--config tune.yaml] [--chat engine/demo/chat.jsonl] \
[--levels 1,4] [--requests 16] [--max-new-tokens 32] [--grid 2,5] [--repeats 5] [--gamma-max 8]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import yaml

from autotune import context
from autotune.backends.vllm import VllmBackend
from autotune.cli.text import columns
from autotune.config import load_config
from autotune.cost.acceptance import expected_tokens
from autotune.cost.costmodel import best_gamma
from autotune.device.profiler import spread
from autotune.knobs import Knobs
from autotune.records import PER_POSITION
from benchmarks._common import claim_dir, int_list, portable, profile_pair, stamp
from benchmarks._schedule import Plan, analyse, choices_json, level_choice_text, ratio_text, write_json
from engine.demo import DEMO_DIR
from engine.loader import load_pair

ROOT = Path(__file__).resolve().parents[2]

WORKLOADS = ("plain", "chat")


def arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=ROOT / "tune.yaml")
    p.add_argument("--chat", type=Path, default=DEMO_DIR / "chat.jsonl", help="the chat workload")
    p.add_argument("--levels", type=int_list, default=[1, 4], help="concurrency levels")
    p.add_argument("--prompts", type=int, default=16, help="prompts of each workload (evenly spread)")
    p.add_argument("--requests", type=int, default=16, help="requests per level per round")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--grid", type=int_list, default=[2, 5], help="K of the draft model in vLLM")
    p.add_argument("--repeats", type=int, default=5, help="rounds per configuration in vLLM")
    p.add_argument("--gamma-max", type=int, default=8, help="positions the engine profiles")
    p.add_argument("--out", type=Path, default=claim_dir("chat_workload") / "chat_workload.json")
    return p.parse_args()


def contexts(args: argparse.Namespace, folder: Path) -> dict[str, context.Context]:
    """One vLLM-backend run context per workload: ``--config`` with the prompts, levels and requests
    of this benchmark, a scratch store, one ``--max-model-len`` for both (so both use one server)."""
    raw = yaml.safe_load(args.config.read_text())
    out = {}
    for name in WORKLOADS:
        w = raw["workload"] | {"concurrency": args.levels, "num_requests": args.requests, "min_batches": 1}
        w |= {"trace": None, "rate": None, "temperature": 0.0}
        if name == "chat":
            w["prompts"] = str(args.chat.resolve())
        elif not str(w["prompts"]).startswith("demo"):
            w["prompts"] = str((args.config.parent / w["prompts"]).resolve())
        vllm = (raw.get("backend", {}).get("vllm") or {}) | {"max_model_len": 1024}
        vllm["env"] = {"VLLM_CPU_KVCACHE_SPACE": "1"}  # three servers up at once: the demo needs little
        cfg = raw | {
            "workload": w,
            "search": raw["search"] | {"max_batch_size": [max(args.levels)], "drafter": ["model"]},
            "storage": {"url": f"sqlite:///{folder / f'{name}.db'}"},
            "backend": {"name": "vllm", "vllm": vllm},
            "models": raw["models"] | {"compile": False},
        }
        path = folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        ctx = context.build(load_config(path))
        chosen = spread(ctx.requests, args.prompts)  # as many of each: the plain file holds more lines
        ctx.requests = [replace(r, max_new_tokens=args.max_new_tokens) for r in chosen]
        out[name] = ctx
    return out


def engine_side(args: argparse.Namespace, ctx: context.Context) -> dict:
    """The engine's profile of one workload: acceptance per position, E(K), the best K per level."""
    cfg = ctx.cfg
    pair = load_pair(cfg.models.target, cfg.models.draft, dtype=cfg.models.dtype, device="cpu")
    prof = profile_pair(pair, ctx.requests, args.levels, args.gamma_max, args.max_new_tokens, repeats=5)
    per_pos = prof.acceptance["per_position_acceptance"]
    best = {b: best_gamma(prof.curves, prof.samples, b, args.gamma_max) for b in args.levels}
    del pair
    gc.collect()
    return {
        "prompt_tokens_median": statistics.median(len(r.prompt_ids) for r in ctx.requests),
        "acceptance_rate": prof.acceptance["acceptance_rate"],
        "per_position_acceptance": per_pos,
        "mean_accepted_length": {k: expected_tokens(per_pos, k) for k in range(1, args.gamma_max + 1)},
        "best_k": {b: p.gamma for b, p in best.items()},
        "predicted_speedup": {b: p.speedup for b, p in best.items()},
        "samples": prof.acceptance["n_samples"],
    }


class WorkloadSwitch:
    """The vLLM backend as a :class:`Plan` sees it, serving two workloads: a plan's command is the
    server's command plus the workload's name, which picks the requests; equal server commands
    share one server (the backend's own reuse)."""

    def __init__(self, backend: VllmBackend, requests: dict[str, list], servers: int) -> None:
        self.backend, self.requests = backend, requests
        backend.keep_servers = max(backend.keep_servers, servers)

    @property
    def keep_servers(self) -> int:
        return self.backend.keep_servers

    @keep_servers.setter
    def keep_servers(self, n: int) -> None:
        self.backend.keep_servers = n

    @property
    def server(self):
        return self.backend.server

    def close(self) -> None:
        self.backend.close()

    def run_command(self, command: list[str], batch: int, seed: int, records=None, with_trace: bool = False):
        *server_command, name = command
        self.backend.ctx.requests = self.requests[name]
        return self.backend.run_command(server_command, batch, seed, records, with_trace=with_trace)


def vllm_side(args: argparse.Namespace, ctxs: dict[str, context.Context]) -> tuple[dict, str | None]:
    """Every configuration of the grid for both workloads, interleaved; per workload its rows, the
    paired ratios, the tool's per-level K and the counted per-position acceptance at the largest K."""
    backend = VllmBackend(ctxs["plain"])
    switch = WorkloadSwitch(backend, {n: c.requests for n, c in ctxs.items()}, 1 + len(args.grid))
    batch, ks = max(args.levels), [0, *args.grid]
    plan = Plan(switch, batch, args.levels, args.repeats, 0, False, interleave=2 * len(ks), bridge=False)
    knobs = {k: Knobs("model" if k else "none", k, max_batch_size=batch) for k in ks}
    with plan.together():
        for k in ks:
            for name in WORKLOADS:
                label = f"{name}: " + (f"K={k}" if k else "no speculation")
                plan.run(label, [*backend.command(knobs[k]), name], "constant" if k else "off", knobs[k])
    out = {}
    for name in WORKLOADS:
        own = Plan(None, batch, args.levels, args.repeats, 0, False)
        own.rows = [r for r in plan.rows if r["config"].startswith(f"{name}: ")]
        own.knobs = {label: kn for label, kn in plan.knobs.items() if label.startswith(f"{name}: ")}
        analyse(own.rows, args.levels, float("inf"))
        top = next((r for r in own.ok() if r["config"] == f"{name}: K={max(ks)}"), None)
        out[name] = {
            "rows": own.rows,
            "level_choices": choices_json(own.level_choices("model")),
            "level_choice_text": level_choice_text(own.level_choices("model")),
            "per_position_acceptance": top
            and {
                b: [statistics.fmean(p) for p in zip(*lv[PER_POSITION], strict=True)]
                for b, lv in top["per_level_rounds"].items()
            },
        }
    return out, backend.version


def tables(result: dict) -> str:
    """The engine's and vLLM's figures per workload, as printed."""
    eng, vl, levels = result["engine"], result["vllm"], result["levels"]
    positions = len(eng["plain"]["per_position_acceptance"])
    rows = [
        [name, eng[name]["prompt_tokens_median"], f"{eng[name]['acceptance_rate']:.3f}"]
        + [f"{p:.2f}" for p in eng[name]["per_position_acceptance"]]
        + [f"{eng[name]['mean_accepted_length'][positions]:.2f}"]
        + [f"K={eng[name]['best_k'][b]} ({eng[name]['predicted_speedup'][b]:.2f}x)" for b in levels]
        for name in WORKLOADS
    ]
    head = ["workload", "prompt tok", "accept"] + [f"p{i + 1}" for i in range(positions)]
    head += [f"E({positions})"] + [f"best K @{b} (pred.)" for b in levels]
    out = ["engine: draft model, B=1 profile at gamma_max, cost-model best K per level", columns(head, rows)]
    out.append("\nvLLM: tokens/s (median over rounds) and x no speculation (paired, 95% CI) per level")
    vrows = []
    for name in WORKLOADS:
        for r in vl[name]["rows"]:
            cells = [r["config"]]
            for b in levels:
                lv = (r.get("levels") or {}).get(b)
                cells += [
                    lv and lv["tokens_per_second"]["median"],
                    lv and ratio_text(lv["over_no_speculation"]),
                ]
            vrows.append(cells)
    vhead = ["configuration"] + [x for b in levels for x in (f"tok/s @{b}", f"x no-spec @{b}")]
    out.append(columns(vhead, vrows))
    for name in WORKLOADS:
        per_pos = vl[name]["per_position_acceptance"] or {}
        counted = "; ".join(
            f"@{b}: "
            + " ".join(f"{p:.2f}" for p in acc)
            + f" (E({len(acc)}) {expected_tokens(acc, len(acc)):.2f})"
            for b, acc in per_pos.items()
        )
        out.append(
            f"{name}: tool's K per level {vl[name]['level_choice_text']}; counted per position {counted}"
        )
    return "\n".join(out)


def main() -> None:
    args = arguments()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        ctxs = contexts(args, Path(scratch))
        engine = {name: engine_side(args, ctx) for name, ctx in ctxs.items()}
        vllm, version = vllm_side(args, ctxs)
        for ctx in ctxs.values():
            ctx.store.close()
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        **stamp(ctxs["plain"].fingerprint["label"]),
        "device": ctxs["plain"].fingerprint["label"],
        "dtype": ctxs["plain"].cfg.models.dtype,
        "vllm_version": version,
        "levels": args.levels,
        "requests_per_level": args.requests,
        "max_new_tokens": args.max_new_tokens,
        "grid": args.grid,
        "repeats": args.repeats,
        "workloads": {name: ctx.workload for name, ctx in ctxs.items()},
        "engine": engine,
        "vllm": vllm,
        "wall_s": time.perf_counter() - t0,
    }
    write_json(args.out, result)  # before the tables: a measurement is never lost to its rendering
    text = tables(result)
    header = (
        f"{result['device']}, {result['dtype']}, vLLM {version}; levels {args.levels}, {args.requests} "
        f"requests x {args.max_new_tokens} tokens per level, {args.repeats} rounds; {result['wall_s']:.0f} s"
    )
    print(f"{header}\n\n{text}")
    args.out.with_suffix(".txt").write_text(portable(f"$ {result['command']}\n{header}\n\n{text}\n"))
    print(f"\nwrote {portable(str(args.out))} and its .txt")


if __name__ == "__main__":
    main()
