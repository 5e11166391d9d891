"""Tests for autotune.device.hardware: CPU fingerprint, NVML fallbacks, ordinal mapping, key stability."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import pynvml
import pytest
import torch

from autotune.device import hardware
from autotune.device.hardware import (
    NvmlIdentity,
    fingerprint,
    map_torch_ordinal_to_nvml_index,
    parse_cpuinfo,
    parse_meminfo,
    theoretical_bandwidth_bytes_per_s,
    theoretical_flops,
)

H200_MEMORY = 143771 * (1 << 20)


@dataclass(frozen=True)
class FakeGpu:
    """One simulated GPU as both NVML and torch would report it."""

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


def _install_fake_gpus(monkeypatch: pytest.MonkeyPatch, gpus: list[FakeGpu], visible: list[int]) -> dict:
    """Patch pynvml and torch.cuda so ``gpus`` exist in NVML and ``visible`` (NVML indices) in torch.

    Returns a dict counting ``nvmlInit`` and ``nvmlShutdown`` calls.
    """
    calls = {"init": 0, "shutdown": 0}

    def check(handle: int, fn_name: str) -> FakeGpu:
        if fn_name in gpus[handle].unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpus[handle]

    def getter(attr: str, fn_name: str):
        return lambda handle: getattr(check(handle, fn_name), attr)

    def init() -> None:
        calls["init"] += 1

    def shutdown() -> None:
        calls["shutdown"] += 1

    patches = {
        "nvmlInit": init,
        "nvmlShutdown": shutdown,
        "nvmlDeviceGetCount": lambda: len(gpus),
        "nvmlDeviceGetHandleByIndex": lambda index: index,
        "nvmlDeviceGetName": getter("name", "nvmlDeviceGetName"),
        "nvmlDeviceGetUUID": getter("uuid", "nvmlDeviceGetUUID"),
        "nvmlDeviceGetCudaComputeCapability": getter("cc", "nvmlDeviceGetCudaComputeCapability"),
        "nvmlDeviceGetMemoryBusWidth": getter("bus_width", "nvmlDeviceGetMemoryBusWidth"),
        "nvmlDeviceGetEnforcedPowerLimit": getter("power_limit_mw", "nvmlDeviceGetEnforcedPowerLimit"),
        "nvmlSystemGetDriverVersion": lambda: gpus[0].driver,
        "nvmlSystemGetCudaDriverVersion": lambda: gpus[0].cuda_driver,
    }
    for name, fn in patches.items():
        monkeypatch.setattr(pynvml, name, fn)

    def memory_info(handle: int) -> SimpleNamespace:
        return SimpleNamespace(total=check(handle, "nvmlDeviceGetMemoryInfo").memory)

    def pci_info(handle: int) -> SimpleNamespace:
        return SimpleNamespace(busId=check(handle, "nvmlDeviceGetPciInfo").pci_bus_id.encode())

    def max_clock(handle: int, kind: int) -> int:
        gpu = check(handle, "nvmlDeviceGetMaxClockInfo")
        return gpu.max_sm_clock if kind == pynvml.NVML_CLOCK_SM else gpu.max_mem_clock

    def mig_mode(handle: int) -> list[int]:
        check(handle, "nvmlDeviceGetMigMode")
        return [0, 0]

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", memory_info)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPciInfo", pci_info)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMaxClockInfo", max_clock)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMigMode", mig_mode)

    def props(ordinal: int) -> SimpleNamespace:
        gpu = gpus[visible[ordinal]]
        return SimpleNamespace(
            name=gpu.name,
            total_memory=gpu.memory,
            multi_processor_count=gpu.sm_count,
            major=gpu.cc[0],
            minor=gpu.cc[1],
            uuid=gpu.uuid.removeprefix("GPU-"),  # torch prints the UUID without the prefix
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
    assert hardware._nvml_call(pynvml, "nvmlDeviceGetSomethingFromTheFuture", 0) is None
