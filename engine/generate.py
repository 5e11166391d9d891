"""Batch generation on the engine: the small public entry point for library users.

``generate`` pushes a list of requests through a :class:`~engine.speculative.SpecEngine`
with at most ``max_batch_size`` rows running, admitting the next request whenever a row
finishes (continuous batching without timing; the timed scheduler is engine.scheduler).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from engine.drafters import Drafter, ModelDrafter, NgramDrafter, NoDrafter
from engine.errors import EngineInputError
from engine.loader import ModelPair
from engine.speculative import Request, SpecConfig, SpecEngine

DRAFTERS = ("model", "ngram", "none")


def make_drafter(kind: str, pair: ModelPair, ngram_min: int = 2, ngram_max: int = 4) -> Drafter:
    """Build the drafter named ``kind`` ("model", "ngram" or "none") for ``pair``."""
    if kind == "model":
        if pair.draft is None:
            raise EngineInputError("drafter 'model' needs a draft model folder")
        return ModelDrafter(pair.draft)
    if kind == "ngram":
        return NgramDrafter(ngram_min, ngram_max)
    if kind == "none":
        return NoDrafter()
    raise EngineInputError(f"drafter: unknown value {kind!r} (choose from {', '.join(DRAFTERS)})")


@dataclass
class GenerateResult:
    """Generated token ids per request (in request order), the run's metrics and wall time."""

    tokens: list[list[int]]
    reasons: list[str]
    metrics: dict
    wall_s: float
    steps: int = 0
    engine: SpecEngine | None = field(default=None, repr=False)


def generate(
    pair: ModelPair,
    requests: list[Request],
    config: SpecConfig = SpecConfig(),
    drafter: str | Drafter = "model",
    max_batch_size: int | None = None,
    seed: int = 0,
    eos_ids: tuple[int, ...] | None = None,
) -> GenerateResult:
    """Generate for ``requests`` (token ids) with speculative decoding on ``pair``.

    Example:
        >>> pair = load_pair("engine/demo/pair/target", "engine/demo/pair/draft")  # doctest: +SKIP
        >>> out = generate(pair, [Request([1, 2, 3], max_new_tokens=16)], SpecConfig(gamma=4))  # doctest: +SKIP
        >>> out.tokens[0], out.metrics["acceptance_rate"]  # doctest: +SKIP
    """
    if not requests:
        return GenerateResult([], [], {}, 0.0)
    drafter_obj = make_drafter(drafter, pair) if isinstance(drafter, str) else drafter
    device = pair.target.lm_head.weight.device
    generator = torch.Generator(device=device).manual_seed(seed)
    slots = min(max_batch_size or len(requests), len(requests))
    cap = config.max_gamma if config.gamma_schedule == "heuristic" else config.gamma
    max_seq_len = max(len(r.prompt_ids) + r.max_new_tokens for r in requests) + cap + 3
    eos = pair.target.config.eos_token_ids if eos_ids is None else eos_ids
    engine = SpecEngine(pair.target, drafter_obj, config, slots, max_seq_len, eos, generator)
    order = {r.id: i for i, r in enumerate(requests)}
    if len(order) != len(requests):
        requests = [Request(r.prompt_ids, r.max_new_tokens, r.temperature, r.top_k, r.top_p, i)
                    for i, r in enumerate(requests)]
        order = {i: i for i in range(len(requests))}
    tokens: list[list[int]] = [[] for _ in requests]
    reasons = [""] * len(requests)
    waiting = list(requests)
    steps = 0
    t0 = time.perf_counter()
    with torch.inference_mode():
        while waiting or engine.n:
            admit = waiting[: engine.free_slots()]
            waiting = waiting[len(admit):]
            engine.add(admit)
            for fin in engine.retire():
                tokens[order[fin.id]], reasons[order[fin.id]] = fin.tokens, fin.reason
            if engine.n:
                engine.step()
                steps += 1
                for fin in engine.retire():
                    tokens[order[fin.id]], reasons[order[fin.id]] = fin.tokens, fin.reason
    wall = time.perf_counter() - t0
    metrics = engine.stats.summary()
    generated = sum(len(t) for t in tokens)
    metrics["generated_tokens"] = generated
    metrics["tokens_per_second"] = generated / wall if wall > 0 else None
    return GenerateResult(tokens, reasons, metrics, wall, steps, engine)
