"""Checkpoints written by transformers' save_pretrained load in the engine with the same logits."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from engine.config import rope_inv_freq
from engine.loader import load_model, load_pair

ATOL = 1e-4
COMMON = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
    "rope_theta": 10000.0,
}

VARIANTS = {
    "llama-gqa-untied": lambda: LlamaForCausalLM(
        LlamaConfig(
            **COMMON, rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 500.0}
        )
    ),
    "llama-bias": lambda: LlamaForCausalLM(LlamaConfig(**COMMON, attention_bias=True, mlp_bias=True)),
    "llama3-rope": lambda: LlamaForCausalLM(LlamaConfig(**COMMON, rope_parameters=dict(LLAMA3_ROPE))),
    "qwen2-tied": lambda: Qwen2ForCausalLM(Qwen2Config(**COMMON, tie_word_embeddings=True)),
}


def build(variant: str, seed: int = 0):
    """A tiny random HF model with weights N(0, 0.3): logits of order 1, so 1e-4 is a tight check."""
    torch.manual_seed(seed)
    model = VARIANTS[variant]().float().eval()
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
    return torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))


def hf_logits(hf, tokens: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return hf(input_ids=tokens).logits.float()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_full_forward_matches_transformers(saved, tokens, variant):
    hf, folder = saved[variant]
    model = load_model(folder, dtype="float32")
    assert model.config.tie_word_embeddings == (variant == "qwen2-tied")
    with torch.inference_mode():
        ours = model(tokens)
    want = hf_logits(hf, tokens)
    assert want.abs().max() > 1.0  # the comparison is not between near-zero logits
    torch.testing.assert_close(ours, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cached_prefill_chunk_and_decode_match_transformers(saved, tokens, variant):
    """Ragged right-padded prefill, a 3-token verify-like chunk, then single-token decodes."""
    hf, folder = saved[variant]
    model = load_model(folder)
    want = hf_logits(hf, tokens)  # (2, T, V)
    b, t = tokens.shape
    prefill = [4, 7]
    cache = model.new_cache(b, t + 2)
    with torch.inference_mode():
        padded = torch.zeros(b, max(prefill), dtype=torch.long)
        for r, n in enumerate(prefill):
            padded[r, :n] = tokens[r, :n]
        logits = model(padded, cache=cache, start=torch.zeros(b, dtype=torch.long), kv_len=max(prefill))
        for r, n in enumerate(prefill):
            torch.testing.assert_close(logits[r, :n], want[r, :n], atol=ATOL, rtol=0)
        pos = torch.tensor(prefill)
        chunk = torch.stack([tokens[r, p : p + 3] for r, p in enumerate(prefill)])  # (B, 3)
        logits = model(chunk, cache=cache, start=pos, kv_len=int(pos.max()) + 3)
        for r, p in enumerate(prefill):
            torch.testing.assert_close(logits[r], want[r, p : p + 3], atol=ATOL, rtol=0)
        pos = pos + 3
        while int(pos.max()) < t:
            step_in = tokens.gather(1, pos.clamp(max=t - 1)[:, None])  # (B, 1)
            logits = model(step_in, cache=cache, start=pos, kv_len=int(pos.max()) + 1)
            for r in range(b):
                if int(pos[r]) < t:
                    torch.testing.assert_close(logits[r, 0], want[r, int(pos[r])], atol=ATOL, rtol=0)
            pos = pos + 1


def test_llama3_rope_scaling_is_applied(saved, tokens):
    """The llama3 variant only passes because of its scaled frequencies: unscaled ones are far off."""
    hf, folder = saved["llama3-rope"]
    model = load_model(folder)
    assert model.config.rope_scaling["rope_type"] == "llama3"
    plain = rope_inv_freq(dataclasses.replace(model.config, rope_scaling=None))
    assert not torch.allclose(model.inv_freq, plain)
    model.inv_freq = plain
    with torch.inference_mode():
        assert (model(tokens) - hf_logits(hf, tokens)).abs().max() > 100 * ATOL


def test_sharded_checkpoint_loads(tmp_path, tokens):
    hf = build("llama-gqa-untied", seed=3)
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    shards = sorted(tmp_path.glob("*.safetensors"))
    assert (tmp_path / "model.safetensors.index.json").is_file() and len(shards) > 1
    model = load_model(tmp_path)
    with torch.inference_mode():
        torch.testing.assert_close(model(tokens), hf_logits(hf, tokens), atol=ATOL, rtol=0)


def test_load_pair_shares_vocab_and_runs(saved, tokens):
    pair = load_pair(saved["llama-gqa-untied"][1], saved["qwen2-tied"][1])
    assert pair.draft is not None and pair.tokenizer is None
    assert pair.draft.config.model_type == "qwen2"
    with torch.inference_mode():
        torch.testing.assert_close(
            pair.draft(tokens), hf_logits(saved["qwen2-tied"][0], tokens), atol=ATOL, rtol=0
        )


def test_loading_for_cpu_flushes_subnormals(tiny_pair_dirs):
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush subnormals")
    torch.set_flush_denormal(False)
    assert (torch.tensor([1e-39]) * 1.0).item() != 0.0  # subnormals survive with the flag off
    load_model(tiny_pair_dirs[0], "float32", "cpu")
    assert (torch.tensor([1e-39]) * 1.0).item() == 0.0  # and read as zero once a model is loaded
