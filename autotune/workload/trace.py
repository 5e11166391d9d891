"""Arrival traces: real traffic for a re-measured run, replayed once after the workload's load levels.

A trace is a list of arrivals ``(offset_s, Request)`` sorted by offset: each request is released
(the engine, :class:`engine.scheduler.LoadGenerator`) or sent (a serving stack,
:func:`autotune.backends.openai_load.run_http_load`) that many seconds after the run starts,
whatever is still running. tune.yaml's ``workload.trace`` names one:

- a JSONL file (:func:`read_trace`), one arrival per line, the shape a request log is cut to::

      {"arrival_s": 0.0, "prompt": "def parse(", "max_new_tokens": 64}
      {"arrival_s": 0.35, "prompt_tokens": [412, 17, 9], "max_new_tokens": 32, "temperature": 0.7}

  ``arrival_s`` (a number >= 0: seconds from the trace's start; lines need not be sorted) and
  exactly one of ``prompt`` (non-empty text, tokenized with the pair's tokenizer and fit to the
  context like the workload prompts, ``workload.truncate_prompts`` included) and ``prompt_tokens``
  (a non-empty list of token ids of the pair's tokenizer) are required; ``max_new_tokens``
  (integer >= 1), ``temperature`` (>= 0), ``top_k`` (integer >= 0) and ``top_p`` (in (0, 1]) default
  to the workload's; ``source`` is informational. Any other key is an error (a typo must not be
  ignored), and every problem is a :class:`~autotune.errors.ConfigError` naming ``file:line`` and
  the key;
- ``phases`` (:func:`phase_trace`): a built-in, seeded trace of the workload prompts in three
  phases, low load, a burst, low load again, sized from the largest load level.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from autotune.config import PHASES, TuneConfig
from autotune.errors import ConfigError
from autotune.workload.runner import CONTEXT_MARGIN, Sampling
from engine.errors import EngineInputError
from engine.scheduler import poisson_arrivals
from engine.speculative import Request
from engine.workload import fit_prompt_to_context

Arrival = tuple[float, Request]
"""One arrival of a trace: its offset from the trace's start (s) and its request."""

TRACE_KEYS = ("arrival_s", "prompt", "prompt_tokens", "max_new_tokens", "temperature", "top_k", "top_p")

# The built-in ``phases`` trace (phase_trace's defaults): the low-load rate keeps one or two of the
# demo pair's requests in flight on a small CPU, and the burst, twice the largest concurrency, fills
# every row and drains before the low load returns (docs/decisions.md#phases-trace).
PHASE_LOW_REQUESTS = 6  # requests in each low-load phase
PHASE_LOW_RATE = 2.0  # Poisson arrivals per second in the low-load phases
PHASE_BURST_FACTOR = 2  # burst size = this x the largest load level's concurrency


def _number(where: str, key: str, value: Any, integer: bool, lo: float, hi: float | None = None) -> Any:
    """A line's number ``value`` of ``key``, >= ``lo`` (or in (``lo``, ``hi``] with ``hi``)."""
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise ConfigError(f"{where}: {key}: must be {kind} (got {value!r})")
    if value < lo if hi is None else not lo < value <= hi:
        bound = f">= {lo}" if hi is None else f"in ({lo}, {hi}]"
        raise ConfigError(f"{where}: {key}: must be {bound} (got {value!r})")
    return value if integer else float(value)


def _line(
    obj: Any,
    where: str,
    tokenizer: Tokenizer,
    sampling: Sampling,
    context: int,
    truncate: bool,
) -> Arrival:
    """One trace line's arrival (``where`` is ``file:line`` for the errors)."""
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: expected a JSON object (got {type(obj).__name__})")
    unknown = sorted(set(obj) - set(TRACE_KEYS) - {"source"})
    if unknown:
        raise ConfigError(f"{where}: {unknown[0]}: unknown key (keys: {', '.join(TRACE_KEYS)}, source)")
    if "arrival_s" not in obj:
        raise ConfigError(f"{where}: arrival_s: required (seconds from the trace's start)")
    arrival = _number(where, "arrival_s", obj["arrival_s"], False, 0.0)
    get = obj.get
    max_new = sampling.max_new_tokens
    if get("max_new_tokens") is not None:
        max_new = _number(where, "max_new_tokens", obj["max_new_tokens"], True, 1)
    temperature = sampling.temperature
    if get("temperature") is not None:
        temperature = _number(where, "temperature", obj["temperature"], False, 0.0)
    top_k = sampling.top_k if get("top_k") is None else _number(where, "top_k", obj["top_k"], True, 0)
    top_p = sampling.top_p if get("top_p") is None else _number(where, "top_p", obj["top_p"], False, 0.0, 1.0)
    has_text, has_ids = "prompt" in obj, "prompt_tokens" in obj
    if has_text == has_ids:
        why = "give one of them, not both" if has_text else "one of them is required"
        raise ConfigError(f"{where}: prompt, prompt_tokens: {why}")
    if has_text:
        key, text = "prompt", obj["prompt"]
        if not isinstance(text, str) or not text:
            raise ConfigError(f"{where}: prompt: must be a non-empty string (got {text!r})")
        ids = tokenizer.encode(text).ids
    else:
        key, ids = "prompt_tokens", obj["prompt_tokens"]
        vocab = tokenizer.get_vocab_size()
        if not isinstance(ids, list) or not ids:
            raise ConfigError(f"{where}: prompt_tokens: must be a non-empty list of token ids (got {ids!r})")
        bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise ConfigError(
                f"{where}: prompt_tokens: every id must be an integer in [0, {vocab}) "
                f"(the tokenizer's vocabulary) (got {bad[0]!r})"
            )
    try:
        ids = fit_prompt_to_context(
            list(ids), context - max_new - CONTEXT_MARGIN, f"{where}: {key}", truncate
        )
    except EngineInputError as exc:
        raise ConfigError(str(exc)) from None
    return arrival, Request(ids, max_new, temperature, top_k, top_p)


def read_trace(
    path: str | Path,
    tokenizer: Tokenizer,
    sampling: Sampling,
    context: int,
    truncate: bool = False,
) -> list[Arrival]:
    """A JSONL trace file's arrivals, sorted by offset (ties keep the file's order), ids 0, 1, ...

    ``sampling`` holds the workload's defaults; ``context`` is the target's context length; a prompt
    longer than it leaves room for is refused, or its last tokens kept with ``truncate``. Every
    problem is a one-line :class:`~autotune.errors.ConfigError` naming ``file:line`` and the key.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: trace file not found")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    arrivals: list[Arrival] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: malformed JSON ({exc.msg})") from None
        arrivals.append(_line(obj, where, tokenizer, sampling, context, truncate))
    if not arrivals:
        raise ConfigError(f"{path}: no arrivals (workload.trace wants one JSON object per line)")
    return _numbered(sorted(arrivals, key=lambda a: a[0]))


def phase_trace(
    requests: Sequence[Request],
    max_concurrency: int,
    seed: int = 0,
    low_requests: int = PHASE_LOW_REQUESTS,
    low_rate: float = PHASE_LOW_RATE,
    burst: int | None = None,
) -> list[Arrival]:
    """The built-in trace (``workload.trace: phases``): ``requests`` cycled in order through three phases.

    1. low load: ``low_requests`` seeded Poisson arrivals at ``low_rate`` per second;
    2. a burst: ``burst`` requests at one instant (default :data:`PHASE_BURST_FACTOR` x
       ``max_concurrency``, the largest load level's concurrency: more than any level keeps in
       flight, so the engine's rows fill and a queue forms), ``1 / low_rate`` s after the last one;
    3. low load again: ``low_requests`` Poisson arrivals at ``low_rate``, the first of them
       ``burst / low_rate`` s after the burst (the time its requests would take to arrive at the
       low rate), so the queue has drained by the time load is low again.

    Batch sizes go from 1-2 rows to every row and back, across the boundaries of a by-batch-size
    table. Same arguments, same trace.

    Example:
        >>> reqs = [Request([1, 2], 8), Request([3], 8)]
        >>> [round(t, 2) for t, _ in phase_trace(reqs, 2, low_requests=1, burst=3)]
        [0.93, 1.43, 1.43, 1.43, 2.93]
    """
    if not requests:
        raise ValueError("phase_trace: no requests to cycle")
    if max_concurrency < 1 or low_requests < 0 or low_rate <= 0:
        raise ValueError("phase_trace: max_concurrency >= 1, low_requests >= 0 and low_rate > 0")
    burst = PHASE_BURST_FACTOR * max_concurrency if burst is None else burst
    first = poisson_arrivals(low_rate, low_requests, seed)
    t_burst = (first[-1] if first else 0.0) + 1.0 / low_rate
    t_after = t_burst + burst / low_rate  # when the third phase's first request arrives
    gaps = [0.0, *poisson_arrivals(low_rate, low_requests - 1, seed + 1)] if low_requests else []
    offsets = first + [t_burst] * burst + [t_after + g for g in gaps]
    return _numbered([(t, requests[k % len(requests)]) for k, t in enumerate(offsets)])


def _numbered(arrivals: Sequence[Arrival]) -> list[Arrival]:
    """The arrivals with request ids 0, 1, ... in order (records are matched by id)."""
    return [(t, replace(r, prompt_ids=list(r.prompt_ids), id=k)) for k, (t, r) in enumerate(arrivals)]


def load_trace(
    cfg: TuneConfig, tokenizer: Tokenizer, context: int, requests: Sequence[Request]
) -> tuple[Arrival, ...] | None:
    """``workload.trace`` of ``cfg`` as arrivals (None when it is null): the file's, or the phases of
    ``requests`` (the workload's) seeded with ``budget.seed`` and sized from the largest batch size."""
    w = cfg.workload
    if w.trace is None:
        return None
    if w.trace == PHASES:
        return tuple(phase_trace(requests, max(cfg.batch_sizes), cfg.budget.seed))
    sampling = Sampling(w.max_new_tokens, w.temperature, w.top_k, w.top_p)
    return tuple(read_trace(w.trace, tokenizer, sampling, context, w.truncate_prompts))
