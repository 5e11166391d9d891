"""Continuous batching under load: a request queue in front of a SpecEngine, with timings.

The scheduler admits waiting requests into free rows at every step (prefilling them as one
batch), runs one speculative (or plain) step over every running row, retires rows that hit
EOS or their budget, and records per-request arrival / first-token / finish times.

Load comes from a :class:`LoadGenerator`:

- closed loop: ``concurrency`` requests in flight; a new one arrives as soon as one finishes;
- open loop: Poisson arrivals at ``rate`` requests/s (seeded), independent of completions;
- replay: explicit ``arrivals``, a list of ``(offset_s, Request)`` (a trace, :mod:`autotune.workload.trace`),
  each request released at its offset, independent of completions.

Each stops after ``num_requests`` requests or once ``duration_s`` has passed (arrivals stop;
requests in flight finish). Same seed -> same arrival times and prompt order.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.errors import EngineInputError
from engine.metrics import percentile
from engine.rows import Finished
from engine.speculative import Request, SpecEngine


def poisson_arrivals(rate: float, n: int, seed: int) -> list[float]:
    """Arrival offsets (s) of ``n`` seeded Poisson arrivals at ``rate`` per second.

    The one definition of open-loop arrivals: the engine's load generator and the HTTP load
    driver of the serving-stack backends both use it, so both see the same arrival times.

    Example:
        >>> poisson_arrivals(10.0, 3, seed=0) == poisson_arrivals(10.0, 3, seed=0)
        True
    """
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


@dataclass
class LoadGenerator:
    """Arrival process over a list of requests (cycled in order), or a replay of explicit arrivals.

    With ``arrivals`` (``(offset_s, Request)`` pairs sorted by offset) the k-th request released is
    the k-th arrival's, at its offset (``requests`` is not used; :meth:`replay` builds one); the
    first ``num_requests`` arrivals are served (all of them when it is larger).
    """

    requests: list[Request]
    num_requests: int
    concurrency: int | None = None  # closed loop
    rate: float | None = None  # open loop, requests per second
    duration_s: float | None = None
    seed: int = 0
    arrivals: Sequence[tuple[float, Request]] | None = None  # replay: explicit times and requests
    _issued: int = field(default=0, init=False)
    _times: list[float] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        modes = (self.concurrency is not None) + (self.rate is not None) + (self.arrivals is not None)
        if modes != 1:
            raise EngineInputError(
                "load: give exactly one of concurrency (closed loop), rate (open loop) or arrivals (replay)"
            )
        if self.concurrency is not None and self.concurrency < 1:
            raise EngineInputError(f"concurrency: must be >= 1 (got {self.concurrency})")
        if self.rate is not None:
            if self.rate <= 0:
                raise EngineInputError(f"rate: must be > 0 (got {self.rate})")
            self._times = poisson_arrivals(self.rate, self.num_requests, self.seed)
        if self.arrivals is not None:
            self._times = [float(t) for t, _ in self.arrivals]
            if any(t < 0 for t in self._times) or self._times != sorted(self._times):
                raise EngineInputError("arrivals: offsets must be >= 0 and sorted")
            self.num_requests = min(self.num_requests, len(self._times))

    @classmethod
    def replay(
        cls, arrivals: Sequence[tuple[float, Request]], duration_s: float | None = None
    ) -> LoadGenerator:
        """Every arrival of ``arrivals`` (``(offset_s, Request)``, sorted) at its offset."""
        return cls([], len(arrivals), duration_s=duration_s, arrivals=arrivals)

    def _make(self, arrival: float) -> tuple[float, Request]:
        if self.arrivals is not None:
            base = self.arrivals[self._issued][1]
        else:
            base = self.requests[self._issued % len(self.requests)]
        req = Request(
            base.prompt_ids, base.max_new_tokens, base.temperature, base.top_k, base.top_p, self._issued
        )
        self._issued += 1
        return arrival, req

    def _open(self, now: float) -> bool:
        return self._issued < self.num_requests and (self.duration_s is None or now < self.duration_s)

    def poll(self, now: float, in_flight: int) -> list[tuple[float, Request]]:
        """Requests that have arrived by ``now`` given ``in_flight`` unfinished requests."""
        out: list[tuple[float, Request]] = []
        if self.concurrency is not None:
            while self._open(now) and in_flight + len(out) < self.concurrency:
                out.append(self._make(now))
        else:
            while self._open(now) and self._times[self._issued] <= now:
                out.append(self._make(self._times[self._issued]))
        return out

    def next_arrival(self, now: float) -> float | None:
        """When the next open-loop or replayed request arrives (None when no more will)."""
        if self.concurrency is not None or not self._open(now):
            return None
        return self._times[self._issued]

    def exhausted(self, now: float) -> bool:
        return not self._open(now)


@dataclass
class RequestRecord:
    id: int
    arrival_s: float
    first_token_s: float
    finish_s: float
    prompt_tokens: int
    output_tokens: list[int]
    reason: str

    @property
    def ttft_ms(self) -> float:
        return 1e3 * (self.first_token_s - self.arrival_s)

    @property
    def e2e_ms(self) -> float:
        return 1e3 * (self.finish_s - self.arrival_s)

    @property
    def tpot_ms(self) -> float | None:
        """Time per output token after the first; None for one-token outputs."""
        n = len(self.output_tokens)
        return 1e3 * (self.finish_s - self.first_token_s) / (n - 1) if n > 1 else None


def load_metrics(records: list[RequestRecord], wall_s: float) -> dict[str, float | None]:
    """Run-level latency percentiles and throughput (docs/metrics.md)."""
    out: dict[str, float | None] = {}
    series = {
        "ttft_ms": [r.ttft_ms for r in records],
        "tpot_ms": [r.tpot_ms for r in records if r.tpot_ms is not None],
        "e2e_ms": [r.e2e_ms for r in records],
    }
    for name, values in series.items():
        for q in (50, 95, 99):
            out[f"{name}_p{q}"] = percentile(values, q)
    generated = sum(len(r.output_tokens) for r in records)
    out["generated_tokens"] = generated
    out["num_requests"] = len(records)
    out["wall_s"] = wall_s
    out["tokens_per_second"] = generated / wall_s if wall_s > 0 else None
    out["requests_per_second"] = len(records) / wall_s if wall_s > 0 else None
    return out


@dataclass
class _Ledger:
    """One run's per-request times: arrival and prompt length at admission, the first token's time
    after the admission's prefill, and a record per retired request."""

    arrival: dict[int, float] = field(default_factory=dict)
    first: dict[int, float] = field(default_factory=dict)
    prompt_len: dict[int, int] = field(default_factory=dict)
    records: list[RequestRecord] = field(default_factory=list)

    def admitted(self, admit: list[tuple[float, Request]]) -> None:
        for t, req in admit:
            self.arrival[req.id], self.prompt_len[req.id] = t, len(req.prompt_ids)

    def started(self, admit: list[tuple[float, Request]], now: float) -> None:
        for _, req in admit:
            self.first[req.id] = now

    def finished(self, done: list[Finished], now: float) -> None:
        for fin in done:
            i = fin.id
            record = RequestRecord(
                i, self.arrival[i], self.first[i], now, self.prompt_len[i], fin.tokens, fin.reason
            )
            self.records.append(record)


@dataclass
class RunResult:
    records: list[RequestRecord]
    metrics: dict[str, Any]  # load_metrics, then SpecStats.summary, then "steps" (docs/metrics.md)
    trace: list[Any] = field(default_factory=list)  # per-row step samples, filled by a caller that asks


class Scheduler:
    """Drives a :class:`SpecEngine` with requests from a :class:`LoadGenerator`.

    ``max_prefill_tokens`` caps one admission's prefill at that many token slots (requests x the
    longest prompt among them, since the engine pads to it), so a burst of arrivals does not stall
    the running rows for one long prefill; the first waiting request is always admitted.
    """

    def __init__(
        self,
        engine: SpecEngine,
        clock: Callable[[], float] = time.perf_counter,
        max_prefill_tokens: int | None = None,
    ) -> None:
        if max_prefill_tokens is not None and max_prefill_tokens < 1:
            raise EngineInputError(f"max_prefill_tokens: must be >= 1 (got {max_prefill_tokens})")
        self.engine, self.clock, self.max_prefill_tokens = engine, clock, max_prefill_tokens

    def admissible(self, waiting: list[tuple[float, Request]], free: int) -> int:
        """How many of the first waiting requests one admission takes."""
        m, width = 0, 0
        for _, req in waiting[:free]:
            w = max(width, len(req.prompt_ids))
            if m and self.max_prefill_tokens is not None and (m + 1) * w > self.max_prefill_tokens:
                break
            m, width = m + 1, w
        return m

    def run(
        self, load: LoadGenerator, max_steps: int | None = None, time_limit_s: float | None = None
    ) -> RunResult:
        """Serve ``load`` to completion; ``time_limit_s`` raises TimeoutError past that wall time.

        Each turn: take the arrivals, admit what fits (one prefill), run one step over the running
        rows and retire the finished; with nothing running or waiting, sleep to the next arrival.
        """
        engine, clock = self.engine, self.clock
        waiting: list[tuple[float, Request]] = []
        ledger = _Ledger()
        steps = 0
        t0 = clock()
        with torch.inference_mode():
            while True:
                now = clock() - t0
                waiting.extend(load.poll(now, len(waiting) + engine.n))
                if waiting and engine.free_slots():
                    waiting, now = self._admit(waiting, ledger, t0)
                if engine.n:
                    engine.step()
                    steps += 1
                    ledger.finished(engine.retire(), clock() - t0)
                    if max_steps is not None and steps >= max_steps:
                        raise RuntimeError(f"scheduler: no progress after {max_steps} steps")
                    if time_limit_s is not None and clock() - t0 > time_limit_s:
                        raise TimeoutError(
                            f"run exceeded its time limit of {time_limit_s:g} s "
                            f"({len(ledger.records)} of {load.num_requests} requests done)"
                        )
                elif not waiting:
                    if load.exhausted(now):
                        break
                    nxt = load.next_arrival(now)
                    if nxt is not None and nxt > now:
                        time.sleep(nxt - now)
        wall = clock() - t0
        records = sorted(ledger.records, key=lambda r: r.id)
        metrics: dict[str, Any] = dict(load_metrics(records, wall))
        metrics.update(engine.stats.summary())
        metrics["steps"] = steps
        return RunResult(records, metrics)

    def _admit(
        self, waiting: list[tuple[float, Request]], ledger: _Ledger, t0: float
    ) -> tuple[list[tuple[float, Request]], float]:
        """Prefill the first waiting requests that fit (:meth:`admissible`) as one batch; their first
        token is timed once the prefill is done. Returns the requests left waiting and that time."""
        engine = self.engine
        admit = waiting[: self.admissible(waiting, engine.free_slots())]
        ledger.admitted(admit)
        engine.add([req for _, req in admit])
        engine.synchronize()
        now = self.clock() - t0
        ledger.started(admit, now)
        ledger.finished(engine.retire(), now)  # a first token may be EOS, or the whole budget
        return waiting[len(admit) :], now
