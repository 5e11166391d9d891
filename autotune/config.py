"""tune.yaml: the single input of ``autotune tune``, validated into a :class:`TuneConfig`.

Every problem is reported as ``<key.path>: <problem> (got <value>)`` through
:class:`~autotune.errors.ConfigError`; the CLI prints it on one line and exits with 2 before
anything is measured or written. Unknown keys are errors too (a typo must not be ignored).
Relative paths are resolved against the folder of the config file; ``demo`` as models.target,
models.draft or workload.prompts names the bundled demo pair and prompts (installed with the
package), so a tune.yaml using it works from any folder. The bundled ``tune.yaml`` documents
every key; ``autotune init`` writes a copy for other models.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from autotune.errors import ConfigError
from autotune.knobs import CHAIN, Tree, parse_tree, tree_name
from engine.demo import DEMO_DRAFT, DEMO_PROMPTS, DEMO_TARGET
from engine.generate import DRAFTERS
from engine.loader import DTYPES as _DTYPE_ALIASES
from engine.speculative import GAMMA_POLICIES  # constant / heuristic per-row gamma policy
from engine.tree import tree_depth
from profiles.exporters import FORMATS as EXPORT_FORMATS

LATENCIES = ("tpot_ms_p95", "tpot_ms_p50", "e2e_ms_p95", "e2e_ms_p50", "ttft_ms_p95", "ttft_ms_p50")
SLO_KEYS = LATENCIES + ("min_tokens_per_second",)
# The engine's dtype table also accepts aliases (fp32, bf16, fp16); tune.yaml takes the canonical names.
DTYPES = tuple(dict.fromkeys(str(t).removeprefix("torch.") for t in _DTYPE_ALIASES.values()))
DEFAULT_CACHE = Path("~/.cache/spec-autotune")
DEMO = "demo"  # models.target / models.draft / workload.prompts: the bundled demo pair and prompts
BACKENDS = ("engine", "vllm", "llamacpp")  # backend.name: where a trial runs (autotune.backends)


@dataclass(frozen=True)
class LoadLevel:
    """One load level of the workload: closed-loop ``concurrency`` or an open-loop Poisson ``rate``."""

    concurrency: int | None = None
    rate: float | None = None

    def batch_key(self, max_batch_size: int) -> int:
        """The batch size a level's metrics are keyed by: its concurrency, or the engine's rows under a rate."""
        return self.concurrency if self.concurrency is not None else max_batch_size


@dataclass(frozen=True)
class VllmConfig:
    """``backend.vllm``: how to launch vLLM (its own venv; see tools/install_vllm_cpu.sh)."""

    python: Path | None = None  # None: $AUTOTUNE_VLLM_PYTHON, then <cache>/vllm-venv/bin/python
    args: tuple[str, ...] = ("--max-model-len", "1024", "--no-enable-prefix-caching")
    env: tuple[tuple[str, str], ...] = (("VLLM_CPU_KVCACHE_SPACE", "2"),)
    startup_timeout_s: float = 900.0
    cache_dir: Path = DEFAULT_CACHE / "vllm-cache"


@dataclass(frozen=True)
class LlamacppConfig:
    """``backend.llamacpp``: where llama-server and the GGUF converter are (tools/install_llamacpp.sh)."""

    home: Path = DEFAULT_CACHE / "llamacpp"  # bin/llama-server, venv/ (converter python), llama.cpp/ (source)
    threads: int = 1  # -t; on a shared 2-core host -t 2 collapsed decoding
    args: tuple[str, ...] = ("--no-cache-prompt",)
    startup_timeout_s: float = 120.0
    pre_tokenizer: str | None = "gpt-2"  # for BPE pre-tokenizers the converter does not know (ids checked)


@dataclass(frozen=True)
class Range:
    """A searched range [low, high], or a fixed value when low == high."""

    low: float
    high: float

    @property
    def fixed(self) -> bool:
        return self.low == self.high


@dataclass(frozen=True)
class TuneConfig:
    target: Path
    draft: Path | None
    device: str = "auto"
    dtype: str = "float32"
    compile: str = "auto"  # auto | true | false: torch.compile the decode/verify forward
    prompts: Path = Path("prompts.jsonl")
    max_new_tokens: int = 48
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    concurrency: tuple[int, ...] = (1, 4)
    rate: float | None = None
    num_requests: int = 8
    truncate_prompts: bool = False
    drafters: tuple[str, ...] = ("model",)
    gamma: Range = Range(0, 8)
    confidence_threshold: Range = Range(0.0, 0.5)
    gamma_policies: tuple[str, ...] = ("constant",)  # tune.yaml search.gamma_schedule
    max_batch_size: tuple[int, ...] = (4,)
    search_gamma_cap: int | str = "auto"  # tune.yaml search.gamma_cap; not the engine's largest row gamma
    tree_shapes: tuple[Tree, ...] = ((),)  # tune.yaml search.tree_topk; () = the chain
    ngram_min: int = 2
    ngram_max: int = 4
    latency: str = "tpot_ms_p95"
    slo: dict[str, float] = field(default_factory=dict)
    n_trials: int = 20
    timeout_s: float | None = None
    trial_timeout_s: float | None = 300.0
    seed: int = 0
    storage: str = "sqlite:///autotune.db"
    study_name: str | None = None
    export_formats: tuple[str, ...] = ()
    export_dir: Path = Path("exports")
    profile_gamma_max: int = 8
    remeasure_top: int = 3
    repeats: int = 3
    backend: str = "engine"
    server_trials: int | None = None  # None: the backend's own default (vllm 6, llamacpp 20)
    server_timeout_s: float | None = None
    vllm: VllmConfig = VllmConfig()
    llamacpp: LlamacppConfig = LlamacppConfig()
    source: Path | None = None

    @property
    def trees_searched(self) -> bool:
        """Whether ``search.tree_topk`` names a tree (top-k > 1 somewhere), not only the chain."""
        return any(self.tree_shapes)

    def with_overrides(self, **changes: Any) -> TuneConfig:
        """This config with command-line overrides (``--backend``, ``--trials``, ``--storage``, ...), checked
        by the same cross-field rules as tune.yaml (ConfigError names the key)."""
        cfg = dataclasses.replace(self, **changes)
        check_backend(cfg)
        return cfg

    @property
    def load_levels(self) -> tuple[LoadLevel, ...]:
        """The load levels every trial runs: one per concurrency, or the one open-loop rate."""
        if self.rate is not None:
            return (LoadLevel(rate=self.rate),)
        return tuple(LoadLevel(concurrency=c) for c in self.concurrency)

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """Batch sizes the load puts on the engine: one per concurrency level."""
        return self.concurrency if self.rate is None else (max(self.max_batch_size),)


class _Section:
    """Reads one mapping, tracking the key path and refusing unknown keys."""

    def __init__(self, raw: Any, path: str, required: bool = False) -> None:
        if raw is None and not required:
            raw = {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{path or 'tune.yaml'}: must be a mapping (got {type(raw).__name__})")
        self.raw, self.path, self.seen = raw, path, set()

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def get(self, name: str, default: Any = None) -> Any:
        self.seen.add(name)
        return self.raw.get(name, default)

    def sub(self, name: str) -> _Section:
        return _Section(self.get(name), self.key(name))

    def done(self) -> None:
        extra = sorted(set(map(str, self.raw)) - self.seen)
        if extra:
            raise ConfigError(f"{self.key(extra[0])}: unknown key")

    # typed getters ------------------------------------------------------------------
    def int(
        self, name: str, default: int | None, lo: int | None = None, allow_none: bool = False
    ) -> int | None:
        v = self.get(name, default)
        if v is None and allow_none:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"{self.key(name)}: must be an integer (got {v!r})")
        if lo is not None and v < lo:
            raise ConfigError(f"{self.key(name)}: must be >= {lo} (got {v})")
        return v

    def num(
        self,
        name: str,
        default: float | None,
        lo: float | None = None,
        hi: float | None = None,
        allow_none: bool = False,
        open_lo: bool = False,
    ) -> float | None:
        v = self.get(name, default)
        if v is None and allow_none:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(f"{self.key(name)}: must be a number (got {v!r})")
        if lo is not None and (v < lo or (open_lo and v == lo)):
            raise ConfigError(f"{self.key(name)}: must be {'>' if open_lo else '>='} {lo} (got {v})")
        if hi is not None and v > hi:
            raise ConfigError(f"{self.key(name)}: must be <= {hi} (got {v})")
        return float(v)

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        v = self.get(name, default)
        if v not in choices:
            raise ConfigError(f"{self.key(name)}: must be one of {', '.join(choices)} (got {v!r})")
        return v

    def choices(self, name: str, default: tuple[str, ...], choices: tuple[str, ...]) -> tuple[str, ...]:
        v = self.get(name, list(default))
        vals = [v] if isinstance(v, str) else v
        if not isinstance(vals, list) or not vals:
            raise ConfigError(
                f"{self.key(name)}: must be one of {', '.join(choices)} or a non-empty list (got {v!r})"
            )
        for x in vals:
            if x not in choices:
                raise ConfigError(f"{self.key(name)}: {x!r} is not one of {', '.join(choices)}")
        return tuple(dict.fromkeys(vals))

    def ints(self, name: str, default: tuple[int, ...], lo: int = 1) -> tuple[int, ...]:
        v = self.get(name, list(default))
        vals = [v] if isinstance(v, int) and not isinstance(v, bool) else v
        if not isinstance(vals, list) or not vals:
            raise ConfigError(
                f"{self.key(name)}: must be an integer or a non-empty list of integers (got {v!r})"
            )
        for x in vals:
            if isinstance(x, bool) or not isinstance(x, int) or x < lo:
                raise ConfigError(f"{self.key(name)}: every value must be an integer >= {lo} (got {x!r})")
        return tuple(sorted(set(vals)))

    def range(self, name: str, default: Range, lo: float, hi: float | None, integer: bool) -> Range:
        v = self.get(name, {"low": default.low, "high": default.high})
        kind = "an integer" if integer else "a number"
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            sub = _Section({"low": v, "high": v}, self.key(name))
        else:
            sub = _Section(v, self.key(name))
        get = (
            (lambda k: sub.int(k, None, lo=int(lo)))
            if integer
            else (lambda k: sub.num(k, None, lo=lo, hi=hi))
        )
        if sub.raw.get("low") is None or sub.raw.get("high") is None:
            raise ConfigError(f"{self.key(name)}: must be {kind} or a mapping with low and high")
        low, high = get("low"), get("high")
        sub.done()
        if hi is not None and high > hi:
            raise ConfigError(f"{self.key(name)}.high: must be <= {hi} (got {high})")
        if high < low:
            raise ConfigError(f"{self.key(name)}.high: must be >= {self.key(name)}.low (got {high} < {low})")
        return Range(low, high)

    def path_(
        self,
        name: str,
        base: Path,
        default: Any = None,
        must_exist: bool = True,
        allow_none: bool = False,
        demo: Path | None = None,
    ) -> Path | None:
        v = self.get(name, default)
        if v is None and allow_none:
            return None
        if demo is not None and v == DEMO:
            return demo
        if not isinstance(v, str) or not v:
            raise ConfigError(f"{self.key(name)}: must be a path (got {v!r})")
        p = Path(v).expanduser()
        p = p if p.is_absolute() else (base / p)
        if must_exist and not p.exists():
            hint = f"; `{DEMO}` names the bundled demo {name}" if demo is not None else ""
            raise ConfigError(f"{self.key(name)}: {v} does not exist (resolved to {p}){hint}")
        return p


def parse(raw: Any, base: Path, source: Path | None = None) -> TuneConfig:
    """Validate a parsed tune.yaml mapping; paths resolve against ``base``."""
    top = _Section(raw, "", required=True)
    m = top.sub("models")
    target = m.path_("target", base, default=None, demo=DEMO_TARGET)
    draft = m.path_("draft", base, allow_none=True, demo=DEMO_DRAFT)
    device = m.get("device", "auto")
    if not isinstance(device, str) or not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device):
        raise ConfigError(f"models.device: must be auto, cpu or cuda[:N] (got {device!r})")
    dtype = m.choice("dtype", "float32", DTYPES)
    compile_mode = m.get("compile", "auto")
    if not (isinstance(compile_mode, bool) or compile_mode == "auto"):
        raise ConfigError(f"models.compile: must be auto, true or false (got {compile_mode!r})")
    compile_mode = {True: "true", False: "false"}.get(compile_mode, compile_mode)
    m.done()

    w = top.sub("workload")
    prompts = w.path_("prompts", base, default=None, demo=DEMO_PROMPTS)
    max_new = w.int("max_new_tokens", 48, lo=1)
    temperature = w.num("temperature", 0.0, lo=0.0)
    top_k = w.int("top_k", 0, lo=0)
    top_p = w.num("top_p", 1.0, lo=0.0, hi=1.0, open_lo=True)
    rate = w.num("rate", None, lo=0.0, open_lo=True, allow_none=True)
    concurrency = w.ints("concurrency", (1, 4))
    num_requests = w.int("num_requests", 8, lo=1)
    truncate = w.get("truncate_prompts", False)
    if not isinstance(truncate, bool):
        raise ConfigError(f"workload.truncate_prompts: must be true or false (got {truncate!r})")
    w.done()

    s = top.sub("search")
    drafters = s.choices("drafter", ("model",), DRAFTERS)
    gamma = s.range("gamma", Range(0, 8), 0, 32, integer=True)
    thr = s.range("confidence_threshold", Range(0.0, 0.5), 0.0, 1.0, integer=False)
    schedules = s.choices("gamma_schedule", ("constant",), GAMMA_POLICIES)
    max_batch = s.ints("max_batch_size", (max(concurrency),))
    cap = s.get("gamma_cap", "auto")
    if not (cap in ("auto", "off") or (isinstance(cap, int) and not isinstance(cap, bool) and cap >= 0)):
        raise ConfigError(f"search.gamma_cap: must be auto, off or an integer >= 0 (got {cap!r})")
    trees = _tree_shapes(s)
    ngram_min = s.int("ngram_min", 2, lo=1)
    ngram_max = s.int("ngram_max", 4, lo=1)
    if ngram_max < ngram_min:
        raise ConfigError(f"search.ngram_max: must be >= search.ngram_min (got {ngram_max} < {ngram_min})")
    s.done()
    if "model" in drafters and draft is None:
        raise ConfigError("models.draft: required when search.drafter includes 'model'")
    if "hybrid" in drafters and "model" not in drafters:
        # autotune.context loads the draft model only when 'model' is searched
        raise ConfigError(
            f"search.drafter: 'hybrid' drafts with the draft model too; list 'model' with it "
            f"(got {list(drafters)!r})"
        )
    if any(trees) and "model" not in drafters:
        raise ConfigError(
            f"search.tree_topk: a tree needs the 'model' drafter in search.drafter "
            f"(got drafter {list(drafters)!r})"
        )

    o = top.sub("objectives")
    latency = o.choice("latency", "tpot_ms_p95", LATENCIES)
    slo_sec = o.sub("slo")
    slo = {}
    for k in list(slo_sec.raw):
        if k not in SLO_KEYS:
            raise ConfigError(f"objectives.slo.{k}: unknown SLO (choose from {', '.join(SLO_KEYS)})")
        val = slo_sec.num(k, None, lo=0.0, open_lo=True, allow_none=True)
        if val is not None:
            slo[k] = val
    o.done()

    b = top.sub("budget")
    n_trials = b.int("n_trials", 20, lo=1)
    timeout = b.num("timeout_s", None, lo=0.0, open_lo=True, allow_none=True)
    trial_timeout = b.num("trial_timeout_s", 300.0, lo=0.0, open_lo=True, allow_none=True)
    seed = b.int("seed", 0)
    remeasure = b.int("remeasure_top", 3, lo=1)
    repeats = b.int("repeats", 3, lo=1)
    b.done()

    st = top.sub("storage")
    url = st.get("url", "sqlite:///autotune.db")
    if not isinstance(url, str) or "://" not in url:
        raise ConfigError(f"storage.url: must be an SQLAlchemy URL like sqlite:///autotune.db (got {url!r})")
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////") and url != "sqlite:///:memory:":
        url = "sqlite:///" + str((base / url[len("sqlite:///") :]).resolve())
    study = st.get("study_name")
    if study is not None and (not isinstance(study, str) or not study):
        raise ConfigError(f"storage.study_name: must be a non-empty string or null (got {study!r})")
    st.done()

    e = top.sub("export")
    formats = e.choices("formats", ("yaml",), EXPORT_FORMATS) if e.raw.get("formats") else ()
    e.seen.add("formats")
    export_dir = e.path_("dir", base, default="exports", must_exist=False)
    e.done()

    bk = top.sub("backend")
    backend = bk.choice("name", "engine", BACKENDS)
    server_trials = bk.int("n_trials", None, lo=1, allow_none=True)
    server_timeout = bk.num("timeout_s", None, lo=0.0, open_lo=True, allow_none=True)
    vllm = _vllm_section(bk.sub("vllm"), base)
    llamacpp = _llamacpp_section(bk.sub("llamacpp"), base)
    bk.done()

    p = top.sub("profile")
    gmax = p.int("gamma_max", max(int(gamma.high), 1), lo=1)
    p.done()
    if gamma.high > gmax:
        raise ConfigError(f"profile.gamma_max: must be >= search.gamma.high (got {gmax} < {int(gamma.high)})")
    deep = next((t for t in trees if tree_depth(t) > gmax), None)
    if deep is not None:
        raise ConfigError(
            f"search.tree_topk: {tree_name(deep)!r} has depth {tree_depth(deep)} > profile.gamma_max {gmax} "
            "(the profiler's acceptance samples stop there)"
        )
    top.done()
    cfg = TuneConfig(
        target=target,
        draft=draft,
        device=device,
        dtype=dtype,
        compile=compile_mode,
        prompts=prompts,
        max_new_tokens=max_new,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        concurrency=concurrency,
        rate=rate,
        num_requests=num_requests,
        truncate_prompts=truncate,
        drafters=drafters,
        gamma=Range(int(gamma.low), int(gamma.high)),
        confidence_threshold=thr,
        gamma_policies=schedules,
        max_batch_size=max_batch,
        search_gamma_cap=cap,
        tree_shapes=trees,
        ngram_min=ngram_min,
        ngram_max=ngram_max,
        latency=latency,
        slo=slo,
        n_trials=n_trials,
        timeout_s=timeout,
        trial_timeout_s=trial_timeout,
        seed=seed,
        storage=url,
        study_name=study,
        export_formats=formats,
        export_dir=export_dir,
        profile_gamma_max=gmax,
        remeasure_top=remeasure,
        repeats=repeats,
        backend=backend,
        server_trials=server_trials,
        server_timeout_s=server_timeout,
        vllm=vllm,
        llamacpp=llamacpp,
        source=source,
    )
    check_backend(cfg)
    return cfg


def check_backend(cfg: TuneConfig) -> None:
    """The backend's rules: a serving stack runs chains of the model, ngram or no drafter. A token tree
    trial would run there as a chain of the tree's depth, a hybrid one as an n-gram without its window,
    each under its own name: refused in one line before anything loads."""
    if cfg.backend == "engine":
        return
    if cfg.trees_searched:
        raise ConfigError(
            f"search.tree_topk: the {cfg.backend} backend runs chains only (no token trees); list "
            f"only 'chain' with it (got {[tree_name(t) for t in cfg.tree_shapes]})"
        )
    if "hybrid" in cfg.drafters:
        raise ConfigError(
            f"search.drafter: the {cfg.backend} backend has no 'hybrid' drafter (no per-row switch "
            f"between n-grams and the draft model); drop it (got {list(cfg.drafters)})"
        )


def _tree_shapes(s: _Section) -> tuple[Tree, ...]:
    """``search.tree_topk``: one shape or a list of them; default the chain only (today's behaviour)."""
    v = s.get("tree_topk", [CHAIN])
    vals = v if isinstance(v, list) and (not v or not all(isinstance(x, int) for x in v)) else [v]
    if not vals:
        raise ConfigError(
            f"{s.key('tree_topk')}: must be 'chain', a shape like '2,1,1', a dynamic tree like "
            f"'2x6/10' or a non-empty list of them "
            f"(got {v!r})"
        )
    return tuple(dict.fromkeys(parse_tree(x, s.key("tree_topk")) for x in vals))


def _args(v: _Section, default: tuple[str, ...]) -> tuple[str, ...]:
    args = v.get("args", list(default))
    if not isinstance(args, list) or not all(
        isinstance(a, (str, int, float)) and not isinstance(a, bool) for a in args
    ):
        raise ConfigError(f"{v.key('args')}: must be a list of command-line arguments (got {args!r})")
    return tuple(str(a) for a in args)


def _llamacpp_section(v: _Section, base: Path) -> LlamacppConfig:
    default = LlamacppConfig()
    home = v.path_("home", base, default=str(default.home), must_exist=False)
    threads = v.int("threads", default.threads, lo=1)
    args = _args(v, default.args)
    timeout = v.num("startup_timeout_s", default.startup_timeout_s, lo=0.0, open_lo=True)
    pre = v.get("pre_tokenizer", default.pre_tokenizer)
    if pre is not None and (not isinstance(pre, str) or not re.fullmatch(r"[a-z0-9._-]+", pre)):
        raise ConfigError(
            f"{v.key('pre_tokenizer')}: must be a llama.cpp pre-tokenizer name or null (got {pre!r})"
        )
    v.done()
    return LlamacppConfig(home, threads, args, timeout, pre)


def _vllm_section(v: _Section, base: Path) -> VllmConfig:
    default = VllmConfig()
    python = v.path_("python", base, allow_none=True)
    args = _args(v, default.args)
    env = v.get("env", dict(default.env))
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(x, (str, int, float)) and not isinstance(x, bool)
        for k, x in env.items()
    ):
        raise ConfigError(f"{v.key('env')}: must be a mapping of variable names to values (got {env!r})")
    timeout = v.num("startup_timeout_s", default.startup_timeout_s, lo=0.0, open_lo=True)
    cache = v.path_("cache_dir", base, default=str(default.cache_dir), must_exist=False)
    v.done()
    return VllmConfig(python, args, tuple((k, str(x)) for k, x in env.items()), timeout, cache)


def check_device(cfg: TuneConfig) -> str:
    """``models.device`` as this host resolves it (``auto`` -> cpu or cuda); a device it lacks is a ConfigError.

    Example:
        >>> check_device(TuneConfig(target=Path("t"), draft=None, device="cpu"))
        'cpu'
    """
    from engine.errors import EngineInputError
    from engine.loader import resolve_device

    try:
        return str(resolve_device(cfg.device))
    except EngineInputError as exc:
        raise ConfigError(f"{cfg.source or 'tune.yaml'}: models.{exc}") from None


def load_config(path: str | Path) -> TuneConfig:
    """Read and validate a tune.yaml (yaml.safe_load only).

    Example:
        >>> cfg = load_config("tune.yaml")  # doctest: +SKIP
        >>> cfg.gamma.high  # doctest: +SKIP
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
