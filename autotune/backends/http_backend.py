"""What every serving-stack backend shares: one server per flag set, the workload over HTTP, the counters.

A stack's backend subclasses :class:`HttpBackend` and supplies its launch command for a trial's
knobs (``command``), its Prometheus counter prefix, extra request fields and server environment.
:meth:`HttpBackend.run` then does the rest the same way for every stack: start (or reuse) the
server, warm it up, run each load level of the workload with a ``/metrics`` scrape before and
after, and return the engine's result dictionary (:class:`autotune.records.TrialResult`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from autotune.backends.openai_load import Endpoint, LoadError, run_http_load
from autotune.backends.prometheus import SpecCounts, by_label, parse_text, total
from autotune.backends.server import ServerError, ServerProcess
from autotune.config import TuneConfig
from autotune.records import LevelMetrics, TrialResult
from autotune.study import levels
from engine.speculative import Request
from profiles.profile import TOOL_VERSION, ExportInputs


def spec_counts(metrics_text: str, prefix: str) -> SpecCounts:
    """The ``<prefix>:spec_decode_*`` counters of one ``/metrics`` scrape (vLLM and llama-server share the names)."""
    samples = parse_text(metrics_text)
    per_pos = by_label(samples, f"{prefix}:spec_decode_num_accepted_tokens_per_pos_total", "position")
    return SpecCounts(
        total(samples, f"{prefix}:spec_decode_num_drafts_total"),
        total(samples, f"{prefix}:spec_decode_num_draft_tokens_total"),
        total(samples, f"{prefix}:spec_decode_num_accepted_tokens_total"),
        tuple(per_pos[p] for p in sorted(per_pos, key=int)),
    )


def trial_inputs(
    cfg: TuneConfig, fingerprint: dict, params: dict, target: str | None = None, draft: str | None = None
) -> ExportInputs:
    """The exporters' inputs for one trial's knobs: one gamma at every batch size.

    ``target``/``draft`` replace the pair's folders (llama.cpp loads GGUF files).
    """
    drafter = params["drafter"]
    gamma = 0 if drafter == "none" else int(params["gamma"])
    ngram = drafter == "ngram"
    return ExportInputs(
        tool_version=TOOL_VERSION,
        created_at="",
        device_label=fingerprint.get("label", ""),
        device_key=fingerprint.get("key", ""),
        target=target or str(cfg.target),
        draft=(draft or str(cfg.draft)) if drafter == "model" and cfg.draft else None,
        drafter=drafter,
        gamma=gamma,
        confidence_threshold=float(params.get("confidence_threshold", 0.0)),
        gamma_schedule=params.get("gamma_schedule", "constant"),
        prompt_lookup_min=cfg.ngram_min if ngram else None,
        prompt_lookup_max=cfg.ngram_max if ngram else None,
        schedule=((max(cfg.batch_sizes), gamma),),
        max_batch_size=int(params["max_batch_size"]),
    )


class HttpBackend:
    """A serving stack driven over its OpenAI-compatible API (see the module docstring)."""

    name = "http"
    default_trials = 6  # study trials when backend.n_trials is null (each one a server start)
    metrics_prefix = ""
    fixed_knobs: dict = {}
    extra_body: tuple[tuple[str, object], ...] = ()
    startup_timeout_s = 600.0

    def __init__(self, ctx, log_dir: Path) -> None:
        self.ctx = ctx
        self.cfg: TuneConfig = ctx.cfg
        self.log_dir = log_dir
        self.server: ServerProcess | None = None
        self.startups: list[float] = []
        self._command: list[str] | None = None
        self._starts = 0

    # what a stack supplies --------------------------------------------------------------------
    def command(self, params: dict) -> list[str]:
        """The launch command for a trial's knobs (``{port}`` is filled in at start)."""
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return {}

    def model_name(self) -> str:
        return str(self.cfg.target)

    def on_started(self, server: ServerProcess) -> None:
        """Called once per new server, after it is healthy (e.g. to read the stack's version)."""

    # shared -----------------------------------------------------------------------------------
    def server_for(self, command: list[str]) -> ServerProcess:
        """The running server for ``command``: the live one when its flags are identical, else a new one."""
        if self.server is not None and self.server.alive() and self._command == command:
            return self.server
        self.close()
        self._starts += 1
        log = self.log_dir / f"{self.name}-{os.getpid()}-{self._starts}.log"
        self.server = ServerProcess(command, log, env=self.env(), startup_timeout_s=self.startup_timeout_s)
        self._command = command
        self.server.start()
        self.startups.append(self.server.startup_s)
        self.on_started(self.server)
        return self.server

    def close(self) -> None:
        """Stop the running server, if any."""
        if self.server is not None:
            self.server.stop()
        self.server = None

    def endpoint(self, server: ServerProcess) -> Endpoint:
        return Endpoint(server.base_url, self.model_name(), extra_body=self.extra_body)

    def evaluate(self, params: dict, seed: int) -> dict:
        """One configuration at every load level in one server (started or reused)."""
        return self.run(self.command(params), int(params["max_batch_size"]), seed)

    def run(self, command: list[str], max_batch_size: int, seed: int, records: dict | None = None) -> dict:
        """The workload's load levels against the server of ``command``; ``records`` collects each level's requests."""
        cfg = self.cfg
        server = self.server_for(command)
        endpoint = self.endpoint(server)
        per_level, tokens, wall = {}, 0.0, 0.0
        try:
            self._warmup(endpoint, max_batch_size)
            t0 = time.perf_counter()
            for kind, value in levels(cfg):
                left = (
                    None if cfg.trial_timeout_s is None else cfg.trial_timeout_s - (time.perf_counter() - t0)
                )
                if left is not None and left <= 0:
                    raise TimeoutError(f"trial exceeded trial_timeout_s={cfg.trial_timeout_s:g} s")
                before = spec_counts(server.get("/metrics"), self.metrics_prefix)
                run = run_http_load(
                    endpoint,
                    self.ctx.requests,
                    cfg.num_requests,
                    concurrency=int(value) if kind == "concurrency" else None,
                    rate=float(value) if kind == "rate" else None,
                    seed=seed,
                    time_limit_s=left,
                )
                counts = spec_counts(server.get("/metrics"), self.metrics_prefix) - before
                m = {**run.metrics, **counts.metrics()}
                key = int(value) if kind == "concurrency" else max_batch_size
                per_level[key] = LevelMetrics.from_metrics(m)
                tokens += m["generated_tokens"]
                wall += m["wall_s"]
                if records is not None:
                    records[key] = run.records
        except (LoadError, TimeoutError, OSError) as exc:
            server.check_alive(grace_s=3.0)  # a dead server explains the failure better, with its log
            self.close()  # a hung or broken server is not reused
            raise ServerError(f"{self.name} trial failed: {exc}") from None
        worst = max(getattr(lv, cfg.latency) or 0.0 for lv in per_level.values())
        return TrialResult(tokens / wall, worst, per_level, startup_s=server.startup_s).to_json()

    def _warmup(self, endpoint: Endpoint, max_batch_size: int) -> None:
        """A short run at the largest batch: first-request failures surface here, lazy init leaves the runs."""
        width = min(max_batch_size, max(self.cfg.batch_sizes))
        short = [
            Request(r.prompt_ids, min(r.max_new_tokens, 16), r.temperature, r.top_k, r.top_p, r.id)
            for r in self.ctx.requests[:width]
        ]
        run_http_load(endpoint, short, len(short), concurrency=width, seed=0, time_limit_s=300)
