"""The speculative decoding engine: batched draft -> one verify pass -> exact acceptance.

Contract: the engine knows nothing about tokenization, tuning or storage. It takes token ids
and sampling parameters, and it guarantees that

- greedy output (temperature 0) equals the target's greedy autoregressive output, token
  for token (fp32), for any drafter, gamma, confidence threshold and batch composition;
- sampled output has exactly the target's distribution (after temperature/top-k/top-p).

State lives in preallocated tensors: running rows are packed in slots ``0..B-1`` of the rows'
state (:class:`engine.rows.RowState`: tokens, lengths, budgets, sampling settings and their host
mirror, one structure) and of the target's and draft's KV caches. ``length[b]`` counts row b's
tokens, including the *pending* token (emitted, not yet fed to the target); the target's cache holds
the first ``length[b] - 1``. Rollback after a rejection is only a length update. Finished rows
are compacted away by moving the last row into their slot, so the hot loop reads plain views.

A step reads the device once (to learn how many tokens each row emitted and which finished):
with ``sync_free`` (the default on CUDA) nothing else in ``step`` waits for the device: the
draft loop runs a fixed ``gamma_max`` positions and feeds a fixed width, top-k is sized from
the host's copy of the rows' settings, and draft/verify times come from CUDA events.
``tests/engine/test_host_syncs.py`` counts the reads. On CPU there is no queue to drain, so
the default there keeps two cheap reads that size work to what is needed (the draft's pending
width, and stopping the draft loop once a confidence threshold has stopped every row). The
n-gram drafter is host code by nature (like vLLM's): it reads the rows it matches.
``gamma = 0`` (or the ``none`` drafter) makes a step a plain autoregressive decode through the
same code, so baseline and speculative runs share every line but the drafting. A by-batch-size
table (``SpecConfig.batch_gammas``) sets each step's K from the number of running rows; a step
whose K is 0 verifies the pending token alone (a plain decode), and the draft model reads the
tokens emitted meanwhile (``Drafter.catch_up``: one draft forward over the pending tokens, no
proposal), so its cache never lags more than a drafting step leaves it.

A token tree (``SpecConfig.tree_topk``, engine.tree) replaces only the draft and verify of a
step (:meth:`SpecEngine._tree_draft_verify`): a tree drafter (engine.tree_draft.TreeDrafter: the
draft model or an EAGLE-3 head) drafts the tree depth by depth, the target verifies every node of
every row in one forward under the tree mask, the accepted path is compacted into place in the
target's cache (and in the drafter's, ``commit_tree``) and handed back as a chain block, so
emission, EOS and budget cuts, rollback and retirement are the chain's code. Chains never build a
tree.

A drafter that reads the target's hidden states (``Drafter.target_layers``: EAGLE-3,
engine.eagle3) gets them from the prefill (``prefill(..., hidden)``) and from each verify pass
(``observe``, before ``commit`` says how many of the verified positions were accepted; after a
tree's verify, the states of the accepted path, so it sees what a chain's verify would have given);
for every other drafter the target computes exactly what it did before.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from itertools import pairwise

import torch

from engine.drafters import Drafter, NoDrafter
from engine.errors import EngineInputError
from engine.metrics import SpecStats
from engine.model import Transformer
from engine.rows import Finished, RowState
from engine.sampling import BatchSampling, accept, sample
from engine.tree import TREE_SAMPLING, DynamicTree, RowTrees, TreeShape, TreeTensors, tree_accept
from engine.tree_draft import TreeDrafter
from engine.workload import fit_prompt_to_context

GAMMA_POLICIES = ("constant", "heuristic")  # SpecConfig.gamma_schedule: how each row sets its gamma


def default_sync_free(device: torch.device) -> bool:
    """Whether a step avoids every device read but its one sync: on CUDA, where a read stalls."""
    return device.type == "cuda"


@dataclass(frozen=True)
class SpecConfig:
    """Speculation settings: the knobs the tuner searches.

    ``gamma_schedule="heuristic"`` adapts gamma per row like transformers' assisted generation:
    +2 after a fully accepted block, -1 otherwise (never below 1, never above ``max_gamma``).

    ``tree_topk`` (one top-k per depth, ``len == gamma``) drafts a token tree instead of a chain
    (engine.tree); all ones, or empty, is the chain. ``tree_sampling`` says how sampled rows pick
    a node's children: k i.i.d. draft samples ("iid", accepted with min(1, p/q) against the
    residual) or the draft's top-k ("topk", deterministic, accepted with the residual's p); greedy
    rows always take the top-k. "iid" is the default: at T > 0 the target's sample is often
    outside the draft's top-k, so top-k children are rejected far more often
    (docs/decisions.md#tree-sampling-iid).

    ``tree_nodes`` > 0 makes the tree dynamic (EAGLE-2, engine.tree.DynamicTree): ``tree_topk`` is
    then one top-k repeated at every depth, and each row verifies the ``tree_nodes`` drafted
    nodes its draft scores highest, expanding the ``topk`` best nodes of each depth. Its children
    are the draft's top-k, so it takes ``tree_sampling="topk"``.

    ``batch_gammas`` is a by-batch-size K table (what vLLM serves as
    ``num_speculative_tokens_per_batch_size``): tuned ``(batch_size, K)`` points, batch sizes
    strictly increasing. A step with B running rows drafts the K of the smallest tuned batch size
    >= B, above the largest the last point's K (:meth:`gamma_at`; the same ranges as the vLLM
    export, profiles.exporters._common.batch_ranges), so speculation can shrink, down to none,
    as the load grows. ``gamma`` is the table's largest K (the chain's length, which sizes the
    cache's lookahead and the per-position stats). Chains only, with the constant schedule: the
    table is the schedule.
    """

    gamma: int = 4
    confidence_threshold: float = 0.0
    gamma_schedule: str = "constant"
    max_gamma: int = 16
    tree_topk: tuple[int, ...] = ()
    tree_sampling: str = "iid"
    tree_nodes: int = 0
    batch_gammas: tuple[tuple[int, int], ...] = ()

    @property
    def tree(self) -> TreeShape | DynamicTree | None:
        """The tree (a static shape, or a dynamic tree's spec), or None for a chain (chains keep the
        chain code path)."""
        if not self.tree_topk or self.gamma == 0 or all(k == 1 for k in self.tree_topk):
            return None
        if self.tree_nodes:
            return DynamicTree(self.tree_topk[0], len(self.tree_topk), self.tree_nodes)
        return TreeShape(self.tree_topk)

    @property
    def lookahead(self) -> int:
        """Cache slots a step may write past a row's length: the chain's gamma or the tree's width."""
        tree = self.tree
        return tree.width if tree is not None else self.max_row_gamma

    def __post_init__(self) -> None:
        object.__setattr__(self, "tree_topk", tuple(self.tree_topk))
        object.__setattr__(
            self,
            "batch_gammas",
            tuple(tuple(p) if isinstance(p, tuple | list) else (p,) for p in self.batch_gammas),
        )
        if self.gamma < 0:
            raise EngineInputError(f"gamma: must be >= 0 (got {self.gamma})")
        if not 0.0 <= self.confidence_threshold <= 1.0:
            raise EngineInputError(
                f"confidence_threshold: must be in [0, 1] (got {self.confidence_threshold})"
            )
        if self.gamma_schedule not in GAMMA_POLICIES:
            raise EngineInputError(
                f"gamma_schedule: must be one of {GAMMA_POLICIES} (got {self.gamma_schedule!r})"
            )
        if self.gamma_schedule == "heuristic" and self.gamma > self.max_gamma:
            raise EngineInputError(
                f"gamma: must be <= max_gamma for the heuristic schedule "
                f"(got {self.gamma} > {self.max_gamma})"
            )
        self._check_tree()
        self._check_batch_gammas()

    def _check_batch_gammas(self) -> None:
        table = self.batch_gammas
        if not table:
            return
        shown = [list(p) for p in table]
        for point in table:
            if len(point) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in point):
                raise EngineInputError(
                    f"batch_gammas: each point is (batch_size, K), two ints (got {list(point)} in {shown})"
                )
        sizes = [size for size, _ in table]
        if sizes[0] < 1 or any(a >= b for a, b in pairwise(sizes)):
            raise EngineInputError(
                f"batch_gammas: batch sizes must be >= 1 and strictly increasing (got {shown})"
            )
        if min(k for _, k in table) < 0:
            raise EngineInputError(f"batch_gammas: every K must be >= 0 (got {shown})")
        if self.gamma != max(k for _, k in table):
            raise EngineInputError(
                f"batch_gammas: gamma must be the table's largest K "
                f"(got gamma {self.gamma}, largest K {max(k for _, k in table)} in {shown})"
            )
        if self.gamma_schedule != "constant":
            raise EngineInputError(
                f"batch_gammas: the table takes gamma_schedule 'constant' (got {self.gamma_schedule!r})"
            )
        if self.tree_topk:
            raise EngineInputError(
                f"batch_gammas: the table is for chains, not trees (got tree_topk {list(self.tree_topk)})"
            )

    def gamma_at(self, batch: int) -> int:
        """The K a step drafts with ``batch`` running rows: the table's (``batch_gammas``), else gamma.

        With a table, the K of the smallest tuned batch size >= ``batch``; above the largest, the
        last point's K (the vLLM export's ranges: a batch size between two tuned ones takes the
        K of the next larger one, the smaller K when K falls with load).

        Example:
            >>> config = SpecConfig(gamma=5, batch_gammas=((1, 5), (4, 3), (16, 0)))
            >>> [config.gamma_at(b) for b in (1, 2, 4, 5, 16, 64)], SpecConfig(gamma=2).gamma_at(8)
            ([5, 3, 3, 0, 0, 0], 2)
        """
        for size, k in self.batch_gammas:
            if batch <= size:
                return k
        return self.batch_gammas[-1][1] if self.batch_gammas else self.gamma

    def _check_tree(self) -> None:
        if self.tree_sampling not in TREE_SAMPLING:
            raise EngineInputError(
                f"tree_sampling: must be one of {TREE_SAMPLING} (got {self.tree_sampling!r})"
            )
        if self.tree_nodes and (
            self.tree_nodes < 0 or len(set(self.tree_topk)) != 1 or self.tree_topk[0] < 2
        ):
            raise EngineInputError(
                f"tree_nodes: a dynamic tree takes tree_nodes >= 1 and one top-k >= 2 at every "
                f"depth (got tree_nodes {self.tree_nodes}, tree_topk {list(self.tree_topk)})"
            )
        if not self.tree_topk:
            return
        if self.tree_nodes and self.tree_sampling != "topk":
            raise EngineInputError(
                f"tree_sampling: a dynamic tree (tree_nodes {self.tree_nodes}) drafts the "
                f"draft's top-k children: set 'topk' (got {self.tree_sampling!r})"
            )
        if self.tree_nodes:  # entries and size
            DynamicTree(self.tree_topk[0], len(self.tree_topk), self.tree_nodes)
        else:
            TreeShape(self.tree_topk)
        if len(self.tree_topk) != self.gamma:
            raise EngineInputError(
                f"tree_topk: needs one top-k per depth, gamma = {self.gamma} (got {list(self.tree_topk)})"
            )
        if self.tree is None:
            return
        if self.confidence_threshold > 0:
            raise EngineInputError(
                f"confidence_threshold: must be 0 with a tree (got {self.confidence_threshold})"
            )
        if self.gamma_schedule != "constant":
            raise EngineInputError(
                f"gamma_schedule: must be 'constant' with a tree (got {self.gamma_schedule!r})"
            )

    @property
    def max_row_gamma(self) -> int:
        """The most draft tokens one row can propose in a step under this config."""
        return self.max_gamma if self.gamma_schedule == "heuristic" else self.gamma

    @staticmethod
    def for_tree(tree: tuple[int, ...] | DynamicTree) -> SpecConfig:
        """The settings that draft ``tree``: a static shape (per-depth top-k) or a dynamic tree.

        Example:
            >>> SpecConfig.for_tree(DynamicTree(2, 3, 5)).tree, SpecConfig.for_tree((2, 1)).gamma
            (DynamicTree(topk=2, depth=3, nodes=5), 2)
        """
        if isinstance(tree, DynamicTree):
            return SpecConfig(
                gamma=tree.depth,
                tree_topk=(tree.topk,) * tree.depth,
                tree_nodes=tree.nodes,
                tree_sampling="topk",
            )
        return SpecConfig(gamma=len(tree), tree_topk=tree)


@dataclass(frozen=True)
class Verdict:
    """What one step's verify decided, as a chain block (a tree's accepted path is handed back as one).

    ``drafts`` (B, G) the proposed tokens (valid up to ``n_proposed``); ``n_accepted`` (B,) how
    many of them the target accepted; ``next_token`` (B,) the recovered or bonus token that
    follows them; ``drafted_at`` the clock when drafting ended (:meth:`SpecEngine._mark`).
    """

    drafts: torch.Tensor
    n_accepted: torch.Tensor
    next_token: torch.Tensor
    n_proposed: torch.Tensor
    drafted_at: torch.cuda.Event | float


@dataclass
class Request:
    """One generation request, in token ids."""

    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    id: int = 0

    def validate(self) -> None:
        """Refuse settings no engine could honour, naming the request and the value."""
        if self.max_new_tokens < 1:
            raise EngineInputError(
                f"request {self.id}: max_new_tokens must be >= 1 (got {self.max_new_tokens})"
            )
        if self.temperature < 0:
            raise EngineInputError(f"request {self.id}: temperature must be >= 0 (got {self.temperature})")
        if self.top_k < 0:
            raise EngineInputError(f"request {self.id}: top_k must be >= 0 (got {self.top_k})")
        if not 0.0 < self.top_p <= 1.0:
            raise EngineInputError(f"request {self.id}: top_p must be in (0, 1] (got {self.top_p})")


class SpecEngine:
    """Runs speculative (or plain) decoding steps over a packed batch of rows.

    Example:
        >>> from engine.drafters import NoDrafter
        >>> engine = SpecEngine(target, NoDrafter(), SpecConfig(gamma=0), 4, 256)  # doctest: +SKIP
        >>> engine.add([Request([1, 2, 3], max_new_tokens=8)])  # doctest: +SKIP
        >>> while engine.n: done = engine.retire(); engine.step()  # doctest: +SKIP
    """

    def __init__(
        self,
        target: Transformer,
        drafter: Drafter,
        config: SpecConfig,
        max_batch_size: int,
        max_seq_len: int,
        eos_ids: tuple[int, ...] | list[int] = (),
        generator: torch.Generator | None = None,
        sync_free: bool | None = None,
    ) -> None:
        self.target, self.drafter, self.config = target, drafter, config
        self.device = target.lm_head.weight.device
        self.sync_free = default_sync_free(self.device) if sync_free is None else sync_free
        drafter.sync_free = self.sync_free
        self.slots, self.max_seq_len = max_batch_size, max_seq_len
        self.generator = generator
        self.max_row_gamma = config.max_row_gamma
        self.speculate = config.gamma > 0 and drafter.name != "none"
        self.lookahead = config.lookahead
        self.first_gamma = config.gamma if self.speculate else 0  # a row's gamma when it is admitted
        self.adapts_gamma = self.speculate and config.gamma_schedule == "heuristic"
        shape = config.tree if self.speculate else None
        if shape is not None and not isinstance(drafter, TreeDrafter):
            raise EngineInputError(
                f"tree_topk: a tree needs the 'model' or 'eagle3' drafter (got {drafter.name!r})"
            )
        self.tree = shape.tensors(target.lm_head.weight.device) if shape is not None else None
        dev, s = self.device, max_batch_size
        self.cache = target.new_cache(s, max_seq_len)
        drafter.reset(s, max_seq_len)
        # A drafter that does not speculate is replaced by one that does nothing (proposes,
        # prefills, commits and moves nothing), so no step asks whether it speculates.
        self.drafter = drafter if self.speculate else NoDrafter()
        self.hidden_layers = self.drafter.target_layers  # the target's states the drafter reads
        self.state = RowState.allocate(s, max_seq_len, dev)
        self.eos = torch.tensor(list(eos_ids) or [-1], dtype=torch.long, device=dev)
        self.n = 0  # running rows, packed in slots 0..n-1
        self.stats = SpecStats(self.max_row_gamma, dev)
        self._timed = dev.type == "cuda"
        self.trace: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # see enable_trace()

    def enable_trace(self) -> None:
        """Record, per verify step and row, tokens accepted and the draft's confidence per position."""
        self.trace = []
        self.drafter.record_confidence = True

    # ------------------------------------------------------------------ admission

    def free_slots(self) -> int:
        return self.slots - self.n

    def add(self, requests: list[Request]) -> None:
        """Prefill ``requests`` into free slots and sample each one's first token.

        A request whose prompt plus ``max_new_tokens`` runs past the target's context
        (``max_position_embeddings``) is refused (:class:`EngineInputError`, naming it): positions
        past the context would be generated without a word. ``generate(truncate_prompts=True)``
        keeps such a prompt's last tokens instead.
        """
        if not requests:
            return
        m, n0 = len(requests), self.n
        if m > self.free_slots():
            raise RuntimeError(f"add: {m} requests but only {self.free_slots()} free slots")
        lens = [len(r.prompt_ids) for r in requests]
        context = self.target.config.max_position_embeddings
        for r in requests:
            r.validate()
            fit_prompt_to_context(r.prompt_ids, context - r.max_new_tokens, f"request {r.id}")
            if (
                not r.prompt_ids
                or len(r.prompt_ids) + r.max_new_tokens + self.lookahead + 2 > self.max_seq_len
            ):
                raise ValueError(
                    f"request {r.id}: prompt of {len(r.prompt_ids)} tokens + {r.max_new_tokens} new "
                    f"tokens does not fit max_seq_len {self.max_seq_len}"
                )
        width = max(lens)
        dev = self.device
        prompts = torch.zeros(m, width, dtype=torch.long)
        for i, r in enumerate(requests):
            prompts[i, : lens[i]] = torch.tensor(r.prompt_ids, dtype=torch.long)
        prompts = prompts.to(dev)
        plen = torch.tensor(lens, dtype=torch.long, device=dev)
        rows = slice(n0, n0 + m)
        self.state.admit(rows, requests, self.first_gamma)
        start = torch.zeros(m, dtype=torch.long, device=dev)
        logits, hidden = self.target.forward_hidden(
            prompts, self.cache, start, width, n0, None, self.hidden_layers
        )  # (m, P, V); (m, P, D) or None
        logits = logits.gather(1, (plen - 1)[:, None, None].expand(-1, 1, logits.shape[-1]))  # (m, 1, V)
        first = sample(self.state.sampling(rows).probs(logits)[:, 0], self.generator)  # (m,)
        self.drafter.prefill(n0, prompts, plen, width, hidden)
        self.state.start(rows, requests, prompts, plen, first, self.eos)  # admission reads the device anyway
        self.n += m

    # ------------------------------------------------------------------ one step

    def synchronize(self) -> None:
        """Wait for queued device work (a no-op on CPU), so host clocks read true times."""
        if self._timed:
            torch.cuda.synchronize(self.device)

    def _mark(self) -> torch.cuda.Event | float:
        """A point in time: a recorded CUDA event on the GPU (no wait), the host clock elsewhere."""
        if self._timed:
            # torch.cuda.Event's constructor has no annotations in torch's own hints
            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record()
            return event
        return time.perf_counter()

    @staticmethod
    def _seconds(a: torch.cuda.Event | float, b: torch.cuda.Event | float) -> float:
        """Seconds between two marks (events must have completed: read after the step's sync)."""
        if isinstance(a, torch.cuda.Event) and isinstance(b, torch.cuda.Event):
            ms: float = a.elapsed_time(b)
            return ms / 1e3
        if isinstance(a, float) and isinstance(b, float):
            return b - a
        raise TypeError("marks of one step are both CUDA events or both host clock readings")

    def step(self) -> list[int]:
        """One draft + verify step over all running rows; returns tokens emitted per row.

        Propose (the drafter's chain, or a token tree), verify (one target forward), accept, emit
        the block into the rows, record the step's counters, and read the device once.
        """
        b = self.n
        if b == 0:
            return []
        rows, st = slice(0, b), self.state
        length = st.length[rows]
        sampling = st.sampling(rows)
        gmax, gammas = self._step_gammas(b)
        width = self.tree.width if self.tree is not None else gmax  # slots written past length
        kv_len = min(max(st.host_len[:b]) + width + 2, self.max_seq_len)
        t0 = self._mark()
        if self.tree is not None:
            verdict = self._tree_draft_verify(self.tree, rows, length, sampling, kv_len)
        else:
            verdict = self._chain_draft_verify(rows, length, gmax, gammas, sampling, kv_len)
        n_emit, new_len = self._emit(rows, length, verdict)
        self._record(b, verdict, n_emit, new_len)
        return self._sync(b, t0, verdict, n_emit, new_len)

    def _step_gammas(self, b: int) -> tuple[int, torch.Tensor]:
        """This step's K (the rows' largest gamma) and the rows' gammas (B,), both capped at the
        by-batch-size table's K for ``b`` running rows."""
        gmax, gammas = max(self.state.host_gamma[:b]), self.state.gamma[:b]
        if self.config.batch_gammas and gmax > (k := self.config.gamma_at(b)):
            gmax, gammas = k, gammas.clamp(max=k)
        return gmax, gammas

    def _chain_draft_verify(
        self,
        rows: slice,
        length: torch.Tensor,
        gmax: int,
        gammas: torch.Tensor,
        sampling: BatchSampling,
        kv_len: int,
    ) -> Verdict:
        """Propose a chain, verify it and the pending token in one target forward, accept a prefix."""
        drafts, draft_probs, n_prop = self._propose(rows, length, gmax, gammas, sampling, kv_len)
        drafted_at = self._mark()
        target_probs = self._verify(rows, length, drafts, sampling, kv_len)
        n_acc, nxt = accept(drafts, draft_probs, target_probs, n_prop, self.generator)
        return Verdict(drafts, n_acc, nxt, n_prop, drafted_at)

    def _propose(
        self,
        rows: slice,
        length: torch.Tensor,
        gmax: int,
        gammas: torch.Tensor,
        sampling: BatchSampling,
        kv_len: int,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """The drafter's chain: tokens (B, G), their probabilities (B, G, V) or None, n_proposed (B,).

        A step whose K is 0 proposes nothing, but the drafter reads the tokens emitted meanwhile
        (``Drafter.catch_up``), so its cache never lags more than a drafting step leaves it.
        """
        tokens = self.state.tokens[rows]
        if gmax > 0:
            threshold, generator = self.config.confidence_threshold, self.generator
            out = self.drafter.propose(tokens, length, gammas, gmax, threshold, sampling, kv_len, generator)
        else:
            self.drafter.catch_up(tokens, length, kv_len)
            b = length.shape[0]
            none = torch.zeros(b, dtype=torch.long, device=self.device)
            out = torch.zeros(b, 0, dtype=torch.long, device=self.device), None, none
        self.stats.draft_forwards += self.drafter.forwards
        return out

    def _verify(
        self, rows: slice, length: torch.Tensor, drafts: torch.Tensor, sampling: BatchSampling, kv_len: int
    ) -> torch.Tensor:
        """The target's processed probabilities (B, 1 + G, V) after the pending token and each draft,
        in one forward; a drafter that reads the target's states gets those of these positions."""
        pending = self.state.tokens[rows].gather(1, (length - 1)[:, None])  # (B, 1)
        verify_in = torch.cat([pending, drafts], 1)  # (B, 1 + G)
        if self.hidden_layers:  # the drafter reads the verified positions' states (engine.eagle3)
            logits, hidden = self.target.decode_hidden(
                verify_in, self.cache, length - 1, kv_len, self.hidden_layers
            )
            self.drafter.observe(hidden)
        else:
            logits = self.target.decode(verify_in, self.cache, length - 1, kv_len)
        return sampling.probs(logits)

    def _emit(self, rows: slice, length: torch.Tensor, verdict: Verdict) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the emitted block into the rows' tokens; returns n_emitted (B,) and the new lengths (B,).

        The block is the accepted drafts, then the recovered/bonus token, cut after the first EOS
        and at the row's budget; a finished row not yet retired emits nothing.
        """
        st, g = self.state, verdict.drafts.shape[1]
        n_acc, nxt = verdict.n_accepted, verdict.next_token
        offs = torch.arange(g + 1, device=self.device)[None, :]  # (1, G+1)
        block = torch.cat([verdict.drafts, nxt[:, None]], 1)  # (B, G+1)
        block = torch.where(offs < n_acc[:, None], block, nxt[:, None])
        n_emit = n_acc + 1
        is_eos = torch.isin(block, self.eos) & (offs < n_emit[:, None])
        first_eos = torch.where(is_eos, offs, g + 1).amin(1)  # (B,)
        hit_eos = first_eos < n_emit
        n_emit = torch.minimum(torch.where(hit_eos, first_eos + 1, n_emit), st.budget[rows] - length)
        n_emit = torch.where(st.finished[rows], 0, n_emit)  # finished, not yet retired: frozen
        pos = (length[:, None] + offs).clamp(max=self.max_seq_len - 1)  # (B, G+1)
        old = st.tokens[rows].gather(1, pos)
        st.tokens[rows].scatter_(1, pos, torch.where(offs < n_emit[:, None], block, old))
        new_len = length + n_emit
        st.length[rows] = new_len
        st.hit_eos[rows] |= hit_eos & (first_eos < n_emit)
        st.finished[rows] = st.hit_eos[rows] | (new_len >= st.budget[rows])
        return n_emit, new_len

    def _record(self, b: int, verdict: Verdict, n_emit: torch.Tensor, new_len: torch.Tensor) -> None:
        """Tell the drafter what was kept, adapt the rows' gammas, and count the step (no device read)."""
        rows, st = slice(0, b), self.state
        n_prop, n_acc = verdict.n_proposed, verdict.n_accepted
        self.drafter.commit(new_len)
        if self.adapts_gamma:
            full = (n_acc == n_prop) & (n_prop > 0)
            st.gamma[rows] = torch.where(full, st.gamma[rows] + 2, st.gamma[rows] - 1).clamp(
                1, self.max_row_gamma
            )
        self.stats.record(n_prop, n_acc, n_emit)
        if (source := self.drafter.sources(b)) is not None:
            self.stats.record_sources(source, n_prop, n_acc)
        g = verdict.drafts.shape[1]
        if self.trace is not None and g > 0 and self.tree is None:  # accepted, draft confidence per position
            self.trace.append((n_acc, self.drafter.confidence(b, g)))

    def _sync(
        self,
        b: int,
        t0: torch.cuda.Event | float,
        verdict: Verdict,
        n_emit: torch.Tensor,
        new_len: torch.Tensor,
    ) -> list[int]:
        """The step's one device read: tokens emitted per row, and the rows' host mirror and timings."""
        st, rows = self.state, slice(0, b)
        t2 = self._mark()
        host: list[list[int]] = torch.stack(
            [n_emit, new_len, st.gamma[rows], st.finished[rows].long()]
        ).tolist()  # the one sync
        self.stats.draft_time_s += self._seconds(t0, verdict.drafted_at)
        self.stats.verify_time_s += self._seconds(verdict.drafted_at, t2)
        self.stats.verify_steps += 1
        g = self.tree.n_nodes if self.tree is not None else verdict.drafts.shape[1]
        self.stats.verify_slots += b * (g + 1)
        self.stats.batch_rows += b
        st.host_len[:b] = host[1]
        st.host_gamma[:b] = host[2]
        st.host_finished[:b] = [bool(f) for f in host[3]]
        return host[0]

    def _tree_draft_verify(
        self,
        tree: TreeTensors | DynamicTree,  # self.tree
        rows: slice,
        length: torch.Tensor,
        sampling: BatchSampling,
        kv_len: int,
    ) -> Verdict:
        """Draft the tree, verify every node of every row in one target forward, accept a path.

        Returns the accepted path as a chain block (drafts (B, gamma): the path's tokens, valid up
        to n_accepted; n_proposed = gamma). The path's target and draft cache entries are compacted
        to their depths, and a drafter that reads the target's states gets those of the path, so
        the rest of the step (and rollback) is the chain's.
        """
        b = length.shape[0]
        drafter = self.drafter
        assert isinstance(drafter, TreeDrafter)  # __init__ refuses a tree for any other drafter
        iid = node_probs = None
        trees: RowTrees
        if isinstance(tree, DynamicTree):
            nodes, trees = drafter.propose_dynamic_tree(self.state.tokens[rows], length, tree, kv_len)
        else:
            if self.config.tree_sampling == "iid" and not sampling.all_greedy:
                iid = sampling.temperature > 0
            nodes, node_probs = drafter.propose_tree(
                self.state.tokens[rows], length, tree, sampling, iid, kv_len, self.generator
            )  # (B, N+1), (B, n_internal, V) | None
            trees = tree.rows(b)
        g = trees.depth
        self.stats.draft_forwards += g
        t1 = self._mark()
        base = length - 1
        attn = trees.attention(base, 0, nodes.shape[1], kv_len)
        hidden = None
        if self.hidden_layers:  # (B, N+1, D) the nodes' states, for a drafter that reads them
            layers = self.hidden_layers
            logits, hidden = self.target.decode_hidden(nodes, self.cache, base, kv_len, layers, attn)
        else:
            logits = self.target.decode(nodes, self.cache, base, kv_len, attn)
        target_probs = sampling.probs(logits)  # (B, N+1, V)
        n_acc, path, nxt = tree_accept(trees, nodes, target_probs, node_probs, iid, self.generator)
        depth = torch.arange(1, g + 1, device=self.device)[None, :]  # (1, G)
        self.cache.compact(0, base[:, None] + path[:, 1:], base[:, None] + depth)
        if hidden is not None:  # the path's states at positions length - 1 + j: what a chain's verify gives
            self.drafter.observe(hidden.gather(1, path[:, :, None].expand(-1, -1, hidden.shape[-1])))
        drafter.commit_tree(trees, path, n_acc)
        n_prop = torch.full((b,), g, dtype=torch.long, device=self.device)
        return Verdict(nodes.gather(1, path[:, 1:]), n_acc, nxt, n_prop, t1)

    # ------------------------------------------------------------------ retirement

    def retire(self) -> list[Finished]:
        """Remove finished rows and return their outputs (in slot order).

        Compaction is one batched copy per buffer: the surviving rows past the new batch size
        move into the holes the finished rows leave below it.
        """
        if self.n == 0:
            return []
        done = [slot for slot in range(self.n) if self.state.host_finished[slot]]  # read at the step's sync
        if not done:
            return []
        out = self.state.outputs(done)
        new_n = self.n - len(done)
        gone = set(done)
        holes = [s for s in done if s < new_n]
        sources = [s for s in range(new_n, self.n) if s not in gone]
        if holes:
            self._move(sources, holes)
        self.n = new_n
        return out

    def _move(self, src: list[int], dst: list[int]) -> None:
        """Rows ``src`` now live in slots ``dst`` (equal-length lists of distinct slots)."""
        length = max(self.state.host_len[s] for s in src)
        si = torch.tensor(src, device=self.device)
        di = torch.tensor(dst, device=self.device)
        self.state.move(src, dst, si, di)
        self.cache.move(si, di, length)
        self.drafter.move(si, di, length)
