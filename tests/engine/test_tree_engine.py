"""Token trees through the engine: greedy == autoregressive, sampled == the target's law.

Greedy: every tree shape and batch composition (one slot, fewer slots than requests with
ragged budgets and an EOS, all rows at once, greedy rows next to sampled ones) must give the
target's greedy autoregressive tokens. Sampling: the first generated tokens of 20 000 copies
of one prompt against the target's exact joint (tiny vocabulary), as in
test_distribution_e2e.py, for top-k and i.i.d. children, with top-k and top-p filters. The same
for dynamic (EAGLE-2) trees, whose structure differs per row and step.
"""

from __future__ import annotations

import pytest
import torch

from engine.drafters import ModelDrafter, NgramDrafter
from engine.errors import EngineInputError
from engine.generate import generate
from engine.loader import ModelPair
from engine.sampling import BatchSampling, process_logits, sample
from engine.speculative import Request, SpecConfig, SpecEngine
from engine.tree import TreeShape

N_NEW = 20  # tokens per request; the conftest `reference` fixture reads it

SHAPES = [(2,), (2, 2), (3, 2, 1), (1, 3, 1, 2), (4, 1, 1, 1, 1)]

pytestmark = pytest.mark.usefixtures("apply_engine_mode")  # every test x ENGINE_MODES (conftest)


def cut_at_eos(tokens: list[int], eos: int) -> list[int]:
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def tree_config(topk: tuple[int, ...], **kw) -> SpecConfig:
    return SpecConfig(gamma=len(topk), tree_topk=topk, **kw)


def dynamic_config(topk: int, depth: int, nodes: int) -> SpecConfig:
    return SpecConfig(gamma=depth, tree_topk=(topk,) * depth, tree_nodes=nodes, tree_sampling="topk")


# (top-k, depth, nodes): fewer nodes than the depth, a few, every candidate (2 + 2 * 4), wide
DYNAMIC = [(2, 4, 2), (2, 4, 6), (2, 2, 6), (3, 3, 10), (4, 5, 12)]


@pytest.mark.parametrize("topk", SHAPES, ids=lambda t: "-".join(map(str, t)))
def test_tree_matches_autoregressive(pair, prompts, reference, make_requests, topk):
    out = generate(pair, make_requests(prompts, N_NEW), tree_config(topk), "model", eos_ids=())
    assert out.tokens == reference
    assert out.engine.tree is not None
    assert 0.0 < out.metrics["acceptance_rate"] < 1.0  # both accept and reject paths ran


BATCHED = {
    "3-2-1": tree_config((3, 2, 1)),
    "1-3-1-2": tree_config((1, 3, 1, 2)),
    "dynamic-3x3-7": dynamic_config(3, 3, 7),
}


@pytest.mark.parametrize("name", BATCHED)
@pytest.mark.parametrize("max_batch_size", [1, 2, 4])
def test_tree_is_batch_invariant(pair, prompts, reference, name, max_batch_size):
    """Fewer slots than requests, ragged budgets and an EOS: rows retire and others join mid-run."""
    eos = reference[3][8]
    budgets = [N_NEW, 4, 11, N_NEW, 1, 15]
    reqs = [Request(p, n, id=10 + i) for i, (p, n) in enumerate(zip(prompts, budgets, strict=True))]
    expected = [cut_at_eos(r[:n], eos) for r, n in zip(reference, budgets, strict=True)]
    out = generate(pair, reqs, BATCHED[name], "model", max_batch_size=max_batch_size, eos_ids=(eos,))
    assert out.tokens == expected


MIXED = {
    "topk": tree_config((3, 2, 1), tree_sampling="topk"),
    "iid": tree_config((3, 2, 1), tree_sampling="iid"),
    "dynamic-2x4-6": dynamic_config(2, 4, 6),
}


@pytest.mark.parametrize("name", MIXED)
def test_greedy_rows_next_to_sampled_rows(pair, prompts, reference, name):
    """Even slots greedy, odd slots sampled (top-k, top-p): the greedy rows still match."""
    reqs = [
        Request(p, N_NEW, id=i)
        if i % 2 == 0
        else Request(p, N_NEW, temperature=1.0, top_k=5, top_p=0.9, id=i)
        for i, p in enumerate(prompts)
    ]
    out = generate(pair, reqs, MIXED[name], "model", eos_ids=())
    assert [t for i, t in enumerate(out.tokens) if i % 2 == 0] == reference[::2]
    assert [len(t) for t in out.tokens] == [N_NEW] * len(prompts)


def test_draft_equal_to_target_accepts_every_depth(target, prompts, reference, make_requests):
    topk = (2, 2, 2)
    n_new = 1 + 2 * (len(topk) + 1)
    out = generate(
        ModelPair(target, target, None, None, None),
        make_requests(prompts, n_new),
        tree_config(topk),
        "model",
        eos_ids=(),
    )
    assert out.tokens == [r[:n_new] for r in reference]
    assert out.metrics["mean_acceptance_length"] == len(topk) + 1
    assert out.steps == 2


def test_trees_accept_more_than_the_chain(pair, prompts, reference, make_requests):
    """Greedy, so deterministic: the tree holds the chain as its first branch and accepts longer paths."""
    chain = generate(pair, make_requests(prompts, N_NEW), SpecConfig(gamma=3), "model", eos_ids=())
    tree = generate(pair, make_requests(prompts, N_NEW), tree_config((3, 2, 2)), "model", eos_ids=())
    assert tree.tokens == chain.tokens == reference
    assert tree.metrics["mean_acceptance_length"] > chain.metrics["mean_acceptance_length"]
    assert tree.metrics["verify_tokens_per_row"] == 1 + 3 + 6 + 12


@pytest.mark.parametrize("spec", DYNAMIC, ids=lambda t: "x".join(map(str, t[:2])) + f"-{t[2]}")
def test_dynamic_tree_matches_autoregressive(pair, prompts, reference, make_requests, spec):
    out = generate(pair, make_requests(prompts, N_NEW), dynamic_config(*spec), "model", eos_ids=())
    assert out.tokens == reference
    assert 0.0 < out.metrics["acceptance_rate"] < 1.0
    assert out.metrics["verify_tokens_per_row"] == 1 + spec[2]


def test_dynamic_tree_with_draft_equal_to_target_accepts_every_depth(
    target, prompts, reference, make_requests
):
    """Depth 2, every candidate verified: the target's greedy path is always in the tree, so every
    step accepts both depths; the second step only does if the first compacted the draft's cache."""
    n_new = 1 + 2 * 3
    out = generate(
        ModelPair(target, target, None, None, None),
        make_requests(prompts, n_new),
        dynamic_config(3, 2, 12),
        "model",
        eos_ids=(),
    )
    assert out.tokens == [r[:n_new] for r in reference]
    assert out.metrics["mean_acceptance_length"] == 3
    assert out.steps == 2


def prefilled_drafter(model, rows: int) -> tuple[ModelDrafter, torch.Tensor, torch.Tensor]:
    """A drafter over ``model`` whose ``rows`` rows hold 6 random tokens, 5 of them in its cache
    (the 6th pending): (drafter, token buffer (rows, 64), lengths)."""
    drafter = ModelDrafter(model)
    drafter.reset(rows, 64)
    tokens = torch.zeros(rows, 64, dtype=torch.long)
    tokens[:, :6] = torch.randint(1, 32, (rows, 6), generator=torch.Generator().manual_seed(0))
    drafter.prefill(0, tokens[:, :5], torch.full((rows,), 5), 5)
    return drafter, tokens, torch.full((rows,), 6)


def test_dynamic_trees_differ_by_row_and_hold_the_best_scored_nodes(model_factory):
    """Rows with different prefixes get different tree structures; each verified set is the top
    ``nodes`` candidates by path score, closed under parents (recomputed by brute force here)."""
    flat = model_factory(seed=3, std=0.3)
    drafter, tokens, length = prefilled_drafter(flat, 6)
    spec = dynamic_config(3, 3, 7).tree
    with torch.inference_mode():
        nodes, trees = drafter.propose_dynamic_tree(tokens, length, spec, 30)
    assert nodes.shape == (6, 8) and torch.equal(nodes[:, 0], tokens[:, 5])
    assert len({str(a) for a in trees.anc.tolist()}) > 1  # the structure is per row

    def logp(prefix):
        with torch.inference_mode():
            return flat(torch.tensor(prefix)[None])[0, -1].float().log_softmax(-1)

    for b in range(6):
        prefix = tokens[b, :6].tolist()
        # brute force: EAGLE-2's expansion with fresh (uncached) forwards
        cands, front = [], [((), 0.0)]
        for _depth in range(3):
            level = []
            for path, score in front:
                top = logp(prefix + list(path)).topk(3)
                level += [
                    (path + (t,), score + v)
                    for v, t in zip(top.values.tolist(), top.indices.tolist(), strict=True)
                ]
            cands += level
            front = sorted(level, key=lambda c: -c[1])[:3]
        best = sorted(cands, key=lambda c: -c[1])[:7]
        want = {c[0] for c in best}
        got = set()
        for i in range(1, 8):
            path, j = [], i
            while j > 0:
                path.append(int(nodes[b, j]))
                j = int(trees.anc[b, j, :j].nonzero().max()) if trees.depths[b, j] > 1 else 0
            got.add(tuple(reversed(path)))
        assert got == want, f"row {b}"


def test_dynamic_tree_settings_are_checked():
    for kw, key in [
        (dict(tree_topk=(2, 1, 2)), "tree_nodes"),
        (dict(tree_topk=(1, 1, 1)), "tree_nodes"),
        (dict(tree_topk=(2, 2, 2), tree_sampling="iid"), "tree_sampling"),
        (dict(tree_topk=(2, 2, 2), tree_nodes=15), "tree_nodes"),
    ]:
        kw = {"tree_nodes": 4, "tree_sampling": "topk", **kw}
        with pytest.raises(EngineInputError, match=key) as err:
            SpecConfig(gamma=3, **kw)
        assert "\n" not in str(err.value)
    assert (
        SpecConfig(gamma=3, tree_topk=(2, 2, 2), tree_nodes=10, tree_sampling="topk").lookahead == 10
    )  # 2 + 2 * 4
    assert (
        SpecConfig(gamma=5, tree_topk=(3,) * 5, tree_nodes=2, tree_sampling="topk").lookahead == 12
    )  # draft: 4 * 3


def test_top_k_one_everywhere_is_the_chain_path(pair, prompts, reference, make_requests):
    out = generate(pair, make_requests(prompts, N_NEW), tree_config((1, 1, 1)), "model", eos_ids=())
    assert out.engine.tree is None and out.tokens == reference


def test_iid_children_are_separate_draws(model_factory):
    """i.i.d. children of one node are independent draft samples (a flat draft: mostly distinct
    tokens), not copies of one draw; top-k children are the draft's best tokens in order."""
    flat = model_factory(seed=3, std=0.02)  # near-uniform logits
    drafter, tokens, length = prefilled_drafter(flat, 8)
    gen = torch.Generator().manual_seed(0)
    tree = TreeShape((4, 2)).tensors("cpu")
    sampling = BatchSampling(torch.ones(8))
    nodes, probs = drafter.propose_tree(
        tokens, length, tree, sampling, torch.ones(8, dtype=torch.bool), 20, gen
    )
    assert nodes.shape == (8, 1 + 4 + 8) and probs.shape == (8, 1 + 4, 32)
    assert sum(len(set(row)) for row in nodes[:, 1:5].tolist()) > 8 * 3  # mostly distinct: separate draws
    drafter.draft_len[:8] = 5
    top, none = drafter.propose_tree(tokens, length, tree, sampling, None, 20, gen)
    assert none is None
    with torch.inference_mode():
        best = flat(tokens[:, :6])[:, -1].topk(4).indices
    assert torch.equal(top[:, 1:5], best)


def test_a_tree_needs_the_model_drafter(target):
    with pytest.raises(EngineInputError, match="tree_topk") as err:
        SpecEngine(target, NgramDrafter(), tree_config((2, 2)), 2, 64)
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------ sampled, end to end

V = 8
N = 20_000
PROMPT = [3, 1, 4, 1]
P_OK = 1e-3


def exact_joint(model, top_k: int, top_p: float) -> torch.Tensor:
    """(V, V, V) probabilities of the first three generated tokens under ``model``."""

    def next_probs(prefixes: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            logits = model(prefixes)[:, -1:]
        m = prefixes.shape[0]
        return process_logits(
            logits,
            torch.ones(m),
            torch.full((m,), top_k) if top_k else None,
            torch.full((m,), top_p) if top_p < 1 else None,
        )[:, 0]

    prompt = torch.tensor(PROMPT)
    t = torch.arange(V)
    p1 = next_probs(prompt[None])[0]
    p2 = next_probs(torch.cat([prompt.expand(V, -1), t[:, None]], 1))
    grid = torch.cartesian_prod(t, t)
    p3 = next_probs(torch.cat([prompt.expand(V * V, -1), grid], 1)).view(V, V, V)
    return p1[:, None, None] * p2[:, :, None] * p3


JOINT_CASES = {  # name: (config, seed); the dynamic tree verifies 5 of its 3 + 9 candidates, chosen by draft score
    "topk": (tree_config((3, 2), tree_sampling="topk"), 1),
    "iid": (tree_config((3, 2), tree_sampling="iid"), 1),
    "dynamic-3x2-5": (dynamic_config(3, 2, 5), 3),
}


@pytest.mark.parametrize(
    ("name", "top_k", "top_p"),
    [
        ("topk", 0, 1.0),
        ("iid", 4, 1.0),
        ("topk", 0, 0.8),
        ("dynamic-3x2-5", 0, 1.0),
        ("dynamic-3x2-5", 4, 1.0),
        ("dynamic-3x2-5", 0, 0.8),
    ],
)
def test_first_three_tokens_have_the_target_joint(small_pair, chi2, name, top_k, top_p):
    """Token 1 comes from the prefill, tokens 2-3 from the first tree step (depth 2)."""
    config, seed = JOINT_CASES[name]
    reqs = [Request(PROMPT, 3, temperature=1.0, top_k=top_k, top_p=top_p, id=i) for i in range(N)]
    out = generate(small_pair, reqs, config, "model", max_batch_size=4096, seed=seed, eos_ids=())
    toks = torch.tensor(out.tokens)
    codes = (toks[:, 0] * V + toks[:, 1]) * V + toks[:, 2]
    joint = exact_joint(small_pair.target, top_k, top_p).flatten()
    assert bool((joint[codes] > 0).all()), "a token outside the filtered support"
    assert chi2(codes, joint) > P_OK
    assert 0.2 < out.metrics["acceptance_rate"] < 0.95
    assert chi2(codes, exact_joint(small_pair.draft, top_k, top_p).flatten()) < P_OK  # power


def wrong_tree_accept(tree, node_tokens, target_probs, draft_probs, iid, generator):
    """A wrong tree rule (engine.tree.tree_accept's signature): siblings tried against p itself, never
    against the residual."""
    b = node_tokens.shape[0]
    rows = torch.arange(b)
    cur, alive = torch.zeros(b, dtype=torch.long), torch.ones(b, dtype=torch.bool)
    n_acc, res, path = torch.zeros(b, dtype=torch.long), target_probs[:, 0].double(), [cur]
    for k in tree.child_slots:
        p = target_probs[rows, cur].double()
        taken, nxt = torch.zeros(b, dtype=torch.bool), cur
        for c in range(k):
            child = tree.children[rows, cur, c].clamp(min=0)
            px = p.gather(1, node_tokens.gather(1, child[:, None]))[:, 0]
            ok = alive & ~taken & (torch.rand(b, generator=generator, dtype=torch.float64) < px)
            nxt, taken = torch.where(ok, child, nxt), taken | ok
        res = torch.where((alive & ~taken)[:, None], p, res)
        cur, n_acc, alive = nxt, n_acc + taken.long(), alive & taken
        res = torch.where(taken[:, None], target_probs[rows, cur].double(), res)
        path.append(cur)
    return n_acc, torch.stack(path, 1), sample(res, generator)


def test_the_engine_check_fails_for_a_wrong_tree_rule(small_pair, chi2, monkeypatch):
    """Siblings tried against p itself, never against the residual: the check must catch it."""
    monkeypatch.setattr("engine.speculative.tree_accept", wrong_tree_accept)
    reqs = [Request(PROMPT, 3, temperature=1.0, id=i) for i in range(N // 2)]
    out = generate(small_pair, reqs, tree_config((3, 2)), "model", max_batch_size=4096, seed=2, eos_ids=())
    toks = torch.tensor(out.tokens)
    codes = (toks[:, 0] * V + toks[:, 1]) * V + toks[:, 2]
    assert chi2(codes, exact_joint(small_pair.target, 0, 1.0).flatten()) < P_OK
