"""The workload over HTTP: streaming completions against an OpenAI-compatible server.

The same requests the engine runs (``max_new_tokens``, temperature / top-k / top-p, seeded) are
sent to ``/v1/completions`` as token ids, or, for a request from a chat line
(:class:`autotune.workload.runner.ChatRequest`), to ``/v1/chat/completions`` as its turns (the
stack applies its own chat template). They go as a closed loop (``concurrency`` requests in
flight; a new one is sent as soon as one finishes), an open loop (Poisson arrivals at ``rate``
req/s, the same seeded arrival times as :class:`engine.scheduler.LoadGenerator`) or a replay of
explicit ``arrivals`` (a trace, :mod:`autotune.workload.trace`: each request sent at its offset).
Latencies are measured on the client:

- arrival: when the request is sent (closed loop) or its scheduled arrival (open loop, replay);
- first token: the first streamed chunk that carries text (a chat chunk: its ``delta``'s content)
  or token ids;
- finish: the ``[DONE]`` event; the token count comes from the server's ``usage``.

Each request becomes an :class:`engine.scheduler.RequestRecord`, and
:func:`engine.scheduler.load_metrics` turns them into the same TTFT/TPOT/e2e percentiles and
tokens/s the engine reports: one definition per metric, whichever backend measured it.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

from autotune.workload.runner import ChatRequest
from engine.scheduler import RequestRecord, RunResult, load_metrics, poisson_arrivals
from engine.speculative import Request


class LoadError(RuntimeError):
    """A request failed (HTTP error, malformed stream, time-out); the message says which and why."""


def parse_sse(lines: Iterable[bytes]) -> Iterator[dict]:
    """JSON payloads of a server-sent-event stream's ``data:`` lines, up to ``data: [DONE]``.

    Example:
        >>> list(parse_sse([b'data: {"a": 1}\\n', b'\\n', b': keep-alive\\n', b'data: [DONE]\\n']))
        [{'a': 1}]
    """
    for raw in lines:
        line = raw.decode("utf-8", errors="replace").strip()
        if not line.startswith("data:"):
            continue
        payload = line[len("data:") :].strip()
        if payload == "[DONE]":
            return
        try:
            event = json.loads(payload)
        except json.JSONDecodeError as exc:
            raise LoadError(f"malformed stream event {payload[:200]!r} ({exc})") from None
        if isinstance(event, dict) and "error" in event:
            raise LoadError(f"server error in stream: {json.dumps(event['error'])[:500]}")
        yield event


@dataclass(frozen=True)
class Endpoint:
    """Where to send requests: base URL and the model name the server serves."""

    base_url: str
    model: str
    request_timeout_s: float = 300.0
    extra_body: tuple[tuple[str, object], ...] = ()  # stack-specific request fields, e.g. return_token_ids


def completion_body(endpoint: Endpoint, req: Request, seed: int) -> dict:
    """The JSON body of one streaming completion for an engine :class:`Request`: its token ids as
    the ``prompt``, or a chat request's turns as ``messages``."""
    prompt: dict[str, object] = (
        {"messages": [m.as_dict() for m in req.messages]}
        if isinstance(req, ChatRequest)
        else {"prompt": list(req.prompt_ids)}
    )
    body = {
        "model": endpoint.model,
        **prompt,
        "max_tokens": req.max_new_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if req.top_k > 0:
        body["top_k"] = req.top_k
    body.update(endpoint.extra_body)
    return body


def completion_path(req: Request) -> str:
    """The endpoint a request goes to: chat completions for a chat request, completions otherwise."""
    return "/v1/chat/completions" if isinstance(req, ChatRequest) else "/v1/completions"


def _has_output(choice: dict) -> bool:
    """A streamed choice carries generated output: text (a chat chunk's in its ``delta``) or token ids."""
    delta = choice.get("delta") or {}
    return bool(
        choice.get("text")
        or delta.get("content")
        or delta.get("reasoning_content")
        or choice.get("token_ids")
    )


def stream_completion(
    endpoint: Endpoint,
    req: Request,
    seed: int,
    arrival_s: float,
    clock: Callable[[], float] = time.perf_counter,
) -> RequestRecord:
    """Send one streaming completion; its record with client-side times."""
    url = urlsplit(endpoint.base_url)
    if url.hostname is None:
        raise LoadError(f"base URL {endpoint.base_url!r} names no host (want http://HOST:PORT)")
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=endpoint.request_timeout_s)
    try:
        conn.request(
            "POST",
            completion_path(req),
            json.dumps(completion_body(endpoint, req, seed)),
            {"Content-Type": "application/json", "Accept": "text/event-stream"},
        )
        resp = conn.getresponse()
        if resp.status != 200:
            raise LoadError(
                f"request {req.id}: HTTP {resp.status}: {resp.read()[:500].decode(errors='replace')}"
            )
        first = None
        usage = None
        reason = "length"
        token_ids: list[int] = []
        for event in parse_sse(resp):
            for choice in event.get("choices") or []:
                if first is None and _has_output(choice):
                    first = clock()
                token_ids.extend(choice.get("token_ids") or [])
                reason = choice.get("finish_reason") or reason
            usage = event.get("usage") or usage
        finish = clock()
    except (OSError, http.client.HTTPException) as exc:
        raise LoadError(f"request {req.id}: {type(exc).__name__}: {exc}") from None
    finally:
        conn.close()
    if usage is None or "completion_tokens" not in usage:
        raise LoadError(f"request {req.id}: the stream carried no usage (completion_tokens)")
    n = int(usage["completion_tokens"])
    tokens = token_ids if len(token_ids) == n else [-1] * n  # ids when the server streams them
    return RequestRecord(
        req.id,
        arrival_s,
        first if first is not None else finish,
        finish,
        int(usage.get("prompt_tokens", len(req.prompt_ids))),
        tokens,
        "eos" if reason == "stop" else "length",
    )


def run_http_load(
    endpoint: Endpoint,
    requests: list[Request],
    num_requests: int,
    *,
    concurrency: int | None = None,
    rate: float | None = None,
    seed: int = 0,
    time_limit_s: float | None = None,
    send: Callable[[Endpoint, Request, int, float], RequestRecord] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    arrivals: Sequence[tuple[float, Request]] | None = None,
) -> RunResult:
    """Drive the server with ``num_requests`` requests (cycled from ``requests``); records + metrics.

    Exactly one of ``concurrency`` (closed loop), ``rate`` (open loop) and ``arrivals`` (replay:
    ``(offset_s, Request)`` pairs sorted by offset, the first ``num_requests`` of them sent, each at
    its offset; ``requests`` is not used). The first failing request stops the run and raises
    LoadError; ``time_limit_s`` bounds the whole run (TimeoutError). ``send`` replaces the HTTP
    call (tests).

    Long because: the load driver's request, stream and timing state live in one scope, as the engine's run_load does.
    """
    if (concurrency is not None) + (rate is not None) + (arrivals is not None) != 1:
        raise ValueError("give exactly one of concurrency, rate and arrivals")
    send = send or (lambda ep, r, s, a: stream_completion(ep, r, s, a, clock))
    offsets: list[float] | None
    if arrivals is not None:
        num_requests = min(num_requests, len(arrivals))
        bases = [r for _, r in arrivals[:num_requests]]
        offsets = [float(t) for t, _ in arrivals[:num_requests]]
        if offsets != sorted(offsets) or any(t < 0 for t in offsets):
            raise ValueError("arrivals: offsets must be >= 0 and sorted")
    else:
        bases = [requests[k % len(requests)] for k in range(num_requests)]
        offsets = poisson_arrivals(rate, num_requests, seed) if rate is not None else None
    jobs = [replace(r, id=k) for k, r in enumerate(bases)]  # a chat request keeps its turns
    records: list[RequestRecord] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    next_job = [0]
    t0 = clock()

    def one(k: int, arrival: float) -> None:
        try:
            record = send(endpoint, jobs[k], seed * 1_000_003 + k, arrival)
        except BaseException as exc:  # noqa: BLE001  (reported by the caller)
            with lock:
                errors.append(exc)
            return
        with lock:
            records.append(record)

    def closed_worker() -> None:
        while True:
            with lock:
                if errors or next_job[0] >= num_requests:
                    return
                k = next_job[0]
                next_job[0] += 1
            one(k, clock())

    if concurrency is not None:
        threads = [
            threading.Thread(target=closed_worker, daemon=True) for _ in range(min(concurrency, num_requests))
        ]
        for th in threads:
            th.start()
    else:
        assert offsets is not None  # rate or arrivals is given when concurrency is not (checked above)
        threads = []
        for k, offset in enumerate(offsets):
            delay = t0 + offset - clock()
            if delay > 0:
                time.sleep(delay)
            if errors:
                break
            th = threading.Thread(target=one, args=(k, t0 + offset), daemon=True)
            th.start()
            threads.append(th)
    for th in threads:
        left = None if time_limit_s is None else max(time_limit_s - (clock() - t0), 0.0)
        th.join(left)
        if th.is_alive():
            raise TimeoutError(f"load did not finish within {time_limit_s:g} s")
    if errors:
        raise errors[0] if isinstance(errors[0], LoadError) else LoadError(str(errors[0]))
    wall = clock() - t0
    records.sort(key=lambda r: r.id)
    metrics = load_metrics(records, wall)
    metrics["mean_batch_size"] = sum(r.finish_s - r.arrival_s for r in records) / wall if wall > 0 else None
    return RunResult(records, metrics)
