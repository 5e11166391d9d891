"""Batch generation on the engine: the small public entry point for library users.

``generate`` pushes a list of requests through a :class:`~engine.speculative.SpecEngine`
with at most ``max_batch_size`` rows running: a closed loop on the continuous-batching
scheduler, admitting the next request whenever a row finishes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from engine.drafters import Drafter, HybridDrafter, ModelDrafter, NgramDrafter, NoDrafter
from engine.eagle3_drafter import Eagle3Drafter
from engine.errors import EngineInputError
from engine.loader import ModelPair
from engine.scheduler import LoadGenerator, Scheduler
from engine.speculative import Request, SpecConfig, SpecEngine
from engine.workload import fit_prompt_to_context

DRAFTERS = ("model", "ngram", "hybrid", "eagle3", "none")


def make_drafter(kind: str, pair: ModelPair, ngram_min: int = 2, ngram_max: int = 4) -> Drafter:
    """Build the drafter named ``kind`` ("model", "ngram", "hybrid", "eagle3" or "none") for ``pair``.

    ``hybrid`` uses the n-gram proposal when the prompt-lookup match is at least ``ngram_min``
    tokens long, else the draft model (engine.drafters.HybridDrafter). ``eagle3`` drafts with
    the pair's EAGLE-3 head (``load_pair(eagle3=folder)``, engine.eagle3)."""
    if kind == "eagle3":
        if pair.eagle3 is None:
            raise EngineInputError("drafter 'eagle3' needs an EAGLE-3 head folder")
        return Eagle3Drafter(pair.eagle3)
    if kind in ("model", "hybrid"):
        if pair.draft is None:
            raise EngineInputError(f"drafter {kind!r} needs a draft model folder")
        return (
            ModelDrafter(pair.draft) if kind == "model" else HybridDrafter(pair.draft, ngram_min, ngram_max)
        )
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
    metrics: dict[str, Any]
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
    truncate_prompts: bool = False,
) -> GenerateResult:
    """Generate for ``requests`` (token ids) with speculative decoding on ``pair``.

    A request whose prompt plus ``max_new_tokens`` runs past the target's context
    (``max_position_embeddings``) is refused (:class:`EngineInputError` naming it), or, with
    ``truncate_prompts``, keeps the last tokens of its prompt that fit.

    Example:
        >>> pair = load_pair("engine/demo/pair/target", "engine/demo/pair/draft")  # doctest: +SKIP
        >>> requests = [Request([1, 2, 3], max_new_tokens=16)]
        >>> out = generate(pair, requests, SpecConfig(gamma=4))  # doctest: +SKIP
        >>> out.tokens[0], out.metrics["acceptance_rate"]  # doctest: +SKIP
    """
    if not requests:
        return GenerateResult([], [], {}, 0.0)
    if truncate_prompts:
        context = pair.target.config.max_position_embeddings
        fitted = [
            fit_prompt_to_context(r.prompt_ids, context - r.max_new_tokens, f"request {r.id}", True)
            for r in requests
        ]
        requests = [
            Request(ids, r.max_new_tokens, r.temperature, r.top_k, r.top_p, r.id)
            for ids, r in zip(fitted, requests, strict=True)
        ]
    drafter_obj = make_drafter(drafter, pair) if isinstance(drafter, str) else drafter
    device = pair.target.lm_head.weight.device
    generator = torch.Generator(device=device).manual_seed(seed)
    slots = min(max_batch_size or len(requests), len(requests))
    max_seq_len = max(len(r.prompt_ids) + r.max_new_tokens for r in requests) + config.lookahead + 3
    eos = pair.target.config.eos_token_ids if eos_ids is None else eos_ids
    engine = SpecEngine(pair.target, drafter_obj, config, slots, max_seq_len, eos, generator)
    load = LoadGenerator(list(requests), len(requests), concurrency=slots)
    run = Scheduler(engine).run(load)
    return GenerateResult(
        [r.output_tokens for r in run.records],
        [r.reason for r in run.records],
        run.metrics,
        run.metrics["wall_s"],
        run.metrics["steps"],
        engine,
    )
