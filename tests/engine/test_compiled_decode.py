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
            reqs = [Request(list(p), 12, id=i, temperature=t) for i, (p, t) in enumerate(zip(prompts, temps, strict=True))]
            generate(pair, reqs[:batch], config, max_batch_size=batch, seed=0)


def test_warm_up_with_trees_leaves_nothing_to_compile(model_factory, perturb, prompts):
    # vocab 40: a model shape no other test compiles, so the warm-up below is this test's own
    target = model_factory(seed=31, vocab=40)
    draft = perturb(target, seed=32, sigma=0.05)
    for model in (target, draft):
        assert model.compile_decode(trees=True) > 0
    before = compiled_frames()
    runs(ModelPair(target, draft, None, None, None), prompts[:3],
         [SpecConfig(gamma=0), SpecConfig(gamma=3), SpecConfig(gamma=3, tree_topk=(2, 2, 1)),
          SpecConfig(gamma=2, tree_topk=(1, 3))])
    assert compiled_frames() == before


def test_without_the_tree_warm_up_a_tree_compiles_on_first_use(model_factory, perturb, prompts):
    # the counter sees compiles: a chain-only warm-up leaves the tree graph to the first tree step
    target = model_factory(seed=33, vocab=41)
    draft = perturb(target, seed=34, sigma=0.05)
    for model in (target, draft):
        model.compile_decode()
    pair = ModelPair(target, draft, None, None, None)
    before = compiled_frames()
    runs(pair, prompts[:3], [SpecConfig(gamma=3)])
    assert compiled_frames() == before
    runs(pair, prompts[:3], [SpecConfig(gamma=3, tree_topk=(2, 2, 1))])
    assert compiled_frames() > before
