"""NVML's view of the GPUs a run uses: which NVML device (or MIG slice) is behind each CUDA ordinal,
its fields, and the link between the used GPUs.

Torch numbers only the devices ``CUDA_VISIBLE_DEVICES`` exposes; NVML numbers every device on the
host, and a MIG slice is a handle under its parent (``nvmlDeviceGetMigDeviceHandleByIndex``) with
its own ``MIG-`` UUID. Every getter is called through :func:`nvml_call`, so a field the driver
cannot report (``NVMLError_NotSupported`` is common on some SKUs, in MIG and virtualised setups)
is None rather than an error. :mod:`autotune.device.hardware` builds the fingerprint from these
readings, :mod:`autotune.device.hostnoise` the busy-GPU check.

Reference: NVML API reference, https://docs.nvidia.com/deploy/nvml-api/
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any

# nvidia-smi topo's names for the path between two GPUs, strongest first; "BOARD" is NVML's
# NVML_TOPOLOGY_INTERNAL (two GPUs on one board), which nvidia-smi has no column for.
LINKS: tuple[str, ...] = ("NV", "BOARD", "PIX", "PXB", "PHB", "NODE", "SYS")
_TOPOLOGY_LINKS = {0: "BOARD", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this host; the message says why (no binding, no driver)."""


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


@dataclass(frozen=True)
class MigIdentity:
    """One MIG slice: its parent's NVML index, its slot under the parent, its ``MIG-`` UUID."""

    parent_index: int
    slot: int
    uuid: str | None


@dataclass(frozen=True)
class NvmlDevice:
    """An enumerated NVML device (a whole GPU, or a MIG slice when ``mig`` is set) and its handle."""

    identity: NvmlIdentity
    handle: object
    mig: MigIdentity | None = None


def uuid_key(uuid: str | None) -> str | None:
    """Lower-case a GPU or MIG UUID and drop its ``GPU-``/``MIG-`` prefix, for comparison.

    Example:
        >>> uuid_key("MIG-AB12"), uuid_key("ab12"), uuid_key("")
        ('ab12', 'ab12', None)
    """
    if not uuid:
        return None
    text = uuid.strip().lower()
    return text[4:] if text.startswith(("gpu-", "mig-")) else text


def _parse_pci_bus_id(bus_id: str | None) -> tuple[int, int, int] | None:
    """``"[domain:]bus:device.function"`` (hex) to ``(domain, bus, device)``; None if malformed."""
    if not bus_id:
        return None
    match = re.fullmatch(r"(?:([0-9a-f]+):)?([0-9a-f]+):([0-9a-f]+)\.[0-9a-f]+", bus_id.strip().lower())
    if match is None:
        return None
    domain, bus, device = match.groups()
    return int(domain or "0", 16), int(bus, 16), int(device, 16)


def visible_device_entries(cuda_visible_devices: str) -> list[str]:
    """Entries of ``CUDA_VISIBLE_DEVICES`` as CUDA reads them: it stops at the first invalid one.

    Example:
        >>> visible_device_entries("2, GPU-1a,-1,0")
        ['2', 'GPU-1a']
    """
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
    """Find the whole NVML device behind torch's CUDA ordinal.

    Matching tries, in order: the UUID torch reports, the PCI bus id torch reports, then the
    ``CUDA_VISIBLE_DEVICES`` entry at ``ordinal`` (an integer, read as an NVML index, which assumes
    CUDA's order is PCI order, or a ``GPU-`` UUID prefix). A MIG slice's UUID never equals its
    parent's: :func:`map_torch_ordinal_to_mig` finds the slice, this finds its parent by PCI bus id.

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
    uuid = uuid_key(torch_uuid)
    if uuid is not None:
        for dev in nvml_devices:
            if uuid_key(dev.uuid) == uuid:
                return dev.index
    pci = _parse_pci_bus_id(torch_pci_bus_id)
    if pci is not None:
        for dev in nvml_devices:
            if _parse_pci_bus_id(dev.pci_bus_id) == pci:
                return dev.index
    indices = {dev.index for dev in nvml_devices}
    if cuda_visible_devices is None:
        return ordinal if ordinal in indices else None
    entries = visible_device_entries(cuda_visible_devices)
    if not 0 <= ordinal < len(entries):
        return None
    entry = entries[ordinal]
    if entry.isdigit():
        return int(entry) if int(entry) in indices else None
    if entry.lower().startswith("mig-"):
        return None
    hits = _prefix_hits(entry, [(dev.uuid, dev.index) for dev in nvml_devices])
    return hits[0] if len(hits) == 1 else None


def map_torch_ordinal_to_mig(
    ordinal: int,
    migs: Sequence[MigIdentity],
    torch_uuid: str | None = None,
    cuda_visible_devices: str | None = None,
) -> MigIdentity | None:
    """Find the MIG slice behind torch's CUDA ordinal: by the UUID torch reports (a slice's CUDA
    UUID is its ``MIG-`` UUID without the prefix), else by a ``MIG-`` prefix in ``CUDA_VISIBLE_DEVICES``.

    Example:
        >>> slices = [MigIdentity(0, s, f"MIG-{s}bbbbbbb-0000") for s in range(2)]
        >>> map_torch_ordinal_to_mig(0, slices, torch_uuid="GPU-1bbbbbbb-0000").slot
        1
        >>> map_torch_ordinal_to_mig(0, slices, cuda_visible_devices="MIG-0bb").slot
        0
    """
    uuid = uuid_key(torch_uuid)
    for mig in migs:
        if uuid is not None and uuid_key(mig.uuid) == uuid:
            return mig
    if cuda_visible_devices is None:
        return None
    entries = visible_device_entries(cuda_visible_devices)
    if not 0 <= ordinal < len(entries) or not entries[ordinal].lower().startswith("mig-"):
        return None
    hits = _prefix_hits(entries[ordinal], [(mig.uuid, mig) for mig in migs])
    return hits[0] if len(hits) == 1 else None


def _prefix_hits(selector: str, candidates: Sequence[tuple[str | None, Any]]) -> list[Any]:
    """The values whose UUID starts with ``selector`` (prefixes dropped, case ignored)."""
    prefix = uuid_key(selector) or ""
    return [value for uuid, value in candidates if prefix and (uuid_key(uuid) or "").startswith(prefix)]


def select_devices(devices: Sequence[NvmlDevice], selectors: Sequence[int | str]) -> list[NvmlDevice]:
    """The enumerated devices ``selectors`` name, in their order: an int (or digits) is an NVML
    index of a whole GPU, a string a ``GPU-``/``MIG-`` UUID or a unique prefix of one (as
    ``CUDA_VISIBLE_DEVICES`` accepts). A selector that names nothing, or several, is skipped.

    Example:
        >>> gpus = [NvmlDevice(NvmlIdentity(i, f"GPU-{i}a", None), i) for i in range(3)]
        >>> [d.identity.index for d in select_devices(gpus, [2, "GPU-0", "GPU-9"])]
        [2, 0]
    """
    chosen: list[NvmlDevice] = []
    for selector in selectors:
        name = str(selector).strip()
        kind = name.lower()[:4]
        if name.isdigit():
            hits = [d for d in devices if d.mig is None and d.identity.index == int(name)]
        else:  # a GPU- prefix names whole GPUs only, a MIG- prefix slices only
            pool = [d for d in devices if kind != ("mig-" if d.mig is None else "gpu-")]
            hits = _prefix_hits(name, [(d.identity.uuid, d) for d in pool])
        if len(hits) == 1 and hits[0] not in chosen:
            chosen.append(hits[0])
    return chosen


def text(value: object) -> str | None:
    """NVML strings arrive as ``str`` or ``bytes`` depending on the binding version."""
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_call(nvml: ModuleType, name: str, *args: object) -> Any:
    """Call one NVML getter by name; None if it is missing from the binding or raises NVMLError."""
    fn = getattr(nvml, name, None)
    if fn is None:
        return None
    try:
        return fn(*args)
    except nvml.NVMLError:
        return None


@contextmanager
def session() -> Iterator[ModuleType]:
    """``pynvml`` between ``nvmlInit`` and ``nvmlShutdown``.

    Raises:
        NvmlUnavailable: Without the ``nvidia-ml-py`` binding or when ``nvmlInit`` fails (no driver).
    """
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable(f"nvidia-ml-py unavailable: {exc}") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(f"nvmlInit failed: {exc}") from None
    try:
        yield pynvml
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def pci_bus_id(nvml: ModuleType, handle: object) -> str | None:
    """NVML's PCI bus id string for ``handle``, or None."""
    pci = nvml_call(nvml, "nvmlDeviceGetPciInfo", handle)
    return text(pci.busId) if pci is not None else None


def enumerate_devices(nvml: ModuleType, with_mig: bool = True) -> list[NvmlDevice]:
    """Every whole GPU NVML sees, each followed (``with_mig``) by the MIG slices under it."""
    devices: list[NvmlDevice] = []
    for index in range(nvml_call(nvml, "nvmlDeviceGetCount") or 0):
        handle = nvml_call(nvml, "nvmlDeviceGetHandleByIndex", index)
        if handle is None:
            continue
        identity = NvmlIdentity(
            index, text(nvml_call(nvml, "nvmlDeviceGetUUID", handle)), pci_bus_id(nvml, handle)
        )
        devices.append(NvmlDevice(identity, handle))
        if with_mig:
            devices.extend(_mig_slices(nvml, identity, handle))
    return devices


def _mig_slices(nvml: ModuleType, parent: NvmlIdentity, handle: object) -> list[NvmlDevice]:
    """The MIG slices under one GPU (none where MIG is off or the binding cannot say)."""
    mode = nvml_call(nvml, "nvmlDeviceGetMigMode", handle)  # [current, pending]
    if mode is None or not mode[0]:
        return []
    slices = []
    for slot in range(nvml_call(nvml, "nvmlDeviceGetMaxMigDeviceCount", handle) or 0):
        mig_handle = nvml_call(nvml, "nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
        if mig_handle is None:  # an empty slot
            continue
        mig = MigIdentity(parent.index, slot, text(nvml_call(nvml, "nvmlDeviceGetUUID", mig_handle)))
        slices.append(NvmlDevice(NvmlIdentity(parent.index, mig.uuid, parent.pci_bus_id), mig_handle, mig))
    return slices


def device_fields(nvml: ModuleType, handle: object) -> dict[str, Any]:
    """Every per-device NVML field of a whole GPU, each queried on its own (None where unsupported)."""
    cc = nvml_call(nvml, "nvmlDeviceGetCudaComputeCapability", handle)
    memory = nvml_call(nvml, "nvmlDeviceGetMemoryInfo", handle)
    power_mw = nvml_call(nvml, "nvmlDeviceGetEnforcedPowerLimit", handle)
    mig = nvml_call(nvml, "nvmlDeviceGetMigMode", handle)  # [current, pending]
    return {
        "name": text(nvml_call(nvml, "nvmlDeviceGetName", handle)),
        "uuid": text(nvml_call(nvml, "nvmlDeviceGetUUID", handle)),
        "pci_bus_id": pci_bus_id(nvml, handle),
        "compute_capability": f"{cc[0]}.{cc[1]}" if cc is not None else None,
        "memory_total_bytes": int(memory.total) if memory is not None else None,
        "memory_bus_width_bits": nvml_call(nvml, "nvmlDeviceGetMemoryBusWidth", handle),
        "max_sm_clock_mhz": nvml_call(nvml, "nvmlDeviceGetMaxClockInfo", handle, nvml.NVML_CLOCK_SM),
        "max_mem_clock_mhz": nvml_call(nvml, "nvmlDeviceGetMaxClockInfo", handle, nvml.NVML_CLOCK_MEM),
        "power_limit_w": power_mw / 1000 if power_mw is not None else None,
        "mig_mode": bool(mig[0]) if mig is not None else None,
    }


def mig_fields(nvml: ModuleType, handle: object, parent_memory_bytes: int | None) -> dict[str, Any]:
    """A MIG slice's own fields: UUID, memory, multiprocessors and GPU-instance slices, and its
    share of the parent's DRAM bandwidth.

    MIG partitions DRAM by memory slices, and a slice's memory is its memory slices' share of the
    parent's, so the bandwidth share is the memory share (``nvmlDeviceGetMemoryInfo`` on the slice's
    handle, else ``memorySizeMB`` of ``nvmlDeviceGetAttributes``); None where either is unknown.
    """
    memory = nvml_call(nvml, "nvmlDeviceGetMemoryInfo", handle)
    attributes = nvml_call(nvml, "nvmlDeviceGetAttributes", handle)
    total = int(memory.total) if memory is not None else None
    if total is None and attributes is not None:
        total = int(attributes.memorySizeMB) << 20
    share = total / parent_memory_bytes if total and parent_memory_bytes else None
    return {
        "uuid": text(nvml_call(nvml, "nvmlDeviceGetUUID", handle)),
        "memory_total_bytes": total,
        "multiprocessor_count": int(attributes.multiprocessorCount) if attributes is not None else None,
        "gpu_instance_slice_count": int(attributes.gpuInstanceSliceCount) if attributes is not None else None,
        "bandwidth_share": min(share, 1.0) if share is not None else None,
    }


def system_fields(nvml: ModuleType) -> dict[str, str | None]:
    """Driver version and the CUDA version the driver supports (``13000`` -> ``"13.0"``)."""
    cuda = nvml_call(nvml, "nvmlSystemGetCudaDriverVersion")
    return {
        "driver_version": text(nvml_call(nvml, "nvmlSystemGetDriverVersion")),
        "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda is not None else None,
    }


def link_between(nvml: ModuleType, a: object, b: object) -> str | None:
    """The path between two whole GPUs in nvidia-smi topo's words: ``"NV"`` where NVML reports
    NVLink peer-to-peer (direct or through NVSwitch), else the PCIe/CPU common ancestor
    (``"PIX"`` ... ``"SYS"``); None where NVML can say neither.
    """
    status = nvml_call(nvml, "nvmlDeviceGetP2PStatus", a, b, nvml.NVML_P2P_CAPS_INDEX_NVLINK)
    if status is not None and status == nvml.NVML_P2P_STATUS_OK:
        return "NV"
    level = nvml_call(nvml, "nvmlDeviceGetTopologyCommonAncestor", a, b)
    return _TOPOLOGY_LINKS.get(int(level)) if level is not None else None


def weakest_link(links: Sequence[str | None]) -> str | None:
    """The slowest of the links between pairs of used GPUs (a collective waits for it); None when
    there is no pair or NVML could not name one of them.

    Example:
        >>> weakest_link(["NV", "PIX", "NV"]), weakest_link(["NV", None]), weakest_link([])
        ('PIX', None, None)
    """
    if not links or any(link is None for link in links):
        return None
    return max(links, key=lambda link: LINKS.index(str(link)))


def interconnect(nvml: ModuleType, handles: Sequence[object]) -> str | None:
    """:func:`weakest_link` over every pair of ``handles`` (whole GPUs, each once)."""
    return weakest_link([link_between(nvml, a, b) for a, b in itertools.combinations(handles, 2)])


@dataclass(frozen=True)
class TorchGpu:
    """What torch says identifies one CUDA device: its ordinal, UUID and PCI bus id (None if absent)."""

    ordinal: int
    uuid: str | None
    pci_bus_id: str | None


@dataclass(frozen=True)
class NvmlView:
    """NVML's readings of the GPUs a run uses, in the run's order.

    Attributes:
        gpus: Per GPU ``{"index", **device_fields, **system_fields}`` of the whole GPU (a MIG
            slice's parent), or None where no NVML device matches.
        migs: Per GPU :func:`mig_fields` of its MIG slice, or None for a whole GPU.
        interconnect: :func:`interconnect` between the distinct whole GPUs; None for one GPU.
        error: Why a GPU has no NVML reading, or None.
    """

    gpus: tuple[dict[str, Any] | None, ...]
    migs: tuple[dict[str, Any] | None, ...]
    interconnect: str | None
    error: str | None


def read(gpus: Sequence[TorchGpu], cuda_visible_devices: str | None) -> NvmlView:
    """NVML's view of the CUDA devices ``gpus`` in one NVML session.

    Raises:
        NvmlUnavailable: Where NVML cannot start (the caller records the reason).
    """
    with session() as nvml:
        devices = enumerate_devices(nvml)
        whole = {d.identity.index: d for d in devices if d.mig is None}
        migs = [d for d in devices if d.mig is not None]
        readings: list[dict[str, Any] | None] = []
        slices: list[dict[str, Any] | None] = []
        parents: list[int] = []
        errors = []
        for gpu in gpus:
            mig = map_torch_ordinal_to_mig(
                gpu.ordinal, [d.mig for d in migs if d.mig is not None], gpu.uuid, cuda_visible_devices
            )
            index = (
                mig.parent_index
                if mig is not None
                else map_torch_ordinal_to_nvml_index(
                    gpu.ordinal,
                    [d.identity for d in whole.values()],
                    gpu.uuid,
                    gpu.pci_bus_id,
                    cuda_visible_devices,
                )
            )
            if index is None:
                readings.append(None)
                slices.append(None)
                errors.append(f"no NVML device matches CUDA device {gpu.ordinal}")
                continue
            fields = {"index": index, **device_fields(nvml, whole[index].handle), **system_fields(nvml)}
            readings.append(fields)
            mig_handle = next(d.handle for d in migs if d.mig == mig) if mig is not None else None
            slices.append(
                mig_fields(nvml, mig_handle, fields["memory_total_bytes"]) if mig_handle is not None else None
            )
            if index not in parents:
                parents.append(index)
        link = interconnect(nvml, [whole[i].handle for i in parents]) if len(parents) > 1 else None
        return NvmlView(tuple(readings), tuple(slices), link, "; ".join(errors) or None)
