"""What every serving-stack backend shares: one server per flag set, the workload over HTTP, the counters.

A stack's backend subclasses :class:`HttpBackend` and supplies its launch command for a trial's
knobs (``command``), its Prometheus counter prefix, extra request fields and server environment.
:meth:`HttpBackend.run` then does the rest the same way for every stack: start (or reuse) the
server, warm it up, run each load level of the workload (the shared loop
:func:`autotune.backends.base.run_levels`) with a ``/metrics`` scrape before and after, and
return the same :class:`autotune.records.TrialResult` as the engine.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from autotune.backends.base import TrialBudget, run_levels
from autotune.backends.openai_load import Endpoint, LoadError, run_http_load
from autotune.backends.prometheus import spec_counts
from autotune.backends.server import ServerError, ServerProcess
from autotune.config import LoadLevel, TuneConfig
from autotune.context import Context
from autotune.device.capacity import Need
from autotune.knobs import Knobs
from autotune.records import TrialResult
from profiles.deployment import Deployment
from profiles.profile import TOOL_VERSION, ExportInputs


def trial_inputs(
    cfg: TuneConfig,
    fingerprint: dict,
    knobs: Knobs,
    target: str | None = None,
    draft: str | None = None,
    deployment: Deployment | None = None,
) -> ExportInputs:
    """The exporters' inputs for one trial's knobs: one gamma at every batch size.

    ``target``/``draft`` replace the pair's folders (llama.cpp loads GGUF files).
    """
    drafter = knobs.drafter
    gamma = 0 if drafter == "none" else knobs.gamma
    ngram = drafter == "ngram"
    return ExportInputs(
        tool_version=TOOL_VERSION,
        created_at="",
        device_label=fingerprint.get("label", ""),
        device_key=fingerprint.get("key", ""),
        target=target or str(cfg.models.target),
        draft=_draft_folder(cfg, drafter, draft),
        drafter=drafter,
        gamma=gamma,
        confidence_threshold=knobs.confidence_threshold,
        gamma_schedule=knobs.gamma_policy,
        prompt_lookup_min=cfg.search.ngram_min if ngram else None,
        prompt_lookup_max=cfg.search.ngram_max if ngram else None,
        schedule=knobs.table if knobs.table and gamma else ((max(cfg.batch_sizes), gamma),),
        max_batch_size=knobs.max_batch_size,
        deployment=deployment,
    )


def _draft_folder(cfg: TuneConfig, drafter: str, draft: str | None) -> str | None:
    """The folder a stack drafts with: the draft model (or ``draft``, its stack-specific file), the
    EAGLE-3 head for ``eagle3`` (vLLM loads the head folder as the tuner does), none for n-grams."""
    if drafter == "model" and cfg.models.draft:
        return draft or str(cfg.models.draft)
    if drafter == "eagle3" and cfg.models.eagle3:
        return draft or str(cfg.models.eagle3)
    return None


class HttpBackend:
    """A serving stack driven over its OpenAI-compatible API (see the module docstring)."""

    name = "http"
    default_trials = 6  # study trials when backend.n_trials is null (each one a server start)
    metrics_prefix = ""
    fixed_knobs: Mapping[str, Any] = {}  # knobs the stack cannot express, and the value they are fixed at
    extra_body: tuple[tuple[str, object], ...] = ()
    startup_timeout_s = 600.0

    keep_servers = 1  # servers kept alive between runs (the current one and idle ones, newest kept)
    serves_table = False  # a stack that takes a by-batch-size K table says so (vLLM)
    skips_drafter_at_k0 = False  # a stack whose table K=0 runs no drafter says so (vLLM with the plugin)
    plans_by_cost = False  # a stack whose server starts take minutes says so (vLLM)
    deployment: Deployment | None = None  # the stack's server flags (set by the stack's backend)

    def server_need(self) -> Need | None:
        """What one server holds (None: unknown; a stack that can say overrides this)."""
        return None

    def __init__(self, ctx: Context, log_dir: Path) -> None:
        self.ctx = ctx
        self.cfg: TuneConfig = ctx.cfg
        self.log_dir = log_dir
        self.server: ServerProcess | None = None
        self.startups: list[float] = []
        self._command: list[str] | None = None
        self._idle: list[tuple[list[str], ServerProcess]] = []  # kept alive, oldest first
        self._starts = 0

    # what a stack supplies --------------------------------------------------------------------
    def command(self, knobs: Knobs) -> list[str]:
        """The launch command for a trial's knobs (``{port}`` is filled in at start)."""
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return {}

    def model_name(self) -> str:
        return str(self.cfg.models.target)

    def on_started(self, server: ServerProcess) -> None:
        """Called once per new server, after it is healthy (e.g. to read the stack's version)."""

    # shared -----------------------------------------------------------------------------------
    def remeasure_order(self, n_configs: int) -> str:
        """Interleaved when every configuration's server stays alive, else back to back in each
        configuration's server (alternating would restart a server every run)."""
        return "interleaved" if n_configs <= self.keep_servers else "back-to-back per server"

    def server_for(self, command: list[str]) -> ServerProcess:
        """The running server for ``command``: the current or a kept idle one when its flags are
        identical, else a new one. The current server is kept idle (up to ``keep_servers`` alive in
        all, the oldest stopped first, before the new one starts)."""
        if self.server is not None and self.server.alive() and self._command == command:
            return self.server
        if self.server is not None and self._command is not None and self.server.alive():
            self._idle.append((self._command, self.server))
            self.server, self._command = None, None
        self.drop_current()  # a dead one
        kept = next((i for i, (cmd, srv) in enumerate(self._idle) if cmd == command and srv.alive()), None)
        if kept is not None:
            self._command, self.server = self._idle.pop(kept)
            return self.server
        for _, srv in [x for x in self._idle if not x[1].alive()]:
            srv.stop()
        self._idle = [x for x in self._idle if x[1].alive()]
        while self._idle and len(self._idle) >= self.keep_servers:
            self._idle.pop(0)[1].stop()
        self._starts += 1
        log = self.log_dir / f"{self.name}-{os.getpid()}-{self._starts}.log"
        self.server = ServerProcess(command, log, env=self.env(), startup_timeout_s=self.startup_timeout_s)
        self._command = command
        self.server.start()
        assert self.server.startup_s is not None  # start() returned: the server is up, its start-up timed
        self.startups.append(self.server.startup_s)
        self.on_started(self.server)
        return self.server

    def close(self) -> None:
        """Stop every server: the running one and the idle ones."""
        self.drop_current()
        while self._idle:
            self._idle.pop()[1].stop()

    def drop_current(self) -> None:
        """Stop the running server (a broken one is never kept or reused)."""
        if self.server is not None:
            self.server.stop()
        self.server, self._command = None, None

    def endpoint(self, server: ServerProcess) -> Endpoint:
        return Endpoint(server.base_url, self.model_name(), extra_body=self.extra_body)

    def budget(self) -> TrialBudget:
        """``backend.n_trials`` (else the stack's default: each trial is a server start) and ``backend.timeout_s``."""
        return TrialBudget(
            self.cfg.backend.n_trials or self.default_trials, self.cfg.backend.timeout_s, "backend"
        )

    def prepare(self, knobs: Knobs) -> None:
        """Start the server of ``knobs`` (or keep the live one with the same flags)."""
        if knobs.is_table and not self.serves_table:
            raise ValueError(f"{self.name} serves no by-batch-size table ({knobs.label})")
        self.server_for(self.command(knobs))

    def run(
        self, knobs: Knobs, seed: int, with_trace: bool = False, levels: Collection[int] | None = None
    ) -> TrialResult:
        """One configuration at every load level (or at ``levels``) in one server (started or reused)."""
        if knobs.is_table and not self.serves_table:
            raise ValueError(f"{self.name} serves no by-batch-size table ({knobs.label})")
        return self.run_command(
            self.command(knobs), knobs.max_batch_size, seed, with_trace=with_trace, levels=levels
        )

    def run_command(
        self,
        command: list[str],
        max_batch_size: int,
        seed: int,
        records: dict | None = None,
        with_trace: bool = False,
        levels: Collection[int] | None = None,
    ) -> TrialResult:
        """The workload's load levels (those at ``levels``, where given; with ``with_trace`` then its
        arrival trace) against the server of ``command``; ``records`` collects each level's requests."""
        cfg = self.cfg
        server = self.server_for(command)
        endpoint = self.endpoint(server)

        def run_level(level: LoadLevel, left: float | None) -> dict:
            before = spec_counts(server.get("/metrics"), self.metrics_prefix)
            run = run_http_load(
                endpoint,
                self.ctx.requests,
                len(level.trace) if level.trace is not None else cfg.workload.requests_at(level.concurrency),
                concurrency=level.concurrency,
                rate=level.rate,
                seed=seed,
                time_limit_s=left,
                arrivals=level.trace,  # the workload's arrival trace (run_levels runs it last)
            )
            counts = spec_counts(server.get("/metrics"), self.metrics_prefix) - before
            if records is not None and level.trace is None:
                records[level.batch_key(max_batch_size)] = run.records
            return {**run.metrics, **counts.metrics()}

        try:
            if not server.warmed:  # once per server: a kept server serving its next round is warm
                self._warmup(endpoint, max_batch_size)
                server.warmed = True
            trace = getattr(self.ctx, "trace", None) if with_trace else None  # stand-in contexts lack it
            return run_levels(
                cfg, max_batch_size, run_level, startup_s=server.startup_s, trace=trace, only=levels
            )
        except (LoadError, TimeoutError, OSError) as exc:
            server.check_alive(grace_s=3.0)  # a dead server explains the failure better, with its log
            self.drop_current()  # a hung or broken server is not reused
            raise ServerError(f"{self.name} trial failed: {exc}") from None

    def _warmup(self, endpoint: Endpoint, max_batch_size: int) -> None:
        """A short run at the largest batch, once per server: first-request failures surface here,
        lazy init leaves the runs (a round of the re-measurement in a kept server skips it:
        docs/decisions.md#warm-up-once)."""
        width = min(max_batch_size, max(self.cfg.batch_sizes))
        short = [replace(r, max_new_tokens=min(r.max_new_tokens, 16)) for r in self.ctx.requests[:width]]
        run_http_load(endpoint, short, len(short), concurrency=width, seed=0, time_limit_s=300)
