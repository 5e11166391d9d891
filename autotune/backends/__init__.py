"""Backends: where a trial runs.

- ``engine`` (the default): this project's engine, in process; seconds per trial. It is what
  ``autotune.study.evaluate`` runs when the context has no server backend, and it always
  profiles the device and warm-starts every other backend.
- ``vllm``: a real vLLM server per configuration (:mod:`autotune.backends.vllm`).
- ``llamacpp``: a real llama-server per configuration, on GGUF files converted from the pair
  (:mod:`autotune.backends.llamacpp`).

A serving-stack backend (:class:`autotune.backends.http_backend.HttpBackend`) is four parts, so SGLang or llama.cpp fit the same shape: a launcher
that turns a trial's knobs into the stack's own flags (taken from the exporter, so what is
tuned is byte-for-byte what is exported), a readiness probe and lifecycle
(:mod:`autotune.backends.server`), an OpenAI-compatible load driver
(:mod:`autotune.backends.openai_load`) and a metrics scraper
(:mod:`autotune.backends.prometheus`). Its ``evaluate`` returns the same dictionary as the
engine's, so the study, selection, schedule, store and report do not care which backend ran.
"""

from __future__ import annotations

from typing import Any, Protocol

BACKENDS = ("engine", "vllm", "llamacpp")

__all__ = ["BACKENDS", "ServerBackend", "open_backend"]


class ServerBackend(Protocol):
    """A serving stack that runs trials (see the module docstring)."""

    name: str
    default_trials: int  # study trials when backend.n_trials is null
    fixed_knobs: dict[str, Any]  # knobs the stack cannot express, and the value they are fixed at

    def evaluate(self, params: dict, seed: int) -> dict:
        """Run one configuration at every load level; the engine's result dictionary."""

    def describe(self) -> dict:
        """What measured a profile: stack name, version, launch command template, start-up times."""

    def close(self) -> None:
        """Stop every server this backend started."""


def open_backend(ctx: Any, name: str) -> ServerBackend | None:
    """The backend called ``name`` for a tuning context; None for the in-process engine."""
    if name == "engine":
        return None
    if name == "vllm":
        from autotune.backends.vllm import VllmBackend

        return VllmBackend(ctx)
    if name == "llamacpp":
        from autotune.backends.llamacpp import LlamacppBackend

        return LlamacppBackend(ctx)
    raise ValueError(f"unknown backend {name!r} (choose from {', '.join(BACKENDS)})")
