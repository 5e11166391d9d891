"""The engine's EAGLE-3 drafter: chains and token trees with a head (engine.eagle3).

Alignment (vLLM's EAGLE proposer): head cache position i holds (token i+1, target state at i), so
its output at i proposes token i+2. A row of ``length`` tokens (the pending one included) has
target states for positions 0..length-2; the head's cache holds positions 0..head_len-1, fed
with target states, and the positions head_len..length-2 are *staged*: their target states wait
in ``_staged`` for the next step. A step feeds the staged positions (one forward), takes the
first proposal at position length-2, then feeds its own proposals with its own pre-norm outputs.
Entries computed from the head's own outputs are speculative: after the verify the target's
states of the accepted positions replace them (the next step feeds them again), so ``commit``
sets head_len to the positions fed with target states, length - 1 before the step; rollback
stays a length update.

Token trees (engine.tree, engine.tree_draft): the staged feed ends at the root's entry (position
length - 2, the pending token with the target's state there), which is node 0 of the head's tree at
cache slot ``base = length - 2``. Node i (depth d, breadth first) goes to slot base + i at RoPE
position base + d (a depth-1 node is token length, so at head position length - 1 as in the chain),
fed with its parent's pre-norm output as h (the root's for depth 1) under the tree mask: it sees
the prefix, the root and its ancestors, which is the chain's input for its path. The engine's verify
hands back the target's states along the accepted path (``observe``, the chain's 1 + G positions),
so the next step stages what a chain step would have staged; the nodes' entries are speculative
like a chain's own drafts, so ``commit_tree`` moves nothing and ``commit`` sets head_len as after
a chain.
"""

from __future__ import annotations

import torch

from engine.drafters import ChainProposal, Drafter
from engine.eagle3 import Eagle3Head
from engine.kv_cache import KVCache
from engine.model import ExplicitAttention
from engine.sampling import BatchSampling
from engine.tree import DynamicTree, RowTrees, TreeTensors
from engine.tree_draft import LevelForward, draft_dynamic_tree, draft_static_tree


class Eagle3Drafter(Drafter):
    """Drafts chains and token trees with an EAGLE-3 head (module docstring: the alignment, the
    rollback and the trees).

    Sync-free mode feeds a fixed width: the staged positions of a row are the tokens its last step
    emitted (at most the verified width, 1 + G, which the host knows from the states' shape) or 1
    after prefill; on CPU the width is read from the rows (like ModelDrafter's pending width).
    """

    name = "eagle3"
    cache: KVCache
    head_len: torch.Tensor  # (slots,) head cache positions fed with target states
    _fed: torch.Tensor  # (slots,) head_len after the last propose/catch_up (length - 1)
    _staged: torch.Tensor  # (slots, W, H) fused target states of positions head_len + j

    def __init__(self, head: Eagle3Head) -> None:
        self.head = head
        self.target_layers = head.config.layer_ids
        self._conf: list[torch.Tensor] = []
        self._width = 1

    def reset(self, slots: int, max_seq_len: int) -> None:
        self.cache = self.head.new_cache(slots, max_seq_len)
        w = self.head.fc.weight
        self.head_len = torch.zeros(slots, dtype=torch.long, device=w.device)
        self._fed = torch.zeros(slots, dtype=torch.long, device=w.device)
        self._staged = torch.zeros(slots, 1, w.shape[0], dtype=w.dtype, device=w.device)
        self._width = 1

    def prefill(
        self,
        slot0: int,
        prompts: torch.Tensor,
        prompt_lens: torch.Tensor,
        kv_len: int,
        hidden: torch.Tensor | None = None,
    ) -> None:
        assert hidden is not None, "an EAGLE-3 head prefills from the target's hidden states"
        m, p = prompts.shape
        fused = self.head.fc(hidden)  # (m, P, H)
        if p > 1:  # positions 0..P-2: (token i+1, state i); position P-1 waits for the first token
            start = torch.zeros(m, dtype=torch.long, device=prompts.device)
            self.head(prompts[:, 1:], fused[:, :-1], self.cache, start, p - 1, slot0)
        last = (prompt_lens - 1)[:, None, None].expand(-1, 1, fused.shape[-1])
        self._staged[slot0 : slot0 + m, :1] = fused.gather(1, last)
        self.head_len[slot0 : slot0 + m] = prompt_lens - 1

    def observe(self, hidden: torch.Tensor) -> None:
        b, w = hidden.shape[:2]
        if w > self._staged.shape[1]:
            grown = self._staged.new_zeros(self._staged.shape[0], w, self._staged.shape[2])
            grown[:, : self._staged.shape[1]] = self._staged
            self._staged = grown
        self._staged[:b, :w] = self.head.fc(hidden)  # positions length - 1 + j = head_len + j
        self._width = w

    def _feed_staged(
        self, tokens: torch.Tensor, length: torch.Tensor, kv_len: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed each row's staged positions; the logits (B, 1, V) and pre-norm output (B, 1, H) at
        its last one (position length - 2: the first proposal)."""
        b = tokens.shape[0]
        hlen = self.head_len[:b]
        n_staged = length - 1 - hlen  # (B,) 1..width for a running row (0: frozen, finished)
        width = self._width if self.sync_free else max(int(n_staged.max()), 1)
        offs = torch.arange(width, device=tokens.device)
        idx = (hlen[:, None] + 1 + offs[None, :]).clamp(max=tokens.shape[1] - 1)  # (B, W)
        logits, out = self.head(tokens.gather(1, idx), self._staged[:b, :width], self.cache, hlen, kv_len)
        self._fed[:b] = length - 1
        if width == 1:
            return logits, out
        last = (n_staged - 1).clamp(min=0)[:, None, None]
        return (
            logits.gather(1, last.expand(-1, 1, logits.shape[-1])),
            out.gather(1, last.expand(-1, 1, out.shape[-1])),
        )

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
        logits, out = self._feed_staged(tokens, length, kv_len)  # (B, 1, V), (B, 1, H)
        chain = ChainProposal(gammas, threshold, sampling, generator, self.record_confidence, self.sync_free)
        self._conf = chain.conf
        start = length - 1  # the first proposal's position
        for i in range(gamma_max):
            if i > 0:
                logits, out = self.head(chain.toks[-1][:, None], out, self.cache, start, kv_len)
                start = start + 1
            if not chain.take(logits):
                break
        self.forwards = len(chain.toks)
        return chain.result()

    def catch_up(self, tokens: torch.Tensor, length: torch.Tensor, kv_len: int) -> None:
        """Feed the staged positions and propose nothing (a step whose K is 0)."""
        self._feed_staged(tokens, length, kv_len)
        self.forwards = 1

    def confidence(self, batch: int, width: int) -> torch.Tensor:
        return torch.stack(self._conf, 1)[:batch, :width]

    def propose_tree(
        self,
        tokens: torch.Tensor,
        length: torch.Tensor,
        tree: TreeTensors,
        sampling: BatchSampling,
        iid: torch.Tensor | None,
        kv_len: int,
        generator: torch.Generator | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft a static tree (engine.tree_draft.draft_static_tree): the staged feed gives the root's
        logits, then one head forward per depth over its nodes (module docstring: slots, positions
        and h). A reduced vocabulary's children are draft ids mapped to target ids: its logits are
        -inf (its probabilities 0) elsewhere."""
        logits, out = self._feed_staged(tokens, length, kv_len)  # (B, 1, V), (B, 1, H) at the root
        root = tokens.gather(1, (length - 1)[:, None])  # (B, 1) the pending token
        forward = self._level_forward(out, kv_len)
        return draft_static_tree(root, logits, length - 2, tree, sampling, iid, kv_len, generator, forward)

    def propose_dynamic_tree(
        self, tokens: torch.Tensor, length: torch.Tensor, tree: DynamicTree, kv_len: int
    ) -> tuple[torch.Tensor, RowTrees]:
        """Draft each row's dynamic tree (engine.tree_draft.draft_dynamic_tree): the staged feed, then
        one head forward of the ``topk`` best-scoring nodes per later depth."""
        logits, out = self._feed_staged(tokens, length, kv_len)
        root = tokens.gather(1, (length - 1)[:, None])
        return draft_dynamic_tree(root, logits, length - 2, tree, kv_len, self._level_forward(out, kv_len))

    def _level_forward(self, out: torch.Tensor, kv_len: int) -> LevelForward:
        """The head's forward over a depth's nodes, each fed with its parent's pre-norm output as h
        (``out`` (B, 1, H): the root's; then each call's own outputs)."""

        def forward(
            nodes: torch.Tensor, came_from: torch.Tensor, start: torch.Tensor, attn: ExplicitAttention
        ) -> torch.Tensor:
            nonlocal out
            h = out.gather(1, came_from[:, :, None].expand(-1, -1, out.shape[-1]))  # (B, T, H) the parents'
            logits: torch.Tensor
            logits, out = self.head(nodes, h, self.cache, start, kv_len, attn=attn)
            return logits

        return forward

    def commit_tree(self, tree: RowTrees, path: torch.Tensor, n_accepted: torch.Tensor) -> None:
        """Nothing to move: the nodes' entries were computed from the head's own outputs, so they are
        speculative; the accepted positions are staged with the target's states (``observe``, which
        the engine calls with the path's states) and re-fed next step, and ``commit`` keeps head_len
        at the positions fed with target states, as after a chain."""

    def commit(self, new_length: torch.Tensor) -> None:
        b = new_length.shape[0]
        self.head_len[:b] = torch.minimum(self._fed[:b], new_length - 1)

    def move(self, src: torch.Tensor, dst: torch.Tensor, length: int) -> None:
        self.cache.move(src, dst, length)
        self.head_len[dst] = self.head_len[src]
        self._staged[dst] = self._staged[src]
