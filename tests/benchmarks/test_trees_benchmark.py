"""benchmarks/engine/trees.py: the configuration list, the shape flag and the min-of-k step costs."""

from __future__ import annotations

import pytest
import torch

from benchmarks.engine import trees
from engine.config import ModelConfig
from engine.errors import EngineInputError
from engine.loader import ModelPair
from engine.model import Transformer


def tiny(seed: int) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(
        vocab_size=32,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
    )
    return Transformer(cfg).eval().requires_grad_(False)


def test_tree_flag_and_configurations() -> None:
    assert trees.tree_list("2,2,1; 3,1") == [(2, 2, 1), (3, 1)]
    greedy = [label for label, *_ in trees.configs([2, 4], [(2, 1)], [4], "greedy")]
    assert greedy == ["AR", "chain g=2", "chain g=4", "tree 2-1", "hybrid g=4"]
    t1 = trees.configs([2], [(2, 1)], [], "t1")
    assert [label for label, *_ in t1] == ["AR", "chain g=2", "tree 2-1", "tree 2-1 topk"]
    assert t1[2][2].tree_sampling == "iid" and t1[3][2].tree_sampling == "topk"
    with pytest.raises(EngineInputError, match="tree_topk"):
        trees.configs([2], [(2, 0)], [], "greedy")
    head = trees.configs([2], [(2, 1)], [4], "greedy", trees.dynamic_list("2x3/4"), drafter="eagle3")
    assert [(label, d) for label, _, _, d in head] == [
        ("AR", "none"),
        ("chain g=2", "eagle3"),
        ("tree 2-1", "eagle3"),
        ("dynamic 2x3/4", "eagle3"),
        ("hybrid g=4", "hybrid"),
    ]


def test_min_costs_time_the_forwards_a_configuration_runs() -> None:
    pair = ModelPair(tiny(0), tiny(1), None, None, None)
    chain = trees.configs([3], [], [], "greedy")[1][2]
    tree = trees.configs([], [(2, 2)], [], "greedy")[1][2]
    width, verify, drafting = trees.min_costs(pair, chain, 2, 10, 2)
    assert width == 4 and verify > 0 and drafting > 0
    width, verify, drafting = trees.min_costs(pair, tree, 2, 10, 2)
    assert width == 1 + 2 + 4 and verify > 0 and drafting > 0
    assert (
        trees.min_costs(pair, trees.configs([], [], [], "greedy")[0][2], 1, 10, 2)[2] == 0.0
    )  # AR drafts nothing
