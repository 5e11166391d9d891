"""Tests for autotune.device.hardware and autotune.device.nvml: CPU fingerprint, NVML fallbacks, ordinal
mapping, MIG slices, several GPUs, key stability."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from unittest import mock

import pynvml
import pytest
import torch

from autotune.device import hardware, nvml
from autotune.device.hardware import (
    fingerprint,
    parse_cpuinfo,
    parse_meminfo,
    theoretical_bandwidth_bytes_per_s,
    theoretical_flops,
)
from autotune.device.nvml import NvmlIdentity, map_torch_ordinal_to_nvml_index
from tests.conftest import CPU_DEVICE_FIELDS, SOFTWARE_FIELDS

H200_MEMORY = 143771 * (1 << 20)


@dataclass(frozen=True)
class FakeMig:
    """One simulated MIG slice as NVML (its own handle) and torch (a device of its own) report it."""

    uuid: str
    name: str = "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    memory: int = 10 * (1 << 30)
    sm_count: int = 16
    gi_slices: int = 1


@dataclass(frozen=True)
class FakeGpu:
    """One simulated GPU as both NVML and torch would report it; ``mig`` holds its MIG slots
    (None: an empty slot), MIG mode being on when there are any."""

    name: str = "NVIDIA H200"
    uuid: str = "GPU-11111111-2222-3333-4444-555555555555"
    pci_bus_id: str = "00000000:3B:00.0"
    memory: int = H200_MEMORY
    cc: tuple[int, int] = (9, 0)
    sm_count: int = 132
    bus_width: int = 6144
    max_sm_clock: int = 1980
    max_mem_clock: int = 3201
    power_limit_mw: int = 700_000
    driver: str = "580.65.06"
    cuda_driver: int = 13000
    unsupported: frozenset[str] = field(default_factory=frozenset)
    mig: tuple[FakeMig | None, ...] = ()


def _not_supported() -> pynvml.NVMLError:
    return pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


def _install_fake_gpus(
    monkeypatch: pytest.MonkeyPatch,
    gpus: list[FakeGpu],
    visible: list[int | tuple[int, int]],
    links: dict[tuple[int, int], str | int] | None = None,
) -> dict:
    """Patch pynvml and torch.cuda so ``gpus`` exist in NVML and ``visible`` in torch: an NVML
    index (a whole GPU) or ``(index, slot)`` (a MIG slice). ``links[(a, b)]`` is ``"NV"`` (NVLink
    peer-to-peer) or an NVML topology level; a pair without one is unsupported both ways.
    A whole GPU's handle is its index, a MIG slice's ``(index, slot)``.

    Returns a dict counting ``nvmlInit`` and ``nvmlShutdown`` calls.
    """
    calls = {"init": 0, "shutdown": 0}
    links = links or {}

    def check(handle: int, fn_name: str) -> FakeGpu:
        if fn_name in gpus[handle].unsupported:
            raise _not_supported()
        return gpus[handle]

    def getter(attr: str, fn_name: str):
        return lambda handle: getattr(check(handle, fn_name), attr)

    def init() -> None:
        calls["init"] += 1

    def shutdown() -> None:
        calls["shutdown"] += 1

    def mig_of(handle: tuple[int, int]) -> FakeMig:
        mig = gpus[handle[0]].mig[handle[1]]
        assert mig is not None
        return mig

    def uuid(handle: int | tuple[int, int]) -> str:
        return mig_of(handle).uuid if isinstance(handle, tuple) else check(handle, "nvmlDeviceGetUUID").uuid

    def memory_info(handle: int | tuple[int, int]) -> SimpleNamespace:
        if isinstance(handle, tuple):
            return SimpleNamespace(total=mig_of(handle).memory)
        return SimpleNamespace(total=check(handle, "nvmlDeviceGetMemoryInfo").memory)

    def attributes(handle: int | tuple[int, int]) -> SimpleNamespace:
        if not isinstance(handle, tuple):
            raise _not_supported()
        mig = mig_of(handle)
        return SimpleNamespace(
            multiprocessorCount=mig.sm_count,
            gpuInstanceSliceCount=mig.gi_slices,
            memorySizeMB=mig.memory >> 20,
        )

    def pci_info(handle: int) -> SimpleNamespace:
        return SimpleNamespace(busId=check(handle, "nvmlDeviceGetPciInfo").pci_bus_id.encode())

    def max_clock(handle: int, kind: int) -> int:
        gpu = check(handle, "nvmlDeviceGetMaxClockInfo")
        return gpu.max_sm_clock if kind == pynvml.NVML_CLOCK_SM else gpu.max_mem_clock

    def mig_mode(handle: int) -> list[int]:
        on = int(bool(check(handle, "nvmlDeviceGetMigMode").mig))
        return [on, on]

    def mig_handle(handle: int, slot: int) -> tuple[int, int]:
        if gpus[handle].mig[slot] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return handle, slot

    def link(a: int, b: int) -> str | int:
        found = links.get((a, b), links.get((b, a)))
        if found is None:
            raise _not_supported()
        return found

    def p2p(a: int, b: int, index: int) -> int:
        assert index == pynvml.NVML_P2P_CAPS_INDEX_NVLINK
        return pynvml.NVML_P2P_STATUS_OK if link(a, b) == "NV" else pynvml.NVML_P2P_STATUS_NOT_SUPPORTED

    def ancestor(a: int, b: int) -> int:
        found = link(a, b)
        return pynvml.NVML_TOPOLOGY_NODE if found == "NV" else int(found)

    patches = {
        "nvmlInit": init,
        "nvmlShutdown": shutdown,
        "nvmlDeviceGetCount": lambda: len(gpus),
        "nvmlDeviceGetHandleByIndex": lambda index: index,
        "nvmlDeviceGetName": getter("name", "nvmlDeviceGetName"),
        "nvmlDeviceGetUUID": uuid,
        "nvmlDeviceGetCudaComputeCapability": getter("cc", "nvmlDeviceGetCudaComputeCapability"),
        "nvmlDeviceGetMemoryBusWidth": getter("bus_width", "nvmlDeviceGetMemoryBusWidth"),
        "nvmlDeviceGetEnforcedPowerLimit": getter("power_limit_mw", "nvmlDeviceGetEnforcedPowerLimit"),
        "nvmlSystemGetDriverVersion": lambda: gpus[0].driver,
        "nvmlSystemGetCudaDriverVersion": lambda: gpus[0].cuda_driver,
        "nvmlDeviceGetMemoryInfo": memory_info,
        "nvmlDeviceGetAttributes": attributes,
        "nvmlDeviceGetPciInfo": pci_info,
        "nvmlDeviceGetMaxClockInfo": max_clock,
        "nvmlDeviceGetMigMode": mig_mode,
        "nvmlDeviceGetMaxMigDeviceCount": lambda handle: len(gpus[handle].mig),
        "nvmlDeviceGetMigDeviceHandleByIndex": mig_handle,
        "nvmlDeviceGetP2PStatus": p2p,
        "nvmlDeviceGetTopologyCommonAncestor": ancestor,
    }
    for name, fn in patches.items():
        monkeypatch.setattr(pynvml, name, fn)

    def props(ordinal: int) -> SimpleNamespace:
        seen = visible[ordinal]
        gpu = gpus[seen[0] if isinstance(seen, tuple) else seen]
        what: FakeGpu | FakeMig = mig_of(seen) if isinstance(seen, tuple) else gpu
        return SimpleNamespace(
            name=what.name,
            total_memory=what.memory,
            multi_processor_count=what.sm_count,
            major=gpu.cc[0],
            minor=gpu.cc[1],
            uuid=what.uuid[4:],  # torch prints the UUID without its GPU-/MIG- prefix
        )

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(visible))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return calls


def _no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_cpu_fingerprint_is_labelled_stable_and_json_serialisable(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_cuda(monkeypatch)
    first, second = fingerprint(), fingerprint()
    assert first["kind"] == "cpu"
    assert first["label"].strip()
    assert first["key"] == second["key"] and len(first["key"]) == 16
    assert first["device"]["physical_cores"] >= 1
    assert first["device"]["isa"] == torch.backends.cpu.get_cpu_capability()
    assert json.loads(json.dumps(first)) == first


def test_cpu_key_ignores_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_cuda(monkeypatch)
    before = fingerprint("cpu")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 97)
    after = fingerprint("cpu")
    assert after["device"]["torch_threads"] == 97
    assert after["key"] == before["key"]


def test_nvml_library_missing_falls_back_to_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_cuda(monkeypatch)

    def missing() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", missing)
    fp = fingerprint()
    assert fp["kind"] == "cpu"
    assert fp["nvml"] is None


def test_nvml_library_missing_with_cuda_keeps_torch_view(monkeypatch: pytest.MonkeyPatch) -> None:
    _install_fake_gpus(monkeypatch, [FakeGpu()], visible=[0])

    def missing() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", missing)
    fp = fingerprint()
    assert fp["kind"] == "cuda"
    assert fp["nvml"] is None
    assert "Not Found" in fp["nvml_error"]
    assert fp["device"]["name"] == "NVIDIA H200"
    assert fp["theoretical"]["bandwidth_bytes_per_s"] is None


def test_fake_gpu_fingerprint_reads_every_nvml_field(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _install_fake_gpus(monkeypatch, [FakeGpu()], visible=[0])
    fp = fingerprint(dtype="bfloat16")
    nvml = fp["nvml"]
    assert fp["kind"] == "cuda"
    assert fp["label"] == "NVIDIA H200 140GB"
    assert nvml == {
        "index": 0,
        "name": "NVIDIA H200",
        "uuid": "GPU-11111111-2222-3333-4444-555555555555",
        "pci_bus_id": "00000000:3B:00.0",
        "compute_capability": "9.0",
        "memory_total_bytes": H200_MEMORY,
        "memory_bus_width_bits": 6144,
        "max_sm_clock_mhz": 1980,
        "max_mem_clock_mhz": 3201,
        "power_limit_w": 700.0,
        "mig_mode": False,
        "driver_version": "580.65.06",
        "cuda_driver_version": "13.0",
    }
    assert fp["device"]["uuid"] == nvml["uuid"]
    assert fp["theoretical"]["bandwidth_bytes_per_s"] == 2 * 3201e6 * 6144 / 8
    assert fp["theoretical"]["dense_bf16_flops"] == 989.4e12
    assert fp["software"]["dtype"] == "bfloat16"
    assert calls == {"init": 1, "shutdown": 1}
    assert json.loads(json.dumps(fp)) == fp


def test_unsupported_nvml_fields_are_recorded_as_none(monkeypatch: pytest.MonkeyPatch) -> None:
    unsupported = frozenset(
        {"nvmlDeviceGetMemoryBusWidth", "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetMigMode"}
    )
    _install_fake_gpus(monkeypatch, [FakeGpu(unsupported=unsupported)], visible=[0])
    nvml = fingerprint()["nvml"]
    assert nvml["memory_bus_width_bits"] is None
    assert nvml["power_limit_w"] is None
    assert nvml["mig_mode"] is None
    assert nvml["max_mem_clock_mhz"] == 3201


def test_nvml_shutdown_runs_when_a_query_raises_unexpectedly(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _install_fake_gpus(monkeypatch, [FakeGpu()], visible=[0])

    def broken() -> int:
        raise RuntimeError("boom")

    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", broken)
    with pytest.raises(RuntimeError):
        fingerprint()
    assert calls["shutdown"] == 1


def test_fingerprint_picks_the_nvml_device_torch_sees(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = [
        FakeGpu(uuid=f"GPU-0000000{i}-2222-3333-4444-555555555555", pci_bus_id=f"00000000:{i + 1:02X}:00.0")
        for i in range(4)
    ]
    _install_fake_gpus(monkeypatch, gpus, visible=[3, 1])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert fingerprint("cuda:0")["nvml"]["index"] == 3
    assert fingerprint("cuda:1")["nvml"]["index"] == 1


def test_key_ignores_clocks_power_and_driver_but_not_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    base = FakeGpu()
    drifted = replace(base, driver="999.1", cuda_driver=13020, power_limit_mw=500_000, max_sm_clock=1500)
    smaller = replace(base, memory=base.memory // 2)
    keys = []
    for gpu in (base, drifted, smaller):
        _install_fake_gpus(monkeypatch, [gpu], visible=[0])
        keys.append(fingerprint()["key"])
    assert keys[0] == keys[1]
    assert keys[0] != keys[2]


def test_explicit_cuda_without_cuda_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_cuda(monkeypatch)
    with pytest.raises(RuntimeError):
        fingerprint("cuda")
    with pytest.raises(ValueError):
        fingerprint("cpu", dtype="float33")


def _four_gpus() -> list[NvmlIdentity]:
    return [
        NvmlIdentity(i, f"GPU-{i}aaaaaaa-0000-0000-0000-000000000000", f"00000000:{0x10 * (i + 1):02X}:00.0")
        for i in range(4)
    ]


def test_ordinal_mapping_follows_cuda_visible_devices() -> None:
    gpus = [replace(g, uuid=None, pci_bus_id=None) for g in _four_gpus()]
    assert map_torch_ordinal_to_nvml_index(0, gpus, cuda_visible_devices="3,1") == 3
    assert map_torch_ordinal_to_nvml_index(1, gpus, cuda_visible_devices="3,1") == 1
    assert map_torch_ordinal_to_nvml_index(2, gpus, cuda_visible_devices="3,1") is None
    assert map_torch_ordinal_to_nvml_index(1, gpus, cuda_visible_devices="2,-1,0") is None
    assert map_torch_ordinal_to_nvml_index(2, gpus) == 2


def test_ordinal_mapping_prefers_uuid_then_pci_over_environment() -> None:
    gpus = _four_gpus()
    by_uuid = map_torch_ordinal_to_nvml_index(
        0, gpus, torch_uuid="2aaaaaaa-0000-0000-0000-000000000000", cuda_visible_devices="0"
    )
    assert by_uuid == 2
    by_pci = map_torch_ordinal_to_nvml_index(0, gpus, torch_uuid="ffffffff", torch_pci_bus_id="0000:40:00.0")
    assert by_pci == 3


def test_ordinal_mapping_accepts_uuid_prefixes_in_cuda_visible_devices() -> None:
    gpus = _four_gpus()
    assert map_torch_ordinal_to_nvml_index(0, gpus, cuda_visible_devices="GPU-1aa") == 1
    assert map_torch_ordinal_to_nvml_index(0, gpus, cuda_visible_devices="MIG-1aa") is None


def test_parse_cpuinfo_counts_physical_cores_not_smt_siblings() -> None:
    blocks = [
        f"processor\t: {cpu}\nmodel name\t: Test CPU @ 3.0GHz\nphysical id\t: 0\ncore id\t\t: {cpu % 2}\n"
        for cpu in range(4)
    ]
    text = "\n".join(blocks)
    assert parse_cpuinfo(text) == {"model_name": "Test CPU @ 3.0GHz", "physical_cores": 2}
    assert parse_cpuinfo(text, allowed_cpus={0}) == {"model_name": "Test CPU @ 3.0GHz", "physical_cores": 1}
    assert parse_cpuinfo("processor : 0\nBogoMIPS : 50\n") == {"model_name": None, "physical_cores": None}


def test_parse_meminfo() -> None:
    assert parse_meminfo("MemTotal:       24684084 kB\nMemFree: 1 kB\n") == 24684084 * 1024
    assert parse_meminfo("") is None


def test_theoretical_bandwidth_a100_80gb_exact() -> None:
    assert theoretical_bandwidth_bytes_per_s(1593, 5120) == 2.03904e12
    assert theoretical_bandwidth_bytes_per_s(None, 5120) is None
    assert theoretical_bandwidth_bytes_per_s(1593, None) is None


@pytest.mark.parametrize(
    ("name", "flops"),
    [
        ("NVIDIA H100 80GB HBM3", 989.4e12),
        ("NVIDIA H100 PCIe", 756.5e12),
        ("NVIDIA H200", 989.4e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA L40S", 362.05e12),
        ("NVIDIA L4", 121e12),
        ("NVIDIA A10", 125e12),
        ("NVIDIA GeForce RTX 4090", 165.2e12),
        ("NVIDIA B200", 2250e12),
        ("NVIDIA L40", None),
        ("NVIDIA GH200 480GB", None),
        (None, None),
    ],
)
def test_theoretical_flops_lookup(name: str | None, flops: float | None) -> None:
    assert theoretical_flops(name) == flops


def test_nvml_call_missing_binding_function_is_none() -> None:
    assert nvml.nvml_call(pynvml, "nvmlDeviceGetSomethingFromTheFuture", 0) is None


# --- several GPUs, tensor parallelism and MIG ------------------------------------------------------

# The keys of a fingerprint with one device at tensor parallel size 1, as profiles already stored
# hold them: the multi-GPU fields must not move them.
ONE_H200_KEY = "45a455fe3ca5b097"
TEST_CPU_KEY = "18570e79202242f9"


def _eight_gpus() -> list[FakeGpu]:
    return [
        FakeGpu(uuid=f"GPU-{i}1111111-2222-3333-4444-555555555555", pci_bus_id=f"00000000:{i + 1:02X}:00.0")
        for i in range(8)
    ]


def _nvlink_everywhere() -> dict[tuple[int, int], str | int]:
    return {(a, b): "NV" for a in range(8) for b in range(a + 1, 8)}


def test_single_device_keys_are_the_stored_keys(monkeypatch: pytest.MonkeyPatch, cpu_fingerprint) -> None:
    _install_fake_gpus(monkeypatch, [FakeGpu()], visible=[0])
    one = fingerprint()
    assert one["key"] == ONE_H200_KEY
    assert (one["gpu_count"], one["tensor_parallel_size"], one["interconnect"]) == (1, 1, None)
    assert one["gpus"] == [
        {
            "ordinal": 0,
            "name": "NVIDIA H200",
            "memory_total_bytes": H200_MEMORY,
            "uuid": "GPU-11111111-2222-3333-4444-555555555555",
            "nvml_index": 0,
            "mig": None,
        }
    ]
    assert fingerprint(gpus=[0], tensor_parallel_size=1)["key"] == ONE_H200_KEY
    assert fingerprint(gpu_count=1)["key"] == ONE_H200_KEY
    cpu = cpu_fingerprint()
    assert cpu["key"] == TEST_CPU_KEY and (cpu["gpu_count"], cpu["gpus"]) == (0, [])


def test_each_tensor_parallel_size_has_its_own_key(monkeypatch: pytest.MonkeyPatch) -> None:
    _install_fake_gpus(monkeypatch, _eight_gpus(), visible=list(range(8)), links=_nvlink_everywhere())
    tp1, tp4, tp8 = (fingerprint(tensor_parallel_size=tp) for tp in (1, 4, 8))
    assert len({tp1["key"], tp4["key"], tp8["key"]}) == 3
    assert (tp4["gpu_count"], tp4["tensor_parallel_size"], tp4["interconnect"]) == (4, 4, "NV")
    assert tp4["label"] == "4x NVIDIA H200 140GB TP4" and tp1["label"] == "NVIDIA H200 140GB"
    assert [g["nvml_index"] for g in tp4["gpus"]] == [0, 1, 2, 3]
    assert fingerprint(gpus=[0, 1, 2, 3], tensor_parallel_size=4)["key"] == tp4["key"]
    assert fingerprint(gpu_count=4, tensor_parallel_size=4)["key"] == tp4["key"]
    # the same GPUs and tensor parallel size behind another NVML index are the same hardware
    assert fingerprint(gpus=[4, 5, 6, 7], tensor_parallel_size=4)["key"] == tp4["key"]
    # two GPUs, each a whole replica (data parallel), are not one GPU
    assert fingerprint(gpu_count=2)["key"] not in (tp1["key"], tp4["key"])
    assert json.loads(json.dumps(tp8)) == tp8


def test_interconnect_is_the_slowest_path_and_absent_where_nvml_cannot_say(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    links = {(0, 1): "NV", (0, 2): pynvml.NVML_TOPOLOGY_HOSTBRIDGE, (1, 2): pynvml.NVML_TOPOLOGY_SYSTEM}
    _install_fake_gpus(monkeypatch, _eight_gpus()[:3], visible=[0, 1, 2], links=links)
    assert fingerprint(gpus=[0, 1], tensor_parallel_size=2)["interconnect"] == "NV"
    assert fingerprint(gpus=[0, 2], tensor_parallel_size=2)["interconnect"] == "PHB"
    three = fingerprint(gpu_count=3, tensor_parallel_size=3)
    assert three["interconnect"] == "SYS"
    _install_fake_gpus(monkeypatch, _eight_gpus()[:3], visible=[0, 1, 2], links={})
    unknown = fingerprint(gpu_count=3, tensor_parallel_size=3)
    assert unknown["interconnect"] is None and unknown["key"] != three["key"]


def test_mixed_gpus_are_named_each_and_keyed_by_each(monkeypatch: pytest.MonkeyPatch) -> None:
    small = FakeGpu(name="NVIDIA H100", memory=80 * (1 << 30), uuid="GPU-9", pci_bus_id="00000000:09:00.0")
    _install_fake_gpus(monkeypatch, [FakeGpu(), small], visible=[0, 1], links={(0, 1): "NV"})
    fp = fingerprint(gpu_count=2, tensor_parallel_size=2)
    assert fp["label"] == "NVIDIA H200 140GB + NVIDIA H100 80GB TP2"
    _install_fake_gpus(
        monkeypatch, [FakeGpu(), replace(small, name="NVIDIA H200", memory=H200_MEMORY)], [0, 1]
    )
    assert fingerprint(gpu_count=2, tensor_parallel_size=2)["key"] != fp["key"]


def test_bad_gpu_sets_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    _install_fake_gpus(monkeypatch, _eight_gpus()[:4], visible=[0, 1, 2, 3])
    for kwargs in (
        {"gpu_count": 3, "tensor_parallel_size": 2},  # 2 does not divide 3
        {"gpus": [0, 0]},
        {"gpus": [0, 9]},
        {"gpus": [0], "gpu_count": 1},
        {"tensor_parallel_size": 0},
        {"tensor_parallel_size": 8},  # more GPUs than torch sees
    ):
        with pytest.raises(ValueError):
            fingerprint(**kwargs)
    with pytest.raises(ValueError, match="need a CUDA device"):
        fingerprint("cpu", gpus=[0])


def test_cpu_runs_at_tensor_parallel_size_above_one_have_their_own_key() -> None:
    with (
        mock.patch.object(hardware, "_cpu_device_fields", return_value=dict(CPU_DEVICE_FIELDS)),
        mock.patch.object(hardware, "_software_fields", return_value={**SOFTWARE_FIELDS, "dtype": "float32"}),
    ):
        tp2 = fingerprint("cpu", tensor_parallel_size=2)
    assert tp2["key"] != TEST_CPU_KEY and tp2["label"] == "Test CPU (2 cores) TP2"


H100_MEMORY = 80 * (1 << 30)
MIG_SLICES = (
    FakeMig("MIG-aaaaaaaa-0000-0000-0000-000000000000", memory=H100_MEMORY // 8),
    None,
    FakeMig(
        "MIG-bbbbbbbb-0000-0000-0000-000000000000",
        "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
        H100_MEMORY // 2,
        60,
        3,
    ),
)


def _h100_with_mig() -> FakeGpu:
    return FakeGpu(
        name="NVIDIA H100 80GB HBM3", memory=H100_MEMORY, bus_width=5120, max_mem_clock=2619, mig=MIG_SLICES
    )


def test_a_mig_slice_is_matched_by_its_own_uuid_with_its_own_memory_and_bandwidth(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _install_fake_gpus(monkeypatch, [FakeGpu(), _h100_with_mig()], visible=[(1, 2)])
    fp = fingerprint()
    parent_bandwidth = 2 * 2619e6 * 5120 / 8
    assert fp["gpus"][0]["mig"] == {
        "uuid": "MIG-bbbbbbbb-0000-0000-0000-000000000000",
        "memory_total_bytes": H100_MEMORY // 2,
        "multiprocessor_count": 60,
        "gpu_instance_slice_count": 3,
        "bandwidth_share": 0.5,
    }
    assert fp["nvml"]["index"] == 1 and fp["nvml"]["mig_mode"] is True and fp["gpus"][0]["nvml_index"] == 1
    assert fp["theoretical"]["bandwidth_bytes_per_s"] == parent_bandwidth / 2
    assert fp["label"] == "NVIDIA H100 80GB HBM3 MIG 3g.40gb 40GB" and fp["nvml_error"] is None
    assert hardware.nvml_selectors(fp) == ["MIG-bbbbbbbb-0000-0000-0000-000000000000"]
    # another slice of the same GPU is another device
    _install_fake_gpus(monkeypatch, [FakeGpu(), _h100_with_mig()], visible=[(1, 0)])
    small = fingerprint()
    assert small["gpus"][0]["mig"]["bandwidth_share"] == 0.125 and small["key"] != fp["key"]


def test_a_mig_slice_without_a_torch_uuid_is_found_by_cuda_visible_devices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _install_fake_gpus(monkeypatch, [_h100_with_mig()], visible=[(0, 0)])
    props = torch.cuda.get_device_properties

    def without_uuid(ordinal: int) -> SimpleNamespace:
        return SimpleNamespace(**{**vars(props(ordinal)), "uuid": None})

    monkeypatch.setattr(torch.cuda, "get_device_properties", without_uuid)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-aaaa")
    fp = fingerprint()
    assert fp["gpus"][0]["mig"]["uuid"] == "MIG-aaaaaaaa-0000-0000-0000-000000000000"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-ffff")  # names no slice: no NVML reading, a reason
    unmatched = fingerprint()
    assert unmatched["nvml"] is None and unmatched["nvml_error"] == "no NVML device matches CUDA device 0"


def test_select_devices_by_index_uuid_and_prefix() -> None:
    whole = [nvml.NvmlDevice(NvmlIdentity(i, f"GPU-{i}aaa-0000", None), i) for i in range(2)]
    mig = nvml.MigIdentity(1, 0, "MIG-0aab-0000")
    devices = [*whole, nvml.NvmlDevice(NvmlIdentity(1, mig.uuid, None), (1, 0), mig)]
    pick = nvml.select_devices
    assert [d.handle for d in pick(devices, [1, "0"])] == [1, 0]
    assert [d.handle for d in pick(devices, ["GPU-0a"])] == [0]  # GPU- names whole GPUs only
    assert [d.handle for d in pick(devices, ["MIG-0a"])] == [(1, 0)]
    assert pick(devices, ["0a"]) == []  # a bare prefix of a GPU and a slice names neither
    assert pick(devices, [7, "GPU-f"]) == []
