"""Timing primitives shared by the ceiling probes, the profiler and the sweep sizing.

:func:`forward_timer` makes a model's cached forward a zero-argument callable; :func:`time_fn`
times a zero-argument callable on a device and summarises the samples robustly (median and
inter-quartile range). On CUDA each repeat is bracketed by ``torch.cuda.Event`` pairs so the
samples are device time; on any other device they are host wall time from
``time.perf_counter``. A measurement whose relative IQR exceeds a threshold is taken once
more and flagged ``noisy`` if it is still spread out.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from engine.model import Transformer

NOISY_IQR_REL = 0.1
"""Relative IQR (IQR / median) above which a measurement counts as noisy."""


def forward_timer(
    model: Transformer, batch: int, k: int, context: int, device: torch.device
) -> Callable[[], object]:
    """A closure running one cached forward of (batch, k) new tokens after ``context`` tokens.

    The cache is prefilled with ``context`` random tokens (seeded) once, here; every call of the
    closure writes the same ``k`` positions after them, so repeated calls time the same work.
    """
    cache = model.new_cache(batch, context + k + 1)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        prefix = torch.randint(0, vocab, (batch, context), generator=gen).to(device)
        model(prefix, cache=cache, start=torch.zeros(batch, dtype=torch.long, device=device), kv_len=context)
    tokens = torch.randint(0, vocab, (batch, k), generator=gen).to(device)
    start = torch.full((batch,), context, dtype=torch.long, device=device)

    def run() -> object:
        with torch.inference_mode():
            return model.decode(tokens, cache, start, context + k)

    return run


def time_fn(
    fn: Callable[[], object], device: torch.device, warmup: int = 3, repeats: int = 10
) -> list[float]:
    """Time ``fn`` repeatedly on ``device``.

    Args:
        fn: Zero-argument callable doing the work to time (its result is discarded).
        device: Device the work runs on; CUDA devices are timed with CUDA events.
        warmup: Untimed calls made first (compilation, allocator, caches, clocks).
        repeats: Timed calls; one sample each.

    Returns:
        ``repeats`` durations in seconds, in call order.

    Raises:
        ValueError: If ``repeats`` < 1 or ``warmup`` < 0.

    Example:
        >>> import torch
        >>> samples = time_fn(lambda: torch.ones(8).sum(), torch.device("cpu"), warmup=1, repeats=3)
        >>> len(samples)
        3
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        return _time_cuda(fn, device, repeats)
    return _time_host(fn, repeats)


def _time_cuda(fn: Callable[[], object], device: torch.device, repeats: int) -> list[float]:
    """Time ``fn`` with one CUDA event pair per repeat, synchronising once at the end."""
    with torch.cuda.device(device):
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        for start, end in zip(starts, ends, strict=True):
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
    return [start.elapsed_time(end) / 1e3 for start, end in zip(starts, ends, strict=True)]


def _time_host(fn: Callable[[], object], repeats: int) -> list[float]:
    """Time ``fn`` with the host's monotonic high-resolution clock."""
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return samples


def summarize(samples: list[float]) -> dict[str, float]:
    """Median, inter-quartile range and relative IQR of timing samples.

    Quartiles use linear interpolation between order statistics (numpy's default).

    Args:
        samples: Durations in seconds; at least one.

    Returns:
        ``{"median": s, "iqr": s, "iqr_rel": iqr / median}`` (``iqr_rel`` is 0 when the median is 0).

    Raises:
        ValueError: If ``samples`` is empty.

    Example:
        >>> summarize([1.0, 2.0, 3.0, 4.0, 5.0])
        {'median': 3.0, 'iqr': 2.0, 'iqr_rel': 0.6666666666666666}
    """
    if not samples:
        raise ValueError("summarize needs at least one sample")
    if len(samples) == 1:
        q1 = median = q3 = float(samples[0])
    else:
        q1, median, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    iqr = q3 - q1
    return {"median": median, "iqr": iqr, "iqr_rel": iqr / median if median > 0 else 0.0}


def measure_stable(
    fn: Callable[[], object],
    device: torch.device,
    warmup: int = 3,
    repeats: int = 10,
    max_iqr_rel: float = NOISY_IQR_REL,
    keep_samples: bool = False,
) -> dict:
    """Time ``fn``; if the samples are spread out, take them once more and flag persistent noise.

    Args:
        fn: Zero-argument callable doing the work to time.
        device: Device the work runs on.
        warmup: Untimed calls before each set of samples.
        repeats: Timed calls per set.
        max_iqr_rel: Relative IQR above which a set is retaken (once) and then flagged.
        keep_samples: Also return the last set's ``samples`` (seconds, in call order).

    Returns:
        The :func:`summarize` fields of the last set taken, plus ``repeats`` (samples in that
        set), ``attempts`` (1 or 2) and ``noisy`` (the last set still exceeded ``max_iqr_rel``).

    Example:
        >>> import torch
        >>> m = measure_stable(lambda: torch.ones(8).sum(), torch.device("cpu"), warmup=1, repeats=3)
        >>> sorted(m)
        ['attempts', 'iqr', 'iqr_rel', 'median', 'noisy', 'repeats']
    """
    samples = time_fn(fn, device, warmup, repeats)
    summary = summarize(samples)
    attempts = 1
    if summary["iqr_rel"] > max_iqr_rel:
        samples = time_fn(fn, device, warmup, repeats)
        summary = summarize(samples)
        attempts = 2
    out = {**summary, "repeats": repeats, "attempts": attempts, "noisy": summary["iqr_rel"] > max_iqr_rel}
    return {**out, "samples": samples} if keep_samples else out
