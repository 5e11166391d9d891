"""Everything a command needs from a validated tune.yaml: pair, requests, store, identities.

``autotune profile`` and ``autotune tune`` both start here, so they agree on what "the same
device + pair + workload" means (the keys under which profiles are stored and reused).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from autotune.config import TuneConfig, check_device
from autotune.device import hostnoise, profiler
from autotune.device.hardware import fingerprint
from autotune.workload.runner import Sampling, build_requests
from autotune.workload.trace import Arrival, load_trace
from engine.errors import EngineInputError
from engine.loader import ModelPair, load_pair
from engine.speculative import Request, SpecConfig
from engine.workload import load_workload
from profiles.hashing import hash_folder, hash_json
from profiles.store import Store


@dataclass
class Context:
    cfg: TuneConfig
    pair: ModelPair
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

    @property
    def device_key(self) -> str:
        return self.fingerprint["key"]

    @property
    def profile_drafter(self) -> str:
        """The drafter whose acceptance and cost the profiler measures: the one the pair is keyed by
        (the draft model, else the EAGLE-3 head), so a stored measurement always describes the pair's
        own drafter; else the first searched one that drafts."""
        drafters = self.cfg.search.drafter
        if self.pair_drafter in drafters:
            return self.pair_drafter
        return next((d for d in drafters if d != "none"), "none")


def build(cfg: TuneConfig, say: Callable[[str], None] | None = None, reprofile: bool = False) -> Context:
    """Load the pair and workload, open the store, compile the engine, compute the identity hashes.

    Everything a user can get wrong (folders, the workload and its arrival trace, the storage URL)
    is checked before the compile, which can take minutes; ``say`` hears that the compile starts.
    With a serving-stack backend the engine only profiles: when the store already holds its
    profile of this workload (and ``reprofile`` is off), it is not compiled at all."""
    needs_draft = (
        "model" in cfg.search.drafter or "hybrid" in cfg.search.drafter
    )  # hybrid falls back to the draft model
    needs_head = "eagle3" in cfg.search.drafter
    check_device(cfg)
    pair = load_pair(
        cfg.models.target,
        cfg.models.draft if needs_draft else None,
        dtype=cfg.models.dtype,
        device=cfg.models.device,
        eagle3=cfg.models.eagle3 if needs_head else None,
    )
    if pair.tokenizer is None:
        raise EngineInputError(f"{cfg.models.target}: no tokenizer.json")
    items = load_workload(cfg.workload.prompts)
    sampling = Sampling(
        cfg.workload.max_new_tokens, cfg.workload.temperature, cfg.workload.top_k, cfg.workload.top_p
    )
    requests = build_requests(
        items,
        pair.tokenizer,
        sampling,
        pair.target.config.max_position_embeddings,
        where=str(cfg.workload.prompts),
        truncate=cfg.workload.truncate_prompts,
    )
    trace = load_trace(cfg, pair.tokenizer, pair.target.config.max_position_embeddings, requests)
    store = Store(cfg.storage.url)
    device = str(pair.target.lm_head.weight.device)
    fp = fingerprint(device, cfg.models.dtype)
    target_hash = hash_folder(cfg.models.target)
    draft_hash = hash_folder(cfg.draft_folder) if cfg.draft_folder is not None else None
    head_hash = hash_folder(cfg.head_beside) if cfg.head_beside is not None else None
    workload = {
        "prompts": str(cfg.workload.prompts),
        "prompts_sha256": hash_json([i.__dict__ for i in items]),
        "max_new_tokens": cfg.workload.max_new_tokens,
        "temperature": cfg.workload.temperature,
        "top_k": cfg.workload.top_k,
        "top_p": cfg.workload.top_p,
        "concurrency": list(cfg.workload.concurrency),
        "rate": cfg.workload.rate,
        "num_requests": cfg.workload.num_requests,
        "dtype": cfg.models.dtype,
        # absent at 1 (one run of num_requests per level): the identity of earlier workloads holds
        **({"min_batches": cfg.workload.min_batches} if cfg.workload.min_batches != 1 else {}),
    }
    store.upsert_device(fp)
    drafter = "model" if needs_draft else "eagle3" if needs_head else cfg.search.drafter[0]
    pair_id = store.upsert_pair(
        str(cfg.models.target),
        str(cfg.draft_folder) if cfg.draft_folder is not None else None,
        drafter,
        target_hash,
        draft_hash,
    )
    stored = _stored_engine(cfg, store, fp["key"], pair_id, workload) if not reprofile else None
    if stored is not None:  # a serving stack runs the trials; the engine's profile is in the store
        compile_note = (
            f"engine: not compiled (the {cfg.backend.name} backend runs every trial; the engine's "
            f"profile of this workload, measured {stored}, is reused from the store)"
        )
        if stored == "compiled":
            workload["engine"] = "compiled"
    else:
        compile_note = _compile(
            pair, cfg.models.compile, [SpecConfig.for_tree(t).tree_topk for t in cfg.search.tree_topk], say
        )
        if pair.target.compiled:  # compiled timings are another measurement (eager keeps its old key)
            workload["engine"] = "compiled"
    return Context(
        cfg,
        pair,
        requests,
        store,
        fp,
        target_hash,
        draft_hash,
        workload,
        hash_json(workload),
        pair_id,
        drafter,
        compile_note=compile_note,
        trace=trace,
        head_hash=head_hash,
    )


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
    # process compile in a fifth of the time (demo pair: 239 s cold, 47 s warm).
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
    ctx: Context, reprofile: bool = False, progress: Callable[[str], None] | None = None
) -> tuple[dict, bool]:
    """The stored profiler measurement for this device + pair + workload, measuring if needed.

    Returns ``(measurement, reused)``.
    """
    if not reprofile:
        found = ctx.store.latest_measurement(ctx.device_key, ctx.pair_id, ctx.workload_hash, "profiler")
        if found is not None:
            return found["data"], True
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
    data = json.loads(json.dumps(data))  # stored form (string keys), same as a reused one
    ctx.store.save_measurement(ctx.device_key, ctx.pair_id, ctx.workload_hash, "profiler", data)
    return data, False


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
