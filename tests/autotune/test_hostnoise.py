"""Busy-host detection (autotune.device.hostnoise) and what ``autotune tune`` does with it."""

from __future__ import annotations

import os
import sys
import types

import pytest

from autotune.device import hostnoise
from autotune.errors import BusyHostError
from autotune.jobs.tune import run_tune
from profiles.store import Store
from tests.autotune.fakes import backend_of, synthetic_run

SYNTHETIC = backend_of(synthetic_run)


def fake_noise(busy: bool) -> dict:
    reasons = ["reference workload CV 30% > 10%"] if busy else []
    return {
        "cv": 0.3 if busy else 0.02,
        "median_ms": 1.0,
        "repeats": 20,
        "others_cpu_share": 0.6 if busy else 0.0,
        "loadavg_1m": 2.5,
        "cpus": 2,
        "busy": busy,
        "reasons": reasons,
        "thresholds": {},
    }


def test_verdict_thresholds() -> None:
    assert hostnoise.verdict(0.05, 0.1) == (False, [])
    busy, reasons = hostnoise.verdict(0.05, 0.5)
    assert busy and reasons == ["other processes used 50% of the CPU > 25%"]
    assert hostnoise.verdict(0.2, None)[0]  # no /proc: the reference CV decides
    # with /proc, a jittery reference alone is no busy host (every quiet run on a 2-core VM read
    # CV 29-31%); a process holding a core is
    assert hostnoise.verdict(0.3, 0.02) == (False, [])
    assert hostnoise.verdict(0.3, 0.5)[1] == ["other processes used 50% of the CPU > 25%"]


def test_others_share_subtracts_this_process() -> None:
    assert hostnoise.others_share(100, 200, 100) == 0.0
    assert hostnoise.others_share(180, 200, 80) == 0.5
    assert hostnoise.others_share(5, 0, 0) == 0.0


def test_measure_reads_a_proc_folder(tmp_path) -> None:
    (tmp_path / "self").mkdir()
    (tmp_path / "stat").write_text("cpu  100 0 50 800 10 0 0 0 0 0\ncpu0 1 2 3 4\n")
    (tmp_path / "self" / "stat").write_text("123 (python (x)) R " + " ".join(["0"] * 10) + " 7 3 0 0\n")
    (tmp_path / "loadavg").write_text("1.50 1.00 0.50 2/100 999\n")
    m = hostnoise.measure(repeats=3, size=8, proc=tmp_path, window_s=0.0)
    assert m["loadavg_1m"] == 1.5 and m["others_cpu_share"] == 0.0 and m["repeats"] == 3
    assert m["cv"] >= 0 and isinstance(m["busy"], bool)
    missing = hostnoise.measure(repeats=2, size=8, proc=tmp_path / "nowhere", window_s=0.0)
    assert missing["others_cpu_share"] is None and missing["loadavg_1m"] is None


def _stat(pid: int, ppid: int, utime: int, stime: int, cutime: int = 0, cstime: int = 0) -> str:
    """A /proc/<pid>/stat line (fields after the command: state, ppid, ..., utime at 14, stime at 15)."""
    return f"{pid} (py) S {ppid} " + " ".join(["0"] * 9) + f" {utime} {stime} {cutime} {cstime} 0 0\n"


def test_this_runs_children_are_not_other_processes(tmp_path) -> None:
    """Inductor's compile workers or a launched server are this run's CPU: a host where only they
    work reads quiet (a compile once made the before-tuning check say busy on a quiet host)."""
    me = os.getpid()
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "stat").write_text(_stat(me, 1, 10, 5, cutime=7, cstime=3))
    for pid, ppid, ticks in ((900001, me, 40), (900002, 900001, 60), (900003, 1, 500)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(_stat(pid, ppid, ticks, 0))
    # own 10 + 5, reaped children 7 + 3, a worker 40 and its child 60; pid 900003 is someone else's
    assert hostnoise._self_jiffies(tmp_path) == 125


def test_proc_is_read_over_a_window_of_many_clock_ticks() -> None:
    # /proc counts 10 ms ticks; the timings alone take ~7 ms, where one tick of any other process
    # read as "50% of 2 CPUs" and sized torch's threads down on a quiet host. 0.5 s = 100 ticks/CPU.
    m = hostnoise.measure(repeats=3, size=8)
    assert hostnoise.WINDOW_S >= 0.5 and m["window_s"] >= hostnoise.WINDOW_S


def test_busy_host_warns_and_is_recorded(tune_config, monkeypatch) -> None:
    monkeypatch.setattr(hostnoise, "measure", lambda gpus=None: fake_noise(True))
    said: list[str] = []
    profile = run_tune(tune_config(), say=said.append, backend_for=SYNTHETIC)
    assert profile["host_noise"]["busy"] is True and profile["host_noise"]["before"]["cv"] == 0.3
    assert sum(line.startswith("warning: busy host") for line in said) == 2  # before and after the study


def test_strict_refuses_to_store_a_profile_from_a_busy_host(tune_config, monkeypatch) -> None:
    cfg = tune_config()
    calls = iter([fake_noise(False), fake_noise(True)])  # quiet at the start, busy by the end
    monkeypatch.setattr(hostnoise, "measure", lambda gpus=None: next(calls))
    with pytest.raises(BusyHostError, match="--strict: busy host after the study"):
        run_tune(cfg, say=lambda _: None, strict=True, backend_for=SYNTHETIC)
    assert Store(cfg.storage.url).list_profiles() == []


def test_quiet_host_with_strict_stores(tune_config, monkeypatch) -> None:
    monkeypatch.setattr(hostnoise, "measure", lambda gpus=None: fake_noise(False))
    profile = run_tune(tune_config(), say=lambda _: None, strict=True, backend_for=SYNTHETIC)
    assert profile["host_noise"]["busy"] is False and profile["id"]


def test_a_timeout_that_cuts_the_study_short_makes_the_choice_provisional(tune_config, monkeypatch) -> None:
    import time

    def slow(cfg, knobs, seed):
        time.sleep(0.05)
        return synthetic_run(cfg, knobs, seed)

    said: list[str] = []
    cfg = tune_config(budget={"timeout_s": 0.01, "n_trials": 3, "repeats": 1})
    profile = run_tune(cfg, say=said.append, backend_for=backend_of(slow))
    assert profile["study"]["provisional"] is True
    assert profile["study"]["trials_run"] == 1 and profile["study"]["trials_planned"] == 3
    assert any("stopped the study after 1 of 3 trials; the choice is provisional" in line for line in said)


def test_a_study_that_runs_all_its_trials_is_not_provisional(tune_config, monkeypatch) -> None:
    profile = run_tune(tune_config(budget={"n_trials": 3}), say=lambda _: None, backend_for=SYNTHETIC)
    assert profile["study"]["provisional"] is False and profile["study"]["trials_run"] == 3


class _FakeNvml:
    """pynvml's calls gpu_activity makes, over a table of GPUs {index: (utilisation %, [pids])} and
    MIG slices {(index, slot): [pids]} (a GPU with slices is in MIG mode; a slice reports no
    utilisation). GPU i's UUID is ``GPU-i0000000-aaaa``, slice (i, s)'s ``MIG-is000000-bbbb``."""

    class NVMLError(Exception):
        pass

    def __init__(
        self, gpus: dict[int, tuple[int, list[int]]], migs: dict[tuple[int, int], list[int]] | None = None
    ) -> None:
        self.gpus, self.migs, self.shut = gpus, migs or {}, False

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int | tuple[int, int]) -> str:
        return f"MIG-{h[0]}{h[1]}000000-bbbb" if isinstance(h, tuple) else f"GPU-{h}0000000-aaaa"

    def nvmlDeviceGetMigMode(self, h: int) -> list[int]:
        on = int(any(parent == h for parent, _ in self.migs))
        return [on, on]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: int) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: int, slot: int) -> tuple[int, int]:
        if (h, slot) not in self.migs:
            raise self.NVMLError("Not Found")
        return h, slot

    def nvmlDeviceGetUtilizationRates(self, h: int | tuple[int, int]):
        if isinstance(h, tuple):
            raise self.NVMLError("Not Supported")
        return types.SimpleNamespace(gpu=self.gpus[h][0], memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, h: int | tuple[int, int]):
        pids = self.migs[h] if isinstance(h, tuple) else self.gpus[h][1]
        return [types.SimpleNamespace(pid=p) for p in pids]


def test_gpu_activity_counts_other_processes_and_makes_the_host_busy(monkeypatch) -> None:
    fake = _FakeNvml({0: (85, [os.getpid(), 4242]), 1: (0, [os.getpid()])})
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = hostnoise.gpu_activity()
    assert gpus == [
        {"index": 0, "uuid": "GPU-00000000-aaaa", "utilization": 0.85, "other_processes": 1},
        {"index": 1, "uuid": "GPU-10000000-aaaa", "utilization": 0.0, "other_processes": 0},
    ]
    assert fake.shut
    busy, reasons = hostnoise.verdict(0.01, 0.0, gpus)
    assert busy and reasons == ["GPU 0 85% utilised by 1 other process(es)"]
    # our own process keeping a GPU busy is not "another process"
    assert hostnoise.verdict(0.01, 0.0, [{"index": 0, "utilization": 0.99, "other_processes": 0}]) == (
        False,
        [],
    )


def test_only_the_gpus_this_run_uses_are_checked(monkeypatch) -> None:
    """Another job on GPU 0 cannot slow a run on GPU 1: the run reads GPU 1 alone."""
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml({0: (90, [4242]), 1: (0, []), 2: (0, [])}))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for used in ([1], ["1"], ["GPU-1"], ["GPU-10000000-aaaa"]):
        gpus = hostnoise.gpu_activity(used)
        assert [g["index"] for g in gpus] == [1] and hostnoise.verdict(0.01, 0.0, gpus) == (False, [])
    assert [g["index"] for g in hostnoise.gpu_activity([2, 0])] == [2, 0]
    assert hostnoise.gpu_activity(["GPU-f", 7]) == []  # names no GPU of this host
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2")  # the default: the GPUs CUDA exposes to this run
    assert [g["index"] for g in hostnoise.gpu_activity()] == [1, 2]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-0")
    assert hostnoise.verdict(0.01, 0.0, hostnoise.gpu_activity())[0]
    assert hostnoise.measure(repeats=3, size=8, gpus=[1])["gpus"] == hostnoise.gpu_activity([1])


def test_a_mig_slice_is_busy_when_another_process_runs_on_it(monkeypatch) -> None:
    me = os.getpid()
    migs = {(0, 0): [me], (0, 1): [4242]}
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml({0: (0, [me, 4242])}, migs))
    mine = hostnoise.gpu_activity(["MIG-00000000-bbbb"])
    assert mine == [{"index": 0, "uuid": "MIG-00000000-bbbb", "utilization": None, "other_processes": 0}]
    assert hostnoise.verdict(0.01, 0.0, mine) == (False, [])
    shared = hostnoise.gpu_activity(["MIG-01"])
    assert hostnoise.verdict(0.01, 0.0, shared) == (True, ["MIG-01000000-bbbb used by 1 other process(es)"])


def test_gpu_activity_is_none_without_nvml(monkeypatch) -> None:
    class Broken:
        def nvmlInit(self):
            raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", Broken())
    assert hostnoise.gpu_activity() is None
    assert hostnoise.measure(repeats=3, size=8)["gpus"] is None


def test_a_busy_host_runs_on_the_cores_left_and_records_it(tune_config, monkeypatch) -> None:
    """Other processes on 60% of 2 CPUs: the run takes 1 thread, says so, records it, restores torch after."""
    import torch

    monkeypatch.setattr(hostnoise, "measure", lambda gpus=None: fake_noise(True))
    torch.set_num_threads(2)
    seen: list[int] = []

    def run(cfg, knobs, seed):
        seen.append(torch.get_num_threads())
        return synthetic_run(cfg, knobs, seed)

    said: list[str] = []
    profile = run_tune(tune_config(), say=said.append, backend_for=backend_of(run))
    assert set(seen) == {1}  # every trial ran on the one free core
    assert torch.get_num_threads() == 2  # restored for whoever runs next in this process
    assert any(
        line.startswith("host: other processes use 60% of 2 CPUs; torch threads 2 -> 1") for line in said
    )
    assert profile["host_noise"]["before"]["torch_threads"] == 1
    assert "torch_threads" not in profile["workload"]  # same identity: --resume works across host states


def test_threads_for_keeps_the_default_on_a_quiet_or_unknown_host() -> None:
    assert hostnoise.threads_for({"others_cpu_share": 0.0, "cpus": 8}, 8) == 8
    assert hostnoise.threads_for({"others_cpu_share": 0.75, "cpus": 8}, 8) == 2
    assert hostnoise.threads_for({"others_cpu_share": 0.99, "cpus": 2}, 2) == 1  # never 0
    assert hostnoise.threads_for({"others_cpu_share": 0.5, "cpus": 16}, 4) == 4  # never more than asked
    assert hostnoise.threads_for({"cpus": 2}, 2) == 2
