"""The vLLM backend: every trial is a real ``vllm serve`` run of the workload.

Knobs -> flags, through the vLLM exporter's own :func:`profiles.exporters.vllm.serve_args`
(what is tuned is byte-for-byte what is exported): gamma -> ``num_speculative_tokens`` (gamma 0
or drafter ``none``: no ``--speculative-config``), drafter ``model``/``ngram`` -> method
``draft_model``/``ngram``, max_batch_size -> ``--max-num-seqs``. vLLM has no draft-confidence
cutoff and no adaptive per-row gamma, so ``confidence_threshold`` is fixed at 0 and
``gamma_schedule`` at ``constant`` (``fixed_knobs``; ``autotune tune`` says so).

Host flags are added to the exporter's: ``--host 127.0.0.1 --port <free>``, ``--dtype`` from
``models.dtype`` and ``backend.vllm.args``. The server runs through
:mod:`autotune.backends.vllm_launcher` in vLLM's own venv (``backend.vllm.python``), in its own
process group, with ``VLLM_CACHE_ROOT`` on ``backend.vllm.cache_dir`` so compiled artifacts
survive restarts. One server serves every load level of a trial and is reused by the next
evaluation when its flags are identical; start-up time is recorded apart from the trial.

Per level: TTFT/TPOT/e2e and tokens/s on the client (:mod:`autotune.backends.openai_load`),
acceptance from the difference of two scrapes of ``/metrics``
(``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``,
``..._num_accepted_tokens_total``, ``..._num_accepted_tokens_per_pos_total{position}``).
``mean_batch_size`` is the client's mean number of requests in flight.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from autotune.backends.openai_load import Endpoint, LoadError, run_http_load
from autotune.backends.prometheus import SpecCounts, by_label, parse_text, total
from autotune.backends.server import ServerError, ServerProcess
from autotune.config import DEFAULT_CACHE, TuneConfig
from autotune.errors import ConfigError
from autotune.study import LEVEL_KEYS, levels
from engine.speculative import Request
from profiles.exporters import vllm as vllm_export
from profiles.profile import TOOL_VERSION, ExportInputs

LAUNCHER = Path(__file__).with_name("vllm_launcher.py")
FIXED_KNOBS = {"confidence_threshold": 0.0, "gamma_schedule": "constant"}
_COUNTERS = {"drafts": "vllm:spec_decode_num_drafts_total", "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
             "accepted": "vllm:spec_decode_num_accepted_tokens_total",
             "per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos_total"}


def resolve_python(configured: Path | None) -> Path:
    """The python of vLLM's venv: ``backend.vllm.python``, $AUTOTUNE_VLLM_PYTHON, or the default install."""
    env = os.environ.get("AUTOTUNE_VLLM_PYTHON")
    if configured is not None:
        where, path = "backend.vllm.python", configured
    elif env:
        where, path = "AUTOTUNE_VLLM_PYTHON", Path(env)
    else:
        where, path = "the default install", (DEFAULT_CACHE / "vllm-venv" / "bin" / "python").expanduser()
    if path.is_file() and os.access(path, os.X_OK):
        return path
    raise ConfigError(f"backend.vllm.python: no vLLM python at {path} (from {where}); install vLLM into its own "
                      "venv with `bash tools/install_vllm_cpu.sh` or set backend.vllm.python")


def trial_inputs(cfg: TuneConfig, fingerprint: dict, params: dict) -> ExportInputs:
    """The exporter's inputs for one trial's knobs: one gamma at every batch size, no threshold."""
    drafter = params["drafter"]
    gamma = 0 if drafter == "none" else int(params["gamma"])
    ngram = drafter == "ngram"
    return ExportInputs(
        tool_version=TOOL_VERSION, created_at="", device_label=fingerprint.get("label", ""),
        device_key=fingerprint.get("key", ""), target=str(cfg.target),
        draft=str(cfg.draft) if drafter == "model" and cfg.draft else None, drafter=drafter, gamma=gamma,
        confidence_threshold=0.0, gamma_schedule="constant",
        prompt_lookup_min=cfg.ngram_min if ngram else None, prompt_lookup_max=cfg.ngram_max if ngram else None,
        schedule=((max(cfg.batch_sizes), gamma),), max_batch_size=int(params["max_batch_size"]))


def serve_command(python: Path, cfg: TuneConfig, inputs: ExportInputs) -> list[str]:
    """The launch command: the exporter's ``vllm serve`` arguments plus this host's flags (``{port}`` filled later)."""
    return [str(python), str(LAUNCHER), *vllm_export.serve_args(inputs), "--host", "127.0.0.1", "--port", "{port}",
            "--dtype", cfg.dtype, *cfg.vllm.args]


def spec_counts(metrics_text: str) -> SpecCounts:
    """vLLM's speculative-decoding counters from one ``/metrics`` scrape."""
    samples = parse_text(metrics_text)
    per_pos = by_label(samples, _COUNTERS["per_pos"], "position")
    return SpecCounts(total(samples, _COUNTERS["drafts"]), total(samples, _COUNTERS["draft_tokens"]),
                      total(samples, _COUNTERS["accepted"]),
                      tuple(per_pos[p] for p in sorted(per_pos, key=int)))


class VllmBackend:
    """Runs trials in real vLLM servers (see the module docstring)."""

    name = "vllm"
    fixed_knobs = FIXED_KNOBS

    def __init__(self, ctx, python: Path | None = None) -> None:
        self.ctx = ctx
        self.cfg: TuneConfig = ctx.cfg
        self.python = python or resolve_python(self.cfg.vllm.python)
        self.cache_dir = Path(self.cfg.vllm.cache_dir).expanduser()
        self.log_dir = self.cache_dir / "logs"
        self.server: ServerProcess | None = None
        self.startups: list[float] = []
        self.version: str | None = None
        self._starts = 0

    # lifecycle ---------------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        return {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "VLLM_CACHE_ROOT": str(self.cache_dir),
                "TORCHINDUCTOR_CACHE_DIR": str(self.cache_dir / "inductor"), **dict(self.cfg.vllm.env)}

    def server_for(self, command: list[str]) -> ServerProcess:
        """The running server for ``command``: the live one when its flags are identical, else a new one."""
        if self.server is not None and self.server.alive() and self._command == command:
            return self.server
        self.close()
        self._starts += 1
        log = self.log_dir / f"vllm-{os.getpid()}-{self._starts}.log"
        self.server = ServerProcess(command, log, env=self._env(), startup_timeout_s=self.cfg.vllm.startup_timeout_s)
        self._command = command
        self.server.start()
        self.startups.append(self.server.startup_s)
        if self.version is None:
            try:
                self.version = json.loads(self.server.get("/version")).get("version")
            except (OSError, ValueError):
                self.version = None
        return self.server

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.server = None

    def describe(self) -> dict:
        command = serve_command(self.python, self.cfg, trial_inputs(self.cfg, self.ctx.fingerprint, {
            "drafter": "none", "gamma": 0, "max_batch_size": max(self.cfg.max_batch_size)}))
        return {"name": self.name, "version": self.version, "python": str(self.python),
                "host_args": command[command.index("--host"):], "env": dict(self.cfg.vllm.env),
                "startup_s": [round(s, 1) for s in self.startups], "fixed_knobs": dict(self.fixed_knobs)}

    # trials --------------------------------------------------------------------------------
    def endpoint(self, server: ServerProcess) -> Endpoint:
        return Endpoint(server.base_url, str(self.cfg.target), extra_body=(("return_token_ids", True),))

    def evaluate(self, params: dict, seed: int) -> dict:
        """One configuration at every load level in one server (started or reused)."""
        inputs = trial_inputs(self.cfg, self.ctx.fingerprint, params)
        return self.run(serve_command(self.python, self.cfg, inputs), int(params["max_batch_size"]), seed)

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
                left = None if cfg.trial_timeout_s is None else cfg.trial_timeout_s - (time.perf_counter() - t0)
                if left is not None and left <= 0:
                    raise TimeoutError(f"trial exceeded trial_timeout_s={cfg.trial_timeout_s:g} s")
                before = spec_counts(server.get("/metrics"))
                run = run_http_load(endpoint, self.ctx.requests, cfg.num_requests,
                                    concurrency=int(value) if kind == "concurrency" else None,
                                    rate=float(value) if kind == "rate" else None, seed=seed, time_limit_s=left)
                counts = spec_counts(server.get("/metrics")) - before
                m = {**run.metrics, **counts.metrics()}
                key = int(value) if kind == "concurrency" else max_batch_size
                per_level[key] = {k: m.get(k) for k in LEVEL_KEYS}
                tokens += m["generated_tokens"]
                wall += m["wall_s"]
                if records is not None:
                    records[key] = run.records
        except (LoadError, TimeoutError, OSError) as exc:
            server.check_alive()  # a dead server explains the failure better, with its log
            self.close()  # a hung or broken server is not reused
            raise ServerError(f"vLLM trial failed: {exc}") from None
        worst = max(lv[cfg.latency] or 0.0 for lv in per_level.values())
        return {"tokens_per_second": tokens / wall, "latency_ms": worst, "per_level": per_level,
                "startup_s": server.startup_s}

    def _warmup(self, endpoint: Endpoint, max_batch_size: int) -> None:
        """A short run at the largest batch: first-request failures surface here, lazy init leaves the runs."""
        width = min(max_batch_size, max(self.cfg.batch_sizes))
        short = [Request(r.prompt_ids, min(r.max_new_tokens, 16), r.temperature, r.top_k, r.top_p, r.id)
                 for r in self.ctx.requests[:width]]
        run_http_load(endpoint, short, len(short), concurrency=width, seed=0, time_limit_s=300)


def vllm_found() -> str | None:
    """Where vLLM's python is, or None (for tests and the benchmark's skip reasons)."""
    try:
        return str(resolve_python(None))
    except ConfigError:
        return None
