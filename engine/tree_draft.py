"""Drafting token trees: the depth-by-depth loops every drafter that drafts trees shares.

A tree drafter (:class:`TreeDrafter`: the draft model, engine.drafters.ModelDrafter, and an
EAGLE-3 head, engine.eagle3.Eagle3Drafter) brings its logits after the root and one forward over
the nodes of a depth (:data:`LevelForward`); the loops here pick the children (a static shape's
top-k or i.i.d. draft samples, or EAGLE-2's best-first expansion for a dynamic tree) and build
the tree attention, so every drafter drafts the same trees from its own logits. Node i (breadth
first, node 0 the root) sits in the drafter's cache at slot ``base + i`` and RoPE position
``base + depth[i]`` (engine.tree.tree_attention), ``base`` being the slot of the root's entry:
``length - 1`` for the draft model (it holds the pending token), ``length - 2`` for the head (its
position i holds token i + 1 with the target's state at i). The verify and its exact acceptance
are the engine's (engine.speculative, engine.tree); a drafter's ``commit_tree`` puts its cache in
order for the accepted path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch

from engine.model import ExplicitAttention
from engine.sampling import BatchSampling, sample
from engine.tree import DynamicTree, RowTrees, TreeTensors, tree_attention

LevelForward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, ExplicitAttention], torch.Tensor]
"""``forward(tokens, came_from, start, attn) -> logits (B, T, V)``: feed the T nodes ``tokens``
(B, T) of one depth at cache slots ``start + j`` ((B,) start) under ``attn``; ``came_from`` (B, T)
is each node's parent as an index into the previous call's nodes (into the root alone, index 0,
on the first call)."""


@runtime_checkable
class TreeDrafter(Protocol):
    """A drafter that drafts token trees (engine.speculative.SpecEngine._tree_draft_verify)."""

    def propose_tree(
        self,
        tokens: torch.Tensor,  # (B, S) the engine's token buffer
        length: torch.Tensor,  # (B,) tokens per row, the pending one included
        tree: TreeTensors,
        sampling: BatchSampling,
        iid: torch.Tensor | None,  # (B,) bool rows whose children are i.i.d. draft samples; None: all top-k
        kv_len: int,
        generator: torch.Generator | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Node tokens (B, N+1) of a static tree (:func:`draft_static_tree`) and, with ``iid``, the
        draft's distribution at every internal node (B, n_internal, V)."""
        ...

    def propose_dynamic_tree(
        self, tokens: torch.Tensor, length: torch.Tensor, tree: DynamicTree, kv_len: int
    ) -> tuple[torch.Tensor, RowTrees]:
        """Node tokens (B, n+1) and each row's dynamic tree (:func:`draft_dynamic_tree`)."""
        ...

    def commit_tree(self, tree: RowTrees, path: torch.Tensor, n_accepted: torch.Tensor) -> None:
        """The target accepted ``path`` (B, depth+1) node indices (root first), ``n_accepted`` (B,) of
        them; ``commit`` follows with the rows' new lengths."""
        ...


def draft_static_tree(
    root: torch.Tensor,  # (B, 1) the root's token (the pending one)
    logits: torch.Tensor,  # (B, 1, V) the drafter's logits after the root
    base: torch.Tensor,  # (B,) the root's cache slot
    tree: TreeTensors,
    sampling: BatchSampling,
    iid: torch.Tensor | None,
    kv_len: int,
    generator: torch.Generator | None,
    forward: LevelForward,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Draft a static tree depth by depth: one forward per depth over all its nodes but the leaves.

    Returns node tokens (B, N+1) in breadth-first order (node 0 = ``root``) and, when ``iid`` is
    given, the draft's distribution at every internal node (B, n_internal, V) (zero outside a
    reduced draft vocabulary, whose logits are -inf there). Top-k children come from the raw
    logits: the order temperature, top-k and top-p keep (and greedy rows need); ``iid`` rows draw
    their k children independently from the processed distribution instead.
    """
    b, shape = root.shape[0], tree.shape
    nodes, node_probs = [root], []
    for d, k in enumerate(shape.topk):
        n_d = logits.shape[1]
        kids = logits.topk(k, -1).indices  # (B, n_d, k) best first
        if iid is not None:
            probs = sampling.probs(logits)  # (B, n_d, V)
            node_probs.append(probs)
            drawn = sample(probs[:, :, None, :].expand(-1, -1, k, -1), generator)  # (B, n_d, k)
            kids = torch.where(iid[:, None, None], drawn, kids)
        level = kids.reshape(b, n_d * k)
        nodes.append(level)
        if d + 1 < shape.depth:
            first = shape.level_offsets[d + 1]
            came_from = torch.arange(n_d, device=root.device).repeat_interleave(k).expand(b, -1)  # (B, n_d*k)
            attn = tree.attention(base, first, n_d * k, kv_len)
            logits = forward(level, came_from, base + first, attn)
    return torch.cat(nodes, 1), (torch.cat(node_probs, 1) if node_probs else None)


def draft_dynamic_tree(
    root: torch.Tensor,  # (B, 1) the root's token
    logits: torch.Tensor,  # (B, 1, V) the drafter's logits after the root
    base: torch.Tensor,  # (B,) the root's cache slot
    tree: DynamicTree,
    kv_len: int,
    forward: LevelForward,
) -> tuple[torch.Tensor, RowTrees]:
    """Draft each row's dynamic tree (engine.tree.DynamicTree): depth 1 is the top-``topk`` after the
    root; each later forward feeds the ``topk`` best-scoring nodes of the previous depth (cache
    slots ``base + 1 + (d - 1) * topk + j``, seeing the prefix, the root and their ancestors) and
    takes each one's top-``topk`` children. Returns node tokens (B, n+1) and the rows' trees
    (``draft_slots``: the fed candidates' slot offsets)."""
    b, dev = root.shape[0], root.device
    k, depth = tree.topk, tree.depth
    top = logits[:, 0].float().log_softmax(-1).topk(k, -1)  # (B, K)
    cand_tok, cand_score, cand_par = [top.indices], [top.values], [torch.full((b, k), -1, device=dev)]
    front_tok, front_score = top.indices, top.values
    front_id = torch.arange(k, device=dev).expand(b, -1)  # candidate index of each fed node
    came_from = torch.zeros(b, k, dtype=torch.long, device=dev)  # its parent among the last fed (the root)
    front_par_slot = torch.zeros(b, k, dtype=torch.long, device=dev)  # its parent's slot (the root: 0)
    n_slots = 1 + (depth - 1) * k
    slot_depth = torch.arange(n_slots, device=dev).add(k - 1).div(k, rounding_mode="floor")  # 0, k per depth
    anc = torch.zeros(b, n_slots, n_slots, dtype=torch.bool, device=dev)
    anc[:, 0, 0] = True
    cand_slot = torch.full((b, tree.candidates), -1, dtype=torch.long, device=dev)
    for d in range(1, depth):
        first = 1 + (d - 1) * k
        slots = torch.arange(first, first + k, device=dev)
        anc[:, first : first + k] = anc.gather(1, front_par_slot[:, :, None].expand(-1, -1, n_slots))
        anc[:, slots, slots] = True
        cand_slot.scatter_(1, front_id, slots.expand(b, -1).contiguous())
        attn = tree_attention(base, slot_depth.expand(b, -1), anc, first, k, kv_len)
        out = forward(front_tok, came_from, base + first, attn)  # (B, K, V)
        top = out.float().log_softmax(-1).topk(k, -1)  # (B, K, K) best first
        score = (front_score[:, :, None] + top.values).reshape(b, k * k)
        tok = top.indices.reshape(b, k * k)
        cand_tok.append(tok)
        cand_score.append(score)
        cand_par.append(front_id[:, :, None].expand(-1, -1, k).reshape(b, k * k))
        if d + 1 < depth:
            best = score.topk(k, -1).indices  # (B, K) the next depth's fed nodes
            front_id = k + (d - 1) * k * k + best
            front_tok, front_score = tok.gather(1, best), score.gather(1, best)
            came_from = best.div(k, rounding_mode="floor")  # the fed node each came from
            front_par_slot = slots[came_from]
    return tree.select(
        root, torch.cat(cand_tok, 1), torch.cat(cand_score, 1), torch.cat(cand_par, 1), cand_slot
    )
