"""tune.yaml: the single input of ``autotune tune``, validated into a nested :class:`TuneConfig`.

One typed, frozen config per section of the file (models, workload, search, objectives, budget,
storage, export, backend, profile), each field named exactly like its yaml key and each section
read by its own ``read`` (:class:`autotune.config.reader.Section` names the key in every error).
Every problem is reported as ``<key.path>: <problem> (got <value>)`` through
:class:`~autotune.errors.ConfigError`; the CLI prints it on one line and exits with 2 before
anything is measured or written. Unknown keys are errors too (a typo must not be ignored).
The rules that join sections (a draft model for the ``model`` drafter, the backend's knobs, the
profiled gamma range) are checked by :meth:`TuneConfig.__post_init__`, so a config changed by
command-line flags (:meth:`TuneConfig.with_overrides`, which re-reads the file's mapping with
the flags applied) obeys every rule a file does.

Relative paths are resolved against the folder of the config file; ``demo`` as models.target,
models.draft or workload.prompts names the bundled demo pair and prompts (installed with the
package), so a tune.yaml using it works from any folder. The bundled ``tune.yaml`` documents
every key; ``autotune init`` writes a copy for other models.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from autotune.config.reader import DEMO, Range, Section
from autotune.errors import ConfigError as ConfigError
from autotune.knobs import CHAIN, TREE_DRAFTERS, Tree, parse_tree, tree_name
from engine.demo import DEMO_DRAFT, DEMO_EAGLE3, DEMO_PROMPTS, DEMO_TARGET
from engine.generate import DRAFTERS as DRAFTERS
from engine.loader import DTYPES as _DTYPE_ALIASES
from engine.speculative import GAMMA_POLICIES as GAMMA_POLICIES
from engine.speculative import Request  # GAMMA_POLICIES: constant / heuristic per row
from engine.tree import tree_depth
from profiles.exporters import FORMATS as EXPORT_FORMATS

__all__ = [
    "BACKENDS",
    "DEMO",
    "DEFAULT_CACHE",
    "BackendConfig",
    "BudgetConfig",
    "ExportConfig",
    "LlamacppConfig",
    "LoadLevel",
    "ModelsConfig",
    "ObjectivesConfig",
    "ProfileConfig",
    "Range",
    "SearchConfig",
    "StorageConfig",
    "TuneConfig",
    "VllmConfig",
    "WorkloadConfig",
    "check_device",
    "load_config",
    "parse",
]

LATENCIES = ("tpot_ms_p95", "tpot_ms_p50", "e2e_ms_p95", "e2e_ms_p50", "ttft_ms_p95", "ttft_ms_p50")
SLO_KEYS = LATENCIES + ("min_tokens_per_second",)
CHOICE_RULES = ("throughput", "knee")
# The engine's dtype table also accepts aliases (fp32, bf16, fp16); tune.yaml takes the canonical names.
DTYPES = tuple(dict.fromkeys(str(t).removeprefix("torch.") for t in _DTYPE_ALIASES.values()))
DEFAULT_CACHE = Path("~/.cache/spec-autotune")
BACKENDS = ("engine", "vllm", "llamacpp")  # backend.name: where a trial runs (autotune.backends)
PHASES = (
    "phases"  # workload.trace: the built-in low / burst / low trace (autotune.workload.trace.phase_trace)
)


@dataclass(frozen=True)
class GgufModels:
    """``models.gguf``: GGUF files llama.cpp serves as they are (``backend.name: llamacpp`` only): no
    Hugging Face folder, the tokenizer is the file's and llama-server tokenizes the prompts."""

    target: Path  # the target model's GGUF file
    draft: Path | None = None  # the draft model's GGUF, needed when search.drafter includes model

    @classmethod
    def read(cls, s: Section, base: Path) -> GgufModels:
        target = s.path_("target", base)
        draft = s.path_("draft", base, allow_none=True)
        s.done()
        assert target is not None
        for name, path in (("target", target), ("draft", draft)):
            if path is None:
                continue
            try:
                with open(path, "rb") as fh:
                    magic = fh.read(4)
            except OSError as exc:
                raise ConfigError(f"{s.key(name)}: {path} cannot be read ({exc.strerror})") from None
            if magic != b"GGUF":
                raise ConfigError(f"{s.key(name)}: {path} is not a GGUF file (no GGUF magic at its start)")
        return cls(target, draft)


@dataclass(frozen=True)
class ModelsConfig:
    """``models``: the pair and how the engine runs it (or, with ``gguf``, the llama.cpp files:
    ``target`` and ``draft`` are then those files)."""

    target: Path
    draft: Path | None = None  # needed when search.drafter includes model (or hybrid)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto: the checkpoint's torch_dtype where the device runs it (device.capacity)
    compile: str = "auto"  # auto | true | false: torch.compile the decode/verify forward
    eagle3: Path | None = None  # an EAGLE-3 head folder (engine.eagle3), needed by the eagle3 drafter
    gguf: GgufModels | None = None  # llama.cpp's files as they are (target and draft are then these)

    @classmethod
    def read(cls, s: Section, base: Path) -> ModelsConfig:
        gguf = GgufModels.read(s.sub("gguf"), base) if s.get("gguf") is not None else None
        target: Path | None
        draft: Path | None
        if gguf is not None:
            given = next((k for k in ("target", "draft") if s.get(k) is not None), None)
            if given is not None:
                raise ConfigError(
                    f"models.{given}: not with models.gguf (its target and draft are the GGUF files; give one or the other)"
                )
            target, draft = gguf.target, gguf.draft
        else:
            target = s.path_("target", base, default=None, demo=DEMO_TARGET)
            draft = s.path_("draft", base, allow_none=True, demo=DEMO_DRAFT)
        eagle3 = s.path_("eagle3", base, allow_none=True, demo=DEMO_EAGLE3)
        device = s.get("device", "auto")
        if not isinstance(device, str) or not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device):
            raise ConfigError(f"models.device: must be auto, cpu or cuda[:N] (got {device!r})")
        dtype = s.choice("dtype", "auto", ("auto", *DTYPES))
        compile_mode = s.get("compile", "auto")
        if not (isinstance(compile_mode, bool) or compile_mode in ("auto", "true", "false")):
            raise ConfigError(f"models.compile: must be auto, true or false (got {compile_mode!r})")
        s.done()
        assert target is not None
        return cls(
            target,
            draft,
            device,
            dtype,
            {True: "true", False: "false"}.get(compile_mode, compile_mode),
            eagle3,
            gguf,
        )


@dataclass(frozen=True)
class LoadLevel:
    """One load level of the workload: closed-loop ``concurrency`` or an open-loop Poisson ``rate``;
    or the workload's arrival trace (``trace``: ``(offset_s, Request)`` pairs, :mod:`autotune.workload.trace`),
    which :func:`autotune.backends.base.run_levels` runs after the levels and keeps apart from them."""

    concurrency: int | None = None
    rate: float | None = None
    trace: tuple[tuple[float, Request], ...] | None = field(default=None, repr=False, compare=False)

    def batch_key(self, max_batch_size: int) -> int:
        """The batch size a level's metrics are keyed by: its concurrency, or the engine's rows under a rate."""
        return self.concurrency if self.concurrency is not None else max_batch_size


@dataclass(frozen=True)
class WorkloadConfig:
    """``workload``: the prompts, their sampling, and the load levels every trial runs."""

    prompts: Path
    max_new_tokens: int = 48
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    concurrency: tuple[int, ...] = (1, 4)
    rate: float | None = None
    num_requests: int = 8
    truncate_prompts: bool = False
    trace: Path | str | None = (
        None  # null | "phases" (autotune.workload.trace.phase_trace) | a JSONL trace file
    )
    min_batches: int = 1  # a closed-loop level of concurrency c runs at least min_batches x c requests

    def requests_at(self, concurrency: int | None) -> int:
        """Requests a load level runs: ``num_requests``, and under closed-loop ``concurrency`` at
        least ``min_batches`` batches' worth, so the level's slots refill as a server's do at that
        load instead of one batch that starts and ends together, whose rounds vary more
        (docs/decisions.md#min-batches).

        Example:
            >>> w = WorkloadConfig(Path("p"), num_requests=16, min_batches=3)
            >>> [w.requests_at(c) for c in (1, 4, 8, 16)], w.requests_at(None)
            ([16, 16, 24, 48], 16)
        """
        return (
            self.num_requests
            if concurrency is None
            else max(self.num_requests, self.min_batches * concurrency)
        )

    @property
    def load_levels(self) -> tuple[LoadLevel, ...]:
        """The load levels every trial runs: one per concurrency, or the one open-loop rate."""
        if self.rate is not None:
            return (LoadLevel(rate=self.rate),)
        return tuple(LoadLevel(concurrency=c) for c in self.concurrency)

    @classmethod
    def read(cls, s: Section, base: Path) -> WorkloadConfig:
        prompts = s.path_("prompts", base, default=None, demo=DEMO_PROMPTS)
        max_new = s.int("max_new_tokens", 48, lo=1)
        temperature = s.num("temperature", 0.0, lo=0.0)
        top_k = s.int("top_k", 0, lo=0)
        top_p = s.num("top_p", 1.0, lo=0.0, hi=1.0, open_lo=True)
        rate = s.num("rate", None, lo=0.0, open_lo=True, allow_none=True)
        concurrency = s.ints("concurrency", (1, 4))
        num_requests = s.int("num_requests", 8, lo=1)
        min_batches = s.int("min_batches", 1, lo=1)
        truncate = s.get("truncate_prompts", False)
        if not isinstance(truncate, bool):
            raise ConfigError(f"workload.truncate_prompts: must be true or false (got {truncate!r})")
        trace = s.get("trace")
        if trace is not None and trace != PHASES:
            trace = s.path_("trace", base)
            if trace is not None and not trace.is_file():
                raise ConfigError(f"workload.trace: {s.raw['trace']} is not a file (resolved to {trace})")
        s.done()
        assert prompts is not None and max_new is not None and num_requests is not None
        assert temperature is not None and top_k is not None and top_p is not None and min_batches is not None
        return cls(
            prompts,
            max_new,
            temperature,
            top_k,
            top_p,
            concurrency,
            rate,
            num_requests,
            truncate,
            trace,
            min_batches,
        )


@dataclass(frozen=True)
class SearchConfig:
    """``search``: the knobs the study searches (a list or range is searched; a single value fixes it).

    ``gamma_schedule`` lists the per-row gamma *policies* (constant, heuristic), not the profile's
    gamma-by-batch-size schedule; ``tree_topk`` holds the parsed trees (``()`` = the chain).
    """

    drafter: tuple[str, ...] = ("model",)
    gamma: Range = Range(0, 8)
    confidence_threshold: Range = Range(0.0, 0.5)
    gamma_schedule: tuple[str, ...] = ("constant",)
    max_batch_size: tuple[int, ...] = (4,)
    gamma_cap: int | str = "auto"  # auto | off | an integer: the study's largest gamma
    tree_topk: tuple[Tree, ...] = ((),)
    ngram_min: int = 2  # the smallest prompt-lookup n-gram matched (drafter ngram)
    ngram_max: int = 4  # the largest prompt-lookup n-gram matched (drafter ngram), >= ngram_min

    @classmethod
    def read(cls, s: Section, concurrency: tuple[int, ...]) -> SearchConfig:
        drafters = s.choices("drafter", ("model",), DRAFTERS)
        gamma = s.range("gamma", Range(0, 8), 0, 32, integer=True)
        thr = s.range("confidence_threshold", Range(0.0, 0.5), 0.0, 1.0, integer=False)
        policies = s.choices("gamma_schedule", ("constant",), GAMMA_POLICIES)
        max_batch = s.ints("max_batch_size", (max(concurrency),))
        cap = s.get("gamma_cap", "auto")
        if not (cap in ("auto", "off") or (isinstance(cap, int) and not isinstance(cap, bool) and cap >= 0)):
            raise ConfigError(f"search.gamma_cap: must be auto, off or an integer >= 0 (got {cap!r})")
        trees = _tree_shapes(s)
        ngram_min = s.int("ngram_min", 2, lo=1)
        ngram_max = s.int("ngram_max", 4, lo=1)
        assert ngram_min is not None and ngram_max is not None
        if ngram_max < ngram_min:
            raise ConfigError(
                f"search.ngram_max: must be >= search.ngram_min (got {ngram_max} < {ngram_min})"
            )
        s.done()
        gamma = Range(int(gamma.low), int(gamma.high))
        return cls(drafters, gamma, thr, policies, max_batch, cap, trees, ngram_min, ngram_max)


@dataclass(frozen=True)
class ObjectivesConfig:
    """``objectives``: the latency minimised next to tokens/s, the SLOs (constraints), and how the
    study's result is chosen without SLOs (``choose``: the highest tokens/s, or the Pareto knee)."""

    latency: str = "tpot_ms_p95"
    slo: Mapping[str, float] = field(default_factory=dict)
    choose: str = "throughput"

    @property
    def knee(self) -> bool:
        """Choose the knee of the Pareto front (only without SLOs: with them, the fastest meeting them)."""
        return self.choose == "knee" and not self.slo

    @classmethod
    def read(cls, s: Section) -> ObjectivesConfig:
        latency = s.choice("latency", "tpot_ms_p95", LATENCIES)
        choose = s.choice("choose", "throughput", CHOICE_RULES)
        slo_sec = s.sub("slo")
        slo = {}
        for k in list(slo_sec.raw):
            if k not in SLO_KEYS:
                raise ConfigError(f"objectives.slo.{k}: unknown SLO (choose from {', '.join(SLO_KEYS)})")
            val = slo_sec.num(k, None, lo=0.0, open_lo=True, allow_none=True)
            if val is not None:
                slo[k] = val
        s.done()
        return cls(latency, slo, choose)


@dataclass(frozen=True)
class BudgetConfig:
    """``budget``: the study's trials and caps on the engine, the seed, the re-measurement."""

    n_trials: int = 20
    timeout_s: float | None = None
    # a trial's fixed cap; None: none (from 3 finished trials on, the guard cuts a run at
    # autotune.search.guard.CUT_FACTOR times its expected seconds)
    trial_timeout_s: float | None = None
    seed: int = 0
    remeasure_top: int = 3
    repeats: int = 3
    disturbed_reruns: int = 2  # re-runs of a trial another process disturbed, before it is pruned
    max_repeats: int = 6  # rounds the finalists may reach when ``repeats`` left the choice undecided
    # the whole run (profiling, study, re-measurement, second look, table contest) in minutes; None: unbounded
    minutes: float | None = None

    @classmethod
    def read(cls, s: Section) -> BudgetConfig:
        n_trials = s.int("n_trials", 20, lo=1)
        timeout = s.num("timeout_s", None, lo=0.0, open_lo=True, allow_none=True)
        trial_timeout = s.num("trial_timeout_s", None, lo=0.0, open_lo=True, allow_none=True)
        seed = s.int("seed", 0)
        remeasure = s.int("remeasure_top", 3, lo=1)
        repeats = s.int("repeats", 3, lo=1)
        reruns = s.int("disturbed_reruns", 2, lo=0)
        repeats_ = repeats or 1
        max_repeats = s.int("max_repeats", max(6, repeats_) if repeats_ > 1 else 1, lo=1)
        minutes = s.num("minutes", None, lo=0.0, open_lo=True, allow_none=True)
        s.done()
        assert n_trials is not None and seed is not None and remeasure is not None and repeats is not None
        assert reruns is not None and max_repeats is not None
        if max_repeats < repeats:
            raise ConfigError(f"budget.max_repeats: {max_repeats} is below budget.repeats ({repeats})")
        return cls(n_trials, timeout, trial_timeout, seed, remeasure, repeats, reruns, max_repeats, minutes)


@dataclass(frozen=True)
class StorageConfig:
    """``storage``: where profiles and studies live (one SQLAlchemy URL), and the study's name."""

    url: str = "sqlite:///autotune.db"
    study_name: str | None = None  # default: derived from device, pair and workload

    @classmethod
    def read(cls, s: Section, base: Path) -> StorageConfig:
        url = s.get("url", "sqlite:///autotune.db")
        if not isinstance(url, str) or "://" not in url:
            raise ConfigError(
                f"storage.url: must be an SQLAlchemy URL like sqlite:///autotune.db (got {url!r})"
            )
        if url.startswith("sqlite:///") and not url.startswith("sqlite:////") and url != "sqlite:///:memory:":
            url = "sqlite:///" + str((base / url[len("sqlite:///") :]).resolve())
        study = s.get("study_name")
        if study is not None and (not isinstance(study, str) or not study):
            raise ConfigError(f"storage.study_name: must be a non-empty string or null (got {study!r})")
        s.done()
        return cls(url, study)


@dataclass(frozen=True)
class ExportConfig:
    """``export``: the formats written after the profile is stored, and their folder."""

    formats: tuple[str, ...] = ()  # the exporters run on the chosen profile, their files written under dir
    dir: Path = Path("exports")  # the folder the exported files are written to

    @classmethod
    def read(cls, s: Section, base: Path) -> ExportConfig:
        formats = s.choices("formats", ("yaml",), EXPORT_FORMATS) if s.raw.get("formats") else ()
        s.seen.add("formats")
        folder = s.path_("dir", base, default="exports", must_exist=False)
        s.done()
        assert folder is not None
        return cls(formats, folder)


@dataclass(frozen=True)
class VllmConfig:
    """``backend.vllm``: how to launch vLLM (its own venv; see tools/install_vllm_cpu.sh)."""

    # the vLLM to run: a `vllm` executable or a python that imports vllm, a path or a name on PATH;
    # None: $AUTOTUNE_VLLM_PYTHON, a `vllm` on PATH that works, then <cache>/vllm-venv/bin/python
    command: str | None = None
    tensor_parallel_size: int = 1  # --tensor-parallel-size: GPUs one server spans
    gpu_memory_utilization: float | None = None  # --gpu-memory-utilization (None: vLLM's own, 0.9)
    max_model_len: int | None = None  # --max-model-len; None: the workload's longest prompt + output
    # more `vllm serve` flags, appended to the tool's (DEFAULT_ARGS); "!FLAG" drops one of those
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # the server's environment, over the CPU defaults (CPU_ENV)
    startup_timeout_s: float | None = None  # None: sized from the weights, then from the first start
    cache_dir: Path = DEFAULT_CACHE / "vllm-cache"
    # servers kept alive, idle, for the configurations served again (the re-measurement then
    # interleaves them with no restart); None: 3 on a CPU host, 1 where the device is a GPU (one
    # server claims most of its memory)
    keep_servers: int | None = None
    # the spec-autotune vLLM plugin (autotune/vllm_plugin, installed in vLLM's venv): a table's K=0
    # skips the drafter, caught up exactly before the next K>0 step (docs/stacks/vllm.md#the-k0-skip-plugin)
    k0_skip: bool = False
    # with k0_skip: after a K=0 step, stay at K=0 while no request of the step has more than this
    # many tokens left, where a switch back to K>0 cannot pay for its catch-up (0: never hold)
    k0_hold_tokens: int = 0

    @classmethod
    def read(cls, v: Section, base: Path) -> VllmConfig:
        default = cls()
        if "python" in v.raw:
            raise ConfigError(
                f"{v.key('python')}: renamed to {v.key('command')} (a vllm executable or a python)"
            )
        command = v.get("command")
        if command is not None and (not isinstance(command, str) or not command):
            raise ConfigError(
                f"{v.key('command')}: must be a vllm executable or a python, a path or a name on PATH"
            )
        if command is not None and ("/" in command or command.startswith("~")):
            path = Path(command).expanduser()
            command = str(path if path.is_absolute() else base / path)
        tp = v.int("tensor_parallel_size", 1, lo=1)
        gpu_mem = v.num("gpu_memory_utilization", None, lo=0.0, hi=1.0, open_lo=True, allow_none=True)
        max_len = v.int("max_model_len", None, lo=16, allow_none=True)
        args = _args(v, default.args)
        env = v.get("env", dict(default.env))
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(x, (str, int, float)) and not isinstance(x, bool)
            for k, x in env.items()
        ):
            raise ConfigError(f"{v.key('env')}: must be a mapping of variable names to values (got {env!r})")
        timeout = v.num("startup_timeout_s", None, lo=0.0, open_lo=True, allow_none=True)
        cache = v.path_("cache_dir", base, default=str(default.cache_dir), must_exist=False)
        keep = v.int("keep_servers", None, lo=1, allow_none=True)
        k0_skip = v.get("k0_skip", default.k0_skip)
        if not isinstance(k0_skip, bool):
            raise ConfigError(f"{v.key('k0_skip')}: must be true or false (got {k0_skip!r})")
        hold = v.int("k0_hold_tokens", default.k0_hold_tokens, lo=0)
        if hold and not k0_skip:
            raise ConfigError(
                f"{v.key('k0_hold_tokens')}: needs {v.key('k0_skip')}: true (the plugin holds K=0)"
            )
        v.done()
        assert cache is not None
        assert tp is not None and hold is not None
        return cls(
            command,
            tp,
            gpu_mem,
            max_len,
            args,
            tuple((k, str(x)) for k, x in env.items()),
            timeout,
            cache,
            keep,
            k0_skip,
            hold,
        )


QUANTIZATIONS = ("f32", "f16", "bf16", "q8_0", "q4_k_m")
"""``backend.llamacpp.quantization``: the GGUF types a converted pair is served in (llama-quantize's names, lower case)."""


@dataclass(frozen=True)
class LlamacppConfig:
    """``backend.llamacpp``: where llama-server and the GGUF converter are (tools/install_llamacpp.sh)."""

    home: Path = DEFAULT_CACHE / "llamacpp"  # bin/llama-server, venv/ (converter python), llama.cpp/ (source)
    threads: int | None = None  # -t; None: the host's physical cores
    gpu_layers: int | None = None  # -ngl: target layers on the GPU (None: llama-server's default)
    draft_gpu_layers: int | None = None  # -ngld: draft layers on the GPU
    args: tuple[str, ...] = ("--no-cache-prompt",)
    startup_timeout_s: float = 120.0  # a llama-server not healthy by then fails its trial
    pre_tokenizer: str | None = "gpt-2"  # for BPE pre-tokenizers the converter does not know (ids checked)
    quantization: str | None = None  # a converted pair's GGUF type (QUANTIZATIONS); None: f32

    @classmethod
    def read(cls, v: Section, base: Path) -> LlamacppConfig:
        default = cls()
        home = v.path_("home", base, default=str(default.home), must_exist=False)
        threads = v.int("threads", None, lo=1, allow_none=True)
        ngl = v.int("gpu_layers", None, lo=0, allow_none=True)
        ngld = v.int("draft_gpu_layers", None, lo=0, allow_none=True)
        args = _args(v, default.args)
        timeout = v.num("startup_timeout_s", default.startup_timeout_s, lo=0.0, open_lo=True)
        pre = v.get("pre_tokenizer", default.pre_tokenizer)
        if pre is not None and (not isinstance(pre, str) or not re.fullmatch(r"[a-z0-9._-]+", pre)):
            raise ConfigError(
                f"{v.key('pre_tokenizer')}: must be a llama.cpp pre-tokenizer name or null (got {pre!r})"
            )
        quant = v.get("quantization")
        if quant is not None and quant not in QUANTIZATIONS:
            raise ConfigError(
                f"{v.key('quantization')}: must be one of {', '.join(QUANTIZATIONS)} or null (got {quant!r})"
            )
        v.done()
        assert home is not None and timeout is not None
        return cls(home, threads, ngl, ngld, args, timeout, pre, quant)


@dataclass(frozen=True)
class BackendConfig:
    """``backend``: where a trial runs, and the study's budget there (each trial a server start)."""

    name: str = "engine"
    n_trials: int | None = None  # None: the backend's own default (vllm 7, llamacpp 20)
    timeout_s: float | None = None
    vllm: VllmConfig = VllmConfig()
    llamacpp: LlamacppConfig = LlamacppConfig()

    @classmethod
    def read(cls, s: Section, base: Path) -> BackendConfig:
        name = s.choice("name", "engine", BACKENDS)
        n_trials = s.int("n_trials", None, lo=1, allow_none=True)
        timeout = s.num("timeout_s", None, lo=0.0, open_lo=True, allow_none=True)
        vllm = VllmConfig.read(s.sub("vllm"), base)
        llamacpp = LlamacppConfig.read(s.sub("llamacpp"), base)
        s.done()
        return cls(name, n_trials, timeout, vllm, llamacpp)


@dataclass(frozen=True)
class ProfileConfig:
    """``profile``: what the profiler measures (verify cost up to ``gamma_max + 1`` tokens)."""

    gamma_max: int = 8

    @classmethod
    def read(cls, s: Section, gamma_high: int) -> ProfileConfig:
        gmax = s.int("gamma_max", max(gamma_high, 1), lo=1)
        s.done()
        assert gmax is not None
        return cls(gmax)


@dataclass(frozen=True)
class TuneConfig:
    """A validated tune.yaml: one typed config per section (see the module docstring)."""

    models: ModelsConfig
    workload: WorkloadConfig
    search: SearchConfig = SearchConfig()
    objectives: ObjectivesConfig = ObjectivesConfig()
    budget: BudgetConfig = BudgetConfig()
    storage: StorageConfig = StorageConfig()
    export: ExportConfig = ExportConfig()
    backend: BackendConfig = BackendConfig()
    profile: ProfileConfig = ProfileConfig()
    source: Path | None = None  # the file it was read from
    raw: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)  # the file's mapping

    def __post_init__(self) -> None:
        _check_across_sections(self)

    @property
    def trees_searched(self) -> bool:
        """Whether ``search.tree_topk`` names a tree (top-k > 1 somewhere), not only the chain."""
        return any(self.search.tree_topk)

    @property
    def draft_folder(self) -> Path | None:
        """The folder that drafts besides the target, by which the pair is keyed in the store: the
        draft model when ``model`` (or ``hybrid``) is searched, else the EAGLE-3 head when ``eagle3``
        is, else None (n-gram lookup needs no folder). With both searched the head is
        :attr:`head_beside`."""
        drafters = self.search.drafter
        if "model" in drafters or "hybrid" in drafters:
            return self.models.draft
        return self.models.eagle3 if "eagle3" in drafters else None

    @property
    def head_beside(self) -> Path | None:
        """The EAGLE-3 head searched beside the draft model (``search.drafter`` lists ``eagle3`` and
        ``model``), else None: the profile records it next to the pair (``pair.eagle3``); the profiler
        measures the draft model only (``Context.profile_drafter``), the study measures the head live."""
        head = self.models.eagle3 if "eagle3" in self.search.drafter else None
        return head if head is not None and head != self.draft_folder else None

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """Batch sizes the load puts on the engine: one per concurrency level."""
        w = self.workload
        return w.concurrency if w.rate is None else (max(self.search.max_batch_size),)

    def with_overrides(self, overrides: Mapping[str, Any]) -> TuneConfig:
        """This config with command-line overrides named by their key path (``{"backend.name": "vllm",
        "budget.n_trials": 3}``), read and checked exactly like the file (ConfigError names the key).

        Example:
            >>> cfg = parse({"models": {"target": "demo", "draft": "demo"}, "workload": {"prompts": "demo"}}, Path("."))
            >>> cfg.with_overrides({"budget.n_trials": 3}).budget.n_trials
            3
        """
        if self.raw is None:
            raise ValueError("with_overrides needs a config read from a mapping (autotune.config.parse)")
        raw = copy.deepcopy(dict(self.raw))
        for path, value in overrides.items():
            *sections, key = path.split(".")
            node = raw
            for name in sections:
                if not isinstance(node.get(name), dict):
                    node[name] = {}
                node = node[name]
            node[key] = value
        base = self.source.resolve().parent if self.source is not None else Path.cwd()
        return parse(raw, base, self.source)


def _check_across_sections(cfg: TuneConfig) -> None:
    """The rules that join sections; ConfigError names the key to change."""
    search = cfg.search
    if "model" in search.drafter and cfg.models.draft is None:
        key = "models.gguf.draft" if cfg.models.gguf is not None else "models.draft"
        raise ConfigError(f"{key}: required when search.drafter includes 'model'")
    if cfg.models.gguf is not None:
        _check_gguf(cfg)
    if "eagle3" in search.drafter:
        if cfg.models.eagle3 is None:
            raise ConfigError(
                "models.eagle3: required when search.drafter includes 'eagle3' (an EAGLE-3 head folder: "
                "config.json + safetensors as vLLM loads them, docs/eagle3.md)"
            )
    if "hybrid" in search.drafter and "model" not in search.drafter:
        # autotune.context loads the draft model only when 'model' is searched
        raise ConfigError(
            f"search.drafter: 'hybrid' drafts with the draft model too; list 'model' with it "
            f"(got {list(search.drafter)!r})"
        )
    if cfg.trees_searched and not set(TREE_DRAFTERS) & set(search.drafter):
        raise ConfigError(
            f"search.tree_topk: a tree needs the 'model' or 'eagle3' drafter in search.drafter "
            f"(got drafter {list(search.drafter)!r})"
        )
    gmax = cfg.profile.gamma_max
    if search.gamma.high > gmax:
        raise ConfigError(
            f"profile.gamma_max: must be >= search.gamma.high (got {gmax} < {int(search.gamma.high)})"
        )
    deep = next((t for t in search.tree_topk if tree_depth(t) > gmax), None)
    if deep is not None:
        raise ConfigError(
            f"search.tree_topk: {tree_name(deep)!r} has depth {tree_depth(deep)} > profile.gamma_max {gmax} "
            "(the profiler's acceptance samples stop there)"
        )
    _check_backend(cfg)


def _check_gguf(cfg: TuneConfig) -> None:
    """``models.gguf`` files run in llama-server only, as they are, with llama-server's tokenizer."""
    name = cfg.backend.name
    if name != "llamacpp":
        raise ConfigError(
            f"models.gguf: GGUF files run in llama.cpp only (backend.name: llamacpp); the {name} backend "
            "loads Hugging Face folders (models.target, models.draft)"
        )
    other = next((d for d in cfg.search.drafter if d not in ("model", "ngram", "none")), None)
    if other is not None:
        raise ConfigError(
            f"search.drafter: {other!r} needs Hugging Face folders (models.target, models.eagle3); with "
            "models.gguf search model, ngram or none"
        )
    if cfg.backend.llamacpp.quantization is not None:
        raise ConfigError(
            "backend.llamacpp.quantization: converts a Hugging Face pair; models.gguf files are served as "
            "they are (remove one of the two)"
        )
    if cfg.workload.trace is not None:
        raise ConfigError(
            "workload.trace: needs the target's tokenizer.json; with models.gguf llama-server tokenizes "
            "the prompts (remove workload.trace or give models.target)"
        )


def _check_backend(cfg: TuneConfig) -> None:
    """A serving stack runs chains of the model, eagle3, ngram or no drafter. A token tree trial
    would run there as a chain of the tree's depth, a hybrid one as an n-gram without its window,
    each under its own name: refused in one line before anything loads."""
    name = cfg.backend.name
    if name == "engine":
        return
    if cfg.trees_searched:
        raise ConfigError(
            f"search.tree_topk: the {name} backend runs chains only (no token trees); list "
            f"only 'chain' with it (got {[tree_name(t) for t in cfg.search.tree_topk]})"
        )
    if "hybrid" in cfg.search.drafter:
        raise ConfigError(
            f"search.drafter: the {name} backend has no 'hybrid' drafter (no per-row switch "
            f"between n-grams and the draft model); drop it (got {list(cfg.search.drafter)})"
        )


def parse(raw: Any, base: Path, source: Path | None = None) -> TuneConfig:
    """Validate a parsed tune.yaml mapping; paths resolve against ``base``."""
    top = Section(raw, "", required=True)
    models = ModelsConfig.read(top.sub("models"), base)
    workload = WorkloadConfig.read(top.sub("workload"), base)
    search = SearchConfig.read(top.sub("search"), workload.concurrency)
    objectives = ObjectivesConfig.read(top.sub("objectives"))
    budget = BudgetConfig.read(top.sub("budget"))
    storage = StorageConfig.read(top.sub("storage"), base)
    export = ExportConfig.read(top.sub("export"), base)
    backend = BackendConfig.read(top.sub("backend"), base)
    profile = ProfileConfig.read(top.sub("profile"), int(search.gamma.high))
    top.done()
    return TuneConfig(
        models, workload, search, objectives, budget, storage, export, backend, profile, source, raw
    )


def _tree_shapes(s: Section) -> tuple[Tree, ...]:
    """``search.tree_topk``: one shape or a list of them; default the chain only."""
    v = s.get("tree_topk", [CHAIN])
    vals = v if isinstance(v, list) and (not v or not all(isinstance(x, int) for x in v)) else [v]
    if not vals:
        raise ConfigError(
            f"{s.key('tree_topk')}: must be 'chain', a shape like '2,1,1', a dynamic tree like "
            f"'2x6/10' or a non-empty list of them (got {v!r})"
        )
    return tuple(dict.fromkeys(parse_tree(x, s.key("tree_topk")) for x in vals))


def _args(v: Section, default: tuple[str, ...]) -> tuple[str, ...]:
    args = v.get("args", list(default))
    if not isinstance(args, list) or not all(
        isinstance(a, (str, int, float)) and not isinstance(a, bool) for a in args
    ):
        raise ConfigError(f"{v.key('args')}: must be a list of command-line arguments (got {args!r})")
    return tuple(str(a) for a in args)


def check_device(cfg: TuneConfig) -> str:
    """``models.device`` as this host resolves it (``auto`` -> cpu or cuda); a device it lacks is a ConfigError.

    Example:
        >>> check_device(TuneConfig(ModelsConfig(Path("t"), device="cpu"), WorkloadConfig(Path("p")), \
search=SearchConfig(drafter=("ngram",))))
        'cpu'
    """
    from engine.errors import EngineInputError
    from engine.loader import resolve_device

    try:
        return str(resolve_device(cfg.models.device))
    except EngineInputError as exc:
        raise ConfigError(f"{cfg.source or 'tune.yaml'}: models.{exc}") from None


def load_config(path: str | Path) -> TuneConfig:
    """Read and validate a tune.yaml (yaml.safe_load only).

    Example:
        >>> cfg = load_config("tune.yaml")  # doctest: +SKIP
        >>> cfg.search.gamma.high  # doctest: +SKIP
        8
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}:{where} not valid YAML ({getattr(exc, 'problem', exc)})") from None
    return parse(raw, path.resolve().parent, path)
