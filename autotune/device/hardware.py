"""Device fingerprint: what accelerator (or CPU) a profile was measured on, and its paper ceilings.

Implements the fingerprint half of docs/metrics.md "Hardware classification". A CUDA device is
described from two sources: ``torch.cuda.get_device_properties`` (always present when torch
sees the GPU) and NVML via ``nvidia-ml-py`` (``import pynvml``), which adds bus width, clocks,
power limit, MIG state and driver versions. Each NVML field is queried on its own and recorded
as ``None`` when the driver cannot answer (``NVMLError_NotSupported`` is common on some SKUs
and in MIG or virtualised setups); a missing or broken NVML leaves ``"nvml": None`` and the
reason in ``"nvml_error"``. Without CUDA the host CPU is described instead.

The ``key`` hashes only identity fields (model, memory size, compute capability, bus width,
core counts, ISA, architecture), never clocks, power limits, driver versions or thread counts,
so a profile stays addressable across driver upgrades and power-capping.

Reference: NVML API reference, https://docs.nvidia.com/deploy/nvml-api/
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

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


@dataclass(frozen=True)
class NvmlIdentity:
    """How one NVML device can be recognised from the CUDA side.

    Attributes:
        index: NVML device index (PCI bus order; ignores ``CUDA_VISIBLE_DEVICES``).
        uuid: ``"GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"``, or None if unreadable.
        pci_bus_id: ``"00000000:3B:00.0"``, or None if unreadable.
    """

    index: int
    uuid: str | None
    pci_bus_id: str | None


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


def _normalize_uuid(uuid: str | None) -> str | None:
    """Lower-case a GPU UUID and drop any ``GPU-`` prefix, for comparison."""
    if not uuid:
        return None
    text = uuid.strip().lower()
    return text[4:] if text.startswith("gpu-") else text


def _parse_pci_bus_id(bus_id: str | None) -> tuple[int, int, int] | None:
    """``"[domain:]bus:device.function"`` (hex) to ``(domain, bus, device)``; None if malformed."""
    if not bus_id:
        return None
    match = re.fullmatch(r"(?:([0-9a-f]+):)?([0-9a-f]+):([0-9a-f]+)\.[0-9a-f]+", bus_id.strip().lower())
    if match is None:
        return None
    domain, bus, device = match.groups()
    return int(domain or "0", 16), int(bus, 16), int(device, 16)


def _visible_device_entries(cuda_visible_devices: str) -> list[str]:
    """Entries of ``CUDA_VISIBLE_DEVICES`` as CUDA reads them: it stops at the first invalid one."""
    entries = []
    for raw in cuda_visible_devices.split(","):
        entry = raw.strip()
        if not (entry.isdigit() or entry.lower().startswith(("gpu-", "mig-"))):
            break
        entries.append(entry)
    return entries


def map_torch_ordinal_to_nvml_index(
    ordinal: int,
    nvml_devices: Sequence[NvmlIdentity],
    torch_uuid: str | None = None,
    torch_pci_bus_id: str | None = None,
    cuda_visible_devices: str | None = None,
) -> int | None:
    """Find the NVML device behind torch's CUDA ordinal.

    Torch numbers only the devices ``CUDA_VISIBLE_DEVICES`` exposes, in that order; NVML numbers
    every device on the host. Matching tries, in order: the UUID torch reports, the PCI bus id
    torch reports, then the ``CUDA_VISIBLE_DEVICES`` entry at ``ordinal`` (an integer, read as
    an NVML index, which assumes CUDA's order is PCI order, or a ``GPU-`` UUID prefix). A MIG
    instance's UUID never equals its parent's, so MIG devices match by PCI bus id.

    Args:
        ordinal: Torch's CUDA device index.
        nvml_devices: Every device NVML enumerates.
        torch_uuid: ``props.uuid`` as text, with or without the ``GPU-`` prefix.
        torch_pci_bus_id: ``"domain:bus:device.function"`` built from torch's properties.
        cuda_visible_devices: The environment variable's value; None when unset.

    Returns:
        The NVML index, or None if nothing identifies the device.

    Example:
        >>> gpus = [NvmlIdentity(i, f"GPU-{i}", None) for i in range(4)]
        >>> map_torch_ordinal_to_nvml_index(0, gpus, cuda_visible_devices="3,1")
        3
    """
    uuid = _normalize_uuid(torch_uuid)
    if uuid is not None:
        for dev in nvml_devices:
            if _normalize_uuid(dev.uuid) == uuid:
                return dev.index
    pci = _parse_pci_bus_id(torch_pci_bus_id)
    if pci is not None:
        for dev in nvml_devices:
            if _parse_pci_bus_id(dev.pci_bus_id) == pci:
                return dev.index
    indices = {dev.index for dev in nvml_devices}
    if cuda_visible_devices is None:
        return ordinal if ordinal in indices else None
    entries = _visible_device_entries(cuda_visible_devices)
    if not 0 <= ordinal < len(entries):
        return None
    entry = entries[ordinal]
    if entry.isdigit():
        return int(entry) if int(entry) in indices else None
    if entry.lower().startswith("mig-"):
        return None
    prefix = entry.lower()[4:]
    hits = [
        dev.index
        for dev in nvml_devices
        if dev.uuid and dev.uuid.lower().removeprefix("gpu-").startswith(prefix)
    ]
    return hits[0] if len(hits) == 1 else None


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

    Clocks, power limits, driver and library versions and thread counts are left out.

    Args:
        fp: A dict from :func:`fingerprint` (only ``kind``, ``device`` and ``nvml`` are read).

    Returns:
        A small dict of identity fields, memory rounded to whole GiB.
    """
    dev = fp["device"]
    memory_gib = round(dev["memory_total_bytes"] / GIB) if dev.get("memory_total_bytes") else None
    if fp["kind"] == "cuda":
        nvml = fp.get("nvml") or {}
        return {
            "kind": "cuda",
            "name": dev["name"],
            "memory_gib": memory_gib,
            "compute_capability": dev["compute_capability"],
            "memory_bus_width_bits": nvml.get("memory_bus_width_bits"),
            "multiprocessor_count": dev["multiprocessor_count"],
        }
    return {
        "kind": "cpu",
        "model_name": dev["model_name"],
        "memory_gib": memory_gib,
        "physical_cores": dev["physical_cores"],
        "isa": dev["isa"],
        "architecture": dev["architecture"],
    }


def fingerprint_key(identity: Mapping[str, Any]) -> str:
    """Stable 16-hex-digit key: the first 16 hex digits of sha256 over canonical JSON.

    Example:
        >>> len(fingerprint_key({"kind": "cpu"}))
        16
    """
    canonical = json.dumps(dict(identity), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _label(kind: str, dev: Mapping[str, Any]) -> str:
    """Human label: ``"NVIDIA H200 140GB"`` or ``"AMD EPYC (2 cores)"``."""
    if kind == "cuda":
        return f"{dev['name']} {round(dev['memory_total_bytes'] / GIB)}GB"
    return f"{dev['model_name']} ({dev['physical_cores']} cores)"


def _text(value: object) -> str | None:
    """NVML strings arrive as ``str`` or ``bytes`` depending on the binding version."""
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml_call(nvml: ModuleType, name: str, *args: object) -> Any:
    """Call one NVML getter by name; None if it is missing from the binding or raises NVMLError."""
    fn = getattr(nvml, name, None)
    if fn is None:
        return None
    try:
        return fn(*args)
    except nvml.NVMLError:
        return None


def _nvml_device_fields(nvml: ModuleType, handle: object) -> dict[str, Any]:
    """Every per-device NVML field, each queried on its own (None where unsupported)."""
    cc = _nvml_call(nvml, "nvmlDeviceGetCudaComputeCapability", handle)
    memory = _nvml_call(nvml, "nvmlDeviceGetMemoryInfo", handle)
    power_mw = _nvml_call(nvml, "nvmlDeviceGetEnforcedPowerLimit", handle)
    mig = _nvml_call(nvml, "nvmlDeviceGetMigMode", handle)  # [current, pending]
    return {
        "name": _text(_nvml_call(nvml, "nvmlDeviceGetName", handle)),
        "uuid": _text(_nvml_call(nvml, "nvmlDeviceGetUUID", handle)),
        "pci_bus_id": _device_pci_bus_id(nvml, handle),
        "compute_capability": f"{cc[0]}.{cc[1]}" if cc is not None else None,
        "memory_total_bytes": int(memory.total) if memory is not None else None,
        "memory_bus_width_bits": _nvml_call(nvml, "nvmlDeviceGetMemoryBusWidth", handle),
        "max_sm_clock_mhz": _nvml_call(nvml, "nvmlDeviceGetMaxClockInfo", handle, nvml.NVML_CLOCK_SM),
        "max_mem_clock_mhz": _nvml_call(nvml, "nvmlDeviceGetMaxClockInfo", handle, nvml.NVML_CLOCK_MEM),
        "power_limit_w": power_mw / 1000 if power_mw is not None else None,
        "mig_mode": bool(mig[0]) if mig is not None else None,
    }


def _nvml_system_fields(nvml: ModuleType) -> dict[str, str | None]:
    """Driver version and the CUDA version the driver supports (``13000`` -> ``"13.0"``)."""
    cuda = _nvml_call(nvml, "nvmlSystemGetCudaDriverVersion")
    return {
        "driver_version": _text(_nvml_call(nvml, "nvmlSystemGetDriverVersion")),
        "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda is not None else None,
    }


def _nvml_snapshot(
    ordinal: int, torch_uuid: str | None, torch_pci_bus_id: str | None
) -> tuple[dict | None, str | None]:
    """NVML's view of torch's device ``ordinal``: ``(fields, None)`` or ``(None, reason)``."""
    try:
        import pynvml
    except ImportError as exc:
        return None, f"nvidia-ml-py unavailable: {exc}"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return None, f"nvmlInit failed: {exc}"
    try:
        handles = {}
        for index in range(_nvml_call(pynvml, "nvmlDeviceGetCount") or 0):
            handle = _nvml_call(pynvml, "nvmlDeviceGetHandleByIndex", index)
            if handle is not None:
                handles[index] = handle
        identities = [
            NvmlIdentity(
                index,
                _text(_nvml_call(pynvml, "nvmlDeviceGetUUID", handle)),
                _device_pci_bus_id(pynvml, handle),
            )
            for index, handle in handles.items()
        ]
        nvml_index = map_torch_ordinal_to_nvml_index(
            ordinal, identities, torch_uuid, torch_pci_bus_id, os.environ.get("CUDA_VISIBLE_DEVICES")
        )
        if nvml_index is None:
            return None, f"no NVML device matches CUDA device {ordinal}"
        return {
            "index": nvml_index,
            **_nvml_device_fields(pynvml, handles[nvml_index]),
            **_nvml_system_fields(pynvml),
        }, None
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def _device_pci_bus_id(nvml: ModuleType, handle: object) -> str | None:
    """NVML's PCI bus id string for ``handle``, or None."""
    pci = _nvml_call(nvml, "nvmlDeviceGetPciInfo", handle)
    return _text(pci.busId) if pci is not None else None


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


def fingerprint(device: str = "auto", dtype: str = "float32") -> dict[str, Any]:
    """Describe the device a measurement runs on, as a JSON-serialisable dict.

    Args:
        device: ``"auto"`` (the current CUDA device if torch sees one, else the CPU), ``"cpu"``,
            ``"cuda"`` or ``"cuda:N"``.
        dtype: Name of the torch dtype measurements use, e.g. ``"bfloat16"``; recorded only.

    Returns:
        ``{"kind": "cuda" | "cpu", "label": str, "key": str, "device": {...}, "nvml": {...} | None,
        "nvml_error": str | None, "theoretical": {"bandwidth_bytes_per_s", "dense_bf16_flops"},
        "software": {...}}``. ``device`` holds torch's view of the GPU (or the CPU fields);
        ``nvml`` holds NVML's fields for the same GPU, any of them None where unsupported.

    Raises:
        ValueError: For an unknown device string, a CUDA index out of range, or a bad dtype.
        RuntimeError: If a CUDA device is requested explicitly but torch sees none.

    Example:
        >>> fp = fingerprint("cpu")
        >>> fp["kind"], len(fp["key"])
        ('cpu', 16)
    """
    if not isinstance(getattr(torch, dtype, None), torch.dtype):
        raise ValueError(f"unknown torch dtype {dtype!r}")
    kind, ordinal = _resolve_device(device)
    nvml: dict | None = None
    nvml_error: str | None = None
    if ordinal is not None:  # kind "cuda": _resolve_device gives CUDA, and only CUDA, an ordinal
        dev = _cuda_device_fields(ordinal)
        nvml, nvml_error = _nvml_snapshot(ordinal, dev["uuid"], dev["pci_bus_id"])
    else:
        dev = _cpu_device_fields()
    nvml_fields = nvml or {}
    fp: dict[str, Any] = {
        "kind": kind,
        "label": _label(kind, dev),
        "key": None,
        "device": dev,
        "nvml": nvml,
        "nvml_error": nvml_error,
        "theoretical": {
            "bandwidth_bytes_per_s": theoretical_bandwidth_bytes_per_s(
                nvml_fields.get("max_mem_clock_mhz"), nvml_fields.get("memory_bus_width_bits")
            ),
            "dense_bf16_flops": theoretical_flops(dev["name"]) if kind == "cuda" else None,
        },
        "software": _software_fields(dtype),
    }
    fp["key"] = fingerprint_key(identity_fields(fp))
    return fp
