"""Shared plumbing of the benchmark scripts: flags, the pair and its requests, JSON and tables.

Every benchmark is ``python -m benchmarks.<group>.<name> [flags]``: seeded, greedy, it prints a
human table and writes ``<out-dir>/<name>.json`` (default ``benchmarks/results/<name>/``, its
claim's folder) holding the exact command line, the parsed flags, the host and the date
(:func:`stamp`), the machine fingerprint (:func:`autotune.device.hardware.fingerprint`), the torch
thread count and the results. Measured figures are ratios of runs made in the same
invocation, so they compare like with like on a noisy host.

Requests come from a JSONL workload (default: the demo prompts): ``--num-prompts`` of them drawn
with the seed (file order kept), each made greedy and given exactly ``--max-new-tokens``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import json
import os
import random
import re
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from autotune.cli.text import columns
from autotune.config import DTYPES
from autotune.device.hardware import fingerprint
from autotune.device.profiler import (
    curves_from_json,
    measure_acceptance,
    measure_curves,
    measure_overhead,
    samples_from_json,
)
from autotune.errors import USER_ERRORS
from autotune.records import Curves, StepSample
from autotune.workload.runner import Sampling, build_requests
from engine.demo import DEMO_DRAFT, DEMO_PROMPTS, DEMO_TARGET
from engine.loader import ModelPair, load_pair
from engine.scheduler import RunResult
from engine.speculative import Request
from engine.workload import load_workload

REPO = Path(__file__).resolve().parents[1]
# Where the claims' folders are: the committed results, or another root for a run that must not
# replace them (``python -m benchmarks run --quick`` sets it to benchmarks/results-quick/).
RESULTS = Path(os.environ.get("BENCHMARKS_RESULTS") or REPO / "benchmarks" / "results")


def int_list(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]`` (an argparse type)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 0, got {text!r}")
    return values


def parser(
    description: str, num_prompts: int = 16, max_new_tokens: int = 64, dtype: bool = True
) -> argparse.ArgumentParser:
    """The flags every benchmark shares; scripts add their own."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--target", type=Path, default=DEMO_TARGET, help="target model folder (default: the demo target)"
    )
    p.add_argument(
        "--draft", type=Path, default=DEMO_DRAFT, help="draft model folder (default: the demo draft)"
    )
    p.add_argument(
        "--prompts", type=Path, default=DEMO_PROMPTS, help="JSONL workload (default: the demo prompts)"
    )
    p.add_argument(
        "--num-prompts",
        type=int,
        default=num_prompts,
        help=f"prompts drawn (seeded) from --prompts; 0 = all (default {num_prompts})",
    )
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=max_new_tokens,
        help=f"tokens generated per request, overriding the workload's lines (default {max_new_tokens})",
    )
    p.add_argument("--device", default="auto", help="auto, cpu or cuda[:N] (default auto)")
    if dtype:
        p.add_argument("--dtype", default="float32", choices=DTYPES, help="weights dtype (default float32)")
    p.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's own; recorded)"
    )
    p.add_argument("--seed", type=int, default=0, help="prompt draw, arrivals and sampling seed (default 0)")
    p.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="where <name>.json goes (default benchmarks/results/<name>/, the claim's folder)",
    )
    return p


def claim_dir(name: str) -> Path:
    """The results folder of the claim ``name`` (a step of benchmarks/claims.py)."""
    return RESULTS / name


def stamp(host: str | None = None) -> dict[str, str]:
    """What every result JSON holds to say where and when it ran: the host's label and the UTC time.

    ``host`` defaults to this machine's CPU label (:func:`autotune.device.hardware.fingerprint`)."""
    return {
        "host": host if host is not None else fingerprint("cpu")["label"],
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


@dataclasses.dataclass
class Bench:
    """One benchmark invocation: its name, flags, start time and the device it runs on."""

    name: str
    args: argparse.Namespace
    started: float = dataclasses.field(default_factory=time.perf_counter)
    started_utc: str = dataclasses.field(
        default_factory=lambda: datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    )
    device: str = "cpu"


def start(name: str, args: argparse.Namespace) -> Bench:
    """Seed everything and pin torch's thread count (one value for every run of the script)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    return Bench(name, args)


def fail(message: str) -> None:
    """One line on stderr and exit code 2, like the ``autotune`` CLI."""
    print(f"error: {message.splitlines()[0] if message else 'failed'}", file=sys.stderr)
    sys.exit(2)


def selected_items(args: argparse.Namespace) -> list:
    """The benchmark's prompts: ``--num-prompts`` of ``--prompts`` (a seeded sample), each with
    ``--max-new-tokens`` and the sampling of the run (greedy unless a script says otherwise)."""
    items = load_workload(args.prompts)
    if 0 < args.num_prompts < len(items):
        keep = sorted(random.Random(args.seed).sample(range(len(items)), args.num_prompts))
        items = [items[i] for i in keep]
    return [
        dataclasses.replace(it, max_new_tokens=args.max_new_tokens, temperature=None, top_k=None, top_p=None)
        for it in items
    ]


def load(
    bench: Bench, dtype: str | None = None, draft: bool = True, eagle3: Path | None = None
) -> tuple[ModelPair, list[Request]]:
    """The pair (on ``--device`` in ``dtype``, default ``--dtype``; with ``eagle3``, that EAGLE-3
    head too) and the benchmark's requests."""
    args = bench.args
    try:
        pair = load_pair(
            args.target,
            args.draft if draft else None,
            dtype=dtype or args.dtype,
            device=args.device,
            eagle3=eagle3,
        )
        if pair.tokenizer is None:
            fail(f"{args.target}: no tokenizer.json")
        items = selected_items(args)
        requests = build_requests(
            items,
            pair.tokenizer,
            Sampling(max_new_tokens=args.max_new_tokens),
            pair.target.config.max_position_embeddings,
            where=str(args.prompts),
        )
    except USER_ERRORS as exc:
        fail(str(exc))
    bench.device = str(pair.target.lm_head.weight.device)
    return pair, requests


def compiled_twin(pair: ModelPair, trees: Sequence[Sequence[int]] = ()) -> ModelPair:
    """A copy of ``pair`` whose decode/verify forward is compiled (what ``autotune tune`` runs by
    default, models.compile: auto; ``trees``: the tree shapes whose forward is warmed too);
    ``compile_s`` holds the compile time, reported apart."""
    twin = dataclasses.replace(
        pair,
        target=copy.deepcopy(pair.target),
        draft=copy.deepcopy(pair.draft) if pair.draft is not None else None,
    )
    twin.compile_decode(trees)
    return twin


@dataclasses.dataclass
class PairProfile:
    """What ``autotune profile`` measures of a pair, as the cost model reads it."""

    curves: Curves
    samples: list[StepSample]
    raw_curves: dict  # the profiler's JSON (profile["curves"])
    acceptance: dict  # the profiler's JSON without its samples
    context: int  # tokens of context the curves were measured at


def profile_pair(
    pair: ModelPair,
    requests: list[Request],
    batch_sizes: Sequence[int],
    gamma_max: int,
    new_tokens: int,
    repeats: int = 7,
    seed: int = 0,
) -> PairProfile:
    """Profile ``pair`` as ``autotune profile`` does: T_verify(B, k) for k = 1..gamma_max + 1, T_draft(B),
    T_prefill(B) at the workload's context (median prompt + new_tokens / 2), the engine's overhead
    around the forwards, and per-position acceptance at gamma_max (B=1, threshold 0)."""
    prompt = int(statistics.median(len(r.prompt_ids) for r in requests))
    context = prompt + new_tokens // 2
    curves = measure_curves(
        pair, sorted(set(batch_sizes)), gamma_max, context, repeats=repeats, prompt_tokens=prompt
    )
    measure_overhead(pair, requests, curves, seed)
    acceptance = measure_acceptance(pair, requests, "model", gamma_max, seed)
    samples = samples_from_json(acceptance)
    return PairProfile(
        curves_from_json(curves),
        samples,
        curves,
        {k: v for k, v in acceptance.items() if k != "samples"} | {"n_samples": len(samples)},
        context,
    )


def sync(device: torch.device | str) -> None:
    """Wait for queued device work before reading a host clock (a no-op on CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def outputs(run: RunResult) -> list[list[int]]:
    """Generated tokens per request, in request order."""
    return [r.output_tokens for r in run.records]


def decode_seconds(run: RunResult) -> float:
    """Decode time: the sum over requests of (finish - first token), i.e. wall time without prefill at B=1."""
    return sum(r.finish_s - r.first_token_s for r in run.records)


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    print(f"\n{title}")
    print(columns(headers, rows))


def _jsonable(value: object) -> object:
    if isinstance(value, Path):
        return str(value)
    return value


def portable(text: str, root: Path = REPO, home: str | None = None) -> str:
    """``text`` with the repository root written as ``<repo>`` and the home folder as ``~``.

    Committed results must not carry the absolute paths of the machine they ran on.

    Example:
        >>> portable('"/work/x/engine", "/work/x2", "/home/u/.cache"', Path("/work/x"), "/home/u")
        '"<repo>/engine", "/work/x2", "~/.cache"'
    """
    home = os.path.expanduser("~") if home is None else home
    for path, mark in ((str(root), "<repo>"), (home, "~")):
        if path and path != "/":
            text = re.sub(re.escape(path) + r"(?![\w.-])", mark, text)
    return text


def write_json(bench: Bench, results: dict, dtype: str | None = None) -> Path:
    """Write ``<out-dir>/<name>.json`` atomically: command line, flags, fingerprint, results.

    Paths in it are made :func:`portable` (``<repo>/...``, ``~/...``)."""
    args = bench.args
    machine = fingerprint(bench.device, dtype or getattr(args, "dtype", "float32"))
    payload = {
        "benchmark": bench.name,
        "command": shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv])),
        "cwd": os.getcwd(),
        "args": {k: _jsonable(v) for k, v in vars(args).items()},
        "host": machine["label"],
        "date_utc": bench.started_utc,
        "started_utc": bench.started_utc,
        "elapsed_s": time.perf_counter() - bench.started,
        "device": bench.device,
        "torch_threads": torch.get_num_threads(),
        "fingerprint": machine,
        **results,
    }
    out_dir = args.out_dir or claim_dir(bench.name)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{bench.name}.json"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(portable(json.dumps(payload, indent=2, default=str)) + "\n")
    tmp.replace(path)
    print(f"\nwrote {path}")
    return path
