"""Tests for autotune.device.ceilings and the timing helpers in autotune.device.timing (no wall-clock asserts)."""

from __future__ import annotations

import json

import pytest
import torch

from autotune.device import timing
from autotune.device.ceilings import measure_ceilings, ridge_point
from autotune.device.timing import measure_stable, summarize, time_fn

CPU = torch.device("cpu")


class FakeClock:
    """A ``perf_counter`` stand-in that a timed function advances by scripted durations."""

    def __init__(self, durations: list[float]) -> None:
        self.now = 0.0
        self.durations = list(durations)
        self.calls = 0

    def perf_counter(self) -> float:
        return self.now

    def work(self) -> None:
        self.now += self.durations[self.calls]
        self.calls += 1


def test_quick_ceilings_are_positive_and_ridge_is_their_ratio() -> None:
    c = measure_ceilings(CPU, quick=True)
    copy, matmul = c["copy_bandwidth"], c["matmul"]
    assert copy["median_bytes_per_s"] > 0 and matmul["median_flops"] > 0
    assert c["ridge_flops_per_byte"] == matmul["median_flops"] / copy["median_bytes_per_s"]
    assert copy["bytes"] > 0 and copy["median_s"] > 0 and matmul["median_s"] > 0
    assert copy["median_bytes_per_s"] == copy["bytes"] / copy["median_s"]
    assert matmul["flops"] == 2 * matmul["n"] ** 3
    assert matmul["dtype"] == "float32"
    assert isinstance(copy["noisy"], bool) and isinstance(matmul["noisy"], bool)
    assert json.loads(json.dumps(c)) == c


def test_quick_ceilings_honour_dtype() -> None:
    assert measure_ceilings(CPU, dtype=torch.bfloat16, quick=True)["matmul"]["dtype"] == "bfloat16"


def test_ceilings_reject_other_devices() -> None:
    with pytest.raises(ValueError):
        measure_ceilings(torch.device("meta"), quick=True)


def test_ridge_point() -> None:
    assert ridge_point(1000.0, 4.0) == 250.0


def test_summarize_median_and_iqr() -> None:
    assert summarize([5.0, 1.0, 4.0, 2.0, 3.0]) == {"median": 3.0, "iqr": 2.0, "iqr_rel": 2.0 / 3.0}
    assert summarize([2.0]) == {"median": 2.0, "iqr": 0.0, "iqr_rel": 0.0}
    with pytest.raises(ValueError):
        summarize([])


def test_time_fn_times_each_repeat_after_warmup(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock([9.0, 1.0, 2.0, 3.0])
    monkeypatch.setattr(timing.time, "perf_counter", clock.perf_counter)
    assert time_fn(clock.work, CPU, warmup=1, repeats=3) == [1.0, 2.0, 3.0]
    with pytest.raises(ValueError):
        time_fn(clock.work, CPU, repeats=0)


def test_measure_stable_retakes_noisy_samples_once(monkeypatch: pytest.MonkeyPatch) -> None:
    noisy, steady = [1.0, 1.0, 2.0, 3.0, 1.0], [1.0] * 5
    clock = FakeClock(noisy + steady)
    monkeypatch.setattr(timing.time, "perf_counter", clock.perf_counter)
    m = measure_stable(clock.work, CPU, warmup=0, repeats=5)
    assert (m["attempts"], m["noisy"], m["median"]) == (2, False, 1.0)


def test_measure_stable_flags_persistent_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    noisy = [1.0, 1.0, 2.0, 3.0, 1.0]
    clock = FakeClock(noisy * 2)
    monkeypatch.setattr(timing.time, "perf_counter", clock.perf_counter)
    m = measure_stable(clock.work, CPU, warmup=0, repeats=5)
    assert (m["attempts"], m["noisy"], m["repeats"]) == (2, True, 5)


def test_measure_stable_keeps_quiet_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock([1.0, 1.02, 0.99, 1.01, 1.0])
    monkeypatch.setattr(timing.time, "perf_counter", clock.perf_counter)
    m = measure_stable(clock.work, CPU, warmup=0, repeats=5)
    assert (m["attempts"], m["noisy"], clock.calls) == (1, False, 5)
