"""Everything a command needs from a validated tune.yaml: pair, requests, store, identities.

``autotune profile`` and ``autotune tune`` both start here, so they agree on what "the same
device + pair + workload" means (the keys under which profiles are stored and reused).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autotune import profiler
from autotune.config import DEFAULT_CACHE, TuneConfig, check_device
from autotune.hardware import fingerprint
from autotune.runner import Sampling, build_requests
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
    pair_drafter: str  # how the pair is keyed in the store: "model" when a draft model is part of it
    compile_note: str = ""  # how the engine runs decode (compiled or eager, and why), for tune's log

    @property
    def device_key(self) -> str:
        return self.fingerprint["key"]

    @property
    def profile_drafter(self) -> str:
        """The drafter whose acceptance the profiler measures (the first searched one that drafts)."""
        return next((d for d in self.cfg.drafters if d != "none"), "none")


def build(cfg: TuneConfig) -> Context:
    """Load the pair and workload, open the store, compute the identity hashes."""
    needs_draft = "model" in cfg.drafters or "hybrid" in cfg.drafters  # hybrid falls back to the draft model
    check_device(cfg)
    pair = load_pair(cfg.target, cfg.draft if needs_draft else None, dtype=cfg.dtype, device=cfg.device)
    compile_note = _compile(pair, cfg.compile, [SpecConfig.for_tree(t).tree_topk for t in cfg.tree_shapes])
    if pair.tokenizer is None:
        raise EngineInputError(f"{cfg.target}: no tokenizer.json")
    items = load_workload(cfg.prompts)
    sampling = Sampling(cfg.max_new_tokens, cfg.temperature, cfg.top_k, cfg.top_p)
    requests = build_requests(
        items,
        pair.tokenizer,
        sampling,
        pair.target.config.max_position_embeddings,
        where=str(cfg.prompts),
        truncate=cfg.truncate_prompts,
    )
    device = str(pair.target.lm_head.weight.device)
    fp = fingerprint(device, cfg.dtype)
    target_hash = hash_folder(cfg.target)
    draft_hash = hash_folder(cfg.draft) if needs_draft else None
    workload = {
        "prompts": str(cfg.prompts),
        "prompts_sha256": hash_json([i.__dict__ for i in items]),
        "max_new_tokens": cfg.max_new_tokens,
        "temperature": cfg.temperature,
        "top_k": cfg.top_k,
        "top_p": cfg.top_p,
        "concurrency": list(cfg.concurrency),
        "rate": cfg.rate,
        "num_requests": cfg.num_requests,
        "dtype": cfg.dtype,
    }
    if pair.target.compiled:  # compiled timings are another measurement (eager keeps its old key)
        workload["engine"] = "compiled"
    store = Store(cfg.storage)
    store.upsert_device(fp)
    drafter = "model" if needs_draft else cfg.drafters[0]
    pair_id = store.upsert_pair(
        str(cfg.target), str(cfg.draft) if needs_draft else None, drafter, target_hash, draft_hash
    )
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
    )


INDUCTOR_CACHE = DEFAULT_CACHE / "inductor"
"""Where compiled engine graphs are cached between runs ($TORCHINDUCTOR_CACHE_DIR wins when set)."""
COMPILE_SLOWER = 1.05
"""models.compile: auto keeps eager when the compiled target decode takes more than this times eager's
time (a margin: on a shared host two equal paths differ by a few percent run to run)."""


def _compile(pair: ModelPair, mode: str, trees: Sequence[Sequence[int]] = ()) -> str:
    """Compile the pair's decode forward per ``models.compile``; returns the line tune prints.

    ``auto`` compiles and falls back to eager, saying why, when torch.compile cannot run here
    (e.g. no C++ compiler for inductor on a CPU host) or when the compiled target decodes clearly
    slower than eager (:data:`COMPILE_SLOWER`, timed interleaved at B=1: profiler.compiled_over_eager);
    ``true`` makes the first an error in one line and never falls back on speed.
    """
    if mode == "false":
        return "engine: eager (models.compile: false)"
    # Inductor's cache makes the next process compile in a fifth of the time (demo pair: 239 s cold,
    # 47 s warm); its default lives in /tmp, which hosts clear. Keep it with our other caches.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(INDUCTOR_CACHE.expanduser()))
    try:
        pair.compile_decode(trees)
    except Exception as exc:  # inductor raises many types (compiler missing, unsupported op)
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        pair.run_eager()
        if mode == "true":
            raise EngineInputError(f"models.compile: torch.compile failed on this host ({why})") from None
        return f"engine: eager (models.compile: auto, torch.compile failed: {why})"
    ratio = profiler.compiled_over_eager(pair.target)
    timing = f"decode {ratio:.2f}x eager's time here"
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
    thresholds = _threshold_grid(cfg.confidence_threshold.low, cfg.confidence_threshold.high)
    data = profiler.measure(
        ctx.pair,
        ctx.requests,
        ctx.profile_drafter,
        max(cfg.batch_sizes),
        cfg.profile_gamma_max,
        str(ctx.pair.target.lm_head.weight.device),
        cfg.dtype,
        thresholds,
        cfg.seed,
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
        ctx.cfg.tree_shapes,
        ctx.cfg.seed,
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
