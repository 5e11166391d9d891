"""Device fingerprint: what accelerator (or CPU, or set of GPUs) a profile was measured on, and
its paper ceilings.

Implements the fingerprint half of docs/metrics.md "Hardware classification". A CUDA device is
described from two sources: ``torch.cuda.get_device_properties`` (always present when torch
sees the GPU) and NVML via ``nvidia-ml-py`` (:mod:`autotune.device.nvml`), which adds bus width,
clocks, power limit, MIG state, driver versions, a MIG slice's own memory and bandwidth share,
and the link between the GPUs a run uses. Each NVML field is queried on its own and recorded as
``None`` when the driver cannot answer; a missing or broken NVML leaves ``"nvml": None`` and the
reason in ``"nvml_error"``. Without CUDA the host CPU is described instead.

The ``key`` hashes only identity fields (model, memory size, compute capability, bus width,
core counts, ISA, architecture; for a run on several GPUs or at tensor parallel size above 1,
also the GPU count, tensor parallel size, interconnect and each GPU's name and memory), never
clocks, power limits, driver versions or thread counts, so a profile stays addressable across
driver upgrades and power-capping, and profiles tuned at different tensor parallel sizes do not
share a key.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from autotune.device import nvml
from autotune.device.nvml import NvmlView

GIB = 1 << 30

# Peak dense (no 2:4 sparsity) BF16 tensor-core FLOP/s with FP32 accumulate, from the vendor
# datasheets (NVIDIA H100, H200, A100, L40S, L4, A10 and HGX B200 datasheets; the Ada
# Lovelace architecture whitepaper for the RTX 4090). Datasheets quote sparse figures with an
# asterisk; these are half of those. Ordered: the first pattern that matches the device name
# wins, so specific variants precede the generic name.
PEAK_DENSE_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    (r"\bH100\b.*\bPCIe\b", 756.5e12),
    (r"\bH100\b.*\bNVL\b", 835.5e12),
    (r"\bH100\b", 989.4e12),  # SXM5
    (r"\bH200\b.*\bNVL\b", 835.5e12),
    (r"\bH200\b", 989.4e12),  # SXM5
    (r"\bB200\b", 2250e12),  # HGX B200: 36 PFLOPS sparse per 8 GPUs
    (r"\bA100\b", 312e12),  # SXM4 and PCIe alike
    (r"\bL40S\b", 362.05e12),
    (r"\bL4\b", 121e12),
    (r"\bA10\b", 125e12),
    (r"\bRTX 4090\b(?! D\b)", 165.2e12),
)


def theoretical_bandwidth_bytes_per_s(
    max_mem_clock_mhz: float | None, bus_width_bits: int | None
) -> float | None:
    """Peak DRAM bandwidth from NVML's max memory clock and bus width: ``2 * f_mem * bus_bits / 8``.

    The factor 2 is the double data rate NVML's memory clock does not include.

    Args:
        max_mem_clock_mhz: ``nvmlDeviceGetMaxClockInfo(h, NVML_CLOCK_MEM)`` in MHz.
        bus_width_bits: ``nvmlDeviceGetMemoryBusWidth(h)`` in bits.

    Returns:
        Bytes per second, or None if either input is missing.

    Example:
        >>> theoretical_bandwidth_bytes_per_s(1593, 5120)  # A100 80GB
        2039040000000.0
    """
    if max_mem_clock_mhz is None or bus_width_bits is None:
        return None
    return 2.0 * max_mem_clock_mhz * 1e6 * bus_width_bits / 8


def theoretical_flops(name: str | None) -> float | None:
    """Peak dense BF16 FLOP/s of a known GPU SKU, looked up by its device name.

    Args:
        name: Device name as NVML or torch report it, e.g. ``"NVIDIA H100 80GB HBM3"``.

    Returns:
        FLOP/s from :data:`PEAK_DENSE_BF16_FLOPS`, or None for an unknown or missing name.

    Example:
        >>> theoretical_flops("NVIDIA H200")
        989400000000000.0
    """
    if not name:
        return None
    for pattern, flops in PEAK_DENSE_BF16_FLOPS:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return flops
    return None


def parse_cpuinfo(text: str, allowed_cpus: set[int] | None = None) -> dict[str, Any]:
    """Model name and physical core count from ``/proc/cpuinfo`` text.

    Physical cores are the distinct ``(physical id, core id)`` pairs, so SMT siblings count
    once. With ``allowed_cpus`` only those logical processors (the process's affinity) count.

    Args:
        text: Contents of ``/proc/cpuinfo``.
        allowed_cpus: Logical processor numbers to consider; None for all.

    Returns:
        ``{"model_name": str | None, "physical_cores": int | None}``; None where the text lacks
        the fields (e.g. on many ARM kernels).

    Example:
        >>> parse_cpuinfo("processor: 0\\nmodel name: X\\nphysical id: 0\\ncore id: 0\\n")
        {'model_name': 'X', 'physical_cores': 1}
    """
    model_name = None
    cores: set[tuple[str, str]] = set()
    for block in text.split("\n\n"):
        fields = _cpuinfo_fields(block)
        if not fields:
            continue
        processor = fields.get("processor", "")
        if allowed_cpus is not None and processor.isdigit() and int(processor) not in allowed_cpus:
            continue
        model_name = model_name or fields.get("model name")
        if "physical id" in fields and "core id" in fields:
            cores.add((fields["physical id"], fields["core id"]))
    return {"model_name": model_name, "physical_cores": len(cores) or None}


def _cpuinfo_fields(block: str) -> dict[str, str]:
    """``key: value`` lines of one ``/proc/cpuinfo`` processor block as a dict."""
    fields = {}
    for line in block.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def parse_meminfo(text: str, field: str = "MemTotal") -> int | None:
    """``field`` (default ``MemTotal``) in bytes from ``/proc/meminfo`` text, or None if absent.

    Example:
        >>> parse_meminfo("MemTotal:       1024 kB\\nMemAvailable: 1 kB\\n")
        1048576
        >>> parse_meminfo("MemTotal:       1024 kB\\nMemAvailable: 1 kB\\n", "MemAvailable")
        1024
    """
    match = re.search(rf"^{re.escape(field)}:\s+(\d+)\s*kB", text, flags=re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None


def available_memory_bytes() -> int | None:
    """Memory the kernel can give new processes now (``MemAvailable``), or None off Linux."""
    return parse_meminfo(_read_text("/proc/meminfo"), "MemAvailable")


def identity_fields(fp: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a fingerprint that identify the hardware, and nothing that drifts.

    Clocks, power limits, driver and library versions and thread counts are left out. The run's
    GPU count, tensor parallel size, interconnect and per-GPU name and memory join only where they
    differ from one device at tensor parallel size 1, so a single-device key (every profile stored
    before they existed) stays the same.

    Args:
        fp: A dict from :func:`fingerprint` (``kind``, ``device``, ``nvml`` and, where present,
            ``gpu_count``, ``tensor_parallel_size``, ``interconnect`` and ``gpus`` are read).

    Returns:
        A small dict of identity fields, memory rounded to whole GiB.

    Example:
        >>> fp = {"kind": "cpu", "device": {"model_name": "X", "memory_total_bytes": GIB,
        ...       "physical_cores": 2, "isa": "AVX2", "architecture": "x86_64"}}
        >>> "tensor_parallel_size" in identity_fields(fp), identity_fields(
        ...     {**fp, "tensor_parallel_size": 2})["tensor_parallel_size"]
        (False, 2)
    """
    dev = fp["device"]
    if fp["kind"] == "cuda":
        reading = fp.get("nvml") or {}
        single = {
            "kind": "cuda",
            "name": dev["name"],
            "memory_gib": _gib(dev.get("memory_total_bytes")),
            "compute_capability": dev["compute_capability"],
            "memory_bus_width_bits": reading.get("memory_bus_width_bits"),
            "multiprocessor_count": dev["multiprocessor_count"],
        }
    else:
        single = {
            "kind": "cpu",
            "model_name": dev["model_name"],
            "memory_gib": _gib(dev.get("memory_total_bytes")),
            "physical_cores": dev["physical_cores"],
            "isa": dev["isa"],
            "architecture": dev["architecture"],
        }
    return {**single, **_parallel_identity(fp)}


def _parallel_identity(fp: Mapping[str, Any]) -> dict[str, Any]:
    """The multi-GPU identity fields, empty for one device (one GPU, or the CPU) at tensor parallel size 1."""
    one = 1 if fp["kind"] == "cuda" else 0
    count = fp.get("gpu_count", one)
    tp = fp.get("tensor_parallel_size", 1)
    if count == one and tp == 1:
        return {}
    fields: dict[str, Any] = {"gpu_count": count, "tensor_parallel_size": tp}
    if fp.get("interconnect") is not None:
        fields["interconnect"] = fp["interconnect"]
    if count > 1:
        fields["gpus"] = [
            {"name": gpu["name"], "memory_gib": _gib(gpu["memory_total_bytes"])} for gpu in fp["gpus"]
        ]
    return fields


def _gib(size: int | None) -> int | None:
    """Bytes to whole GiB (None for unknown or zero)."""
    return round(size / GIB) if size else None


def fingerprint_key(identity: Mapping[str, Any]) -> str:
    """Stable 16-hex-digit key: the first 16 hex digits of sha256 over canonical JSON.

    Example:
        >>> len(fingerprint_key({"kind": "cpu"}))
        16
    """
    canonical = json.dumps(dict(identity), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _label(kind: str, dev: Mapping[str, Any], gpus: Sequence[Mapping[str, Any]], tp: int) -> str:
    """Human label: ``"NVIDIA H200 140GB"``, ``"4x NVIDIA H200 140GB TP4"`` or ``"AMD EPYC (2 cores)"``."""
    if kind == "cuda":
        each = [f"{gpu['name']} {round(gpu['memory_total_bytes'] / GIB)}GB" for gpu in gpus]
        if len(each) == 1:
            text = each[0]
        else:
            text = f"{len(each)}x {each[0]}" if len(set(each)) == 1 else " + ".join(each)
    else:
        text = f"{dev['model_name']} ({dev['physical_cores']} cores)"
    return text if tp == 1 else f"{text} TP{tp}"


def _torch_uuid(props: object) -> str | None:
    """Torch's device UUID as ``"GPU-…"`` (torch prints it without the prefix); None if absent."""
    raw = getattr(props, "uuid", None)
    text = str(raw).strip().lower() if raw is not None else ""
    if not text:
        return None
    if text.startswith(("gpu-", "mig-")):
        return text[:3].upper() + text[3:]
    return "GPU-" + text


def _torch_pci_bus_id(props: object) -> str | None:
    """``"domain:bus:device.0"`` from torch's ``pci_*_id`` properties (newer torch), or None."""
    ids = [getattr(props, name, None) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
    if any(not isinstance(value, int) for value in ids):
        return None
    return f"{ids[0]:08X}:{ids[1]:02X}:{ids[2]:02X}.0"


def _cuda_device_fields(ordinal: int) -> dict[str, Any]:
    """What torch's CUDA runtime reports about device ``ordinal``."""
    props = torch.cuda.get_device_properties(ordinal)
    return {
        "ordinal": ordinal,
        "name": str(props.name),
        "memory_total_bytes": int(props.total_memory),
        "multiprocessor_count": int(props.multi_processor_count),
        "compute_capability": f"{props.major}.{props.minor}",
        "uuid": _torch_uuid(props),
        "pci_bus_id": _torch_pci_bus_id(props),
    }


def _read_text(path: str) -> str:
    """A file's text, or ``""`` where it does not exist or cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def _sysconf_memory_bytes() -> int | None:
    """Physical memory from ``sysconf``; None where unsupported."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def _cpu_device_fields() -> dict[str, Any]:
    """Host CPU: model, cores, threads, ISA capability, memory, architecture."""
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    info = parse_cpuinfo(_read_text("/proc/cpuinfo"), affinity)
    return {
        "model_name": info["model_name"] or platform.processor() or platform.machine() or "unknown CPU",
        "physical_cores": info["physical_cores"] or os.cpu_count(),
        "logical_cpus": os.cpu_count(),
        "affinity_cpus": len(affinity) if affinity is not None else None,
        "torch_threads": torch.get_num_threads(),
        "isa": torch.backends.cpu.get_cpu_capability(),
        "memory_total_bytes": parse_meminfo(_read_text("/proc/meminfo")) or _sysconf_memory_bytes(),
        "architecture": platform.machine(),
    }


def _software_fields(dtype: str) -> dict[str, Any]:
    """Library versions a measurement depends on, plus the dtype it was taken in."""
    return {
        "torch": str(torch.__version__),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "python": platform.python_version(),
        "platform": sys.platform,
        "dtype": dtype,
    }


def _resolve_device(device: str) -> tuple[str, int | None]:
    """``"auto" | "cpu" | "cuda" | "cuda:N"`` to ``(kind, cuda ordinal or None)``.

    The engine's :func:`engine.loader.resolve_device` is the one resolver (the same values, the
    same messages); an explicit CUDA device without CUDA stays a RuntimeError, as
    :func:`fingerprint` documents, everything else it refuses is a ValueError.
    """
    from engine.errors import EngineInputError
    from engine.loader import resolve_device

    try:
        dev = resolve_device(device)
    except EngineInputError as exc:
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise RuntimeError(str(exc)) from None
        raise
    if dev.type == "cpu":
        return "cpu", None
    return "cuda", torch.cuda.current_device() if dev.index is None else dev.index


def _used_ordinals(
    first: int, gpus: Sequence[int] | None, gpu_count: int | None, tensor_parallel_size: int
) -> list[int]:
    """The CUDA ordinals a run uses: ``gpus``, else ``gpu_count`` (default: the tensor parallel
    size) consecutive ordinals from ``first``; checked against what torch sees."""
    if gpus is not None and gpu_count is not None:
        raise ValueError("pass the GPUs a run uses either as gpus=[...] or as gpu_count=N, not both")
    if tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size must be at least 1 (got {tensor_parallel_size})")
    if gpus is not None:
        ordinals = list(gpus)
    else:
        count = tensor_parallel_size if gpu_count is None else gpu_count
        ordinals = list(range(first, first + count))
    visible = torch.cuda.device_count()
    if not ordinals or len(set(ordinals)) != len(ordinals) or any(not 0 <= o < visible for o in ordinals):
        raise ValueError(f"GPUs {ordinals}: need distinct CUDA ordinals below the {visible} torch sees")
    if len(ordinals) % tensor_parallel_size:
        raise ValueError(
            f"tensor_parallel_size {tensor_parallel_size} does not divide the {len(ordinals)} GPU(s) used"
        )
    return ordinals


def _cuda_gpus(ordinals: Sequence[int]) -> tuple[list[dict[str, Any]], NvmlView | None, str | None]:
    """Torch's fields of each used GPU, NVML's view of them, and why NVML is missing (or None)."""
    devs = [_cuda_device_fields(ordinal) for ordinal in ordinals]
    try:
        view = nvml.read(
            [nvml.TorchGpu(d["ordinal"], d["uuid"], d["pci_bus_id"]) for d in devs],
            os.environ.get("CUDA_VISIBLE_DEVICES"),
        )
    except nvml.NvmlUnavailable as exc:
        return devs, None, str(exc)
    return devs, view, view.error


def _gpu_entry(dev: Mapping[str, Any], reading: Mapping[str, Any] | None, mig: dict | None) -> dict[str, Any]:
    """One used GPU of a fingerprint: torch's name, memory and UUID, its NVML index, its MIG slice."""
    return {
        "ordinal": dev["ordinal"],
        "name": dev["name"],
        "memory_total_bytes": dev["memory_total_bytes"],
        "uuid": dev["uuid"],
        "nvml_index": reading["index"] if reading is not None else None,
        "mig": mig,
    }


def _bandwidth(reading: Mapping[str, Any] | None, mig: Mapping[str, Any] | None) -> float | None:
    """Theoretical DRAM bandwidth of one GPU, or of a MIG slice: its share of the parent's."""
    fields = reading or {}
    whole = theoretical_bandwidth_bytes_per_s(
        fields.get("max_mem_clock_mhz"), fields.get("memory_bus_width_bits")
    )
    if mig is None or whole is None:
        return whole
    return whole * mig["bandwidth_share"] if mig["bandwidth_share"] is not None else None


def fingerprint(
    device: str = "auto",
    dtype: str = "float32",
    *,
    gpus: Sequence[int] | None = None,
    gpu_count: int | None = None,
    tensor_parallel_size: int = 1,
) -> dict[str, Any]:
    """Describe the device (or the GPUs) a measurement runs on, as a JSON-serialisable dict.

    Args:
        device: ``"auto"`` (the current CUDA device if torch sees one, else the CPU), ``"cpu"``,
            ``"cuda"`` or ``"cuda:N"``: the run's first GPU.
        dtype: Name of the torch dtype measurements use, e.g. ``"bfloat16"``; recorded only.
        gpus: The CUDA ordinals the run uses, first one first (it overrides ``device``'s index).
        gpu_count: Or how many GPUs, consecutive from ``device``'s. Default: ``tensor_parallel_size``.
        tensor_parallel_size: The serving stack's tensor parallel size; it must divide the GPU count.

    Returns:
        ``{"kind": "cuda" | "cpu", "label": str, "key": str, "device": {...}, "nvml": {...} | None,
        "nvml_error": str | None, "gpu_count": int, "tensor_parallel_size": int,
        "interconnect": str | None, "gpus": [...], "theoretical": {"bandwidth_bytes_per_s",
        "dense_bf16_flops"}, "software": {...}}``. ``device`` holds torch's view of the first GPU
        (or the CPU fields); ``nvml`` NVML's fields of the same GPU (a MIG slice's parent), any of
        them None where unsupported. ``gpus`` lists each used GPU (``ordinal``, ``name``,
        ``memory_total_bytes``, ``uuid``, ``nvml_index``, ``mig``: the slice's own UUID, memory,
        multiprocessors and bandwidth share, or None); ``gpu_count`` is 0 on the CPU.
        ``interconnect`` is the slowest path between the used GPUs in nvidia-smi topo's words
        (``"NV"``, ``"PIX"`` ... ``"SYS"``), None for one GPU or where NVML cannot say.
        ``theoretical`` is per GPU (a MIG slice's share of its parent's bandwidth).

    Raises:
        ValueError: For an unknown device string, a CUDA index out of range, GPUs on a CPU run,
            a tensor parallel size that does not divide the GPU count, or a bad dtype.
        RuntimeError: If a CUDA device is requested explicitly but torch sees none.

    Example:
        >>> fp = fingerprint("cpu")
        >>> fp["kind"], len(fp["key"]), fp["gpu_count"], fp["tensor_parallel_size"]
        ('cpu', 16, 0, 1)

    Long because: it assembles the fingerprint's fields in their stored order.
    """
    if not isinstance(getattr(torch, dtype, None), torch.dtype):
        raise ValueError(f"unknown torch dtype {dtype!r}")
    kind, ordinal = _resolve_device(device)
    view: NvmlView | None = None
    nvml_error: str | None = None
    entries: list[dict[str, Any]] = []
    if ordinal is not None:  # kind "cuda": _resolve_device gives CUDA, and only CUDA, an ordinal
        devs, view, nvml_error = _cuda_gpus(_used_ordinals(ordinal, gpus, gpu_count, tensor_parallel_size))
        readings = view.gpus if view is not None else (None,) * len(devs)
        migs = view.migs if view is not None else (None,) * len(devs)
        entries = [_gpu_entry(d, r, m) for d, r, m in zip(devs, readings, migs, strict=True)]
        dev = devs[0]
        first_nvml, first_mig = readings[0], migs[0]
    elif gpus is not None or gpu_count is not None:
        raise ValueError("gpus and gpu_count need a CUDA device (the CPU runs take none)")
    else:
        dev, first_nvml, first_mig = _cpu_device_fields(), None, None
    fp: dict[str, Any] = {
        "kind": kind,
        "label": _label(kind, dev, entries, tensor_parallel_size),
        "key": None,
        "device": dev,
        "nvml": first_nvml,
        "nvml_error": nvml_error,
        "gpu_count": len(entries),
        "tensor_parallel_size": tensor_parallel_size,
        "interconnect": view.interconnect if view is not None else None,
        "gpus": entries,
        "theoretical": {
            "bandwidth_bytes_per_s": _bandwidth(first_nvml, first_mig),
            "dense_bf16_flops": theoretical_flops(dev["name"]) if kind == "cuda" else None,
        },
        "software": _software_fields(dtype),
    }
    fp["key"] = fingerprint_key(identity_fields(fp))
    return fp


def nvml_selectors(fp: Mapping[str, Any]) -> list[int | str] | None:
    """How NVML names the GPUs a fingerprint's run uses, for :func:`autotune.device.hostnoise.measure`:
    a MIG slice's ``MIG-`` UUID, else the NVML index, else torch's ``GPU-`` UUID; None on the CPU.

    Example:
        >>> nvml_selectors({"kind": "cuda", "gpus": [{"nvml_index": 3, "uuid": "GPU-a", "mig": None}]})
        [3]
    """
    if fp["kind"] != "cuda":
        return None
    selectors: list[int | str] = []
    for gpu in fp.get("gpus") or []:
        mig = gpu.get("mig")
        if mig is not None and mig.get("uuid"):
            selectors.append(mig["uuid"])
        elif gpu.get("nvml_index") is not None:
            selectors.append(gpu["nvml_index"])
        elif gpu.get("uuid"):
            selectors.append(gpu["uuid"])
    return selectors
