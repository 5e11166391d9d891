"""Transformer.compile_decode: the warm-up compiles every graph a run meets, chains and token trees.

A graph compiled inside a trial would put tens of seconds of compiling into one measurement, so
after the warm-up a run must compile nothing. Dynamo counts the frames it compiles; these tests
read that counter around real engine runs (B=1 and B=3, chains and trees, greedy and sampled).
"""

from __future__ import annotations

from torch._dynamo.utils import counters

from engine.generate import generate
from engine.loader import ModelPair
from engine.speculative import Request, SpecConfig


def compiled_frames() -> int:
    return counters["frames"]["ok"]


def runs(pair: ModelPair, prompts: list[list[int]], configs: list[SpecConfig]) -> None:
    for config in configs:
        for batch in (1, 3):
            temps = (0.0, 1.0, 0.0)  # greedy and sampled rows in one batch
            reqs = [
                Request(list(p), 12, id=i, temperature=t)
                for i, (p, t) in enumerate(zip(prompts, temps, strict=True))
            ]
            generate(pair, reqs[:batch], config, max_batch_size=batch, seed=0)


def pair_of(model_factory, perturb, seed: int, vocab: int) -> ModelPair:
    # a vocabulary no other test uses: a model shape nobody compiled, so the warm-up is this test's own
    target = model_factory(seed=seed, vocab=vocab)
    return ModelPair(target, perturb(target, seed=seed + 1, sigma=0.05), None, None, None)


CHAINS = [SpecConfig(gamma=0), SpecConfig(gamma=3)]


def test_warm_up_with_trees_leaves_nothing_to_compile(model_factory, perturb, prompts):
    pair = pair_of(model_factory, perturb, 31, vocab=40)
    shapes = [(2, 2, 1), (1, 3)]  # (1, 3) feeds a one-node level: the warm-up covers width 1 too
    assert pair.compile_decode(trees=shapes) > 0
    before = compiled_frames()
    runs(pair, prompts[:3], CHAINS + [SpecConfig(gamma=len(s), tree_topk=s) for s in shapes])
    assert compiled_frames() == before


def test_warm_up_with_a_dynamic_tree_leaves_nothing_to_compile(model_factory, perturb, prompts):
    """A dynamic tree feeds the tree graph top-k nodes per draft forward and its nodes + 1 to verify:
    warmed by its per-depth top-k, as autotune passes it (SpecConfig.for_tree(tree).tree_topk)."""
    pair = pair_of(model_factory, perturb, 35, vocab=44)
    dynamic = SpecConfig(gamma=3, tree_topk=(2, 2, 2), tree_nodes=5, tree_sampling="topk")
    pair.compile_decode(trees=[dynamic.tree_topk])
    before = compiled_frames()
    runs(pair, prompts[:3], CHAINS + [dynamic])
    assert compiled_frames() == before


def test_the_warm_up_compiles_only_the_widths_the_searched_trees_feed(model_factory, perturb, prompts):
    # the counter sees compiles: trees that start with top-k 2 never feed one node, so the warm-up
    # leaves that graph out, and a tree starting with top-k 1 compiles it on its first forward
    pair = pair_of(model_factory, perturb, 33, vocab=41)
    pair.compile_decode(trees=[(2, 1, 1)])
    before = compiled_frames()
    runs(pair, prompts[:3], CHAINS + [SpecConfig(gamma=3, tree_topk=(2, 1, 1))])
    assert compiled_frames() == before
    runs(pair, prompts[:3], [SpecConfig(gamma=2, tree_topk=(1, 3))])
    assert compiled_frames() > before


def test_without_trees_the_warm_up_leaves_the_tree_graph_to_the_first_tree(model_factory, perturb, prompts):
    pair = pair_of(model_factory, perturb, 35, vocab=42)
    pair.compile_decode()
    before = compiled_frames()
    runs(pair, prompts[:3], CHAINS)
    assert compiled_frames() == before
    runs(pair, prompts[:3], [SpecConfig(gamma=3, tree_topk=(2, 2, 1))])
    assert compiled_frames() > before
