"""engine.tree: shapes, the tree attention mask, and exact tree acceptance.

The acceptance checks simulate B = 100 000 independent rows in one batched call on direct
probability tables over a 6-token vocabulary: p1 (V,), p2 (V, V) = p(. | x1) and p3 (V, V, V)
= p(. | x1, x2) play the target, q1/q2 the draft. Tokens a step does not emit (the step ended
earlier) are completed from the exact conditionals, so the first three tokens of every row
must follow p1 p2 p3 exactly. Deliberately wrong rules run through the same check and fail it.
"""

from __future__ import annotations

import pytest
import torch

from engine.errors import EngineInputError
from engine.speculative import SpecConfig
from engine.tree import DynamicTree, RowTrees, TreeShape, tree_accept

V = 6
B = 100_000
P_OK = 1e-3


def table(seed: int, *shape: int, zeros: bool = False) -> torch.Tensor:
    """Random distributions over V (last axis); ``zeros`` removes about a third of each support."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(*shape, V, generator=gen) * 1.5
    if zeros:
        cut = torch.rand(*shape, V, generator=gen) < 0.35
        cut[..., 0] = False  # keep the support non-empty
        logits = logits.masked_fill(cut, float("-inf"))
    return logits.softmax(-1)


# ------------------------------------------------------------------ shapes and the mask


def test_shape_arrays():
    s = TreeShape((3, 2, 1))
    assert s.depth == 3 and s.n_nodes == 3 + 6 + 6 and s.level_offsets == [0, 1, 4, 10]
    assert s.parents[:10] == [-1, 0, 0, 0, 1, 1, 2, 2, 3, 3]
    assert s.parents[10:] == list(range(4, 10))
    assert s.depths == [0, 1, 1, 1] + [2] * 6 + [3] * 6
    t = s.tensors("cpu")
    assert t.children.tolist()[:4] == [[1, 2, 3], [4, 5, -1], [6, 7, -1], [8, 9, -1]]
    assert t.anc[12].nonzero().flatten().tolist() == [0, 2, 6, 12]  # root, depth 1, depth 2, self
    assert TreeShape((1, 1)).is_chain and not s.is_chain


@pytest.mark.parametrize(("topk", "word"), [((), "tree_topk"), ((2, 0), "tree_topk"), ((16, 16), "256")])
def test_bad_shapes_are_refused_naming_the_key(topk, word):
    with pytest.raises(EngineInputError, match=word) as err:
        TreeShape(topk)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("kw", "key"),
    [
        ({"gamma": 3, "tree_topk": (2, 2)}, "tree_topk"),
        ({"gamma": 2, "tree_topk": (2, 0)}, "tree_topk"),
        ({"gamma": 2, "tree_topk": (2, 2), "confidence_threshold": 0.5}, "confidence_threshold"),
        ({"gamma": 2, "tree_topk": (2, 2), "gamma_schedule": "heuristic"}, "gamma_schedule"),
        ({"gamma": 2, "tree_topk": (2, 2), "tree_sampling": "beam"}, "tree_sampling"),
    ],
)
def test_spec_config_refuses_trees_it_cannot_honour(kw, key):
    with pytest.raises(EngineInputError, match=key) as err:
        SpecConfig(**kw)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("window", [None, 3])
def test_tree_forward_equals_each_paths_plain_forward(model_factory, window):
    """One cached forward with the tree mask gives every node the logits of prefix + its path."""
    kw = {"sliding_window": window, "sliding_layers": (1,)} if window else {}
    model = model_factory(seed=5, **kw)
    shape = TreeShape((2, 3, 1))
    tt = shape.tensors("cpu")
    gen = torch.Generator().manual_seed(0)
    prefixes = [[3, 4, 5, 6, 7], [9, 1]]  # ragged rows; the last prefix token is the root
    n = shape.n_nodes + 1
    nodes = torch.randint(0, 32, (2, n), generator=gen)
    plen = torch.tensor([len(p) for p in prefixes])
    nodes[:, 0] = torch.tensor([p[-1] for p in prefixes])
    cache = model.new_cache(2, 64)
    with torch.inference_mode():
        width = int(plen.max()) - 1
        pre = torch.zeros(2, width, dtype=torch.long)
        for i, p in enumerate(prefixes):
            pre[i, : len(p) - 1] = torch.tensor(p[:-1])
        model(pre, cache=cache, start=torch.zeros(2, dtype=torch.long), kv_len=width, slot0=0)
        base = plen - 1
        kv_len = int(base.max()) + n
        logits = model(nodes, cache=cache, start=base, kv_len=kv_len, attn=tt.attention(base, 0, n, kv_len))
        for row, p in enumerate(prefixes):
            for i in range(n):
                path, j = [], i
                while j > 0:
                    path.append(int(nodes[row, j]))
                    j = shape.parents[j]
                ref = model(torch.tensor([p + path[::-1]]))[0, -1]
                torch.testing.assert_close(logits[row, i], ref, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------ acceptance, simulated


def simulate(topk: tuple[int, int], iid: bool, seed: int, zeros: bool = False, accept=tree_accept):
    """B rows of one tree step on the tables; returns every row's first three tokens (B, 3)."""
    gen = torch.Generator().manual_seed(seed)
    p1, p2, p3 = table(1, zeros=zeros), table(2, V, zeros=zeros), table(3, V, V, zeros=zeros)
    q1, q2 = table(4), table(5, V)
    shape = TreeShape(topk)
    tt = shape.tensors("cpu")
    k1, k2 = topk
    if iid:
        x1 = torch.multinomial(q1, B * k1, replacement=True, generator=gen).view(B, k1)
        x2 = torch.multinomial(q2[x1.flatten()], k2, replacement=True, generator=gen).view(B, k1 * k2)
    else:
        x1 = q1.topk(k1).indices.expand(B, k1)
        x2 = q2[x1.flatten()].topk(k2, -1).indices.reshape(B, k1 * k2)
    par1 = x1.repeat_interleave(k2, 1)  # (B, k1*k2) each depth-2 node's parent token
    tokens = torch.cat([torch.zeros(B, 1, dtype=torch.long), x1, x2], 1)  # root token unused
    target = torch.cat([p1.expand(B, 1, V), p2[x1], p3[par1, x2]], 1)  # (B, N+1, V)
    draft = torch.cat([q1.expand(B, 1, V), q2[x1]], 1) if iid else None  # (B, 1 + k1, V)
    flag = torch.ones(B, dtype=torch.bool) if iid else None
    n_acc, path, nxt = accept(tt, tokens, target, draft, flag, gen)
    path_tok = tokens.gather(1, path)  # (B, 3)
    out = torch.zeros(B, 3, dtype=torch.long)
    for j in range(3):  # emitted tokens, then completion from the exact conditionals
        if j == 0:
            exact = p1.expand(B, V)
        elif j == 1:
            exact = p2[out[:, 0]]
        else:
            exact = p3[out[:, 0], out[:, 1]]
        fresh = torch.multinomial(exact, 1, generator=gen)[:, 0]
        emitted = torch.where(n_acc > j, path_tok[:, j + 1 if j < 2 else 2], nxt)
        out[:, j] = torch.where(n_acc >= j, emitted, fresh)
    joint = p1[:, None, None] * p2[:, :, None] * p3
    return out, joint.flatten(), n_acc


def codes(out: torch.Tensor) -> torch.Tensor:
    return (out[:, 0] * V + out[:, 1]) * V + out[:, 2]


@pytest.mark.parametrize("iid", [False, True], ids=["topk", "iid"])
@pytest.mark.parametrize("zeros", [False, True], ids=["full", "filtered"])
def test_sampled_tree_emits_the_target_joint(chi2, iid, zeros):
    out, joint, n_acc = simulate((3, 2), iid, seed=7, zeros=zeros)
    c = codes(out)
    assert bool((joint[c] > 0).all()), "a token outside the target's support"
    assert chi2(c, joint) > P_OK
    assert (
        0 < float((n_acc == 0).float().mean()) < 1 and float((n_acc == 2).float().mean()) > 0.02
    )  # all paths ran


def naive_iid(tree, node_tokens, target_probs, draft_probs, iid, generator):
    """Wrong: every sampled sibling is tried against p itself (no residual between siblings)."""
    b = node_tokens.shape[0]
    rows = torch.arange(b)
    cur, alive, n_acc = (
        torch.zeros(b, dtype=torch.long),
        torch.ones(b, dtype=torch.bool),
        torch.zeros(b, dtype=torch.long),
    )
    res, path = target_probs[:, 0].double(), [cur]
    for k in tree.shape.topk:
        p, q = target_probs[rows, cur].double(), draft_probs[rows, cur].double()
        taken, nxt = torch.zeros(b, dtype=torch.bool), cur
        for c in range(k):
            child = tree.children[cur, c].clamp(min=0)
            x = node_tokens.gather(1, child[:, None])
            ok = (
                alive
                & ~taken
                & (
                    torch.rand(b, generator=generator, dtype=torch.float64) * q.gather(1, x)[:, 0]
                    < p.gather(1, x)[:, 0]
                )
            )
            nxt, taken = torch.where(ok, child, nxt), taken | ok
        res = torch.where((alive & ~taken)[:, None], (p - q).clamp(min=0), res)
        cur, n_acc, alive = nxt, n_acc + taken.long(), alive & taken
        res = torch.where(taken[:, None], target_probs[rows, cur].double(), res)
        path.append(cur)
    from engine.sampling import sample

    return n_acc, torch.stack(path, 1), sample(res, generator)


def _no_renorm(tree, node_tokens, target_probs, generator):
    b = node_tokens.shape[0]
    rows = torch.arange(b)
    cur, alive, n_acc = (
        torch.zeros(b, dtype=torch.long),
        torch.ones(b, dtype=torch.bool),
        torch.zeros(b, dtype=torch.long),
    )
    res, path = target_probs[:, 0].double(), [cur]
    for k in tree.shape.topk:
        p = target_probs[rows, cur].double()
        taken, nxt = torch.zeros(b, dtype=torch.bool), cur
        for c in range(k):
            child = tree.children[cur, c].clamp(min=0)
            x = node_tokens.gather(1, child[:, None])
            ok = (
                alive
                & ~taken
                & (torch.rand(b, generator=generator, dtype=torch.float64) < p.gather(1, x)[:, 0])
            )
            nxt, taken = torch.where(ok, child, nxt), taken | ok
        res = torch.where((alive & ~taken)[:, None], p, res)
        cur, n_acc, alive = nxt, n_acc + taken.long(), alive & taken
        res = torch.where(taken[:, None], target_probs[rows, cur].double(), res)
        path.append(cur)
    from engine.sampling import sample

    return n_acc, torch.stack(path, 1), sample(res, generator)


@pytest.mark.parametrize(
    ("iid", "wrong"), [(True, naive_iid), (False, _no_renorm)], ids=["iid-no-residual", "topk-no-renorm"]
)
def test_the_check_detects_a_wrong_rule(chi2, iid, wrong):
    accept = wrong if iid else (lambda t, n, tp, dp, f, g: wrong(t, n, tp, g))
    out, joint, _ = simulate((3, 2), iid, seed=8, accept=accept)
    assert chi2(codes(out), joint) < P_OK


def test_greedy_rows_follow_the_target_argmax():
    """One-hot targets: the accepted path is the argmax chain as far as the tree holds it."""
    gen = torch.Generator().manual_seed(3)
    shape = TreeShape((3, 2, 2))
    tt = shape.tensors("cpu")
    b, n = 4000, shape.n_nodes + 1
    tokens = torch.randint(0, V, (b, n), generator=gen)
    argmax = torch.randint(0, V, (b, n), generator=gen)
    target = torch.nn.functional.one_hot(argmax, V).float()
    n_acc, path, nxt = tree_accept(tt, tokens, target, None, None, gen)
    for row in range(200):
        node, depth = 0, 0
        while depth < shape.depth:
            kids = [
                c for c in range(1, n) if shape.parents[c] == node and tokens[row, c] == argmax[row, node]
            ]
            if not kids:
                break
            node, depth = kids[0], depth + 1
            assert int(path[row, depth]) == node
        assert int(n_acc[row]) == depth
        assert int(nxt[row]) == int(argmax[row, node])
    assert 0 < float(n_acc.float().mean()) < shape.depth


@pytest.mark.parametrize(
    "topk", [(2,), (3, 2, 1), (1, 3, 1, 2), (2, 2, 2)], ids=lambda t: "-".join(map(str, t))
)
def test_row_trees_from_parents_rebuild_a_static_shape(topk):
    """The per-row structure (dynamic trees) built from parent links equals the static shape's arrays."""
    shape = TreeShape(topk)
    t = shape.tensors("cpu")
    rows = RowTrees.from_parents(
        torch.tensor([shape.parents] * 2), torch.tensor([shape.depths] * 2), t.draft_slots.expand(2, -1), topk
    )
    assert torch.equal(rows.anc, t.anc.expand(2, -1, -1))
    n_int, kmax = t.children.shape
    assert torch.equal(rows.children[:, :n_int], t.children.expand(2, -1, -1))
    assert bool((rows.children[:, n_int:] == -1).all())  # leaves have no children
    base = torch.tensor([5, 9])
    for first, count in [(0, shape.n_nodes + 1), (1, topk[0])]:
        want, got = t.attention(base, first, count, 30), rows.attention(base, first, count, 30)
        assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))


def test_dynamic_tree_selection_is_the_best_scored_closed_set():
    """Random scores that decrease along every path: the chosen nodes are the top ``nodes`` by score,
    every chosen node's parent is chosen, ties go to the shallower candidate."""
    gen = torch.Generator().manual_seed(0)
    spec = DynamicTree(topk=2, depth=3, nodes=6)
    b, m = 50, spec.candidates  # 2 + 4 + 4
    parents = torch.tensor([-1, -1, 0, 0, 1, 1, 2, 2, 3, 3])  # depth-2 fed nodes: candidates 2 and 3
    step = -torch.rand(b, m, generator=gen).round(decimals=1)  # many ties, some zero steps
    scores = step.clone()
    for c in range(2, m):
        scores[:, c] = scores[:, parents[c]] + step[:, c]
    tokens = torch.arange(100, 100 + m).expand(b, -1)
    slots = torch.tensor([1, 2, 3, 4, -1, -1, -1, -1, -1, -1]).expand(b, -1)
    nodes, trees = spec.select(
        torch.zeros(b, 1, dtype=torch.long), tokens, scores, parents.expand(b, -1), slots
    )
    depth_of = spec.candidate_depths("cpu")
    for r in range(b):
        chosen = (nodes[r, 1:] - 100).tolist()
        assert chosen == sorted(chosen)
        kth = sorted(scores[r].tolist(), reverse=True)[spec.nodes - 1]
        assert all(scores[r, c] >= kth for c in chosen) and sum(scores[r] > kth) <= spec.nodes
        for i, c in enumerate(chosen, 1):
            p = int(parents[c])
            assert p < 0 or p in chosen  # closed under parents
            assert int(trees.depths[r, i]) == int(depth_of[c])
            parent_node = 0 if p < 0 else chosen.index(p) + 1
            assert bool(trees.anc[r, i, parent_node]) and int(trees.draft_slots[r, i]) == int(slots[r, c])
