"""The on-policy distillation pieces of the demo training (tools/demo_pair/onpolicy.py)."""

from __future__ import annotations

import torch

from engine.generate import generate
from engine.loader import ModelPair
from engine.speculative import Request, SpecConfig
from tools.demo_pair.onpolicy import (
    OnPolicyConfig,
    OnPolicyData,
    grow,
    pack,
    target_continuations,
    weighted_kl,
)


def test_grow_preserves_the_function_with_and_without_cache(model_factory):
    small = model_factory(3, layers=1, attention_bias=True)
    big = grow(small, 3)
    assert big.config.num_hidden_layers == 3 and small.config.num_hidden_layers == 1
    x = torch.randint(0, 32, (2, 11))
    with torch.no_grad():
        torch.testing.assert_close(big(x), small(x), atol=0, rtol=0)
    # the new layers are not dead: their inputs are random, only the output projections are zero
    assert big.model.layers[2].self_attn.q_proj.weight.abs().sum() > 0
    assert big.model.layers[1].mlp.down_proj.weight.abs().sum() == 0
    # a speculative run with the grown draft produces what the small one produced, token for token
    target = model_factory(4, layers=2)
    reqs = [Request([1, 5, 7], 12, id=0), Request([2, 9], 12, id=1)]
    a = generate(ModelPair(target, small, None, None, None), reqs, SpecConfig(gamma=3))
    b = generate(
        ModelPair(target, big.eval().requires_grad_(False), None, None, None), reqs, SpecConfig(gamma=3)
    )
    assert a.tokens == b.tokens and a.metrics["acceptance_rate"] == b.metrics["acceptance_rate"]
    assert grow(small, 1) is small


def test_pack_weights_prompt_generated_and_padding():
    tokens, weights = pack([([1, 2, 3], [4, 5], 0.0), ([6], [7, 8, 9, 10, 11, 12, 13, 14], 1.0)], 6, 0, 0.25)
    assert tokens.tolist() == [[1, 2, 3, 4, 5, 0], [6, 7, 8, 9, 10, 11]]
    # position j predicts token j + 1: prompt tokens 2, 3 at 0.25; generated 4, 5 at 1; padding 0
    assert weights.tolist() == [[0.25, 0.25, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0, 1.0]]


def test_weighted_kl_is_zero_only_for_equal_distributions():
    t = torch.randn(2, 5, 7)
    w = torch.ones(2, 5)
    assert weighted_kl(t, t.clone(), w).item() < 1e-6
    assert weighted_kl(t, torch.randn(2, 5, 7), w).item() > 1e-3
    # weight 0 positions do not count
    d = t.clone()
    d[:, 0] = torch.randn(2, 7) * 5
    w0 = w.clone()
    w0[:, 0] = 0
    assert weighted_kl(t, d, w0).item() < 1e-6


def test_data_visits_every_sequence_once_per_epoch():
    tokens = torch.arange(10)[:, None].repeat(1, 4)
    data = OnPolicyData(tokens, torch.ones(10, 3), batch=4, seed=0)
    seen = torch.cat([data()[0][:, 0] for _ in range(5)]).tolist()  # 20 rows = two epochs
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:]) == list(range(10))
    assert seen[:10] != list(range(10))  # shuffled


def test_target_continuations_are_the_targets_own_outputs(model_factory):
    target = model_factory(5, layers=2)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    oc = OnPolicyConfig(max_new_tokens=6, gen_batch=2, temperatures=(0.0, 1.0))
    out = target_continuations(target, prompts, oc, seed=0, log=lambda _: None)
    assert [p for p, _, _ in out] == prompts and [t for _, _, t in out] == [0.0, 1.0, 0.0]
    ref = generate(
        ModelPair(target, None, None, None, None),
        [Request(p, 6) for p in prompts],
        SpecConfig(gamma=0),
        drafter="none",
    )
    for i in (0, 2):  # greedy rows equal plain greedy decoding
        assert out[i][1] == ref.tokens[i]
