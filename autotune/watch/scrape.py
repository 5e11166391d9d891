"""One scrape of a live server's /metrics: its URL, the GET, and what the watch reads of the text.

:func:`read_scrape` turns one /metrics text into a :class:`Scrape`: the spec-decode counters
through the tuner's own reader (:func:`autotune.backends.prometheus.read_spec_counts`, so the watch
and ``autotune tune`` read one scrape the same way), the stack's other counters and its gauges
(NaN and missing series are absent, not zero). docs/watch.md lists the metric names.
"""

from __future__ import annotations

import math
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

from autotune.backends import prometheus
from autotune.backends.prometheus import Samples, SpecCounts
from autotune.errors import ConfigError

STACKS = ("vllm", "llamacpp")

# the counters (differenced per window) beside the spec-decode ones, and the gauges, of each stack
COUNTERS: Mapping[str, Mapping[str, str]] = {
    "vllm": {
        "generated": "vllm:generation_tokens_total",
        # the time finished requests spent scheduled (prefill + decode) and their count: the
        # window's time-averaged requests running by Little's law (autotune.watch.windows.window)
        "running_seconds": "vllm:request_inference_time_seconds_sum",
        "finished": "vllm:request_inference_time_seconds_count",
    },
    "llamacpp": {
        "generated": "llamacpp:tokens_predicted_total",
        "decodes": "llamacpp:n_decode_total",
    },
}
GAUGES: Mapping[str, Mapping[str, str]] = {
    "vllm": {
        "running": "vllm:num_requests_running",
        "waiting": "vllm:num_requests_waiting",
        "started": "process_start_time_seconds",
    },
    "llamacpp": {
        "running": "llamacpp:requests_processing",
        "waiting": "llamacpp:requests_deferred",
        "busy_per_decode": "llamacpp:n_busy_slots_per_decode",
    },
}


class MetricsError(ValueError):
    """A /metrics text the watch cannot read (no samples, or not the stack's)."""


def metrics_url(url: str) -> str:
    """``http://HOST:PORT`` -> ``http://HOST:PORT/metrics`` (a URL already ending in /metrics is kept).

    Example:
        >>> metrics_url("http://127.0.0.1:8000/"), metrics_url("http://h:1/metrics")
        ('http://127.0.0.1:8000/metrics', 'http://h:1/metrics')
    """
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"--url: need http://HOST:PORT of a running server (got {url!r})")
    try:
        _ = parts.port  # raises on a bad port
    except ValueError:
        raise ConfigError(f"--url: bad port in {url!r}") from None
    path = parts.path.rstrip("/")
    if not path.endswith("/metrics"):
        path += "/metrics"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def fetch_metrics(url: str, timeout: float) -> str:
    """One ``GET url`` (no retry); OSError (URLError, timeouts, refused) or MetricsError on failure."""
    request = urllib.request.Request(url, headers={"Accept": "text/plain"}, method="GET")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body = response.read(64 * 1024 * 1024)
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MetricsError(f"not UTF-8 text (byte {exc.start})") from None


def _value(samples: Samples, name: str) -> float | None:
    """Sum of ``name`` over its label sets, NaN and infinities ignored; None when no finite sample."""
    values = [v for (n, _), v in samples.items() if n == name and math.isfinite(v)]
    return sum(values) if values else None


def detect_stack(samples: Samples) -> str | None:
    """``vllm`` or ``llamacpp`` from the metric names' prefix (None when neither is there).

    Example:
        >>> from autotune.backends.prometheus import parse_text
        >>> detect_stack(parse_text("llamacpp:n_decode_total 3")), detect_stack(parse_text("up 1"))
        ('llamacpp', None)
    """
    for stack in STACKS:
        if any(n.startswith(f"{stack}:") for n, _ in samples):
            return stack
    return None


@dataclass(frozen=True)
class Scrape:
    """What the watch reads of one /metrics text: counters, spec-decode counts, gauges (absent: unknown)."""

    stack: str
    at: float  # seconds on the watch's monotonic clock
    counters: Mapping[str, float]  # COUNTERS' keys
    spec: SpecCounts | None  # the spec-decode counters (None: the server does not speculate)
    gauges: Mapping[str, float]  # GAUGES' keys
    engines: int = 1  # data-parallel engines reporting (vLLM's distinct ``engine`` labels)


def read_scrape(text: str, stack: str | None = None, at: float = 0.0) -> Scrape:
    """One /metrics text -> :class:`Scrape`; MetricsError when it has no samples or not the stack's.

    Example:
        >>> s = read_scrape("vllm:num_requests_running{engine=\\"0\\"} 2.0\\nvllm:generation_tokens_total 9")
        >>> s.stack, s.counters["generated"], s.gauges["running"], s.spec
        ('vllm', 9.0, 2.0, None)
    """
    samples = prometheus.parse_text(text)
    if not samples:
        raise MetricsError("no Prometheus samples in the response")
    found = detect_stack(samples)
    if stack is None:
        if found is None:
            raise MetricsError(
                "neither vllm: nor llamacpp: metrics in the response (is this a vLLM or llama-server?)"
            )
        stack = found
    elif not any(n.startswith(f"{stack}:") for n, _ in samples):
        raise MetricsError(f"no {stack}: metrics in the response (is this a {stack} server?)")
    counters = {k: v for k, name in COUNTERS[stack].items() if (v := _value(samples, name)) is not None}
    gauges = {k: v for k, name in GAUGES[stack].items() if (v := _value(samples, name)) is not None}
    return Scrape(stack, at, counters, prometheus.read_spec_counts(samples, stack), gauges, engines(samples))


def engines(samples: Samples) -> int:
    """How many data-parallel engines the server reports: the distinct values of the ``engine``
    label on its ``vllm:`` series (vLLM labels every engine's series; 1 when there is no label).

    Each engine schedules its own batch, so the load a by-batch-size table sees is one engine's:
    the watch divides the summed running and waiting counts by this (the mean over engines).

    Example:
        >>> from autotune.backends.prometheus import parse_text
        >>> engines(parse_text('vllm:num_requests_running{engine="0"} 3\\nvllm:num_requests_running{engine="1"} 5'))
        2
    """
    found = {dict(labels).get("engine") for (name, labels) in samples if name.startswith("vllm:")}
    found.discard(None)
    return max(len(found), 1)
