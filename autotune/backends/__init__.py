"""Backends: where a trial runs. Each implements :class:`autotune.backends.base.Backend`.

- ``engine`` (the default): this project's engine, in process; seconds per trial
  (:mod:`autotune.backends.engine`). The engine also profiles the device and warm-starts every
  other backend.
- ``vllm``: a real vLLM server per configuration (:mod:`autotune.backends.vllm`).
- ``llamacpp``: a real llama-server per configuration, on GGUF files converted from the pair
  (:mod:`autotune.backends.llamacpp`).

A serving-stack backend (:class:`autotune.backends.http_backend.HttpBackend`) is four parts, so
SGLang or another stack fits the same shape: a launcher that turns a trial's knobs into the
stack's own flags (taken from the exporter, so what is tuned is byte-for-byte what is exported),
a readiness probe and lifecycle (:mod:`autotune.backends.server`), an OpenAI-compatible load
driver (:mod:`autotune.backends.openai_load`) and a metrics scraper
(:mod:`autotune.backends.prometheus`). Every backend runs a trial's load levels through the one
loop :func:`autotune.backends.base.run_levels` and returns the same
:class:`autotune.records.TrialResult`, so the study, selection, schedule, store and report do
not care which backend ran.
"""

from __future__ import annotations

from autotune.backends.base import Backend, TrialBudget, run_levels
from autotune.config import BACKENDS
from autotune.context import Context

__all__ = ["BACKENDS", "Backend", "TrialBudget", "open_backend", "run_levels"]


def open_backend(ctx: Context) -> Backend:
    """The backend ``backend.name`` names, for a tuning context (a missing stack fails here, in seconds)."""
    name = ctx.cfg.backend.name
    if name == "engine":
        from autotune.backends.engine import EngineBackend

        return EngineBackend(ctx)
    if name == "vllm":
        from autotune.backends.vllm import VllmBackend

        return VllmBackend(ctx)
    if name == "llamacpp":
        from autotune.backends.llamacpp import LlamacppBackend

        return LlamacppBackend(ctx)
    raise ValueError(f"unknown backend {name!r} (choose from {', '.join(BACKENDS)})")
