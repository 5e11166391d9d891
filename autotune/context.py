"""Everything a command needs from a validated tune.yaml: pair, requests, store, identities.

``autotune profile`` and ``autotune tune`` both start here, so they agree on what "the same
device + pair + workload" means (the keys under which profiles are stored and reused).
"""

from __future__ import annotations

import functools
import gc
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tokenizers import Tokenizer

from autotune.config import TuneConfig, check_device
from autotune.device import hostnoise, profiler
from autotune.device.capacity import Checkpoint, Need, check_fits, free_bytes, read_checkpoint, resolve_dtype
from autotune.device.gguf_header import read_gguf, read_metadata
from autotune.device.hardware import fingerprint
from autotune.errors import ConfigError
from autotune.workload.runner import CONTEXT_MARGIN, Sampling, build_requests
from autotune.workload.trace import Arrival, load_trace
from engine.chat import read_chat_template
from engine.errors import EngineInputError
from engine.loader import ModelPair, load_pair, load_tokenizer
from engine.speculative import Request, SpecConfig
from engine.workload import WorkloadItem, load_workload
from profiles.hashing import hash_folder, hash_json
from profiles.store import Store


@dataclass(frozen=True)
class PairFiles:
    """The pair as its files describe it (config.json, safetensors headers, tokenizer.json): what a
    run needs to know of the models without loading a weight."""

    tokenizer: Tokenizer | None  # None for models.gguf: llama-server tokenizes (autotune.backends.llamacpp)
    target: Checkpoint
    draft: Checkpoint | None = None
    head: Checkpoint | None = None

    @property
    def context_length(self) -> int:
        """The target's ``max_position_embeddings`` (2048 when config.json does not say)."""
        return int(self.target.config.get("max_position_embeddings") or 2048)

    @property
    def checkpoints(self) -> tuple[Checkpoint, ...]:
        return tuple(c for c in (self.target, self.draft, self.head) if c is not None)

    def needs(self, dtype: str, rows: int, tokens: int) -> list[Need]:
        """Weights in ``dtype`` and the KV cache of ``rows`` sequences of ``tokens`` (target and draft)."""
        out = [Need(f"{c.folder.name} weights ({dtype})", c.weights_bytes(dtype)) for c in self.checkpoints]
        per_token = sum(c.kv_bytes_per_token(dtype) for c in (self.target, self.draft) if c is not None)
        out.append(Need(f"KV cache ({rows} x {tokens} tokens)", per_token * rows * tokens))
        return out


def read_pair(cfg: TuneConfig, needs_draft: bool, needs_head: bool) -> PairFiles:
    """The pair's files, checked as the loader would (vocabularies, tokenizer) but without weights."""
    if cfg.models.gguf is not None:
        return _gguf_pair(cfg, needs_draft)
    target = read_checkpoint(cfg.models.target)
    draft = read_checkpoint(cfg.models.draft) if needs_draft and cfg.models.draft is not None else None
    head = read_checkpoint(cfg.models.eagle3) if needs_head and cfg.models.eagle3 is not None else None
    if draft is not None and draft.config.get("vocab_size") != target.config.get("vocab_size"):
        raise EngineInputError(
            f"{draft.folder}: draft vocab_size {draft.config.get('vocab_size')} != target vocab_size "
            f"{target.config.get('vocab_size')}"
        )
    if not (cfg.models.target / "tokenizer.json").is_file():
        raise EngineInputError(f"{cfg.models.target}: no tokenizer.json")
    return PairFiles(load_tokenizer(cfg.models.target), target, draft, head)


def _gguf_pair(cfg: TuneConfig, needs_draft: bool) -> PairFiles:
    """``models.gguf``: the files' headers (shape, vocabulary, size); no tokenizer.json, llama-server
    tokenizes the prompts when the backend starts (:mod:`autotune.backends.llamacpp`)."""
    assert cfg.models.gguf is not None
    target = read_gguf(cfg.models.gguf.target, "models.gguf.target")
    path = cfg.models.gguf.draft
    draft = read_gguf(path, "models.gguf.draft") if needs_draft and path is not None else None
    if draft is not None and draft.config.get("vocab_size") != target.config.get("vocab_size"):
        raise ConfigError(
            f"models.gguf.draft: {path} has {draft.config.get('vocab_size')} tokens, the target "
            f"{target.config.get('vocab_size')} (a draft model must share the target's vocabulary)"
        )
    return PairFiles(None, target, draft)


def model_hash(path: Path) -> str:
    """The store's key of a model: :func:`profiles.hashing.hash_folder` of a folder, the sha256 of a
    GGUF file's bytes (``models.gguf``)."""
    if path.is_dir():
        return hash_folder(path)
    st = path.stat()
    return _file_hash(str(path.resolve()), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8)
def _file_hash(path: str, mtime_ns: int, size: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass
class Context:
    """One run's inputs: the validated config (``models.dtype`` resolved), the pair's files, the
    requests, the store and the identities. The engine's pair (:attr:`pair`) is loaded only where
    the engine runs: always for the engine backend, and for a serving stack only to profile, when it
    fits beside nothing else, released before the first server starts (:func:`ensure_profile`)."""

    cfg: TuneConfig
    files: PairFiles
    requests: list[Request]
    store: Store
    fingerprint: dict
    target_hash: str
    draft_hash: str | None
    workload: dict
    workload_hash: str
    pair_id: int
    pair_drafter: str  # how the pair is keyed in the store: "model" with a draft model, "eagle3" with a head
    compile_note: str = ""  # how the engine runs decode (compiled or eager, and why), for tune's log
    trace: tuple[Arrival, ...] | None = None  # workload.trace as arrivals (autotune.workload.trace)
    head_hash: str | None = None  # the EAGLE-3 head searched beside the draft model (cfg.head_beside)
    notes: list[str] = field(default_factory=list)  # dtype, memory and engine lines for tune's log
    loaded: ModelPair | None = None  # the engine's pair while it is held
    device: str = "cpu"  # models.device as this host resolves it (cpu, cuda:N)

    @property
    def pair(self) -> ModelPair:
        """The engine's loaded pair (:func:`load_engine`); asking for it when it is not held is a bug."""
        if self.loaded is None:
            raise RuntimeError("the engine's pair is not loaded (a serving-stack run holds no weights)")
        return self.loaded

    @property
    def device_key(self) -> str:
        return self.fingerprint["key"]

    @property
    def longest_sequence(self) -> int:
        """The workload's longest prompt + output (trace included), in tokens: a stack's max model length."""
        requests = [*self.requests, *(request for _, request in self.trace or ())]
        return max(len(r.prompt_ids) + r.max_new_tokens for r in requests) + CONTEXT_MARGIN

    @property
    def profile_drafter(self) -> str:
        """The drafter whose acceptance and cost the profiler measures: the one the pair is keyed by
        (the draft model, else the EAGLE-3 head), so a stored measurement always describes the pair's
        own drafter; else the first searched one that drafts."""
        drafters = self.cfg.search.drafter
        if self.pair_drafter in drafters:
            return self.pair_drafter
        return next((d for d in drafters if d != "none"), "none")


IDENTITY_VERSION = 1
"""The workload identity's layout. A key at its default value is left out, so adding a knob keeps
every stored identity (and the measurements and studies keyed by it); a change of meaning bumps this."""


def workload_identity(cfg: TuneConfig, items: Sequence[WorkloadItem]) -> dict:
    """What makes two runs the same workload (hashed into the store's keys): prompts, sampling, levels, dtype."""
    w = cfg.workload
    return {
        "prompts": str(w.prompts),
        "prompts_sha256": hash_json([i.identity() for i in items]),
        "max_new_tokens": w.max_new_tokens,
        "temperature": w.temperature,
        "top_k": w.top_k,
        "top_p": w.top_p,
        "concurrency": list(w.concurrency),
        "rate": w.rate,
        "num_requests": w.num_requests,
        "dtype": cfg.models.dtype,
        **({"min_batches": w.min_batches} if w.min_batches != 1 else {}),
        **_chat_identity(cfg, items),
    }


def _chat_identity(cfg: TuneConfig, items: Sequence[WorkloadItem]) -> dict:
    """A chat-formatted workload says so (``format: chat``, which the profile and ``autotune tune``
    show) and is keyed by the target's chat template too (it makes the text the drafter sees); a
    plain workload adds no key. With ``models.gguf`` the template is the target file's
    ``tokenizer.chat_template`` (llama-server applies it; without one, llama-server's default)."""
    if not any(i.messages for i in items):
        return {}
    if cfg.models.gguf is not None:
        source = read_metadata(cfg.models.target, "models.gguf.target").get("tokenizer.chat_template")
        default = {"chat_template": "llama-server's default"}
        return {"format": "chat", **({"chat_template_sha256": hash_json(source)} if source else default)}
    template = read_chat_template(cfg.models.target)
    if template is None:
        return {}
    return {"format": "chat", "chat_template_sha256": hash_json(template.source)}


def _with_dtype(cfg: TuneConfig, files: PairFiles, device: str) -> tuple[TuneConfig, str]:
    """``cfg`` with ``models.dtype: auto`` resolved for ``device`` (:func:`autotune.device.capacity.resolve_dtype`)."""
    dtype, why = resolve_dtype(cfg.models.dtype, files.target.torch_dtype, device)
    resolved = cfg if dtype == cfg.models.dtype else cfg.with_overrides({"models.dtype": dtype})
    return resolved, f"dtype: {dtype} ({why})"


def engine_needs(cfg: TuneConfig, files: PairFiles, requests: Sequence[Request]) -> list[Need]:
    """What the engine holds for this run: the pair in ``models.dtype`` and its KV cache at the
    largest batch (every row the workload's longest sequence plus the speculative lookahead)."""
    longest = max(len(r.prompt_ids) + r.max_new_tokens for r in requests) + cfg.profile.gamma_max + 4
    return files.needs(cfg.models.dtype, max(cfg.batch_sizes), longest)


def _needs(cfg: TuneConfig) -> tuple[bool, bool]:
    """Whether the search needs the draft model (``model``, ``hybrid``) and the EAGLE-3 head."""
    return "model" in cfg.search.drafter or "hybrid" in cfg.search.drafter, "eagle3" in cfg.search.drafter


def host_fingerprint(cfg: TuneConfig, device: str) -> dict:
    """The fingerprint a profile of ``cfg`` (``models.dtype`` resolved) is stored under: ``device``
    and, for vLLM, the GPUs its servers span (``backend.vllm.tensor_parallel_size``)."""
    tp = cfg.backend.vllm.tensor_parallel_size if cfg.backend.name == "vllm" else 1
    return fingerprint(device, cfg.models.dtype, tensor_parallel_size=tp)


def profile_keys(cfg: TuneConfig) -> tuple[dict, str, str | None]:
    """What :func:`build` stores a profile of ``cfg`` under (the host's fingerprint, the target's and
    the draft's hashes), from the files' headers: for ``profiles show current`` and ``export current``."""
    device = check_device(cfg)
    device = "cuda:0" if device == "cuda" else device
    cfg, _ = _with_dtype(cfg, read_pair(cfg, *_needs(cfg)), device)
    draft = cfg.draft_folder
    return host_fingerprint(cfg, device), model_hash(cfg.models.target), model_hash(draft) if draft else None


def build(cfg: TuneConfig, say: Callable[[str], None] | None = None, reprofile: bool = False) -> Context:
    """Read the pair's files and the workload, open the store, compute the identity hashes; with the
    engine backend, check that the pair fits and load (and compile) it.

    Everything a user can get wrong (folders, checkpoint headers, the workload and its arrival
    trace, the storage URL, memory) is checked before anything loads or compiles; ``say`` hears
    that the compile starts. A serving-stack backend loads no weights here (:func:`ensure_profile`).
    """
    needs_draft, needs_head = _needs(cfg)
    device = check_device(cfg)
    device = "cuda:0" if device == "cuda" else device
    files = read_pair(cfg, needs_draft, needs_head)
    cfg, dtype_note = _with_dtype(cfg, files, device)
    items, requests, trace = _workload(cfg, files)
    notes = [dtype_note, *inert_max_new_tokens(cfg.workload.max_new_tokens, cfg.workload.prompts, items)]
    if cfg.backend.name == "engine":
        notes.append(check_fits(engine_needs(cfg, files, requests), free_bytes(device), device, FIT_KNOBS))
    store = Store(cfg.storage.url)
    fp = host_fingerprint(cfg, device)
    workload = workload_identity(cfg, items)
    drafter = "model" if needs_draft else "eagle3" if needs_head else cfg.search.drafter[0]
    pair_id = _register(store, cfg, fp, drafter)
    stored = _stored_engine(cfg, store, fp["key"], pair_id, workload) if not reprofile else None
    if stored == "compiled":
        workload["engine"] = "compiled"
    draft = cfg.draft_folder
    ctx = Context(
        cfg,
        files,
        requests,
        store,
        fp,
        model_hash(cfg.models.target),
        model_hash(draft) if draft is not None else None,
        workload,
        hash_json(workload),
        pair_id,
        drafter,
        trace=trace,
        head_hash=hash_folder(cfg.head_beside) if cfg.head_beside is not None else None,
        notes=notes,
        device=device,
    )
    _engine_for(ctx, stored, say)
    return ctx


def inert_max_new_tokens(max_new_tokens: int, prompts: Path, items: Sequence[WorkloadItem]) -> list[str]:
    """A note where ``workload.max_new_tokens`` reaches no request: every line of the prompts file
    sets its own ``max_new_tokens``, to other values (the lines win: editing the key changes nothing).

    Example:
        >>> from engine.workload import WorkloadItem
        >>> lines = [WorkloadItem("a", max_new_tokens=64), WorkloadItem("b", max_new_tokens=32)]
        >>> inert_max_new_tokens(16, Path("p.jsonl"), lines)
        ['workload.max_new_tokens: 16 reaches no request: every line of p.jsonl sets its own max_new_tokens (32-64)']
        >>> inert_max_new_tokens(16, Path("p.jsonl"), [WorkloadItem("a", max_new_tokens=64), WorkloadItem("b")])
        []
    """
    own = {i.max_new_tokens for i in items}
    if not items or None in own or max_new_tokens in own:
        return []
    values = sorted(n for n in own if n is not None)
    span = f"{values[0]}-{values[-1]}" if len(values) > 1 else str(values[0])
    return [
        f"workload.max_new_tokens: {max_new_tokens} reaches no request: every line of {prompts.name} "
        f"sets its own max_new_tokens ({span})"
    ]


def _workload(
    cfg: TuneConfig, files: PairFiles
) -> tuple[list[WorkloadItem], list[Request], tuple[Arrival, ...] | None]:
    """The workload's lines, its requests tokenized with the target's tokenizer, and its arrival trace
    (``models.gguf``: no requests yet, llama-server tokenizes them when the backend starts)."""
    items = load_workload(cfg.workload.prompts)
    if files.tokenizer is None:
        return items, [], None
    w = cfg.workload
    requests = build_requests(
        items,
        files.tokenizer,
        Sampling(w.max_new_tokens, w.temperature, w.top_k, w.top_p),
        files.context_length,
        where=str(w.prompts),
        truncate=w.truncate_prompts,
        chat_folder=cfg.models.target,
    )
    return items, requests, load_trace(cfg, files.tokenizer, files.context_length, requests)


def _register(store: Store, cfg: TuneConfig, fp: dict, drafter: str) -> int:
    """Store the device and the pair (by folder hashes); the pair's id."""
    store.upsert_device(fp)
    draft = cfg.draft_folder
    return store.upsert_pair(
        str(cfg.models.target),
        str(draft) if draft is not None else None,
        drafter,
        model_hash(cfg.models.target),
        model_hash(draft) if draft is not None else None,
    )


def _engine_for(ctx: Context, stored: str | None, say: Callable[[str], None] | None) -> None:
    """Load the engine for the engine backend; a serving stack's waits for :func:`ensure_profile`."""
    backend = ctx.cfg.backend.name
    if stored is not None:  # a serving stack runs the trials; the engine's profile is in the store
        ctx.compile_note = (
            f"engine: not loaded (the {backend} backend runs every trial; the engine's "
            f"profile of this workload, measured {stored}, is reused from the store)"
        )
    elif backend == "engine":
        load_engine(ctx, say)
    else:
        ctx.compile_note = f"engine: not loaded yet (the {backend} backend runs every trial)"


FIT_KNOBS = "models.dtype, search.max_batch_size or workload.concurrency, or models.device"


def load_engine(ctx: Context, say: Callable[[str], None] | None = None) -> None:
    """Load the pair into the engine (and compile it per ``models.compile``); the workload identity
    notes a compiled engine (compiled timings are another measurement than eager ones)."""
    cfg = ctx.cfg
    needs_draft = ctx.files.draft is not None
    ctx.loaded = load_pair(
        cfg.models.target,
        cfg.models.draft if needs_draft else None,
        dtype=cfg.models.dtype,
        device=cfg.models.device,
        eagle3=cfg.models.eagle3 if ctx.files.head is not None else None,
    )
    ctx.compile_note = _compile(
        ctx.loaded, cfg.models.compile, [SpecConfig.for_tree(t).tree_topk for t in cfg.search.tree_topk], say
    )
    if ctx.loaded.target.compiled and ctx.workload.get("engine") != "compiled":
        ctx.workload["engine"] = "compiled"
        ctx.workload_hash = hash_json(ctx.workload)


def release_engine(ctx: Context) -> None:
    """Drop the engine's pair (before a serving stack's first server starts)."""
    ctx.loaded = None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _stored_engine(
    cfg: TuneConfig, store: Store, device_key: str, pair_id: int, workload: dict
) -> str | None:
    """With a serving-stack backend and ``models.compile: auto``, how the stored engine profile of
    this workload was measured ("compiled" or "eager", the compiled one first), else None."""
    if cfg.backend.name == "engine" or cfg.models.compile != "auto":
        return None
    for engine, key in (("compiled", {**workload, "engine": "compiled"}), ("eager", workload)):
        if store.latest_measurement(device_key, pair_id, hash_json(key), "profiler") is not None:
            return engine
    return None


COMPILE_SLOWER = 1.05
"""models.compile: auto keeps eager when the compiled target decode takes more than this times eager's
time (a margin: on a shared host two equal paths differ by a few percent run to run)."""


def _compile(
    pair: ModelPair,
    mode: str,
    trees: Sequence[Sequence[int]] = (),
    say: Callable[[str], None] | None = None,
) -> str:
    """Compile the pair's decode forward per ``models.compile``; returns the line tune prints
    (``say`` hears that the compile starts).

    ``auto`` first reads the host for :data:`autotune.device.hostnoise.WINDOW_S`: when other processes hold
    a core torch's threads need (:func:`autotune.device.hostnoise.threads_for`), it keeps eager and says so
    rather than compile for minutes and then compare the two paths under that load. It compiles and
    falls back to eager, saying why, when torch.compile cannot run here (e.g. no C++ compiler for
    inductor on a CPU host) or when the compiled target decodes clearly slower than eager
    (:data:`COMPILE_SLOWER`, timed interleaved at B=1: profiler.compiled_over_eager, on the cores
    other processes leave free, like the profiler's timings and every trial); ``true`` makes the
    first an error in one line and never falls back on speed or load.

    Long because: the compile, its eager fallbacks and their log lines are one decision.
    """
    if mode == "false":
        return "engine: eager (models.compile: false)"
    threads = torch.get_num_threads()
    if mode == "auto":
        host = hostnoise.others_now()
        if hostnoise.threads_for(host, threads) < threads:
            return (
                f"engine: eager (models.compile: auto; other processes used {host['others_cpu_share']:.0%} of "
                f"{host['cpus']} CPUs before compiling, and a compiled/eager comparison under that load decides "
                "nothing; models.compile: true compiles anyway)"
            )
    if say is not None:
        say(
            f"engine: compiling decode/verify (models.compile: {mode}; minutes the first time, "
            "about a minute once inductor's cache holds the graphs)"
        )
    # Inductor's cache (autotune.INDUCTOR_CACHE, set when the package is imported) makes the next
    # process compile in a fraction of the time (docs/decisions.md#inductor-cache).
    try:
        pair.compile_decode(trees)
    except Exception as exc:  # inductor raises many types (compiler missing, unsupported op)
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        pair.run_eager()
        if mode == "true":
            raise EngineInputError(f"models.compile: torch.compile failed on this host ({why})") from None
        return f"engine: eager (models.compile: auto, torch.compile failed: {why})"
    free = hostnoise.threads_for(hostnoise.others_now(), threads)
    torch.set_num_threads(free)
    try:
        ratio = profiler.compiled_over_eager(pair.target)
    finally:
        torch.set_num_threads(threads)
    timing = f"decode {ratio:.2f}x eager's time here" + (
        f" (timed on {free} of {threads} threads: other processes held a core)" if free < threads else ""
    )
    if mode == "auto" and ratio > COMPILE_SLOWER:
        spent = pair.compile_s
        pair.run_eager()
        return (
            f"engine: eager (models.compile: auto; compiled in {spent:.1f} s but its {timing}, "
            "so eager is kept; models.compile: true forces it)"
        )
    return (
        f"engine: compiled decode/verify in {pair.compile_s:.1f} s, {timing} (torch.compile, dynamic "
        "shapes, once per process; models.compile: false skips it)"
    )


def ensure_profile(
    ctx: Context,
    reprofile: bool = False,
    progress: Callable[[str], None] | None = None,
    say: Callable[[str], None] | None = None,
    beside: Need | None = None,
) -> tuple[dict, bool]:
    """The stored profiler measurement for this device + pair + workload, measuring if needed.

    Returns ``(measurement, reused)``. With a serving-stack backend the engine is loaded only to
    profile, and only when the pair fits in the device's free memory beside ``beside`` (what one of
    the stack's servers will hold: the engine is a prior worth having only where it could share the
    host with the servers); it is released before returning, so no server ever runs beside it. Where it
    does not fit, or the engine refuses a model the stack loads (an EAGLE-3 head variant the engine
    does not implement), the run goes on without the engine's prior (:func:`no_engine_measurement`:
    no curves, nothing stored) and ``ctx.notes`` says so.
    """
    if not reprofile:
        found = ctx.store.latest_measurement(ctx.device_key, ctx.pair_id, ctx.workload_hash, "profiler")
        if found is not None:
            return found["data"], True
    if ctx.files.tokenizer is None:  # models.gguf: nothing the engine loads
        ctx.notes.append("engine prior: none (models.gguf: the engine loads Hugging Face folders only)")
        return no_engine_measurement(ctx), False
    stack = ctx.cfg.backend.name != "engine"
    if stack and ctx.loaded is None:
        try:
            needs = [
                *engine_needs(ctx.cfg, ctx.files, ctx.requests),
                *([beside] if beside is not None else []),
            ]
            line = check_fits(needs, free_bytes(ctx.device), ctx.device, FIT_KNOBS)
        except ConfigError as exc:
            ctx.notes.append(f"engine prior: none, the pair does not fit in the engine here ({exc})")
            return no_engine_measurement(ctx), False
        try:
            load_engine(ctx, say)
        except EngineInputError as exc:  # e.g. a published head the engine does not implement
            release_engine(ctx)
            ctx.notes.append(
                f"engine prior: none, the engine does not load this pair ({exc}); "
                f"the {ctx.cfg.backend.name} servers load it themselves"
            )
            return no_engine_measurement(ctx), False
        ctx.notes.append(f"engine prior: the pair is loaded to profile, then released ({line})")
        if not reprofile:  # a compiled engine is keyed apart: its stored measurement may exist
            found = ctx.store.latest_measurement(ctx.device_key, ctx.pair_id, ctx.workload_hash, "profiler")
            if found is not None:
                release_engine(ctx)
                return found["data"], True
    try:
        data = _measure(ctx, progress)
    except PriorOverBudget as exc:  # a serving stack goes on without the prior; nothing stored
        ctx.notes.append(f"engine prior: stopped ({exc}); the study starts without the cost model's prior")
        return no_engine_measurement(ctx), False
    finally:
        if stack:
            release_engine(ctx)
    ctx.store.save_measurement(ctx.device_key, ctx.pair_id, ctx.workload_hash, "profiler", data)
    return data, False


class PriorOverBudget(Exception):
    """Raised by a serving-stack run's progress callback when profiling the engine has used its share
    of ``budget.minutes``: the prior is worth less than the server trials it would crowd out."""


def _measure(ctx: Context, progress: Callable[[str], None] | None) -> dict:
    cfg = ctx.cfg
    thresholds = _threshold_grid(cfg.search.confidence_threshold.low, cfg.search.confidence_threshold.high)
    data = profiler.measure(
        ctx.pair,
        ctx.requests,
        ctx.profile_drafter,
        max(cfg.batch_sizes),
        cfg.profile.gamma_max,
        str(ctx.pair.target.lm_head.weight.device),
        cfg.models.dtype,
        thresholds,
        cfg.budget.seed,
        progress,
    )
    return json.loads(json.dumps(data))  # stored form (string keys), same as a reused one


def no_engine_measurement(ctx: Context) -> dict:
    """A measurement without the engine: no curves, samples or classification, so the study has no
    cost-model prior (no gamma cap, warm starts spread over the range) and the profile says so."""
    return {
        "fingerprint": ctx.fingerprint,
        "ceilings": {},
        "curves": {},
        "knee_tokens": None,
        "acceptance": {"gamma_max": ctx.cfg.profile.gamma_max, "drafter": ctx.profile_drafter, "samples": []},
        "verification_efficiency": {},
        "draft_cost_ratio": {},
        "classification": {},
        "engine": "not loaded",
    }


def extend_for_trees(ctx: Context, measurement: dict, say: Callable[[str], None]) -> dict:
    """With trees searched: the verify widths and draft ranks trees need, measured once and stored
    (``autotune profile`` and ``autotune tune`` alike; a serving-stack backend never searches trees:
    :func:`autotune.config.check_backend`)."""
    if not ctx.cfg.trees_searched:
        return measurement
    extended = profiler.extend_for_trees(
        ctx.pair,
        ctx.requests,
        measurement,
        ctx.cfg.search.tree_topk,
        ctx.cfg.budget.seed,
        progress=lambda s: say(f"  profiling: {s}"),
    )
    if extended is None:
        return measurement
    ctx.store.save_measurement(ctx.device_key, ctx.pair_id, ctx.workload_hash, "profiler", extended)
    say("profile: tree verify widths and draft ranks measured and stored")
    return extended


def _threshold_grid(low: float, high: float, steps: int = 6) -> tuple[float, ...]:
    if high <= low:
        return (low,)
    return tuple(round(low + (high - low) * i / (steps - 1), 4) for i in range(steps))
