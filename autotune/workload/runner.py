"""Run the engine on a workload under load: the one measurement every command shares.

``autotune bench``, the profiler's acceptance pass and every Optuna trial call
:func:`run_load` (one configuration) or :func:`compare` (a configuration against the
autoregressive baseline under the same arrivals and prompts).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from tokenizers import Tokenizer

from autotune.records import StepSample
from engine.chat import ChatTemplate, ChatTurn, read_chat_template
from engine.errors import EngineInputError
from engine.generate import make_drafter
from engine.loader import ModelPair
from engine.metrics import draft_cost_ratio, speedup, verification_efficiency
from engine.scheduler import LoadGenerator, RunResult, Scheduler
from engine.speculative import Request, SpecConfig, SpecEngine
from engine.workload import WorkloadItem, fit_prompt_to_context

CONTEXT_MARGIN = 20
"""Tokens a sequence keeps free past prompt + max_new_tokens (the speculative lookahead's room)."""


@dataclass(frozen=True)
class LoadSpec:
    """How requests arrive: closed loop (``concurrency``), open loop (``rate`` req/s) or a replay of
    ``arrivals`` (a trace, :mod:`autotune.workload.trace`: ``(offset_s, Request)`` sorted by offset, each
    request at its offset; ``num_requests`` and the run's ``requests`` are then not used)."""

    max_batch_size: int = 1
    concurrency: int | None = None  # defaults to max_batch_size when rate and arrivals are None
    rate: float | None = None
    num_requests: int = 8
    arrivals: tuple[tuple[float, Request], ...] | None = field(default=None, repr=False)
    duration_s: float | None = None
    max_prefill_tokens: int | None = None  # cap on one admission's prefill (requests x longest prompt)


@dataclass(frozen=True)
class Sampling:
    """Defaults for workload lines that do not set their own."""

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0


@dataclass
class ChatRequest(Request):
    """A request from a ``messages`` line: the engine runs the ids of the conversation rendered
    with the target's chat template; a serving stack is sent the turns and applies its own."""

    messages: tuple[ChatTurn, ...] = ()


def chat_template_for(items: list[WorkloadItem], folder: Path | None, where: str) -> ChatTemplate | None:
    """The target's chat template when a line holds ``messages`` (None for a plain workload); a
    chat line with no template to render it is refused, naming the line and the folder."""
    chat = next((item for item in items if item.messages), None)
    if chat is None:
        return None
    template = read_chat_template(folder) if folder is not None else None
    if template is None:
        whose = f"{folder} has none" if folder is not None else "no target folder was given"
        raise EngineInputError(
            f"{where}:{chat.line}: messages are rendered with the target's chat template, and {whose} "
            "(tokenizer_config.json chat_template or chat_template.jinja)"
        )
    return template


def _prompt_ids(
    item: WorkloadItem, tokenizer: Tokenizer, template: ChatTemplate | None, at: str
) -> list[int]:
    """The line's prompt tokens: its text encoded, or its conversation rendered with ``template``."""
    if not item.messages:
        return tokenizer.encode(item.prompt).ids
    assert template is not None  # chat_template_for refuses a chat line without one
    try:
        return template.encode(tokenizer, item.messages)
    except EngineInputError as exc:
        raise EngineInputError(f"{at}: {exc}") from None


def build_requests(
    items: list[WorkloadItem],
    tokenizer: Tokenizer,
    sampling: Sampling,
    context: int,
    where: str = "workload",
    truncate: bool = False,
    chat_folder: Path | None = None,
) -> list[Request]:
    """Tokenize workload items into engine requests, checking each against the context.

    A ``messages`` line is rendered with the chat template of ``chat_folder`` (the target's) and
    becomes a :class:`ChatRequest`.
    """
    template = chat_template_for(items, chat_folder, where)
    out: list[Request] = []
    for i, item in enumerate(items):
        max_new = item.max_new_tokens or sampling.max_new_tokens
        at = f"{where}:{item.line or i + 1}"
        ids = _prompt_ids(item, tokenizer, template, at)
        ids = fit_prompt_to_context(ids, context - max_new - CONTEXT_MARGIN, at, truncate)
        args = (
            ids,
            max_new,
            sampling.temperature if item.temperature is None else item.temperature,
            sampling.top_k if item.top_k is None else item.top_k,
            sampling.top_p if item.top_p is None else item.top_p,
        )
        out.append(
            ChatRequest(*args, id=i, messages=item.messages) if item.messages else Request(*args, id=i)
        )
    return out


def run_load(
    pair: ModelPair,
    requests: list[Request],
    spec: SpecConfig,
    drafter: str,
    load: LoadSpec,
    seed: int = 0,
    warmup: bool = True,
    trace: bool = False,
    time_limit_s: float | None = None,
    ngram: tuple[int, int] = (2, 4),
) -> RunResult:
    """One engine run of ``requests`` under ``load`` with speculation settings ``spec``.

    ``spec.tree_topk`` drafts a token tree (the ``model`` and ``eagle3`` drafters; engine.tree). ``ngram`` is the
    prompt-lookup window (min, max) of the ``ngram`` and ``hybrid`` drafters (tune.yaml
    search.ngram_min/ngram_max).

    ``trace=True`` also returns per-row step samples (``RunResult.trace``: tokens accepted and
    draft confidence per position, as :class:`~autotune.records.StepSample`).

    Long because: the engine's load loop: admission, steps and per-request timing share one scope.
    """
    if spec.gamma == 0:
        drafter = "none"
    if load.arrivals is not None:  # a replay: the trace's own requests, each at its offset
        requests = [r for _, r in load.arrivals]
    device = pair.target.lm_head.weight.device
    max_seq_len = max(len(r.prompt_ids) + r.max_new_tokens for r in requests) + spec.lookahead + 3
    eos = pair.target.config.eos_token_ids
    concurrency = (
        load.concurrency
        if load.concurrency is not None or load.rate is not None or load.arrivals is not None
        else load.max_batch_size
    )

    def once(
        reqs: list[Request],
        n: int,
        conc: int | None,
        rate: float | None,
        record: bool = False,
        arrivals: tuple[tuple[float, Request], ...] | None = None,
    ) -> RunResult:
        generator = torch.Generator(device=device).manual_seed(seed)
        engine = SpecEngine(
            pair.target,
            make_drafter(drafter, pair, *ngram),
            spec,
            load.max_batch_size,
            max_seq_len,
            eos,
            generator,
        )
        if record:
            engine.enable_trace()
        gen = LoadGenerator(
            reqs, n, concurrency=conc, rate=rate, duration_s=load.duration_s, seed=seed, arrivals=arrivals
        )
        result = Scheduler(engine, max_prefill_tokens=load.max_prefill_tokens).run(
            gen, time_limit_s=time_limit_s
        )
        if engine.trace is not None:  # record: enable_trace() above
            result.trace = [
                StepSample(int(n_acc), tuple(conf))
                for accepted, confidence in engine.trace
                for n_acc, conf in zip(accepted.tolist(), confidence.tolist(), strict=True)
            ]
        return result

    if warmup:  # first-touch allocations and lazy init out of the measured run
        short = [replace(r, max_new_tokens=min(r.max_new_tokens, 8)) for r in requests[: load.max_batch_size]]
        once(short, len(short), load.max_batch_size, None)
    if load.arrivals is not None:
        return once(requests, len(load.arrivals), None, None, trace, load.arrivals)
    return once(requests, load.num_requests, concurrency, load.rate, trace)


def compare(
    pair: ModelPair,
    requests: list[Request],
    spec: SpecConfig,
    drafter: str,
    load: LoadSpec,
    seed: int = 0,
) -> dict:
    """Speculative run and autoregressive baseline under the same load; flat metrics dict.

    Keys are the run's metrics, the baseline's with a ``baseline_`` prefix, ``speedup``
    (baseline wall time / speculative wall time for the same requests) and, when every
    request is greedy, ``greedy_match`` (identical outputs).
    """
    spec_run = run_load(pair, requests, spec, drafter, load, seed)
    base_run = run_load(pair, requests, SpecConfig(gamma=0), "none", load, seed)
    out = dict(spec_run.metrics)
    out.update({f"baseline_{k}": v for k, v in base_run.metrics.items() if not isinstance(v, list)})
    out["speedup"] = speedup(base_run.metrics["wall_s"], spec_run.metrics["wall_s"])
    t_decode = base_run.metrics.get("verify_step_ms")
    if t_decode and out.get("draft_forward_ms"):
        out["draft_cost_ratio"] = draft_cost_ratio(out["draft_forward_ms"], t_decode)
    if t_decode and out.get("verify_step_ms"):
        out["verification_efficiency"] = verification_efficiency(
            out["verify_step_ms"], out["verify_tokens_per_row"], t_decode
        )
    if all(r.temperature <= 0 for r in requests):
        out["greedy_match"] = [r.output_tokens for r in spec_run.records] == [
            r.output_tokens for r in base_run.records
        ]
    return out
