"""Inside vLLM: the engine-tuned export, the vLLM-tuned choice, popular defaults and a grid of K.

One run, one vLLM server per configuration (the vllm backend's launcher, the same host flags,
a fresh server each), the same prompts and load (the workload of ``--config``, default the
bundled tune.yaml), in this order:

1. vLLM without speculation (measured again at the end: the drift check);
2. popular defaults: draft_model K=3 and K=5;
3. the config exported by ``autotune tune --backend engine`` (the newest engine-backend profile
   for this host and pair, exported by the vLLM exporter, per-batch-size table included);
4. the config chosen by ``autotune tune --backend vllm`` (the newest vllm-backend profile);
5. a grid of K = 1..8 (draft_model; configurations already measured above are not run twice).

Each server runs every load level of the workload ``--repeats`` times after a warm-up; rows and
summary as in ``benchmarks/_transfer.py``. Goals of the vLLM issue: the vllm-backend choice
within 5% of the grid's best and >= 1.2x over no speculation; the engine-backend export's ratio
to the grid's best is the tool's transfer error. Usage::

    python -m benchmarks.stacks.transfer_vllm [--config tune.yaml] [--repeats 3] [--grid 1,2,3,4,5,6,7,8]
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

from autotune.backends.vllm import VllmBackend, serve_command
from autotune.knobs import Knobs
from benchmarks._common import stamp
from benchmarks._transfer import arguments, measure_plan, open_stack, report, summarize
from profiles.profile import export_inputs
from profiles.schema import Profile

ROOT = Path(__file__).resolve().parents[2]


def build_plan(
    args: argparse.Namespace,
    backend: VllmBackend,
    batch: int,
    engine_prof: dict | None,
    vllm_prof: dict | None,
) -> list[tuple[str, list[str]]]:
    """The servers to measure, in order: no speculation, vLLM's usual K=3 and K=5, both profiles'
    exports (where stored), the K grid, and no speculation again (the drift check)."""

    def grid_command(k: int) -> list[str]:
        knobs = Knobs("model" if k else "none", k, max_batch_size=batch)
        return backend.command(knobs)

    plan = [
        ("no speculation", grid_command(0)),
        ("default K=3", grid_command(3)),
        ("default K=5", grid_command(5)),
    ]
    for label, prof, how in (
        ("engine-backend export", engine_prof, "autotune tune"),
        ("vllm-backend choice", vllm_prof, "autotune tune --backend vllm"),
    ):
        if prof is None:
            print(
                f"note: no {label.split()[0]} profile for this host and pair (run `{how}`)", file=sys.stderr
            )
        else:
            plan.append(
                (
                    f"{label} (profile #{prof['id']})",
                    serve_command(
                        backend.python,
                        replace(export_inputs(Profile.from_json(prof)), deployment=backend.deployment),
                    ),
                )
            )
    plan += [(f"grid K={k}", grid_command(int(k))) for k in args.grid.split(",")]
    plan.append(("no speculation (again, last)", grid_command(0)))
    return plan


def main() -> None:
    args = arguments(__doc__, "vllm", [("--grid", "1,2,3,4,5,6,7,8", "K values of the grid")])
    cfg, ctx, backend, engine_prof, vllm_prof = open_stack(args, "vllm", VllmBackend)
    batch = max(cfg.search.max_batch_size)
    plan = build_plan(args, backend, batch, engine_prof, vllm_prof)

    t0 = time.perf_counter()
    rows = measure_plan(backend, plan, batch, args.repeats, cfg.budget.seed)
    summary = summarize(rows, cfg.workload.temperature == 0, "vllm-backend choice")
    result = {
        "command": shlex.join([sys.executable, *sys.argv]),
        **stamp(ctx.fingerprint["label"]),
        "device": ctx.fingerprint["label"],
        "config": str(args.config),
        "vllm_version": backend.version,
        "workload": ctx.workload,
        "max_num_seqs": batch,
        "repeats": args.repeats,
        "wall_s": time.perf_counter() - t0,
        "engine_profile": engine_prof and {k: engine_prof[k] for k in ("id", "chosen", "schedule")},
        "vllm_profile": vllm_prof and {k: vllm_prof[k] for k in ("id", "chosen", "schedule")},
        "summary": summary,
        "rows": rows,
    }
    w = cfg.workload
    report(
        args.out,
        f"vLLM {backend.version} on {ctx.fingerprint['label']}; workload {w.prompts.name}, concurrency "
        f"{list(w.concurrency)}, {w.num_requests} requests x {w.max_new_tokens} tokens per level, "
        f"{args.repeats} repeats per server; --max-num-seqs {batch}",
        result,
    )


if __name__ == "__main__":
    main()
