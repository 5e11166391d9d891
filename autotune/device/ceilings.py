"""Measured roofline ceilings: copy bandwidth, matmul FLOP/s and the ridge point between them.

docs/metrics.md "Hardware classification": ridge = FLOP/s / (bytes/s), the arithmetic intensity
(FLOP per byte moved) above which a kernel is compute-bound on this device. The paper
ceilings (NVML bandwidth, datasheet FLOP/s) live in :mod:`autotune.device.hardware`; these are what
the device actually delivers to torch.

- Copy bandwidth: ``dst.copy_(src)`` over a large buffer; bytes counted = read + written.
  At least 1 GiB moved per copy on GPU (far past L2), 256 MiB on CPU (past the LLC).
- Matmul: a square ``n x n`` matmul, ``2 n^3`` FLOP, bf16 on GPU and fp32 on CPU by default,
  on random data. On CPU ``n`` is doubled from 256 until one run takes ~12 ms or more (so the
  timed run stays under ~100 ms); on GPU ``n = 8192``.

Each is timed with :func:`autotune.device.timing.measure_stable` (median, IQR, one retake if noisy).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from autotune.device.timing import measure_stable

MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class _Plan:
    """Sizes and repeat counts of one measurement run."""

    buffer_bytes: int  # each of src and dst; a copy moves twice this
    matmul_n: int | None  # None: calibrate on the CPU
    warmup: int
    repeats: int


_PLANS = {
    ("cuda", False): _Plan(GIB, 8192, warmup=3, repeats=20),
    ("cuda", True): _Plan(32 * MIB, 1024, warmup=1, repeats=5),
    ("cpu", False): _Plan(128 * MIB, None, warmup=2, repeats=10),
    ("cpu", True): _Plan(4 * MIB, 128, warmup=1, repeats=5),
}

_CPU_MATMUL_N_MIN = 256
_CPU_MATMUL_N_MAX = 2048
_CPU_MATMUL_MAX_S = 0.1


def ridge_point(flops_per_s: float, bytes_per_s: float) -> float:
    """Arithmetic intensity (FLOP/byte) where the compute and bandwidth roofs meet.

    Example:
        >>> ridge_point(989.4e12, 4.8e12)
        206.125
    """
    return flops_per_s / bytes_per_s


def measure_copy_bandwidth(
    device: torch.device, buffer_bytes: int, warmup: int, repeats: int
) -> dict[str, Any]:
    """Device-memory copy bandwidth from ``dst.copy_(src)``.

    Args:
        device: Where both buffers live.
        buffer_bytes: Size of each buffer; one copy moves ``2 * buffer_bytes`` (read + write).
        warmup: Untimed copies first (page faults, allocator, clocks).
        repeats: Timed copies per set of samples.

    Returns:
        ``{"median_bytes_per_s", "median_s", "iqr_rel", "bytes", "repeats", "attempts", "noisy"}``.
    """
    numel = buffer_bytes // 4
    src = torch.ones(numel, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    moved = 2 * numel * src.element_size()
    stats = measure_stable(lambda: dst.copy_(src), device, warmup, repeats)
    return {
        "median_bytes_per_s": moved / stats["median"],
        "median_s": stats["median"],
        "iqr_rel": stats["iqr_rel"],
        "bytes": moved,
        "repeats": stats["repeats"],
        "attempts": stats["attempts"],
        "noisy": stats["noisy"],
    }


def measure_matmul(
    device: torch.device, dtype: torch.dtype, n: int, warmup: int, repeats: int
) -> dict[str, Any]:
    """Matmul throughput of ``(n, n) @ (n, n)`` on random data, ``2 n^3`` FLOP per run.

    Args:
        device: Where the operands live.
        dtype: Operand dtype.
        n: Matrix side.
        warmup: Untimed runs first.
        repeats: Timed runs per set of samples.

    Returns:
        ``{"median_flops", "median_s", "iqr_rel", "n", "flops", "dtype", "repeats", "attempts", "noisy"}``;
        ``median_flops`` is FLOP/s and ``flops`` the FLOP count of one run.
    """
    a, b = _matmul_operands(device, dtype, n)
    out = torch.empty((n, n), dtype=dtype, device=device)
    flops = 2 * n**3
    stats = measure_stable(lambda: torch.matmul(a, b, out=out), device, warmup, repeats)
    return {
        "median_flops": flops / stats["median"],
        "median_s": stats["median"],
        "iqr_rel": stats["iqr_rel"],
        "n": n,
        "flops": flops,
        "dtype": str(dtype).removeprefix("torch."),
        "repeats": stats["repeats"],
        "attempts": stats["attempts"],
        "noisy": stats["noisy"],
    }


def _matmul_operands(device: torch.device, dtype: torch.dtype, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two seeded random ``(n, n)`` matrices (random data: zeros would flatter the tensor cores)."""
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn((n, n), generator=gen, device=device, dtype=torch.float32).to(dtype)  # (n, n)
    b = torch.randn((n, n), generator=gen, device=device, dtype=torch.float32).to(dtype)  # (n, n)
    return a, b


def _calibrate_cpu_matmul_n(dtype: torch.dtype) -> int:
    """Largest power-of-two ``n`` in [256, 2048] whose CPU matmul should stay under ~100 ms.

    Doubles ``n`` while eight times the fastest of three runs (the cost of ``2n``) fits.
    """
    n = _CPU_MATMUL_N_MIN
    while n < _CPU_MATMUL_N_MAX:
        a, b = _matmul_operands(torch.device("cpu"), dtype, n)
        torch.matmul(a, b)
        fastest = min(_time_once(torch.matmul, a, b) for _ in range(3))
        if 8 * fastest > _CPU_MATMUL_MAX_S:
            break
        n *= 2
    return n


def _time_once(fn: Callable[..., object], *args: object) -> float:
    """Host seconds one call of ``fn(*args)`` takes."""
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def _fit_gpu_buffer(device: torch.device, want: int) -> int:
    """Halve the copy buffer until src + dst take under half of the free device memory."""
    free, _ = torch.cuda.mem_get_info(device)
    while want > 64 * MIB and 2 * want > free // 2:
        want //= 2
    return want


def measure_ceilings(
    device: torch.device, dtype: torch.dtype | None = None, quick: bool = False
) -> dict[str, Any]:
    """Measure copy bandwidth, matmul FLOP/s and their ridge point on ``device``.

    Args:
        device: A CPU or CUDA device.
        dtype: Matmul dtype; None for bf16 on GPU and fp32 on CPU.
        quick: Small sizes and few repeats, for tests and smoke runs (numbers are not ceilings).

    Returns:
        ``{"device": str, "quick": bool, "torch_threads": int, "copy_bandwidth": {...},
        "matmul": {...}, "ridge_flops_per_byte": float}`` with the sub-dicts of
        :func:`measure_copy_bandwidth` and :func:`measure_matmul`.

    Raises:
        ValueError: For a device that is neither CPU nor CUDA.

    Example:
        >>> import torch
        >>> c = measure_ceilings(torch.device("cpu"), quick=True)
        >>> c["ridge_flops_per_byte"] == c["matmul"]["median_flops"] / c["copy_bandwidth"]["median_bytes_per_s"]
        True
    """
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device type {device.type!r}; use cpu or cuda")
    on_gpu = device.type == "cuda"
    plan = _PLANS[(device.type, quick)]
    dtype = dtype or (torch.bfloat16 if on_gpu else torch.float32)
    buffer_bytes = _fit_gpu_buffer(device, plan.buffer_bytes) if on_gpu else plan.buffer_bytes
    n = plan.matmul_n or _calibrate_cpu_matmul_n(dtype)
    with torch.inference_mode():
        copy = measure_copy_bandwidth(device, buffer_bytes, plan.warmup, plan.repeats)
        matmul = measure_matmul(device, dtype, n, plan.warmup, plan.repeats)
    return {
        "device": str(device),
        "quick": quick,
        "torch_threads": torch.get_num_threads(),
        "copy_bandwidth": copy,
        "matmul": matmul,
        "ridge_flops_per_byte": ridge_point(matmul["median_flops"], copy["median_bytes_per_s"]),
    }
