"""``autotune bench``: speculative vs autoregressive decoding on the engine."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from autotune.cli.options import print_json
from autotune.cli.render import render_bench
from engine.demo import DEMO_DRAFT, DEMO_PROMPTS, DEMO_TARGET
from engine.generate import DRAFTERS
from engine.speculative import GAMMA_POLICIES, Request, SpecConfig

if TYPE_CHECKING:
    from autotune.workload.runner import Sampling
    from engine.loader import ModelPair

Arrivals = tuple[tuple[float, Request], ...]  # (offset_s, request), sorted by offset


@click.command()
@click.option(
    "--target",
    type=click.Path(path_type=Path),
    default=DEMO_TARGET,
    show_default="demo target",
    help="Target model folder (config.json + *.safetensors + tokenizer.json).",
)
@click.option(
    "--draft",
    type=click.Path(path_type=Path),
    default=DEMO_DRAFT,
    show_default="demo draft",
    help="Draft model folder (for --drafter model).",
)
@click.option(
    "--eagle3",
    "eagle3",
    type=click.Path(path_type=Path),
    default=None,
    help="EAGLE-3 head folder (for --drafter eagle3; vLLM's format, docs/eagle3.md).",
)
@click.option("--drafter", type=click.Choice(DRAFTERS), default="model", show_default=True)
@click.option(
    "--gamma",
    type=click.IntRange(min=0),
    default=4,
    show_default=True,
    help="Draft tokens per step (0 = speculation off).",
)
@click.option(
    "--confidence-threshold",
    type=click.FloatRange(0, 1),
    default=0.0,
    show_default=True,
    help="A row stops drafting when the draft's top probability falls below this.",
)
@click.option("--gamma-schedule", type=click.Choice(GAMMA_POLICIES), default="constant", show_default=True)
@click.option(
    "--batch-size",
    "--max-batch-size",
    "batch_size",
    type=click.IntRange(min=1),
    default=None,
    help="Rows the engine runs at once (continuous batching slots; default: --concurrency, else 1).",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=None,
    help="Closed loop: requests in flight (default: the batch size). Without --max-batch-size the "
    "engine runs this many rows; a smaller --max-batch-size queues the rest.",
)
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Open loop: Poisson arrivals per second (instead of --concurrency).",
)
@click.option(
    "--trace",
    default=None,
    metavar="FILE|phases",
    help="Replay an arrival trace instead of --concurrency/--rate: a JSONL file of "
    '{"arrival_s": ..., "prompt": ... | "prompt_tokens": [...]} lines, or phases (low load, a burst '
    "of 2x the batch size, low load; autotune.workload.trace). --num-requests does not apply.",
)
@click.option("--num-requests", type=click.IntRange(min=1), default=8, show_default=True)
@click.option(
    "--duration",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Stop issuing requests after this many seconds (at most --num-requests).",
)
@click.option(
    "--max-prefill-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Cap one admission's prefill at this many token slots (requests x longest prompt).",
)
@click.option("--temperature", type=click.FloatRange(min=0), default=0.0, show_default=True)
@click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True)
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=64, show_default=True)
@click.option(
    "--prompts",
    type=click.Path(path_type=Path),
    default=DEMO_PROMPTS,
    show_default="demo prompts",
    help='JSONL workload: {"prompt": ..., "max_new_tokens": ...} per line.',
)
@click.option(
    "--truncate-prompts",
    is_flag=True,
    help="Keep the last tokens of a prompt that, with its max_new_tokens, runs past the target's "
    "context (default: refuse it, naming its line; tune.yaml: workload.truncate_prompts).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--device", default="auto", show_default=True, help="auto, cpu or cuda[:N].")
@click.option("--dtype", default="float32", show_default=True, help="float32, bfloat16 or float16.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def bench(
    target,
    draft,
    eagle3,
    drafter,
    gamma,
    confidence_threshold,
    gamma_schedule,
    batch_size,
    concurrency,
    rate,
    trace,
    num_requests,
    duration,
    max_prefill_tokens,
    temperature,
    top_k,
    top_p,
    max_new_tokens,
    prompts,
    truncate_prompts,
    seed,
    device,
    dtype,
    as_json,
):
    """Speculative vs autoregressive decoding on the same engine, prompts and load."""
    from autotune.workload.runner import LoadSpec, Sampling, compare

    _check_trace(trace, rate, concurrency)
    spec = SpecConfig(gamma=gamma, confidence_threshold=confidence_threshold, gamma_schedule=gamma_schedule)
    batch_size = batch_size or (concurrency if rate is None else None) or 1
    sampling = Sampling(max_new_tokens, temperature, top_k, top_p)
    pair, requests = _bench_inputs(
        target, draft, eagle3, drafter, dtype, device, prompts, sampling, truncate_prompts
    )
    arrivals = _arrivals(trace, requests, pair, sampling, batch_size, seed, truncate_prompts)
    load = LoadSpec(
        max_batch_size=batch_size,
        concurrency=None if rate or arrivals else (concurrency or batch_size),
        rate=rate,
        num_requests=len(arrivals) if arrivals is not None else num_requests,
        duration_s=duration,
        max_prefill_tokens=max_prefill_tokens,
        arrivals=arrivals,
    )
    result = compare(pair, requests, spec, drafter, load, seed)
    device_name = str(pair.target.lm_head.weight.device)
    result.update(gamma=gamma, drafter=drafter, confidence_threshold=confidence_threshold)
    result.update(batch_size=batch_size, device=device_name, dtype=dtype)
    if as_json:
        print_json(result)
        return
    click.echo(render_bench(result, drafter, gamma, confidence_threshold, batch_size, load.num_requests))


def _check_trace(trace: str | None, rate: float | None, concurrency: int | None) -> None:
    """``--trace`` is a file or ``phases``, and replaces ``--concurrency`` and ``--rate``."""
    if trace is not None and (rate is not None or concurrency is not None):
        raise click.UsageError("--trace replaces --concurrency and --rate: give one of them")
    if trace not in (None, "phases") and not Path(trace).is_file():
        raise click.BadParameter(f"{trace}: no such file (or phases)", param_hint="--trace")


def _bench_inputs(
    target: Path,
    draft: Path,
    eagle3: Path | None,
    drafter: str,
    dtype: str,
    device: str,
    prompts: Path,
    sampling: Sampling,
    truncate: bool,
) -> tuple[ModelPair, list[Request]]:
    """The pair ``drafter`` needs, and the prompts as engine requests (each checked against the context)."""
    from autotune.workload.runner import build_requests
    from engine.loader import load_pair
    from engine.workload import load_workload

    items = load_workload(prompts)
    if drafter == "eagle3" and eagle3 is None:
        raise click.UsageError("--drafter eagle3 needs --eagle3 HEAD_FOLDER")
    pair = load_pair(
        target,
        draft if drafter in ("model", "hybrid") else None,
        dtype=dtype,
        device=device,
        eagle3=eagle3 if drafter == "eagle3" else None,
    )
    if pair.tokenizer is None:
        raise click.BadParameter(f"{target}: no tokenizer.json", param_hint="--target")
    context = pair.target.config.max_position_embeddings
    return pair, build_requests(
        items, pair.tokenizer, sampling, context, where=str(prompts), truncate=truncate, chat_folder=target
    )


def _arrivals(
    trace: str | None,
    requests: list[Request],
    pair: ModelPair,
    sampling: Sampling,
    batch_size: int,
    seed: int,
    truncate: bool,
) -> Arrivals | None:
    """The arrivals ``--trace`` asks for: the phases trace over ``requests``, or the file's; None without it."""
    from autotune.workload.trace import phase_trace, read_trace

    if trace == "phases":
        return tuple(phase_trace(requests, batch_size, seed))
    if trace is None:
        return None
    assert pair.tokenizer is not None  # _bench_inputs refuses a target without one
    context = pair.target.config.max_position_embeddings
    return tuple(read_trace(trace, pair.tokenizer, sampling, context, truncate))
