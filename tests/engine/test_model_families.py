"""Qwen3, Mistral, sliding windows and activations: checkpoints written by transformers load in the
engine with transformers' logits (fp32, <= 1e-4), and speculative greedy output equals the
autoregressive greedy output (and transformers' own greedy generate)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from engine.generate import generate
from engine.loader import ModelPair, load_model
from engine.speculative import Request, SpecConfig

ATOL = 1e-4
VOCAB, T = 64, 16
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)

VARIANTS = {  # name -> (builder, sliding window the engine must apply, layers it applies to)
    "qwen3": (lambda: Qwen3ForCausalLM(Qwen3Config(**COMMON, head_dim=16)), None, ()),
    "qwen3-bias-tied": (
        lambda: Qwen3ForCausalLM(Qwen3Config(**COMMON, attention_bias=True, tie_word_embeddings=True)),
        None,
        (),
    ),
    "qwen3-sliding-layer1": (
        lambda: Qwen3ForCausalLM(
            Qwen3Config(**COMMON, use_sliding_window=True, sliding_window=4, max_window_layers=1)
        ),
        4,
        (1,),
    ),
    "mistral-sliding": (lambda: MistralForCausalLM(MistralConfig(**COMMON, sliding_window=4)), 4, (0, 1)),
    "mistral-full": (lambda: MistralForCausalLM(MistralConfig(**COMMON, sliding_window=None)), None, ()),
    "qwen2-sliding": (
        lambda: Qwen2ForCausalLM(
            Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=5, max_window_layers=0)
        ),
        5,
        (0, 1),
    ),
    "llama-gelu": (lambda: LlamaForCausalLM(LlamaConfig(**COMMON, hidden_act="gelu")), None, ()),
    "llama-gelu-tanh": (
        lambda: LlamaForCausalLM(LlamaConfig(**COMMON, hidden_act="gelu_pytorch_tanh")),
        None,
        (),
    ),
}


def build(variant: str, seed: int = 0):
    """A tiny random HF model with weights N(0, 0.3): logits of order 1, so 1e-4 is a tight check."""
    torch.manual_seed(seed)
    model = VARIANTS[variant][0]().float().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """variant -> (hf model, folder written by save_pretrained)."""
    out = {}
    for variant in VARIANTS:
        hf = build(variant)
        folder = tmp_path_factory.mktemp(variant)
        hf.save_pretrained(folder)
        out[variant] = (hf, folder)
    return out


@pytest.fixture(scope="module")
def tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(1))


def hf_logits(hf, tokens: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return hf(input_ids=tokens).logits.float()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_config_is_read_as_transformers_reads_it(saved, variant):
    hf, folder = saved[variant]
    cfg = load_model(folder).config
    assert cfg.model_type == hf.config.model_type
    assert (cfg.sliding_window, cfg.sliding_layers) == VARIANTS[variant][1:]
    assert cfg.qk_norm == (cfg.model_type == "qwen3")
    assert cfg.hidden_act == hf.config.hidden_act


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_full_forward_matches_transformers(saved, tokens, variant):
    hf, folder = saved[variant]
    with torch.inference_mode():
        ours = load_model(folder)(tokens)
    want = hf_logits(hf, tokens)
    assert want.abs().max() > 1.0  # the comparison is not between near-zero logits
    torch.testing.assert_close(ours, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cached_prefill_chunk_and_decode_match_transformers(saved, tokens, variant):
    """Ragged right-padded prefill, a 4-token verify-like chunk, then single-token decodes past the window."""
    hf, folder = saved[variant]
    model = load_model(folder)
    want = hf_logits(hf, tokens)
    b = tokens.shape[0]
    prefill = [3, 6]
    cache = model.new_cache(b, T + 8)
    with torch.inference_mode():
        padded = torch.zeros(b, max(prefill), dtype=torch.long)
        for r, n in enumerate(prefill):
            padded[r, :n] = tokens[r, :n]
        logits = model(padded, cache=cache, start=torch.zeros(b, dtype=torch.long), kv_len=max(prefill))
        for r, n in enumerate(prefill):
            torch.testing.assert_close(logits[r, :n], want[r, :n], atol=ATOL, rtol=0)
        pos = torch.tensor(prefill)
        chunk = torch.stack([tokens[r, p : p + 4] for r, p in enumerate(prefill)])
        logits = model(chunk, cache=cache, start=pos, kv_len=int(pos.max()) + 4)
        for r, p in enumerate(prefill):
            torch.testing.assert_close(logits[r], want[r, p : p + 4], atol=ATOL, rtol=0)
        pos = pos + 4
        while int(pos.min()) < T:
            step_in = tokens.gather(1, pos.clamp(max=T - 1)[:, None])
            logits = model(step_in, cache=cache, start=pos, kv_len=int(pos.max()) + 1)
            for r in range(b):
                if int(pos[r]) < T:
                    torch.testing.assert_close(logits[r, 0], want[r, int(pos[r])], atol=ATOL, rtol=0)
            pos = pos + 1


@pytest.mark.parametrize("variant", ["mistral-sliding", "qwen3-sliding-layer1", "qwen2-sliding"])
def test_the_sliding_window_is_what_makes_them_match(saved, tokens, variant):
    """Without the window the logits past it are far off: the parity above is not vacuous."""
    hf, folder = saved[variant]
    model = load_model(folder)
    model.config = dataclasses.replace(model.config, sliding_window=None, sliding_layers=())
    for layer in model.model.layers:
        layer.self_attn.sliding = False
    with torch.inference_mode():
        assert (model(tokens) - hf_logits(hf, tokens)).abs().max() > 100 * ATOL


def test_qwen3_qk_norm_weights_are_used(saved, tokens):
    hf, folder = saved["qwen3"]
    model = load_model(folder)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.fill_(1.0)
    with torch.inference_mode():
        assert (model(tokens) - hf_logits(hf, tokens)).abs().max() > 100 * ATOL


def _draft_of(model, seed: int = 5, sigma: float = 0.02):
    """A draft close to ``model``: its weights plus N(0, sigma) noise (accepts some blocks, rejects others)."""
    gen = torch.Generator().manual_seed(seed)
    out = copy.deepcopy(model)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * sigma)
    return out


@pytest.mark.parametrize(
    "variant", ["qwen3", "qwen3-sliding-layer1", "mistral-sliding", "qwen2-sliding", "llama-gelu"]
)
def test_speculative_greedy_equals_autoregressive_and_transformers(saved, variant):
    hf, folder = saved[variant]
    target = load_model(folder)
    pair = ModelPair(target, _draft_of(target), None, folder, folder)
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (2, 5, 9)]
    requests = [Request(p, max_new_tokens=18, temperature=0.0, id=i) for i, p in enumerate(prompts)]
    ar = generate(pair, requests, SpecConfig(gamma=0), drafter="none", max_batch_size=3, eos_ids=())
    for gamma in (2, 4):
        spec = generate(
            pair, requests, SpecConfig(gamma=gamma), drafter="model", max_batch_size=3, eos_ids=()
        )
        assert spec.tokens == ar.tokens, gamma
        assert 0 < spec.metrics["acceptance_rate"] < 1  # both accepted and rejected drafts were exercised
    for prompt, ours in zip(prompts, ar.tokens, strict=True):
        with torch.inference_mode():
            out = hf.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                do_sample=False,
                max_new_tokens=18,
                pad_token_id=0,
            )
        theirs = out[0, len(prompt) :].tolist()  # stops early at the model's eos
        assert ours[: len(theirs)] == theirs
