"""Drafters: who proposes the tokens the target verifies.

One small interface, its implementations:

- :class:`ModelDrafter`: a small draft model with its own KV cache (the classic pairing);
- :class:`NgramDrafter`: prompt lookup, no model (vLLM's ``ngram`` method): find the latest
  earlier occurrence of the row's last n tokens and propose what followed it;
- :class:`NoDrafter`: proposes nothing, so every step is a plain autoregressive decode;
- :class:`HybridDrafter`: per row and step, the n-gram proposal when the prompt-lookup match
  is long enough, else the draft model's (which the confidence threshold may cut to nothing);
- ``Eagle3Drafter`` (engine.eagle3_drafter): an EAGLE-3 head fed with the target's hidden states.

Both model drafters draw their chains through :class:`ChainProposal` (the token, its
probabilities, its confidence and the threshold rule, position by position).

Rows are packed in slots ``0..B-1``; the engine owns the token buffer and the per-row lengths
and tells the drafter when rows are prefilled, committed or moved.
"""

from __future__ import annotations

import torch

from engine.errors import EngineInputError
from engine.kv_cache import KVCache
from engine.model import ExplicitAttention, Transformer
from engine.sampling import BatchSampling, sample
from engine.tree import DynamicTree, RowTrees, TreeTensors
from engine.tree_draft import LevelForward, draft_dynamic_tree, draft_static_tree


class Drafter:
    """Interface: ``propose`` returns (tokens (B, G), probs (B, G, V) or None, n_proposed (B,))."""

    name = "none"
    record_confidence = False  # keep per-position confidence even when no threshold needs it
    sync_free = False  # set by the engine: size work by bounds, never by reading device values
    forwards = 0  # draft model forwards of the last ``propose``
    # target layers whose hidden states the drafter reads (engine.eagle3); () = none, the target's
    # forward then computes nothing extra and ``prefill`` gets ``hidden=None``
    target_layers: tuple[int, ...] = ()

    def reset(self, slots: int, max_seq_len: int) -> None:
        """(Re)allocate per-slot state for ``slots`` rows of up to ``max_seq_len`` tokens."""

    def prefill(
        self,
        slot0: int,
        prompts: torch.Tensor,
        prompt_lens: torch.Tensor,
        kv_len: int,
        hidden: torch.Tensor | None = None,
    ) -> None:
        """Rows slot0..slot0+m-1 start with ``prompts`` (m, P), right-padded to ``prompt_lens``;
        ``hidden`` (m, P, D): the target's states of :attr:`target_layers` at those positions."""

    def observe(self, hidden: torch.Tensor) -> None:
        """The verify pass's target states of :attr:`target_layers`, (B, 1 + G, D) at positions
        ``length - 1 ..`` (only :attr:`target_layers` drafters get it); ``commit`` follows and
        says how many of them were accepted."""

    def propose(
        self,
        tokens: torch.Tensor,  # (B, S) the engine's token buffer (rows 0..B-1)
        length: torch.Tensor,  # (B,) tokens per row, the pending (not yet verified) one included
        gammas: torch.Tensor,  # (B,) proposals wanted per row
        gamma_max: int,
        threshold: float,
        sampling: BatchSampling,
        kv_len: int,
        generator: torch.Generator | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        b = tokens.shape[0]
        empty = torch.zeros(b, 0, dtype=torch.long, device=tokens.device)
        return empty, None, torch.zeros(b, dtype=torch.long, device=tokens.device)

    def catch_up(self, tokens: torch.Tensor, length: torch.Tensor, kv_len: int) -> None:
        """A step that drafts nothing (a by-batch-size table's K = 0, engine.speculative): keep up
        with the rows' tokens (``tokens`` (B, S), ``length`` (B,) as in :meth:`propose`), so the
        next ``propose`` finds its state as after a drafting step. ``commit`` follows, as usual."""

    def commit(self, new_length: torch.Tensor) -> None:
        """Rows now hold ``new_length`` tokens (pending one included); roll back what was rejected."""

    def confidence(self, batch: int, width: int) -> torch.Tensor:
        """(B, G) top probability behind each proposal of the last ``propose`` (1 when certain)."""
        return torch.ones(batch, width)

    def move(self, src: torch.Tensor, dst: torch.Tensor, length: int) -> None:
        """Slots ``src`` now live in slots ``dst`` (the engine compacts finished rows away)."""

    def sources(self, batch: int) -> torch.Tensor | None:
        """(B,) which source proposed each row in the last ``propose`` (:data:`SOURCES`), or None."""
        return None


NoDrafter = Drafter
SOURCES = ("none", "ngram", "model")  # per-row draft sources a drafter may report (HybridDrafter)


# Tokens a row can hold that the draft model has not been fed yet. After prefill it is 1 (the
# first sampled token). A step feeds the draft the pending tokens and then its own proposals
# but the last: with g draft forwards the draft has seen length + g - 1 tokens. If the target
# accepts all g and adds a bonus token, the row grows to length + g + 1 and 2 are unseen (the
# last proposal and the bonus); after any rejection, an early threshold stop or a cut at EOS
# or budget, the row ends at or before the draft's horizon and 1 is unseen (commit() clamps
# the draft's length to the row's committed tokens). A step that drafts nothing (a by-batch-size
# table's K = 0) feeds the pending tokens (catch_up), so 1 is unseen after it too. So 2 bounds
# it, and the sync-free path feeds a fixed width of 2 (padding writes past the row's length,
# which the next step overwrites) instead of reading the maximum back from the device.
PENDING_MAX = 2


class ChainProposal:
    """A chain proposal drawn position by position, shared by the drafters that draft with a model
    (:class:`ModelDrafter`, ``Eagle3Drafter``): each position's token (the argmax when every row is
    greedy, the draft's one-hot q being exact there; else a sample of the draft's processed
    distribution, whose probabilities the exact acceptance needs), its confidence, and the rows
    still proposing under ``threshold`` and their gammas.

    The drafter feeds each position's logits (B, 1, V) to :meth:`take` and reads
    :meth:`result` at the end.
    """

    def __init__(
        self,
        gammas: torch.Tensor,
        threshold: float,
        sampling: BatchSampling,
        generator: torch.Generator | None,
        record_confidence: bool,
        sync_free: bool,
    ) -> None:
        self.gammas, self.threshold, self.sampling, self.generator = gammas, threshold, sampling, generator
        self.sync_free = sync_free
        self.greedy = sampling.temperature <= 0
        self.want_conf = threshold > 0 or record_confidence
        self.toks: list[torch.Tensor] = []
        self.probs: list[torch.Tensor] = []
        self.conf: list[torch.Tensor] = []  # (B,) per position: the drafter's ``confidence``
        self.n_proposed = torch.zeros(gammas.shape[0], dtype=torch.long, device=gammas.device)
        self.active = gammas > 0

    def take(self, logits: torch.Tensor) -> bool:
        """Draw the next position from ``logits`` (B, 1, V); False when no row proposes further
        (read only where the step may sync: a sync-free step drafts every position)."""
        i = len(self.toks)
        if self.sampling.all_greedy:  # q is one-hot: the deterministic-drafter rule is exact
            probs, tok = None, logits[:, 0].argmax(-1)
        else:
            probs = self.sampling.probs(logits)[:, 0]  # (B, V); a reduced vocabulary's: 0 outside it
            tok = sample(probs, self.generator)  # one-hot rows (greedy) give their argmax
            self.probs.append(probs)
        self.toks.append(tok)
        if self.want_conf:
            top = logits[:, 0].float().softmax(-1).amax(-1)
            conf = top if probs is None else torch.where(self.greedy, top, probs.amax(-1))  # (B,)
            self.conf.append(conf)
        if self.threshold > 0:  # a row proposes position i while confident and under its gamma
            self.active = self.active & (conf >= self.threshold)
            self.n_proposed += self.active.long()
            self.active = self.active & (self.gammas > i + 1)
            if not self.sync_free and not bool(self.active.any()):
                return False
        return True

    def result(self) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """(tokens (B, iters), probs (B, iters, V) or None when all greedy, n_proposed (B,))."""
        iters = len(self.toks)
        # no threshold: row b proposes its first gammas[b] positions
        n_proposed = self.gammas.clamp(max=iters) if self.threshold <= 0 else self.n_proposed
        probs = torch.stack(self.probs, 1) if self.probs else None
        return torch.stack(self.toks, 1), probs, n_proposed


class ModelDrafter(Drafter):
    """A draft model with its own static KV cache and per-row committed length.

    Sync-free mode (``sync_free``, set by the engine on CUDA) runs all ``gamma_max`` draft
    positions even when a confidence threshold has stopped every row (rows past their stop
    are masked out of ``n_proposed``), and feeds a fixed width of :data:`PENDING_MAX` (or the
    ``width`` a caller that has read the rows already passes: :class:`HybridDrafter`).
    """

    name = "model"
    # per-slot state, allocated by reset() (the engine resets a drafter before it prefills any row)
    cache: KVCache
    draft_len: torch.Tensor  # (slots,) tokens of the row held in the draft cache
    _fed: torch.Tensor  # (slots,) positions the last propose wrote with valid inputs
    _tree_base: torch.Tensor  # (B,) the root's position, set by propose_tree / propose_dynamic_tree

    def __init__(self, model: Transformer) -> None:
        self.model = model
        self._conf: list[torch.Tensor] = []

    def reset(self, slots: int, max_seq_len: int) -> None:
        self.cache = self.model.new_cache(slots, max_seq_len)
        device = self.model.lm_head.weight.device
        self.draft_len = torch.zeros(slots, dtype=torch.long, device=device)
        self._fed = torch.zeros(slots, dtype=torch.long, device=device)

    def prefill(
        self,
        slot0: int,
        prompts: torch.Tensor,
        prompt_lens: torch.Tensor,
        kv_len: int,
        hidden: torch.Tensor | None = None,
    ) -> None:
        m = prompts.shape[0]
        start = torch.zeros(m, dtype=torch.long, device=prompts.device)
        self.model(prompts, cache=self.cache, start=start, kv_len=kv_len, slot0=slot0)
        self.draft_len[slot0 : slot0 + m] = prompt_lens

    def propose(
        self,
        tokens: torch.Tensor,
        length: torch.Tensor,
        gammas: torch.Tensor,
        gamma_max: int,
        threshold: float,
        sampling: BatchSampling,
        kv_len: int,
        generator: torch.Generator | None,
        width: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        b = tokens.shape[0]
        device = tokens.device
        dlen = self.draft_len[:b]
        n_pending = length - dlen  # (B,) tokens the draft has not seen yet, 1..PENDING_MAX (or width)
        if width is None:
            width = PENDING_MAX if self.sync_free else int(n_pending.max())
        offs = torch.arange(width, device=device)
        idx = (dlen[:, None] + offs[None, :]).clamp(max=tokens.shape[1] - 1)  # (B, W)
        inp = tokens.gather(1, idx)  # (B, W) right-padded pending tokens
        chain = ChainProposal(gammas, threshold, sampling, generator, self.record_confidence, self.sync_free)
        self._conf = chain.conf
        start = dlen
        for i in range(gamma_max):
            logits = self.model.decode(inp, self.cache, start, kv_len)  # (B, W, V); W = 1 after the first
            if i == 0 and width > 1:  # each row's last pending token
                logits = logits.gather(1, (n_pending - 1)[:, None, None].expand(-1, 1, logits.shape[-1]))
            if not chain.take(logits):
                break
            if i + 1 < gamma_max:
                start, inp = start + (n_pending if i == 0 else 1), chain.toks[-1][:, None]
        iters = len(chain.toks)
        self._fed[:b] = dlen + n_pending + iters - 1  # positions written with valid inputs
        self.forwards = iters
        return chain.result()

    def confidence(self, batch: int, width: int) -> torch.Tensor:
        return torch.stack(self._conf, 1)[:batch, :width]

    def catch_up(
        self, tokens: torch.Tensor, length: torch.Tensor, kv_len: int, width: int | None = None
    ) -> None:
        """Feed the rows' pending tokens and nothing else (one draft forward, no proposal).

        A step that drafts nothing still emits a token per row, so without this the rows would
        run ahead of the draft cache by one token per such step, past the fixed
        :data:`PENDING_MAX` the sync-free step feeds. After it the draft has seen every token
        (``_fed`` = length): the commit that follows leaves 1 unseen (the new pending token), as
        after a rejection. ``width``: as in :meth:`propose`.
        """
        self._root_logits(tokens, length, kv_len, width)
        self._fed[: tokens.shape[0]] = length
        self.forwards = 1

    def _root_logits(
        self, tokens: torch.Tensor, length: torch.Tensor, kv_len: int, width: int | None = None
    ) -> torch.Tensor:
        """Feed the rows' pending tokens; the draft's logits after the last one (the tree's root):
        (B, 1, V)."""
        dlen = self.draft_len[: tokens.shape[0]]
        n_pending = length - dlen  # (B,) 1..PENDING_MAX (or width)
        if width is None:
            width = PENDING_MAX if self.sync_free else int(n_pending.max())
        idx = (dlen[:, None] + torch.arange(width, device=tokens.device)[None, :]).clamp(
            max=tokens.shape[1] - 1
        )
        logits = self.model.decode(tokens.gather(1, idx), self.cache, dlen, kv_len)
        return logits.gather(1, (n_pending - 1)[:, None, None].expand(-1, 1, logits.shape[-1]))

    def propose_tree(
        self,
        tokens: torch.Tensor,  # (B, S) the engine's token buffer
        length: torch.Tensor,  # (B,)
        tree: TreeTensors,
        sampling: BatchSampling,
        iid: torch.Tensor | None,  # (B,) bool rows whose children are i.i.d. draft samples; None: all top-k
        kv_len: int,
        generator: torch.Generator | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft a token tree depth by depth (engine.tree_draft.draft_static_tree): one draft forward
        per depth over all its nodes, after one over the pending tokens.

        Depth d's nodes sit in the draft cache at slots ``length - 1 + node`` and see the prefix and
        their ancestors (tree mask); :meth:`commit_tree` compacts the accepted path.
        """
        base = length - 1
        self._tree_base = base
        root = tokens.gather(1, base[:, None])  # (B, 1)
        logits = self._root_logits(tokens, length, kv_len)
        forward = self._level_forward(kv_len)
        return draft_static_tree(root, logits, base, tree, sampling, iid, kv_len, generator, forward)

    def propose_dynamic_tree(
        self, tokens: torch.Tensor, length: torch.Tensor, tree: DynamicTree, kv_len: int
    ) -> tuple[torch.Tensor, RowTrees]:
        """Draft each row's dynamic tree (engine.tree_draft.draft_dynamic_tree): ``depth`` draft
        forwards, the first over the pending tokens, each later one over the ``topk`` best-scoring
        nodes of the previous depth (at draft-cache slots ``length + (d - 1) * topk + j``). Returns
        node tokens (B, n+1) and the rows' trees."""
        base = length - 1
        self._tree_base = base
        root = tokens.gather(1, base[:, None])
        logits = self._root_logits(tokens, length, kv_len)
        return draft_dynamic_tree(root, logits, base, tree, kv_len, self._level_forward(kv_len))

    def _level_forward(self, kv_len: int) -> LevelForward:
        """The draft model's forward over a depth's nodes (a token sees its ancestors' entries)."""

        def forward(
            nodes: torch.Tensor, came_from: torch.Tensor, start: torch.Tensor, attn: ExplicitAttention
        ) -> torch.Tensor:
            return self.model.decode(nodes, self.cache, start, kv_len, attn)

        return forward

    def commit_tree(self, tree: RowTrees, path: torch.Tensor, n_accepted: torch.Tensor) -> None:
        """Move the accepted path's draft entries to their depths (the nodes the draft was fed: every
        accepted node but maybe the last; a static tree's leaves and a dynamic tree's unexpanded
        nodes were never fed)."""
        b, depth = path.shape[0], path.shape[1] - 1
        base = self._tree_base
        if depth > 1:
            src = tree.draft_slots.gather(1, path[:, 1:depth]).clamp(min=0)  # unfed: past what commits
            js = torch.arange(1, depth, device=path.device)[None, :]
            self.cache.compact(0, base[:, None] + src, base[:, None] + js)
        last = path.gather(1, n_accepted[:, None])
        fed = n_accepted - 1 + (tree.draft_slots.gather(1, last)[:, 0] >= 0).long()
        self._fed[:b] = base + 1 + fed

    def commit(self, new_length: torch.Tensor) -> None:
        b = new_length.shape[0]
        # The target's cache holds every committed token but the pending one.
        self.draft_len[:b] = torch.minimum(self._fed[:b], new_length - 1)

    def move(self, src: torch.Tensor, dst: torch.Tensor, length: int) -> None:
        self.cache.move(src, dst, length)
        self.draft_len[dst] = self.draft_len[src]


class NgramDrafter(Drafter):
    """Prompt-lookup drafting: match the last n in [n_min, n_max] tokens, propose the continuation."""

    name = "ngram"

    def __init__(self, n_min: int = 2, n_max: int = 4) -> None:
        if not 1 <= n_min <= n_max:
            raise EngineInputError(f"ngram: need 1 <= n_min <= n_max (got {n_min}, {n_max})")
        self.n_min, self.n_max = n_min, n_max

    def _lookup(self, seq: torch.Tensor, want: int) -> torch.Tensor:
        """Continuation of the latest earlier match of the longest suffix n-gram (maybe empty)."""
        length = seq.shape[0]
        for n in range(min(self.n_max, length - 1), self.n_min - 1, -1):
            windows = seq[: length - 1].unfold(0, n, 1)  # (length-n, n) n-grams ending before the last token
            hits = (windows == seq[length - n :]).all(-1).nonzero()
            if hits.numel():
                begin = int(hits[-1]) + n
                return seq[begin : begin + want]
        return seq[:0]

    def propose(
        self,
        tokens: torch.Tensor,
        length: torch.Tensor,
        gammas: torch.Tensor,
        gamma_max: int,
        threshold: float,
        sampling: BatchSampling,
        kv_len: int,
        generator: torch.Generator | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        out, n_proposed = self.lookup(tokens, length.tolist(), gammas.tolist(), gamma_max)
        return out, None, torch.tensor(n_proposed, dtype=torch.long, device=tokens.device)

    def lookup(
        self, tokens: torch.Tensor, lengths: list[int], gammas: list[int], gamma_max: int
    ) -> tuple[torch.Tensor, list[int]]:
        """Each row's continuation (B, gamma_max), right-padded, and its length, given the rows'
        lengths and gammas on the host."""
        out = torch.zeros(len(lengths), gamma_max, dtype=torch.long, device=tokens.device)
        n_proposed = []
        for row, (n, g) in enumerate(zip(lengths, gammas, strict=True)):
            cont = self._lookup(tokens[row, :n], g)
            out[row, : cont.numel()] = cont
            n_proposed.append(cont.numel())
        return out, n_proposed


class HybridDrafter(Drafter):
    """Dynamic draft selection per row and step (after vLLM's ngram / draft-model split).

    A row whose last ``n`` tokens (``n_min <= n <= n_max``) reappear earlier in it takes the
    n-gram continuation (no model forward; often right on copied spans); every other row takes
    the draft model's proposal, cut by the confidence threshold (possibly to nothing). When every
    row has an n-gram proposal the draft model does not run at all; its cache catches up on the
    next step that needs it (the model drafter feeds every token it has not seen). The lookup
    reads the rows on the host (as :class:`NgramDrafter` does) and, in the same read, how many
    tokens each row's draft cache lags: the draft model is fed that width and takes the engine's
    ``sync_free`` setting, so in a sync-free step it reads nothing of its own (no read per draft
    token to stop early).

    The n-gram proposal is deterministic, so for sampled rows its draft distribution is one-hot
    (the deterministic-drafter rule of engine.sampling.accept), next to the model's q for the
    others. :meth:`sources` tells the engine which source served each row (engine.metrics
    splits usage and acceptance by source).
    """

    name = "hybrid"

    def __init__(self, model: Transformer, n_min: int = 2, n_max: int = 4) -> None:
        self.model = ModelDrafter(model)
        self.ngram = NgramDrafter(n_min, n_max)
        self._source: torch.Tensor | None = None
        self._ran_model = False

    @property
    def record_confidence(self) -> bool:
        return self.model.record_confidence

    @record_confidence.setter
    def record_confidence(self, value: bool) -> None:
        self.model.record_confidence = value

    @property
    def sync_free(self) -> bool:
        return self.model.sync_free

    @sync_free.setter
    def sync_free(self, value: bool) -> None:
        self.model.sync_free = value

    def reset(self, slots: int, max_seq_len: int) -> None:
        self.model.reset(slots, max_seq_len)

    def prefill(
        self,
        slot0: int,
        prompts: torch.Tensor,
        prompt_lens: torch.Tensor,
        kv_len: int,
        hidden: torch.Tensor | None = None,
    ) -> None:
        self.model.prefill(slot0, prompts, prompt_lens, kv_len)

    def propose(
        self,
        tokens: torch.Tensor,
        length: torch.Tensor,
        gammas: torch.Tensor,
        gamma_max: int,
        threshold: float,
        sampling: BatchSampling,
        kv_len: int,
        generator: torch.Generator | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        b = tokens.shape[0]
        device = tokens.device
        lag = length - self.model.draft_len[:b]  # (B,) tokens the draft model has not seen
        lengths, row_gammas, lags = torch.stack([length, gammas.long(), lag]).tolist()  # the lookup's read
        ng_tokens, ng_counts = self.ngram.lookup(tokens, lengths, row_gammas, gamma_max)  # (B, G)
        ng_prop = torch.tensor(ng_counts, dtype=torch.long, device=device)  # (B,)
        use_ng = ng_prop > 0  # (B,)
        self._ran_model = not all(ng_counts)
        if not self._ran_model:
            self.model._fed[:b] = self.model.draft_len[:b]  # nothing new fed: commit keeps the draft's length
            self.forwards = 0
            self._source = torch.full((b,), SOURCES.index("ngram"), dtype=torch.long, device=device)
            return ng_tokens, None, ng_prop
        m_tokens, m_probs, m_prop = self.model.propose(
            tokens, length, gammas, gamma_max, threshold, sampling, kv_len, generator, width=max(lags)
        )
        self.forwards = self.model.forwards
        pad = gamma_max - m_tokens.shape[1]  # the model may stop early (threshold); n-gram rows keep gamma
        m_tokens = torch.nn.functional.pad(m_tokens, (0, pad))
        out = torch.where(use_ng[:, None], ng_tokens, m_tokens)  # (B, G)
        n_prop = torch.where(use_ng, ng_prop, m_prop)
        probs = m_probs
        if m_probs is not None:  # one-hot q for the n-gram rows
            m_probs = torch.nn.functional.pad(m_probs, (0, 0, 0, pad))
            one_hot = torch.zeros_like(m_probs).scatter_(-1, ng_tokens[..., None], 1.0)
            probs = torch.where(use_ng[:, None, None], one_hot, m_probs)
        # The model fed its own drafts for the n-gram rows: only their pending tokens are valid.
        self.model._fed[:b] = torch.where(use_ng, length, self.model._fed[:b])
        self._source = torch.where(use_ng, 1, torch.where(m_prop > 0, 2, 0))  # SOURCES indices
        return out, probs, n_prop

    def catch_up(self, tokens: torch.Tensor, length: torch.Tensor, kv_len: int) -> None:
        """The draft model reads every token it has not seen (reading the lags, as the lookup does:
        after n-gram steps they may exceed what the model's sync-free width covers); every row's
        source is "none"."""
        b = tokens.shape[0]
        lag = int((length - self.model.draft_len[:b]).max())
        self.model.catch_up(tokens, length, kv_len, width=lag)
        self.forwards = self.model.forwards
        self._ran_model = False
        self._source = torch.full((b,), SOURCES.index("none"), dtype=torch.long, device=tokens.device)

    def sources(self, batch: int) -> torch.Tensor | None:
        return None if self._source is None else self._source[:batch]

    def confidence(self, batch: int, width: int) -> torch.Tensor:
        if not self._ran_model:
            return torch.ones(batch, width)
        return self.model.confidence(batch, width)

    def commit(self, new_length: torch.Tensor) -> None:
        self.model.commit(new_length)

    def move(self, src: torch.Tensor, dst: torch.Tensor, length: int) -> None:
        self.model.move(src, dst, length)
