"""The ``autotune`` command line: one command per verb.

Every user mistake (a bad flag value, a missing model folder, a malformed workload line, an
invalid tune.yaml key) ends with ``error: <one line naming it>`` on stderr and exit code 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from autotune.errors import USER_ERRORS
from autotune.table import table
from engine.demo import DEMO_DRAFT, DEMO_PROMPTS, DEMO_TARGET


class _Group(click.Group):
    """Turns user errors raised anywhere below into one line and exit code 2."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except USER_ERRORS as exc:
            click.echo(f"error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", err=True)
            sys.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="spec-autotune")
def main() -> None:
    """spec-autotune: measure speculative decoding on this host, tune it, export serving configs.

    \b
    Start here:
      autotune bench            speculative vs autoregressive on the bundled demo pair
      autotune tune             the main job: profile, Optuna study, store, export
    """


def _print_json(obj: object) -> None:
    click.echo(json.dumps(obj, indent=2, default=str))


BENCH_ROWS = [
    ("tokens_per_second", "tokens/s"), ("requests_per_second", "requests/s"), ("speedup", "speedup (x)"),
    ("acceptance_rate", "acceptance rate"), ("mean_acceptance_length", "mean acceptance length"),
    ("per_position_acceptance", "per-position acceptance"), ("rollback_frequency", "rollback frequency"),
    ("verification_efficiency", "verification efficiency"), ("draft_cost_ratio", "draft cost ratio"),
    ("batch_utilization", "batch utilization"), ("mean_batch_size", "mean batch size"),
    ("ttft_ms_p50", "ttft ms p50"), ("ttft_ms_p95", "ttft ms p95"), ("tpot_ms_p50", "tpot ms p50"),
    ("tpot_ms_p95", "tpot ms p95"), ("e2e_ms_p50", "e2e ms p50"), ("e2e_ms_p95", "e2e ms p95"),
]


@main.command()
@click.option("--target", type=click.Path(path_type=Path), default=DEMO_TARGET, show_default="demo target",
              help="Target model folder (config.json + *.safetensors + tokenizer.json).")
@click.option("--draft", type=click.Path(path_type=Path), default=DEMO_DRAFT, show_default="demo draft",
              help="Draft model folder (for --drafter model).")
@click.option("--drafter", type=click.Choice(["model", "ngram", "none"]), default="model", show_default=True)
@click.option("--gamma", type=click.IntRange(min=0), default=4, show_default=True,
              help="Draft tokens per step (0 = speculation off).")
@click.option("--confidence-threshold", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="A row stops drafting when the draft's top probability falls below this.")
@click.option("--gamma-schedule", type=click.Choice(["constant", "heuristic"]), default="constant", show_default=True)
@click.option("--batch-size", "--max-batch-size", "batch_size", type=click.IntRange(min=1), default=1,
              show_default=True, help="Rows the engine runs at once (continuous batching slots).")
@click.option("--concurrency", type=click.IntRange(min=1), default=None,
              help="Closed loop: requests in flight (default: the batch size).")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Open loop: Poisson arrivals per second (instead of --concurrency).")
@click.option("--num-requests", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0), default=0.0, show_default=True)
@click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True)
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--prompts", type=click.Path(path_type=Path), default=DEMO_PROMPTS, show_default="demo prompts",
              help="JSONL workload: {\"prompt\": ..., \"max_new_tokens\": ...} per line.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--device", default="auto", show_default=True, help="auto, cpu or cuda[:N].")
@click.option("--dtype", default="float32", show_default=True, help="float32, bfloat16 or float16.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def bench(target, draft, drafter, gamma, confidence_threshold, gamma_schedule, batch_size, concurrency, rate,
          num_requests, temperature, top_k, top_p, max_new_tokens, prompts, seed, device, dtype, as_json):
    """Speculative vs autoregressive decoding on the same engine, prompts and load."""
    from autotune.runner import LoadSpec, Sampling, build_requests, compare
    from engine.loader import load_pair
    from engine.speculative import SpecConfig
    from engine.workload import load_workload

    spec = SpecConfig(gamma=gamma, confidence_threshold=confidence_threshold, gamma_schedule=gamma_schedule)
    items = load_workload(prompts)
    pair = load_pair(target, draft if drafter == "model" else None, dtype=dtype, device=device)
    if pair.tokenizer is None:
        raise click.BadParameter(f"{target}: no tokenizer.json", param_hint="--target")
    sampling = Sampling(max_new_tokens, temperature, top_k, top_p)
    requests = build_requests(items, pair.tokenizer, sampling, pair.target.config.max_position_embeddings,
                              where=str(prompts))
    load = LoadSpec(max_batch_size=batch_size, concurrency=None if rate else (concurrency or batch_size),
                    rate=rate, num_requests=num_requests)
    result = compare(pair, requests, spec, drafter, load, seed)
    result.update({"gamma": gamma, "drafter": drafter, "confidence_threshold": confidence_threshold,
                   "batch_size": batch_size, "device": str(pair.target.lm_head.weight.device), "dtype": dtype})
    if as_json:
        _print_json(result)
        return
    rows = [(label, result.get(key), result.get(f"baseline_{key}")) for key, label in BENCH_ROWS]
    click.echo(f"drafter={drafter} gamma={gamma} threshold={confidence_threshold} batch={batch_size} "
               f"requests={num_requests} device={result['device']}")
    click.echo(table(["metric", "speculative", "autoregressive"], rows))
    if "greedy_match" in result:
        click.echo(f"greedy_match: {str(result['greedy_match']).lower()}")
