"""Sizing the load sweep on this host: the batch sizes up to where the target's decode throughput saturates.

``autotune init`` writes these levels as workload.concurrency (and search.max_batch_size): one
request up to the first doubling of the batch that adds less than :data:`SATURATION_GAIN` decode
throughput, so a GPU gets a wider sweep than a CPU. The throughput is the target's own cached
decode step (:func:`autotune.device.timing.forward_timer`), timed for seconds, before any tuning.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

SATURATION_GAIN = 1.15  # a doubling of the batch that adds less decode throughput than this: saturated
MAX_SWEEP_BATCH = 256


@dataclass(frozen=True)
class Sweep:
    """The load levels ``init`` writes and the measurement they come from."""

    levels: tuple[int, ...]  # 1, 2, 4, ... up to the saturation batch
    device: str
    tokens_per_second: dict[int, float]  # the target's decode throughput per batch size

    def describe(self) -> str:
        """``concurrency [1, 2, 4, 8] (decode tokens/s per doubling on cpu: 1.9x 1.7x 1.1x)``."""
        bs = sorted(self.tokens_per_second)
        gains = " ".join(
            f"{self.tokens_per_second[b] / self.tokens_per_second[a]:.2f}x" for a, b in pairwise(bs)
        )
        return (
            f"concurrency {list(self.levels)}: the target's decode throughput on {self.device} grows "
            f"{gains} per doubling of the batch (saturated below {SATURATION_GAIN:g}x)"
        )


def saturation_levels(tokens_per_second: dict[int, float], gain: float = SATURATION_GAIN) -> tuple[int, ...]:
    """Powers of two from 1 to the first batch whose doubling added less than ``gain`` throughput
    (that batch shows the saturation), else to the largest measured.

    Example:
        >>> saturation_levels({1: 10.0, 2: 19.0, 4: 35.0, 8: 38.0, 16: 39.0})
        (1, 2, 4, 8)
        >>> saturation_levels({1: 10.0, 2: 20.0, 4: 40.0})
        (1, 2, 4)
    """
    bs = sorted(tokens_per_second)
    top = next((b for a, b in pairwise(bs) if tokens_per_second[b] < gain * tokens_per_second[a]), bs[-1])
    return tuple(b for b in bs if b <= top)


def size_sweep(
    target: Path,
    device: str = "auto",
    dtype: str = "float32",
    context: int = 128,
    max_batch: int = MAX_SWEEP_BATCH,
) -> Sweep:
    """Time one decode step of ``target`` (after ``context`` cached tokens) at batch 1, 2, 4, ... and
    return the levels up to its saturation (:func:`saturation_levels`). Stops early past the
    saturation, at ``max_batch``, or when a batch does not fit in memory (the largest that fitted
    is then the top). Seconds on a small model; a GPU measures with CUDA events."""
    import torch

    from autotune.device.capacity import Need, check_fits, free_bytes, read_checkpoint, resolve_dtype
    from autotune.device.timing import forward_timer, time_fn
    from autotune.errors import ConfigError
    from engine.errors import EngineInputError
    from engine.loader import load_model, resolve_device

    try:
        dev = resolve_device(device)
    except EngineInputError as exc:
        raise ConfigError(f"--device: {exc}") from None
    where = f"{dev.type}:{dev.index or 0}" if dev.type == "cuda" else "cpu"
    checkpoint = read_checkpoint(Path(target))
    dtype, _ = resolve_dtype(dtype, checkpoint.torch_dtype, where)
    weights = Need(f"{Path(target).name} weights ({dtype})", checkpoint.weights_bytes(dtype))
    check_fits([weights], free_bytes(where), where, "--dtype or --device, or --sweep bundled")
    model = load_model(target, dtype, str(dev))
    limit = min(context + 2, model.config.max_position_embeddings)
    context = max(limit - 2, 1)
    tps: dict[int, float] = {}
    batch = 1
    while batch <= max_batch:
        try:
            run = forward_timer(model, batch, 1, context, dev)
            seconds = statistics.median(time_fn(run, dev, warmup=2, repeats=5))
        except torch.OutOfMemoryError:
            break
        tps[batch] = batch / seconds
        if batch > 1 and tps[batch] < SATURATION_GAIN * tps[batch // 2]:
            break
        batch *= 2
    if not tps:
        raise ConfigError(
            f"{target}: one decode step at batch 1 does not fit on {where} in {dtype} "
            "(try --dtype, --device, or --sweep bundled)"
        )
    label = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    return Sweep(saturation_levels(tps), label, tps)
