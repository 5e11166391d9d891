"""Token trees: static shapes, the tree attention mask and exact tree acceptance (batched).

A tree is verified in one target forward: row b feeds its pending token (the *root*, node 0)
and the N drafted nodes, in breadth-first order, at cache slots ``base[b] + i`` (``base`` =
the root's position = ``length - 1``). Node i sits at RoPE position ``base + depth[i]`` and
attends to the row's committed prefix (slots ``< base``) and to its ancestors (itself
included), never to its siblings or cousins. After acceptance the accepted path's cache
entries are copied from ``base + node`` to ``base + depth`` (compaction), so rollback stays a
length reset. A chain is the tree with top-k 1 at every depth; the engine keeps chains on its
chain path (engine.speculative) and only builds trees on request.

Shapes are static: ``topk[d]`` children for every node of depth d (depth = gamma =
``len(topk)``), e.g. ``(3, 2, 1, 1)`` has 3 + 6 + 6 + 6 = 21 nodes. The children of a node are
contiguous and in the drafter's order (best first for top-k children).

Acceptance (one row; p(. | s) the target's processed distribution after prefix s, q the draft's)
--------------------------------------------------------------------------------------------------
Walk from the root. At node s with children c_1..c_k (tokens x_1..x_k) and residual r := p(. | s):

- *deterministic children* (the draft's top-k, distinct tokens, a function of s only): try
  c_j: accept with probability r(x_j) / sum(r); on rejection set r(x_j) := 0 (the residual
  with the rejected siblings zeroed, renormalised implicitly);
- *sampled children* (x_j drawn i.i.d. from q(. | s)): normalise r, accept with probability
  min(1, r(x_j) / q(x_j)); on rejection set r := max(0, r - q) (renormalised next try).

The first accepted child becomes the new node (r := p(. | s, x_j)); when every child is
rejected (or the node is a leaf) emit one token sampled from the final r and stop. Greedy rows
(p one-hot at the argmax) reduce to "follow the child equal to the argmax, else emit the argmax"
under the deterministic rule; a greedy row never needs randomness.

Claim: the emitted token sequence has exactly the target's distribution.

Proof. It suffices that, at any node s reached, the *next* emitted token y has law p(. | s):
then, conditioned on y, either y is an accepted child, the walk continues at s + y with
residual p(. | s, y) and a subtree that depends only on (s, y) and fresh draft randomness (so
the same argument applies one level down: induction on depth gives the joint), or y was
sampled from the final residual and the step ends (the next step starts from the committed
prefix, again with law p by the same argument).

Deterministic children. Let r_0 = p and r_j = r_{j-1} with x_j zeroed. The sibling loop is
sequential sampling from p by asking "is it x_1? else is it x_2? ...": P(y = x_1) = p(x_1); given
"not x_1", y has law p restricted to the complement, i.e. r_1 / sum(r_1), and accepting x_2
with probability r_1(x_2) / sum(r_1) gives P(y = x_2) = (1 - p(x_1)) r_1(x_2) / (1 - p(x_1)) =
p(x_2); by induction P(y = x_j) = p(x_j) and the final draw from r_k / sum(r_k) gives every
other token its p-mass. (k = 1 is the deterministic-drafter rule of engine.sampling.accept.)

Sampled children. One try with residual r (normalised) and x ~ q: P(try emits y) =
q(y) min(1, r(y)/q(y)) = min(q(y), r(y)); P(reject) = 1 - sum min(q, r) = sum max(0, r - q) =: Z;
so P(y) = min(q, r)(y) + Z * max(0, r - q)(y) / Z = r(y) (if Z = 0 the try always accepts).
The next sibling is an independent fresh draw from q tried against the conditional law
max(0, r - q) / Z, so by induction over siblings (recursive rejection sampling: SpecInfer's
multi-step speculative sampling) the emitted token has law p. Duplicated tokens among
siblings are harmless (a duplicate is simply tried again against the new residual).

References: Leviathan et al. 2023 (speculative sampling); Miao et al. 2024 (SpecInfer, token
trees, multi-step speculative sampling); Chen et al. 2023; Li et al. 2024 (EAGLE-2 trees);
Jeon et al. 2024 (recursive speculative decoding, sampling without replacement).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from engine.errors import EngineInputError
from engine.model import ExplicitAttention
from engine.sampling import sample

MAX_TREE_NODES = 256  # drafted nodes per row (the verify width is this + 1)
TREE_SAMPLING = ("topk", "iid")


@dataclass(frozen=True)
class TreeShape:
    """A static tree: ``topk[d]`` children per node of depth d; depth (gamma) = ``len(topk)``.

    Example:
        >>> s = TreeShape((2, 1))
        >>> s.parents, s.depths
        ([-1, 0, 0, 1, 2], [0, 1, 1, 2, 2])
    """

    topk: tuple[int, ...]

    def __post_init__(self) -> None:
        topk = tuple(self.topk)
        object.__setattr__(self, "topk", topk)
        if not topk or any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in topk):
            raise EngineInputError(f"tree_topk: every depth needs an integer top-k >= 1 (got {list(topk)})")
        if self.n_nodes > MAX_TREE_NODES:
            raise EngineInputError(f"tree_topk: {list(topk)} has {self.n_nodes} nodes (at most {MAX_TREE_NODES})")

    @property
    def depth(self) -> int:
        return len(self.topk)

    @property
    def is_chain(self) -> bool:
        return all(k == 1 for k in self.topk)

    @cached_property
    def level_sizes(self) -> list[int]:
        """Nodes per depth 1..depth (depth 0 is the root alone)."""
        sizes, n = [], 1
        for k in self.topk:
            n *= k
            sizes.append(n)
        return sizes

    @property
    def n_nodes(self) -> int:
        """Drafted nodes (the root excluded)."""
        return sum(self.level_sizes)

    @cached_property
    def level_offsets(self) -> list[int]:
        """Index of depth d's first node, d = 0..depth (node 0 is the root)."""
        offs = [0, 1]
        for size in self.level_sizes[:-1]:
            offs.append(offs[-1] + size)
        return offs

    @cached_property
    def parents(self) -> list[int]:
        """Parent node per node (-1 for the root), breadth-first, children of a node contiguous."""
        par = [-1]
        for d, k in enumerate(self.topk):
            first = self.level_offsets[d]
            count = 1 if d == 0 else self.level_sizes[d - 1]
            par += [first + i for i in range(count) for _ in range(k)]
        return par

    @cached_property
    def depths(self) -> list[int]:
        dep = [0]
        for d, size in enumerate(self.level_sizes):
            dep += [d + 1] * size
        return dep

    @property
    def n_internal(self) -> int:
        """Nodes with children: the root and depths 1..depth-1 (the first ones in node order)."""
        return self.level_offsets[-1]

    def tensors(self, device: torch.device | str) -> TreeTensors:
        """The shape's index tensors on ``device`` (build once per engine)."""
        n = self.n_nodes + 1
        parents = torch.tensor(self.parents, dtype=torch.long)
        anc = torch.eye(n, dtype=torch.bool)
        for i in range(1, n):  # parents come first in breadth-first order
            anc[i] |= anc[parents[i]]
        kmax = max(self.topk)
        children = torch.full((self.n_internal, kmax), -1, dtype=torch.long)
        for i in range(1, n):
            p = int(parents[i])
            slot = int((children[p] >= 0).sum())
            children[p, slot] = i
        return TreeTensors(self, parents.to(device), torch.tensor(self.depths, device=device), anc.to(device),
                           children.to(device))


@dataclass(frozen=True)
class TreeTensors:
    """Device copies of a shape's arrays: parents (N+1,), depths (N+1,), ancestors (N+1, N+1)
    (``anc[i, j]``: j is i or an ancestor of i), children (n_internal, max top-k) (-1 padded)."""

    shape: TreeShape
    parents: torch.Tensor
    depths: torch.Tensor
    anc: torch.Tensor
    children: torch.Tensor

    def attention(self, base: torch.Tensor, first: int, count: int, kv_len: int) -> ExplicitAttention:
        """Tree attention for queries = nodes ``first .. first+count-1`` of every row.

        Row b's node i sits at cache slot ``base[b] + i`` and RoPE position ``base[b] + depth[i]``;
        a key slot s is visible iff s < base[b] (committed prefix) or s - base[b] is an ancestor
        (or self) of the query node. Slots past the tree are never visible.
        """
        n = self.depths.shape[0]
        dev = base.device
        nodes = torch.arange(first, first + count, device=dev)  # (T,)
        positions = base[:, None] + self.depths[nodes][None, :]  # (B, T)
        slots = torch.arange(kv_len, device=dev)[None, :]  # (1, L)
        rel = slots - base[:, None]  # (B, L) node index of a tree slot
        in_tree = (rel >= 0) & (rel < n)
        rel_c = rel.clamp(0, n - 1)
        key_pos = torch.where(rel >= 0, base[:, None] + self.depths[rel_c], slots)  # (B, L)
        anc = self.anc[nodes][:, rel_c.flatten()].view(count, *rel.shape).transpose(0, 1)  # (B, T, L)
        visible = (rel < 0)[:, None, :] | (in_tree[:, None, :] & anc)
        return ExplicitAttention(positions, key_pos, visible)


def tree_accept(
    tree: TreeTensors,
    node_tokens: torch.Tensor,  # (B, N+1) int64: the root (pending token) then the drafted nodes
    target_probs: torch.Tensor,  # (B, N+1, V): p(. | path to node i)
    draft_probs: torch.Tensor | None,  # (B, n_internal, V): q(. | path to node i); needed for iid rows
    iid: torch.Tensor | None,  # (B,) bool: rows whose children were sampled i.i.d. from q (else deterministic)
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact acceptance on a tree for a batch of rows (the rule and its proof: module docstring).

    Returns ``(n_accepted (B,), path (B, depth+1) node indices (root first; entries past
    n_accepted repeat the last accepted node), next_token (B,))``: row b keeps the tokens of
    ``path[b, 1 : 1 + n_accepted[b]]`` then ``next_token[b]``.

    Example:
        >>> t = TreeShape((2,)).tensors("cpu")
        >>> p = torch.tensor([[[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])  # root, then the two children
        >>> n, path, nxt = tree_accept(t, torch.tensor([[5, 1, 2]]), p, None, None, None)
        >>> int(n), path.tolist(), int(nxt)
        (1, [[0, 2]], 1)
    """
    b = node_tokens.shape[0]
    dev = node_tokens.device
    rows = torch.arange(b, device=dev)
    res = target_probs[:, 0].double()  # (B, V) residual at the current node (unnormalised)
    cur = torch.zeros(b, dtype=torch.long, device=dev)
    alive = torch.ones(b, dtype=torch.bool, device=dev)
    n_acc = torch.zeros(b, dtype=torch.long, device=dev)
    path = [cur]
    use_iid = iid is not None and draft_probs is not None
    for k in tree.shape.topk:
        taken = torch.zeros(b, dtype=torch.bool, device=dev)
        nxt = cur
        q = draft_probs[rows, cur].double() if use_iid else None  # (B, V)
        u = torch.rand(b, k, generator=generator, dtype=torch.float64, device=dev)
        for c in range(k):
            child = tree.children[cur, c].clamp(min=0)  # (B,) (finished rows: any valid index)
            x = node_tokens.gather(1, child[:, None])  # (B, 1)
            px = res.gather(1, x)[:, 0]
            mass = res.sum(-1)
            trying = alive & ~taken
            ok = u[:, c] * mass < px  # deterministic: accept w.p. r(x) / sum(r)
            rej_res = res.scatter(1, x, 0.0)
            if use_iid:
                qx = q.gather(1, x)[:, 0]
                ok = torch.where(iid, (qx > 0) & (u[:, c] * qx * mass < px), ok)  # min(1, (r(x)/sum r) / q(x))
                diff = (res / mass[:, None] - q).clamp(min=0)
                diff = torch.where(diff.sum(-1, keepdim=True) > 0, diff, res)  # r == q: cannot reject; guard
                rej_res = torch.where(iid[:, None], diff, rej_res)
            ok = ok & trying
            nxt = torch.where(ok, child, nxt)
            taken = taken | ok
            res = torch.where((trying & ~ok)[:, None], rej_res, res)
        cur = nxt
        n_acc = n_acc + taken.long()
        alive = alive & taken
        res = torch.where(taken[:, None], target_probs[rows, cur].double(), res)
        path.append(cur)
    return n_acc, torch.stack(path, 1), sample(res, generator)
