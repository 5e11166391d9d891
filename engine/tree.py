"""Token trees: static shapes, dynamic (EAGLE-2) trees, the tree attention mask and exact tree
acceptance (batched).

A tree is verified in one target forward: row b feeds its pending token (the *root*, node 0)
and the N drafted nodes, in breadth-first order, at cache slots ``base[b] + i`` (``base`` =
the root's position = ``length - 1``). Node i sits at RoPE position ``base + depth[i]`` and
attends to the row's committed prefix (slots ``< base``) and to its ancestors (itself
included), never to its siblings or cousins. After acceptance the accepted path's cache
entries are copied from ``base + node`` to ``base + depth`` (compaction), so rollback stays a
length reset. A chain is the tree with top-k 1 at every depth; the engine keeps chains on its
chain path (engine.speculative) and only builds trees on request.

Static shapes: ``topk[d]`` children for every node of depth d (depth = gamma =
``len(topk)``), e.g. ``(3, 2, 1, 1)`` has 3 + 6 + 6 + 6 = 21 nodes. The children of a node are
contiguous and in the drafter's order (best first for top-k children). Dynamic trees
(:class:`DynamicTree`) give each row its own structure every step, chosen by the draft's
scores; :class:`RowTrees` holds per-row structures (a static shape is the repeated case) and
the attention and acceptance below take them.

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

Dynamic trees. The argument above needs, at each node s reached, children that are distinct
tokens fixed before the target's randomness is drawn and that depend on nothing the walk has
revealed beyond s. A dynamic tree is a deterministic function of the committed prefix and the
draft's logits (top-k children, selection by score), drawn before acceptance, so conditioning
on the walk reaching s leaves s's children fixed; a node may have fewer children than another
(or none: the walk then emits from the residual), which the sibling induction allows (k >= 0).
So the deterministic rule is exact on dynamic trees; i.i.d. children are not used there (a
selection that looks at sampled tokens would bias which children remain).

References: Leviathan et al. 2023 (speculative sampling); Miao et al. 2024 (SpecInfer, token
trees, multi-step speculative sampling); Chen et al. 2023; Li et al. 2024 (EAGLE-2 trees);
Jeon et al. 2024 (recursive speculative decoding, sampling without replacement).
"""

from __future__ import annotations

import re
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
            raise EngineInputError(
                f"tree_topk: {list(topk)} has {self.n_nodes} nodes (at most {MAX_TREE_NODES})"
            )

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

    @property
    def width(self) -> int:
        """Cache slots a step writes past the root (target and draft: node i at slot root + i)."""
        return self.n_nodes

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
        return TreeTensors(
            self,
            parents.to(device),
            torch.tensor(self.depths, device=device),
            anc.to(device),
            children.to(device),
        )


@dataclass(frozen=True)
class DynamicTree:
    """EAGLE-2's dynamic tree: each row's own tree, built best-first from the draft's confidence.

    Depth 1 holds the draft's top-``topk`` tokens after the root. At each later depth the
    ``topk`` nodes of the previous depth with the highest *path score* (the sum of the draft's
    log-probabilities along the path from the root) are fed to the draft model (one forward of
    ``topk`` tokens per row) and each proposes its top-``topk`` children. Of all the candidates
    (``topk`` + ``(depth - 1) * topk**2``), the ``nodes`` with the highest path scores are verified.
    A child never scores above its parent (log-probabilities are <= 0) and ties keep the earlier
    (shallower) candidate, so the chosen set always contains its nodes' parents: it is a tree.

    The tree depends only on the committed prefix and the draft's logits (no randomness), so
    the deterministic top-k acceptance rule (module docstring) is exact on it: sampled rows use
    that rule (``tree_sampling="topk"``), greedy rows follow the argmax child.

    Its name, ``"KxD/N"`` (top-K, depth D, N nodes verified), is what ``tune.yaml`` and the
    benchmarks take (:meth:`parse`).

    Example:
        >>> t = DynamicTree.parse("2x4/8")
        >>> t, t.name, t.candidates, t.width
        (DynamicTree(topk=2, depth=4, nodes=8), '2x4/8', 14, 8)
    """

    topk: int
    depth: int
    nodes: int

    @staticmethod
    def parse(text: str) -> DynamicTree:
        """``"KxD/N"`` -> the spec; EngineInputError (naming the text) when it is not one."""
        m = re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*/\s*(\d+)\s*", str(text))
        if m is None:
            raise EngineInputError(
                f"tree_nodes: {text!r} is not a dynamic tree 'KxD/N' (top-K, depth D, N nodes)"
            )
        return DynamicTree(*map(int, m.groups()))

    @property
    def name(self) -> str:
        return f"{self.topk}x{self.depth}/{self.nodes}"

    def __str__(self) -> str:
        return self.name

    def __post_init__(self) -> None:
        if self.topk < 2:
            raise EngineInputError(f"tree_nodes: a dynamic tree needs top-k >= 2 (got {self.topk})")
        if self.depth < 1:
            raise EngineInputError(f"tree_nodes: a dynamic tree needs depth (gamma) >= 1 (got {self.depth})")
        if not 1 <= self.nodes <= min(self.candidates, MAX_TREE_NODES):
            raise EngineInputError(
                f"tree_nodes: must be in 1..{min(self.candidates, MAX_TREE_NODES)} for top-k "
                f"{self.topk} and depth {self.depth} (got {self.nodes})"
            )

    @property
    def candidates(self) -> int:
        """Draft tokens the expansion produces (the verified ``nodes`` are the best of them)."""
        return self.topk + (self.depth - 1) * self.topk**2

    @property
    def n_nodes(self) -> int:
        return self.nodes

    @property
    def width(self) -> int:
        """Cache slots a step writes past the root: the verified nodes (target), the fed nodes (draft)."""
        return max(self.nodes, (self.depth - 1) * self.topk)

    def tensors(self, device: torch.device | str) -> DynamicTree:
        """Nothing to precompute (the tree is built per step): the engine's handle is the spec itself."""
        return self

    def candidate_depths(self, device: torch.device | str) -> torch.Tensor:
        """Depth of every candidate (M,), in candidate order: depth 1's topk, then topk**2 per depth."""
        sizes = torch.tensor([self.topk] + [self.topk**2] * (self.depth - 1), device=device)
        return torch.arange(1, self.depth + 1, device=device).repeat_interleave(sizes)

    def select(
        self,
        root: torch.Tensor,
        tokens: torch.Tensor,
        scores: torch.Tensor,
        parents: torch.Tensor,
        draft_slots: torch.Tensor,
    ) -> tuple[torch.Tensor, RowTrees]:
        """The verified trees from the candidates (all (B, M), candidate order = depth by depth):
        ``parents`` are candidate indices (-1: the root), ``draft_slots`` the draft-cache slot
        offsets of the candidates the draft was fed (-1 otherwise). Returns node tokens (B, n+1)
        (the root, ``root`` (B, 1), first) and the rows' trees, nodes in candidate order.

        Example:
            >>> t = DynamicTree(topk=2, depth=2, nodes=3)
            >>> toks = torch.tensor([[7, 8, 9, 10, 11, 12]])
            >>> sc = torch.tensor([[-0.1, -2.0, -0.5, -0.9, -3.0, -3.1]])
            >>> par, slots = torch.tensor([[-1, -1, 0, 0, 1, 1]]), torch.tensor([[1, 2, -1, -1, -1, -1]])
            >>> nodes, rt = t.select(torch.tensor([[5]]), toks, sc, par, slots)
            >>> nodes.tolist(), rt.depths.tolist(), rt.children[0, 1].tolist()
            ([[5, 7, 9, 10]], [[0, 1, 2, 2]], [2, 3])
        """
        b, m = tokens.shape
        dev = tokens.device
        best = scores.sort(dim=-1, descending=True, stable=True).indices[:, : self.nodes]
        chosen = best.sort(-1).values  # (B, n) candidate order: parents before children
        node_of = torch.zeros(
            b, m + 1, dtype=torch.long, device=dev
        )  # candidate -> node (m: the root, node 0)
        node_of.scatter_(1, chosen, torch.arange(1, self.nodes + 1, device=dev).expand(b, -1).contiguous())
        par = parents.gather(1, chosen)
        par_node = node_of.gather(1, torch.where(par >= 0, par, m))
        col = torch.zeros(b, 1, dtype=torch.long, device=dev)
        tree = RowTrees.from_parents(
            torch.cat([col - 1, par_node], 1),
            torch.cat([col, self.candidate_depths(dev)[chosen]], 1),
            torch.cat([col, draft_slots.gather(1, chosen)], 1),
            (self.topk,) * self.depth,
        )
        return torch.cat([root, tokens.gather(1, chosen)], 1), tree


def tree_depth(tree: tuple[int, ...] | DynamicTree) -> int:
    """Depth (= gamma) of a tree as the tuner names it: a static per-depth top-k or a dynamic tree."""
    return tree.depth if isinstance(tree, DynamicTree) else len(tree)


@dataclass(frozen=True)
class TreeTensors:
    """Device copies of a shape's arrays: parents (N+1,), depths (N+1,), ancestors (N+1, N+1)
    (``anc[i, j]``: j is i or an ancestor of i), children (n_internal, max top-k) (-1 padded)."""

    shape: TreeShape
    parents: torch.Tensor
    depths: torch.Tensor
    anc: torch.Tensor
    children: torch.Tensor

    @property
    def n_nodes(self) -> int:
        return self.shape.n_nodes

    @property
    def width(self) -> int:
        return self.shape.width

    @cached_property
    def draft_slots(self) -> torch.Tensor:
        """Draft-cache slot (offset from the root's) per node: its own index for nodes the draft
        model was fed (depths < gamma), -1 for the leaves, which it never feeds."""
        idx = torch.arange(self.depths.shape[0], device=self.depths.device)
        return torch.where(self.depths < self.shape.depth, idx, -1)

    def rows(self, b: int) -> RowTrees:
        """The shape as ``b`` identical per-row trees (views, no copies)."""
        return RowTrees(
            self.depths.expand(b, -1),
            self.anc.expand(b, -1, -1),
            self.children.expand(b, -1, -1),
            self.draft_slots.expand(b, -1),
            self.shape.topk,
        )

    def attention(self, base: torch.Tensor, first: int, count: int, kv_len: int) -> ExplicitAttention:
        """Tree attention for queries = nodes ``first .. first+count-1`` of every row
        (:func:`tree_attention`)."""
        b = base.shape[0]
        return tree_attention(
            base, self.depths.expand(b, -1), self.anc.expand(b, -1, -1), first, count, kv_len
        )


def tree_attention(
    base: torch.Tensor, depths: torch.Tensor, anc: torch.Tensor, first: int, count: int, kv_len: int
) -> ExplicitAttention:
    """Tree attention for queries = nodes ``first .. first+count-1`` of every row.

    Row b's node i sits at cache slot ``base[b] + i`` and RoPE position ``base[b] + depths[b, i]``;
    a key slot s is visible iff s < base[b] (committed prefix) or s - base[b] is an ancestor (or
    self) of the query node (``anc[b, query, s - base[b]]``). Slots past the tree are never visible.
    """
    b, n = depths.shape
    dev = base.device
    nodes = torch.arange(first, first + count, device=dev)  # (T,)
    positions = base[:, None] + depths[:, nodes]  # (B, T)
    slots = torch.arange(kv_len, device=dev)[None, :]  # (1, L)
    rel = slots - base[:, None]  # (B, L) node index of a tree slot
    in_tree = (rel >= 0) & (rel < n)
    rel_c = rel.clamp(0, n - 1)
    key_pos = torch.where(rel >= 0, base[:, None] + depths.gather(1, rel_c), slots)  # (B, L)
    anc_q = anc[:, first : first + count].gather(2, rel_c[:, None, :].expand(-1, count, -1))  # (B, T, L)
    visible = (rel < 0)[:, None, :] | (in_tree[:, None, :] & anc_q)
    return ExplicitAttention(positions, key_pos, visible)


@dataclass(frozen=True)
class RowTrees:
    """One tree per row (a static shape repeated, or each row's own dynamic tree), node 0 the root,
    parents before children: depths (B, n), ancestors (B, n, n) (``anc[b, i, j]``: j is i or an
    ancestor of i), children (B, n_internal, max children) (-1 padded, best first), draft_slots
    (B, n) (the node's draft-cache slot offset, -1 if the draft never fed it) and ``child_slots``:
    the most children a node of each depth 0..gamma-1 may have (the acceptance walk tries that many)."""

    depths: torch.Tensor
    anc: torch.Tensor
    children: torch.Tensor
    draft_slots: torch.Tensor
    child_slots: tuple[int, ...]

    @property
    def depth(self) -> int:
        return len(self.child_slots)

    def attention(self, base: torch.Tensor, first: int, count: int, kv_len: int) -> ExplicitAttention:
        return tree_attention(base, self.depths, self.anc, first, count, kv_len)

    @staticmethod
    def from_parents(
        parents: torch.Tensor, depths: torch.Tensor, draft_slots: torch.Tensor, child_slots: tuple[int, ...]
    ) -> RowTrees:
        """Per-row trees from parent indices (B, n) (-1 for the root; parents first, siblings in
        the order their acceptance tries them).

        Example:
            >>> t = RowTrees.from_parents(torch.tensor([[-1, 0, 0, 2]]), torch.tensor([[0, 1, 1, 2]]),
            ...                           torch.tensor([[0, -1, 1, -1]]), (2, 2))
            >>> t.children.tolist(), t.anc[0, 3].tolist()
            ([[[1, 2], [-1, -1], [3, -1], [-1, -1]]], [True, False, True, True])
        """
        b, n = parents.shape
        dev = parents.device
        kmax = max(child_slots)
        idx = torch.arange(n, device=dev)
        # ancestors: follow parent links depth times (n is a sentinel column for "no parent")
        anc = torch.eye(n, n + 1, dtype=torch.bool, device=dev).expand(b, -1, -1).clone()
        par = torch.where(parents >= 0, parents, n)
        par_ext = torch.cat([par, torch.full((b, 1), n, device=dev, dtype=par.dtype)], 1)  # (B, n+1)
        cur = par
        for _ in range(len(child_slots)):
            anc.scatter_(2, cur[:, :, None], True)
            cur = par_ext.gather(1, cur)
        # children: node i is the c-th child of its parent, c = earlier nodes with the same parent
        earlier = (parents[:, :, None] == parents[:, None, :]) & (idx[None, None, :] < idx[None, :, None])
        rank = earlier.sum(-1)  # (B, n)
        flat = torch.where(parents >= 0, par * kmax + rank, n * kmax)  # the root goes to a dump slot
        children = torch.full((b, n * kmax + 1), -1, dtype=torch.long, device=dev)
        children.scatter_(1, flat, idx.expand(b, -1).clone())
        return RowTrees(
            depths, anc[:, :, :n], children[:, :-1].view(b, n, kmax), draft_slots, tuple(child_slots)
        )


def tree_accept(
    tree: RowTrees | TreeTensors,  # per-row trees, or one static shape for every row
    node_tokens: torch.Tensor,  # (B, N+1) int64: the root (pending token) then the drafted nodes
    target_probs: torch.Tensor,  # (B, N+1, V): p(. | path to node i)
    draft_probs: torch.Tensor | None,  # (B, n_internal, V): q(. | path to node i); needed for iid rows
    iid: torch.Tensor
    | None,  # (B,) bool: rows whose children were sampled i.i.d. from q (else deterministic)
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact acceptance on a tree for a batch of rows (the rule and its proof: module docstring).

    Returns ``(n_accepted (B,), path (B, depth+1) node indices (root first; entries past
    n_accepted repeat the last accepted node), next_token (B,))``: row b keeps the tokens of
    ``path[b, 1 : 1 + n_accepted[b]]`` then ``next_token[b]``.

    Example:
        >>> t = TreeShape((2,)).tensors("cpu")
        >>> p = torch.tensor([[[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])  # root, two children
        >>> n, path, nxt = tree_accept(t, torch.tensor([[5, 1, 2]]), p, None, None, None)
        >>> int(n), path.tolist(), int(nxt)
        (1, [[0, 2]], 1)
    """
    b = node_tokens.shape[0]
    dev = node_tokens.device
    if isinstance(tree, TreeTensors):
        tree = tree.rows(b)
    rows = torch.arange(b, device=dev)
    res = target_probs[:, 0].double()  # (B, V) residual at the current node (unnormalised)
    cur = torch.zeros(b, dtype=torch.long, device=dev)
    alive = torch.ones(b, dtype=torch.bool, device=dev)
    n_acc = torch.zeros(b, dtype=torch.long, device=dev)
    path = [cur]
    for k in tree.child_slots:
        taken = torch.zeros(b, dtype=torch.bool, device=dev)
        nxt = cur
        # (B, V) q at the current node, for rows whose children were sampled i.i.d.
        q = draft_probs[rows, cur].double() if iid is not None and draft_probs is not None else None
        u = torch.rand(b, k, generator=generator, dtype=torch.float64, device=dev)
        for c in range(k):
            child = tree.children[rows, cur, c]  # (B,) -1: none (a leaf, or fewer children)
            x = node_tokens.gather(1, child.clamp(min=0)[:, None])  # (B, 1)
            trying = alive & ~taken & (child >= 0)
            ok, rej_res = _test_child(res, x, u[:, c], q, iid)
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


def _test_child(
    res: torch.Tensor,  # (B, V) float64 residual at the current node (unnormalised)
    x: torch.Tensor,  # (B, 1) the child's token
    u: torch.Tensor,  # (B,) float64 uniforms, one per row
    q: torch.Tensor | None,  # (B, V) float64 draft distribution at the node, for i.i.d. rows
    iid: torch.Tensor | None,  # (B,) bool rows whose children were sampled i.i.d. from q
) -> tuple[torch.Tensor, torch.Tensor]:
    """One child's test against the node's residual: accepted (B,) bool, and the residual if rejected.

    A deterministic child is accepted w.p. r(x) / sum(r), and rejecting it zeroes r(x); an i.i.d.
    child w.p. min(1, (r(x) / sum r) / q(x)) (never where q(x) = 0), and rejecting it leaves
    max(r / sum r - q, 0).
    """
    px = res.gather(1, x)[:, 0]
    mass = res.sum(-1)
    ok = u * mass < px  # deterministic: accept w.p. r(x) / sum(r)
    rej_res = res.scatter(1, x, 0.0)
    if iid is not None and q is not None:
        qx = q.gather(1, x)[:, 0]
        ok = torch.where(iid, (qx > 0) & (u * qx * mass < px), ok)  # min(1, (r(x)/sum r) / q(x))
        diff = (res / mass[:, None] - q).clamp(min=0)
        diff = torch.where(diff.sum(-1, keepdim=True) > 0, diff, res)  # r == q: cannot reject; guard
        rej_res = torch.where(iid[:, None], diff, rej_res)
    return ok, rej_res
