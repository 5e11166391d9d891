"""Measuring the host: who the device is, what it can do, whether it is busy, and how the pair runs on it.

Modules: :mod:`~autotune.device.hardware` (the fingerprint and its key), :mod:`~autotune.device.timing`
(timers), :mod:`~autotune.device.ceilings` (roofline ceilings), :mod:`~autotune.device.hostnoise`
(other processes on the host), :mod:`~autotune.device.profiler` (verify and draft curves, acceptance
samples), :mod:`~autotune.device.classify` (memory- or compute-bound per batch size),
:mod:`~autotune.device.sizing` (the load sweep ``autotune init`` writes: batch sizes up to where the
target's decode throughput saturates).
"""

__all__ = ["ceilings", "classify", "hardware", "hostnoise", "profiler", "sizing", "timing"]
