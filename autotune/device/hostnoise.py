"""Busy-host detection: how noisy is this host right now, before we measure anything on it.

Two kinds of evidence, recorded together in ``profile["host_noise"]``:

- the coefficient of variation (stdev / mean) of a fixed small reference workload (a 192x192
  float32 matmul chain, timed ``repeats`` times after a warm-up) on the host CPU;
- other processes' CPU use: the busy share of all cores from ``/proc/stat`` over a window of at
  least :data:`WINDOW_S` (the timings, then idle) minus this process's own share
  (``/proc/self/stat``), and ``/proc/loadavg``. ``/proc`` counts in clock ticks (10 ms), so a
  window as short as the timings alone reads one tick of anyone else as a large share of the
  cores (docs/decisions.md#host-noise-window);
- on NVIDIA hosts, the utilisation of each GPU (or MIG slice) the run uses and the compute
  processes on it other than this one (NVML: ``nvmlDeviceGetUtilizationRates``,
  ``nvmlDeviceGetComputeRunningProcesses``): another process computing on one of them makes the
  host busy (:data:`GPU_BUSY` utilisation before we start); GPUs the run does not use are not read.

The host counts as busy when other processes used more than :data:`OTHERS_BUSY` of the cores
during the window (steal time included: another VM on the same host counts) or another process
computes on a GPU. The CV is recorded and printed beside it; only where ``/proc`` is missing (not
Linux) does a CV above :data:`CV_BUSY` make the host busy (:func:`verdict` says why). The same /proc readers (:class:`CpuSample`) read the host around every study
trial (:mod:`autotune.search.guard`) and before a compile (:func:`others_now`).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from autotune.device import nvml

CV_BUSY = 0.10
"""Coefficient of variation of the reference workload above which a host without /proc counts as busy."""
OTHERS_BUSY = 0.25
"""Share of all cores used by other processes above which the host counts as busy."""
GPU_BUSY = 0.10
"""GPU utilisation (NVML, share of the last sample period) by others above which the host counts as busy."""
WINDOW_S = 0.5
"""Seconds of /proc accounting per check: 100 clock ticks per CPU-second, so 1% resolution on 2 CPUs."""


def gpu_activity(gpus: Sequence[int | str] | None = None) -> list[dict] | None:
    """Per NVIDIA GPU this run uses: ``{"index", "uuid", "utilization", "other_processes"}``; None
    without NVML.

    Another run on a GPU this one does not use cannot slow it, so only the run's GPUs are read:
    ``gpus`` as NVML names them (indices, ``GPU-``/``MIG-`` UUIDs or prefixes of them, e.g.
    :func:`autotune.device.hardware.nvml_selectors`); None reads the entries of
    ``CUDA_VISIBLE_DEVICES`` the same way, or every GPU where it is unset. A MIG slice is read on
    its own handle. ``utilization`` is NVML's share of the last sample period in which a kernel
    ran (0..1); ``other_processes`` counts compute processes on the GPU (or slice) that are not
    this one; either is None where NVML cannot report it (utilisation of a MIG slice).
    """
    selectors = gpus if gpus is not None else _visible_gpus()
    try:
        with nvml.session() as lib:
            with_mig = selectors is not None and any(str(s).lower().startswith("mig-") for s in selectors)
            devices = nvml.enumerate_devices(lib, with_mig=with_mig)
            used = (
                [d for d in devices if d.mig is None]
                if selectors is None
                else nvml.select_devices(devices, selectors)
            )
            return [_activity(lib, device) for device in used]
    except Exception:  # no library, no driver, a binding that breaks: nothing to report  # noqa: BLE001
        return None


def _visible_gpus() -> list[str] | None:
    """The GPUs ``CUDA_VISIBLE_DEVICES`` exposes to this run, as it names them; None where it is unset."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    return None if env is None else nvml.visible_device_entries(env)


def _activity(lib: ModuleType, device: nvml.NvmlDevice) -> dict:
    """One GPU's (or MIG slice's) utilisation and the compute processes on it other than this one."""
    procs = nvml.nvml_call(lib, "nvmlDeviceGetComputeRunningProcesses", device.handle)
    rates = nvml.nvml_call(lib, "nvmlDeviceGetUtilizationRates", device.handle)
    return {
        "index": device.identity.index,
        "uuid": device.identity.uuid,
        "utilization": rates.gpu / 100.0 if rates is not None else None,
        "other_processes": sum(1 for p in procs if p.pid != os.getpid()) if procs is not None else None,
    }


def _proc_stat(root: Path) -> tuple[int, int] | None:
    """(busy, total) jiffies over all cores from ``/proc/stat``, or None."""
    try:
        fields = (root / "stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return None
    values = [int(v) for v in fields]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values[:8]) - idle, sum(values[:8])


def _self_jiffies(root: Path) -> int | None:
    """CPU time of this process and of every process it started, in clock ticks: its own utime +
    stime, its waited-for children's (cutime + cstime), and every live descendant's utime + stime.
    Inductor's compile workers and a server the study launched are this run's work, not "other
    processes" (counted as others, a compile made a quiet host read busy right after it)."""
    try:
        fields = (root / "self" / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    own = int(fields[11]) + int(fields[12])
    if len(fields) > 14:
        own += int(fields[13]) + int(fields[14])
    return own + _descendants_jiffies(root, os.getpid())


def _descendants_jiffies(root: Path, pid: int) -> int:
    """utime + stime of the live processes below ``pid`` (0 where /proc has no per-process entries)."""
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    try:
        entries = [e for e in root.iterdir() if e.name.isdigit()]
    except OSError:
        return 0
    for entry in entries:
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            parent[int(entry.name)] = int(fields[1])
            ticks[int(entry.name)] = int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            continue  # a process that ended while we read
    total, frontier = 0, [pid]
    while frontier:
        below = [p for p, pp in parent.items() if pp in frontier]
        total += sum(ticks[p] for p in below)
        frontier = below
    return total


def _loadavg(root: Path) -> float | None:
    try:
        return float((root / "loadavg").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None


@dataclass(frozen=True)
class CpuSample:
    """One read of /proc's CPU counters: when (``time.monotonic``), all cores' (busy, total) jiffies,
    this process's jiffies and the 1-minute load average (None where /proc lacks them)."""

    at: float
    stat: tuple[int, int] | None
    own: int | None
    loadavg_1m: float | None

    @classmethod
    def read(cls, proc: str | Path = "/proc") -> CpuSample:
        root = Path(proc)
        return cls(time.monotonic(), _proc_stat(root), _self_jiffies(root), _loadavg(root))

    def since(self, start: CpuSample) -> dict:
        """The window from ``start`` to this sample: ``{"window_s", "others_cpu_share", "loadavg_1m",
        "cpus"}``, the keys :func:`measure` reports them under (the load average is this sample's).

        Example:
            >>> a = CpuSample(0.0, (100, 1000), 10, 0.5)
            >>> CpuSample(2.0, (500, 1400), 210, 1.4).since(a)["others_cpu_share"]
            0.5
        """
        others = None
        if self.stat and start.stat and self.own is not None and start.own is not None:
            others = others_share(
                self.stat[0] - start.stat[0], self.stat[1] - start.stat[1], self.own - start.own
            )
        return {
            "window_s": self.at - start.at,
            "others_cpu_share": others,
            "loadavg_1m": self.loadavg_1m,
            "cpus": os.cpu_count(),
        }


def others_now(window_s: float = WINDOW_S, proc: str | Path = "/proc") -> dict:
    """Other processes' CPU over the next ``window_s`` seconds, nothing timed (this process sleeps):
    the short check a decision takes before it spends minutes (:meth:`CpuSample.since`'s keys)."""
    start = CpuSample.read(proc)
    time.sleep(window_s)
    return CpuSample.read(proc).since(start)


def others_share(busy_delta: int, total_delta: int, self_delta: int) -> float:
    """Share of all cores' time used by other processes over a window (0 when nothing elapsed).

    Example:
        >>> others_share(busy_delta=150, total_delta=200, self_delta=100)
        0.25
    """
    if total_delta <= 0:
        return 0.0
    return max(busy_delta - self_delta, 0) / total_delta


def verdict(cv: float, others: float | None, gpus: list[dict] | None = None) -> tuple[bool, list[str]]:
    """(busy, reasons) from other processes' CPU share and GPU activity; from the reference CV only
    where /proc gives no CPU share (``others`` None).

    Busy means another process held a core (or the GPU) during the window: that is what slows and
    skews a trial. The reference CV alone is no evidence of it: sub-millisecond timings jitter with
    every interrupt, so a quiet host can read a CV far above :data:`CV_BUSY`
    (docs/decisions.md#host-busy-rule); it is recorded (``cv``) and printed, not a verdict, where
    /proc is read.

    Example:
        >>> verdict(0.02, 0.05)
        (False, [])
        >>> verdict(0.18, 0.05)  # a jittery reference on a host nobody else uses
        (False, [])
        >>> verdict(0.18, 0.60)
        (True, ['other processes used 60% of the CPU > 25%'])
        >>> verdict(0.18, None)  # no /proc: the CV is all there is
        (True, ['reference workload CV 18% > 10%'])
        >>> verdict(0.02, 0.05, [{"index": 0, "utilization": 0.9, "other_processes": 1}])
        (True, ['GPU 0 90% utilised by 1 other process(es)'])
        >>> verdict(0.02, 0.05, [{"index": 0, "uuid": "MIG-1a", "utilization": None, "other_processes": 2}])
        (True, ['MIG-1a used by 2 other process(es)'])
    """
    reasons = []
    if others is None and cv > CV_BUSY:
        reasons.append(f"reference workload CV {cv:.0%} > {CV_BUSY:.0%}")
    if others is not None and others > OTHERS_BUSY:
        reasons.append(f"other processes used {others:.0%} of the CPU > {OTHERS_BUSY:.0%}")
    for g in gpus or []:
        count, used = g["other_processes"], g["utilization"]
        if not count:
            continue
        uuid = str(g.get("uuid"))
        where = uuid if uuid.startswith("MIG-") else f"GPU {g['index']}"
        if used is None:  # a MIG slice reports no utilisation; another process on it shares its SMs
            reasons.append(f"{where} used by {count} other process(es)")
        elif used > GPU_BUSY:
            reasons.append(f"{where} {used:.0%} utilised by {count} other process(es)")
    return bool(reasons), reasons


def measure(
    repeats: int = 20,
    size: int = 192,
    proc: str | Path = "/proc",
    window_s: float = WINDOW_S,
    gpus: Sequence[int | str] | None = None,
) -> dict:
    """Time the reference workload ``repeats`` times and read /proc over at least ``window_s`` around it.

    Returns ``{"cv", "median_ms", "repeats", "window_s", "others_cpu_share", "loadavg_1m", "cpus",
    "gpus", "busy", "reasons", "thresholds"}`` (``gpus``: :func:`gpu_activity` of the run's GPUs,
    named as that function takes them; None without NVML).

    Example:
        >>> m = measure(repeats=3, size=16, window_s=0.05)
        >>> sorted(m)[:4], isinstance(m["busy"], bool)
        (['busy', 'cpus', 'cv', 'gpus'], True)
    """
    root = Path(proc)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen)
    b = torch.randn(size, size, generator=gen)

    def work() -> None:
        x = a
        for _ in range(4):
            x = torch.tanh(x @ b)

    for _ in range(3):
        work()
    start = CpuSample.read(root)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        work()
        samples.append(time.perf_counter() - t0)
    # /proc's ticks need the window, the CV not
    time.sleep(max(0.0, window_s - (time.monotonic() - start.at)))
    cpu = CpuSample.read(root).since(start)
    mean = statistics.fmean(samples)
    cv = statistics.stdev(samples) / mean if len(samples) > 1 and mean > 0 else 0.0
    activity = gpu_activity(gpus)
    busy, reasons = verdict(cv, cpu["others_cpu_share"], activity)
    return {
        "cv": cv,
        "median_ms": statistics.median(samples) * 1e3,
        "repeats": repeats,
        **cpu,
        "gpus": activity,
        "busy": busy,
        "reasons": reasons,
        "thresholds": {"cv": CV_BUSY, "others_cpu_share": OTHERS_BUSY, "gpu_utilization": GPU_BUSY},
    }


def threads_for(noise: dict, current: int) -> int:
    """torch intra-op threads for a run on this host: ``current``, or the cores other processes leave free.

    Intra-op threads wait for each other at the end of every op, so one thread sharing a core
    with a busy process stalls them all, and the whole run slows many times over
    (docs/decisions.md#threads-on-busy-host). When other processes use a measurable share of the
    cores, the run takes only the cores they leave (rounded, at least 1).

    Example:
        >>> threads_for({"others_cpu_share": 0.5, "cpus": 2}, current=2)
        1
        >>> threads_for({"others_cpu_share": 0.05, "cpus": 2}, current=2)
        2
        >>> threads_for({"others_cpu_share": None, "cpus": 2}, current=2)
        2
    """
    free = free_cores(noise)
    if free is None or noise["others_cpu_share"] <= OTHERS_BUSY:
        return current
    return min(current, max(1, int(free + 0.5)))


def free_cores(noise: Mapping[str, Any]) -> float | None:
    """Cores other processes left free over the window (None when /proc was not read).

    Example:
        >>> free_cores({"others_cpu_share": 0.24, "cpus": 2})
        1.52
    """
    others, cpus = noise.get("others_cpu_share"), noise.get("cpus")
    if others is None or not cpus:
        return None
    return cpus - others * cpus


def summary(noise: dict) -> str:
    """One line for people; a busy host's line starts with ``warning:``.

    Example:
        >>> summary({"cv": 0.03, "others_cpu_share": 0.1, "loadavg_1m": 1.2, "cpus": 2, "busy": False, "reasons": []})
        'host noise: reference CV 3.0%, other processes 10% of the CPU, load 1.20 on 2 CPUs: quiet'
        >>> summary({"cv": 0.3, "others_cpu_share": None, "loadavg_1m": None, "busy": True,
        ...          "reasons": ["reference workload CV 30% > 10%"]})[:60]
        'warning: busy host (reference workload CV 30% > 10%); host n'
    """
    others = noise.get("others_cpu_share")
    load = noise.get("loadavg_1m")
    text = (
        f"host noise: reference CV {noise['cv']:.1%}"
        + (f", other processes {others:.0%} of the CPU" if others is not None else "")
        + (f", load {load:.2f} on {noise.get('cpus')} CPUs" if load is not None else "")
    )
    if noise["busy"]:
        return (
            f"warning: busy host ({'; '.join(noise['reasons'])}); {text}; "
            "decisions may be noise (--strict refuses to store such a profile)"
        )
    return text + ": quiet"
