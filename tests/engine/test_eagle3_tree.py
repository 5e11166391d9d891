"""Token trees drafted by an EAGLE-3 head: the guarantees of the chain (test_eagle3.py) and of the draft
model's trees (test_tree_engine.py), for static and dynamic trees.

Greedy output equals the target's autoregressive output (batch 1 and 8, ragged prompts and budgets,
full and reduced draft vocabularies); the head's tree nodes are the children a chain computed from
scratch would propose; sampled output has the target's law (chi-square at T=1 with top-k / top-p,
and a wrong rule the same check catches); the head's cache after random tree steps equals a fresh
prefill; the sync-free step reads the device once and, compiled, a run compiles nothing after the
warm-up. Heads come from test_eagle3.py's helpers (written in vLLM's format, loaded back).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from engine.drafters import HybridDrafter, NgramDrafter
from engine.eagle3 import Eagle3Head, load_eagle3
from engine.eagle3_drafter import Eagle3Drafter
from engine.errors import EngineInputError
from engine.generate import generate
from engine.loader import ModelPair
from engine.sampling import BatchSampling
from engine.speculative import Request, SpecConfig, SpecEngine
from engine.tree import DynamicTree, TreeShape
from tests.engine.conftest import naive_greedy
from tests.engine.test_eagle3 import (
    P_OK,
    PROMPT,
    SMALL_TARGETS,
    N,
    V,
    check_head,
    drain,
    exact_joint,
    fit_head,
    frequent_tokens,
    head_config,
    random_head,
    random_steps,
    write_vllm_folder,
)
from tests.engine.test_host_syncs import reads_per_step
from tests.engine.test_tree_engine import wrong_tree_accept

TREES = {  # static shapes (top-k children; i.i.d. for sampled rows by default) and a dynamic tree
    "2,1,1": SpecConfig.for_tree((2, 1, 1)),
    "3,2": SpecConfig.for_tree((3, 2)),
    "2x3/5": SpecConfig.for_tree(DynamicTree(2, 3, 5)),
}
BUDGETS = [20, 4, 11, 20, 1, 15, 9, 17]  # max_new_tokens per prompt: rows retire and others join


@pytest.fixture(scope="module")
def heads(eager_target, tmp_path_factory) -> dict[int, Eagle3Head]:
    """draft_vocab_size -> a fitted head on the tiny target (full vocabulary 32, reduced 24)."""
    out = {}
    for dv in (32, 24):
        targets = None if dv == 32 else frequent_tokens(eager_target, dv)
        raw = head_config(eager_target.config, dv)
        head = fit_head(random_head(eager_target, raw, targets, seed=dv, std=0.3), eager_target)
        out[dv] = load_eagle3(
            write_vllm_folder(tmp_path_factory.mktemp(f"tree-{dv}"), raw, head), eager_target
        )
    return out


@pytest.fixture(scope="module")
def expected(eager_target, ragged_prompts) -> list[list[int]]:
    return [naive_greedy(eager_target, p, n) for p, n in zip(ragged_prompts, BUDGETS, strict=True)]


def run(target, head, config, prompts, budgets, batch, sync_free=False, eos=(), kinds=None):
    """generate()'s loop with an explicit sync-free setting; returns tokens and the engine.
    ``kinds``: per request, its sampling settings (default greedy)."""
    kinds = kinds or [{}] * len(prompts)
    reqs = [
        Request(list(p), n, id=i, **k)
        for i, (p, n, k) in enumerate(zip(prompts, budgets, kinds, strict=True))
    ]
    max_seq = max(len(p) + n for p, n in zip(prompts, budgets, strict=True)) + config.lookahead + 3
    gen = torch.Generator().manual_seed(0)
    engine = SpecEngine(target, Eagle3Drafter(head), config, batch, max_seq, eos, gen, sync_free=sync_free)
    return drain(engine, reqs), engine


# ------------------------------------------------------------------ greedy equals the target's


@pytest.mark.parametrize("sync_free", [False, True])
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("name", list(TREES))
@pytest.mark.parametrize("draft_vocab", [32, 24])
def test_greedy_tree_output_equals_the_target_greedy(
    eager_target, heads, ragged_prompts, expected, draft_vocab, name, batch, sync_free
):
    tokens, engine = run(
        eager_target, heads[draft_vocab], TREES[name], ragged_prompts, BUDGETS, batch, sync_free
    )
    assert engine.tree is not None
    assert tokens == expected
    assert 0 < int(engine.stats.accepted) < int(engine.stats.proposed), "both acceptance and rejection"


@pytest.mark.parametrize("name", ["3,2", "2x3/5"])
def test_greedy_rows_next_to_sampled_rows_and_an_eos(eager_target, heads, ragged_prompts, expected, name):
    """Even slots greedy, odd slots sampled (top-k, top-p: i.i.d. children on the static tree): the
    greedy rows still equal the target's, cut at an EOS."""
    eos = expected[0][9]  # row 0 stops there (or at an earlier occurrence)
    kinds = [{} if i % 2 == 0 else dict(temperature=1.0, top_k=5, top_p=0.9) for i in range(len(BUDGETS))]
    tokens, _ = run(eager_target, heads[24], TREES[name], ragged_prompts, BUDGETS, 8, eos=(eos,), kinds=kinds)
    want = [r[: r.index(eos) + 1] if eos in r else r for r in expected]
    assert tokens[::2] == want[::2]
    assert all(len(t) <= n for t, n in zip(tokens, BUDGETS, strict=True))


# ------------------------------------------------------------------ the nodes are the chain's proposals


def chain_logits(head: Eagle3Head, target, prefix: list[int], path: list[int]) -> torch.Tensor:
    """(V,) the head's logits after ``prefix`` (its last token pending) and the drafts ``path``, computed
    as a chain from scratch: the target's states from one uncached forward, one head forward over
    positions 0..len(prefix)-2 with them, then each draft fed with the previous pre-norm output."""
    n = len(prefix)
    seq = torch.tensor([prefix])
    with torch.inference_mode():
        _, aux = target.forward_hidden(seq[:, : n - 1], layers=head.config.layer_ids)
        cache = head.new_cache(1, n + len(path))
        zero = torch.zeros(1, dtype=torch.long)
        logits, out = head(seq[:, 1:], head.fc(aux), cache, zero, n - 1)
        logits, out = logits[:, -1:], out[:, -1:]
        for j, tok in enumerate(path):
            start = torch.full((1,), n - 1 + j)
            logits, out = head(torch.tensor([[tok]]), out, cache, start, n + j)
    return logits[0, 0]


def prefilled(target, head, prompts: list[list[int]], config: SpecConfig):
    """An engine with ``prompts`` admitted (greedy first tokens) and its drafter, before any step."""
    drafter = Eagle3Drafter(head)
    engine = SpecEngine(target, drafter, config, len(prompts), 64)
    with torch.inference_mode():
        engine.add([Request(p, 8, id=i) for i, p in enumerate(prompts)])
    return engine, drafter


@pytest.mark.parametrize("draft_vocab", [32, 24])
def test_static_tree_children_are_the_chains_top_k(eager_target, heads, ragged_prompts, draft_vocab):
    """Every node's children are the head's top-k after the node's path, as a chain computes it from
    scratch: a wrong h, position, mask or slot changes them (greedy output would not notice)."""
    prompts = ragged_prompts[:4]
    head, shape = heads[draft_vocab], TreeShape((3, 2, 2))
    engine, drafter = prefilled(eager_target, head, prompts, SpecConfig.for_tree(shape.topk))
    st, b = engine.state, len(prompts)
    with torch.inference_mode():
        nodes, probs = drafter.propose_tree(
            st.tokens[:b], st.length[:b], shape.tensors("cpu"), st.sampling(slice(0, b)), None, 40, None
        )
    assert probs is None and nodes.shape == (b, 1 + shape.n_nodes)
    vocab = set((torch.arange(draft_vocab) + head.d2t).tolist())
    assert set(nodes[:, 1:].flatten().tolist()) <= vocab
    children: dict[int, list[int]] = {}
    for i, p in enumerate(shape.parents[1:], 1):
        children.setdefault(p, []).append(i)
    for row in range(b):
        prefix = st.tokens[row, : int(st.length[row])].tolist()
        for parent, kids in children.items():
            path, j = [], parent
            while j > 0:
                path.insert(0, int(nodes[row, j]))
                j = shape.parents[j]
            want = chain_logits(head, eager_target, prefix, path).topk(len(kids)).indices.tolist()
            assert nodes[row, kids].tolist() == want, (row, parent)


@pytest.mark.parametrize("draft_vocab", [32, 24])
def test_dynamic_tree_holds_the_best_scored_chain_paths(eager_target, heads, ragged_prompts, draft_vocab):
    """Each row's verified set is EAGLE-2's best-scored candidates, recomputed by brute force from the
    chain's logits (fresh, uncached head forwards per path)."""
    prompts = ragged_prompts[:4]
    head, spec = heads[draft_vocab], DynamicTree(3, 3, 7)
    engine, drafter = prefilled(eager_target, head, prompts, SpecConfig.for_tree(spec))
    st, b = engine.state, len(prompts)
    with torch.inference_mode():
        nodes, trees = drafter.propose_dynamic_tree(st.tokens[:b], st.length[:b], spec, 40)
    assert nodes.shape == (b, 8)
    for row in range(b):
        prefix = st.tokens[row, : int(st.length[row])].tolist()
        cands, front = [], [((), 0.0)]
        for _depth in range(3):
            level = []
            for path, score in front:
                top = chain_logits(head, eager_target, prefix, list(path)).float().log_softmax(-1).topk(3)
                level += [
                    (path + (t,), score + v)
                    for v, t in zip(top.values.tolist(), top.indices.tolist(), strict=True)
                ]
            cands += level
            front = sorted(level, key=lambda c: -c[1])[:3]
        want = {c[0] for c in sorted(cands, key=lambda c: -c[1])[:7]}
        got = set()
        for i in range(1, 8):
            path, j = [], i
            while j > 0:
                path.append(int(nodes[row, j]))
                j = int(trees.anc[row, j, :j].nonzero().max()) if trees.depths[row, j] > 1 else 0
            got.add(tuple(reversed(path)))
        assert got == want, f"row {row}"


def test_reduced_vocabulary_iid_children_are_draft_tokens(small_target, small_heads):
    """i.i.d. children are drawn from q, which is 0 off the draft vocabulary; top-k children too."""
    engine, drafter = prefilled(small_target, small_heads[5], [PROMPT] * 64, SpecConfig.for_tree((3, 2)))
    st = engine.state
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        nodes, probs = drafter.propose_tree(
            st.tokens[:64],
            st.length[:64],
            TreeShape((3, 2)).tensors("cpu"),
            BatchSampling(torch.ones(64)),
            torch.ones(64, dtype=torch.bool),
            16,
            gen,
        )
    outside = [t for t in range(V) if t not in SMALL_TARGETS]
    assert probs is not None and probs.shape == (64, 4, V) and float(probs[..., outside].abs().max()) == 0.0
    assert set(nodes[:, 1:].flatten().tolist()) <= set(SMALL_TARGETS)
    assert any(len(set(kids)) < 3 for kids in nodes[:, 1:4].tolist())  # i.i.d. draws repeat; top-k never


# ------------------------------------------------------------------ sampled output is the target's


JOINT = {  # depth 2: token 1 from the prefill, tokens 2-3 from the first tree step
    "iid-3,2": SpecConfig.for_tree((3, 2)),
    "topk-3,2": SpecConfig(gamma=2, tree_topk=(3, 2), tree_sampling="topk"),
    "dynamic-3x2/5": SpecConfig.for_tree(DynamicTree(3, 2, 5)),
}


def sample_three(target, head, config, top_k, top_p, n=N, seed=0):
    reqs = [Request(PROMPT, 3, temperature=1.0, top_k=top_k, top_p=top_p, id=i) for i in range(n)]
    pair = ModelPair(target, None, None, Path("target"), None)
    out = generate(pair, reqs, config, Eagle3Drafter(head), max_batch_size=4096, seed=seed, eos_ids=())
    toks = torch.tensor(out.tokens)
    assert toks.shape == (n, 3) and out.engine is not None and out.engine.tree is not None
    return (toks[:, 0] * V + toks[:, 1]) * V + toks[:, 2], out.metrics


@pytest.mark.parametrize(
    ("name", "draft_vocab", "top_k", "top_p"),
    [  # the random full-vocabulary head's dynamic tree accepts ~4% (its confidence picks the wrong
        # subtrees): too few acceptances to test that path, so dynamic trees run on the reduced head
        ("iid-3,2", 5, 0, 1.0),
        ("iid-3,2", 5, 4, 1.0),
        ("iid-3,2", 5, 0, 0.8),
        ("iid-3,2", V, 0, 1.0),
        ("topk-3,2", V, 0, 0.8),
        ("dynamic-3x2/5", 5, 0, 1.0),
        ("dynamic-3x2/5", 5, 4, 1.0),
        ("dynamic-3x2/5", 5, 0, 0.8),
    ],
)
def test_sampled_first_three_tokens_have_the_target_joint(
    small_target, small_heads, chi2, name, draft_vocab, top_k, top_p
):
    codes, metrics = sample_three(small_target, small_heads[draft_vocab], JOINT[name], top_k, top_p)
    joint = exact_joint(small_target, top_k, top_p).flatten()
    assert bool((joint[codes] > 0).all()), "a token outside the top-k / top-p support"
    assert chi2(codes, joint) > P_OK
    assert 0.05 < metrics["acceptance_rate"] < 0.95  # acceptance and recovery both happened often


def test_the_check_fails_for_a_wrong_tree_rule(small_target, small_heads, chi2, monkeypatch):
    monkeypatch.setattr("engine.speculative.tree_accept", wrong_tree_accept)
    codes, _ = sample_three(small_target, small_heads[5], JOINT["iid-3,2"], 0, 1.0, n=N // 2, seed=2)
    assert chi2(codes, exact_joint(small_target, 0, 1.0).flatten()) < P_OK


# ------------------------------------------------------------------ the head's cache after rollbacks

ROLLBACK = {
    "2,1": SpecConfig.for_tree((2, 1)),
    "3,2-topk": SpecConfig(gamma=2, tree_topk=(3, 2), tree_sampling="topk"),
    "3x2/6": SpecConfig.for_tree(DynamicTree(3, 2, 6)),
    "2x3/5": SpecConfig.for_tree(DynamicTree(2, 3, 5)),
}


@pytest.mark.parametrize("sync_free", [False, True])
@pytest.mark.parametrize("name", list(ROLLBACK))
def test_head_cache_equals_fresh_prefill_after_random_tree_steps(eager_target, heads, name, sync_free):
    """Rows join, finish and move at random, greedy and sampled; after every step each row's head cache
    equals a fresh prefill and its staged states are the target's (test_eagle3.check_head), paths of
    two accepted nodes or more included (staged through a fed node's entry)."""
    drafter = Eagle3Drafter(heads[24])
    deep = []

    def after_step(engine: SpecEngine) -> None:
        check_head(engine, drafter, eager_target)
        staged = engine.state.length[: engine.n] - 1 - drafter.head_len[: engine.n]
        deep.append(int(staged.max()) >= 3)  # the root and two accepted nodes staged

    random_steps(
        eager_target,
        drafter,
        ROLLBACK[name],
        list(ROLLBACK).index(name) + 10 * sync_free,
        sync_free,
        after_step,
    )
    assert any(deep), "no row accepted two nodes: staging a path through a fed node went untested"


# ------------------------------------------------------------------ sync-free, compiled, refused


@pytest.mark.parametrize(
    "config", [SpecConfig.for_tree((3, 2, 1)), TREES["2x3/5"]], ids=["tree-3-2-1", "dynamic-2x3-5"]
)
def test_sync_free_tree_step_reads_the_device_exactly_once(eager_target, heads, prompts, counted, config):
    drafter = Eagle3Drafter(heads[24])
    per_step = reads_per_step(eager_target, None, prompts, config, True, counted, drafter=drafter)
    assert len(per_step) > 2
    assert per_step == [1] * len(per_step)
    cpu = reads_per_step(
        eager_target, None, prompts, config, False, counted, drafter=Eagle3Drafter(heads[24])
    )
    assert max(cpu) > 1  # the CPU default reads the staged width: the counter sees the head's reads


def test_compiled_tree_verify_compiles_nothing_after_the_warm_up(model_factory, prompts):
    """The verify of a head's tree is the target's hidden-state forward under the tree mask: the
    warm-up (trees and the head's layers, as autotune passes them) compiles it, a run compiles nothing."""
    target = model_factory(seed=37, vocab=46)
    head = random_head(target, head_config(target.config, 46), None, seed=4)
    pair = ModelPair(target, None, None, Path("target"), None, eagle3=head)
    dynamic = SpecConfig.for_tree(DynamicTree(2, 3, 5))
    assert pair.compile_decode(trees=[(2, 1, 1), dynamic.tree_topk]) > 0
    before = counters["frames"]["ok"]
    for config in (SpecConfig(gamma=3), SpecConfig.for_tree((2, 1, 1)), dynamic):
        for batch in (1, 3):
            reqs = [
                Request(list(p), 12, id=i, temperature=t)
                for i, (p, t) in enumerate(zip(prompts[:3], (0.0, 1.0, 0.0), strict=True))
            ]
            generate(pair, reqs[:batch], config, Eagle3Drafter(head), max_batch_size=batch, seed=0)
    assert counters["frames"]["ok"] == before
    greedy = generate(pair, [Request(prompts[1], 12)], SpecConfig.for_tree((2, 1, 1)), Eagle3Drafter(head))
    assert greedy.tokens == [naive_greedy(target, prompts[1], 12)]


@pytest.mark.parametrize("make", [NgramDrafter, lambda: HybridDrafter(None)], ids=["ngram", "hybrid"])
def test_a_tree_needs_the_model_or_the_eagle3_drafter(eager_target, heads, make):
    with pytest.raises(
        EngineInputError, match="tree_topk: a tree needs the 'model' or 'eagle3' drafter"
    ) as err:
        SpecEngine(eager_target, make(), SpecConfig.for_tree((2, 1)), 2, 64)
    assert "\n" not in str(err.value)
    engine = SpecEngine(eager_target, Eagle3Drafter(heads[32]), SpecConfig.for_tree((2, 1)), 2, 64)
    assert engine.tree is not None
