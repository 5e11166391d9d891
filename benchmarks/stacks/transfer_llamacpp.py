"""Inside llama.cpp: the engine-tuned export, the llamacpp-tuned choice, defaults and an n-max x p-min grid.

One run, one llama-server per configuration (the llamacpp backend's launcher and GGUF files,
the same host flags, a fresh server each), the same prompts and load (the workload of
``--config``, default the bundled tune.yaml), in this order:

1. llama-server without speculation (measured again at the end: the drift check);
2. llama.cpp's defaults with the draft model: ``--spec-draft-n-max 3 --spec-draft-p-min 0``;
3. the config exported by ``autotune tune --backend engine`` (newest engine-backend profile for
   this host and pair, through the llama.cpp exporter with the GGUF paths);
4. the config chosen by ``autotune tune --backend llamacpp`` (newest llamacpp-backend profile);
5. a grid over ``--spec-draft-n-max`` x ``--spec-draft-p-min``.

Rows and summary as in ``benchmarks/_transfer.py``. Goals of the llama.cpp issue: the
llamacpp-backend choice within 5% of the grid's best and never below no speculation; the
engine-backend export's ratio to the grid's best is the transfer error. Usage::

    python -m benchmarks.stacks.transfer_llamacpp [--config tune.yaml] [--repeats 3] [--n-max 1,2,3,4,6,8] \
[--p-min 0,0.3,0.6]
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from autotune.backends.llamacpp import LlamacppBackend
from autotune.knobs import Knobs
from benchmarks._common import stamp
from benchmarks._transfer import arguments, measure_plan, open_stack, report, summarize
from profiles.profile import export_inputs
from profiles.schema import Profile

ROOT = Path(__file__).resolve().parents[2]


def build_plan(
    args: argparse.Namespace,
    backend: LlamacppBackend,
    batch: int,
    engine_prof: dict | None,
    chosen_prof: dict | None,
) -> list[tuple[str, list[str]]]:
    """The servers to measure, in order: no speculation, llama.cpp's defaults, both profiles' exports
    (where stored), the n-max x p-min grid, and no speculation again (the drift check)."""

    def grid_command(n_max: int, p_min: float) -> list[str]:
        return backend.command(Knobs("model" if n_max else "none", n_max, p_min, max_batch_size=batch))

    def profile_command(prof: dict) -> list[str]:
        inputs = export_inputs(
            Profile.from_json(prof),
            str(backend.target_gguf),
            str(backend.draft_gguf) if backend.draft_gguf else None,
        )
        return backend.profile_command(inputs)

    plan = [
        ("no speculation", grid_command(0, 0.0)),
        ("llama.cpp defaults (n-max 3, p-min 0)", grid_command(3, 0.0)),
    ]
    for label, prof, how in (
        ("engine-backend export", engine_prof, "autotune tune"),
        ("llamacpp-backend choice", chosen_prof, "autotune tune --backend llamacpp"),
    ):
        if prof is None:
            print(
                f"note: no {label.split()[0]} profile for this host and pair (run `{how}`)", file=sys.stderr
            )
        else:
            plan.append((f"{label} (profile #{prof['id']})", profile_command(prof)))
    plan += [
        (f"grid n-max {n} p-min {pm:g}", grid_command(int(n), float(pm)))
        for n in args.n_max.split(",")
        for pm in (float(x) for x in args.p_min.split(","))
    ]
    plan.append(("no speculation (again, last)", grid_command(0, 0.0)))
    return plan


def main() -> None:
    args = arguments(
        __doc__,
        "llamacpp",
        [
            ("--n-max", "1,2,3,4,6,8", "--spec-draft-n-max values of the grid"),
            ("--p-min", "0,0.3,0.6", "--spec-draft-p-min values of the grid"),
        ],
    )
    cfg, ctx, backend, engine_prof, chosen_prof = open_stack(args, "llamacpp", LlamacppBackend)
    batch = max(cfg.search.max_batch_size)
    plan = build_plan(args, backend, batch, engine_prof, chosen_prof)

    t0 = time.perf_counter()
    rows = measure_plan(backend, plan, batch, args.repeats, cfg.budget.seed)
    summary = summarize(rows, cfg.workload.temperature == 0, "llamacpp-backend choice")
    result = {
        "command": shlex.join([sys.executable, *sys.argv]),
        **stamp(ctx.fingerprint["label"]),
        "device": ctx.fingerprint["label"],
        "config": str(args.config),
        "llama_server_version": backend.version,
        "workload": ctx.workload,
        "parallel": batch,
        "threads": cfg.backend.llamacpp.threads,
        "repeats": args.repeats,
        "wall_s": time.perf_counter() - t0,
        "gguf": backend.describe()["gguf"],
        "engine_profile": engine_prof and {k: engine_prof[k] for k in ("id", "chosen", "schedule")},
        "llamacpp_profile": chosen_prof and {k: chosen_prof[k] for k in ("id", "chosen", "schedule")},
        "summary": summary,
        "rows": rows,
    }
    w = cfg.workload
    report(
        args.out,
        f"llama-server {backend.version} on {ctx.fingerprint['label']}, -t {cfg.backend.llamacpp.threads}; "
        f"workload {w.prompts.name}, concurrency {list(w.concurrency)}, {w.num_requests} requests x "
        f"{w.max_new_tokens} tokens per level, {args.repeats} repeats per server; -np {batch}",
        result,
    )


if __name__ == "__main__":
    main()
