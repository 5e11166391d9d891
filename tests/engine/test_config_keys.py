"""Every config.json key that changes the math is implemented or refused, and malformed configs are one line.

Two tables walk the keys: IMPLEMENTED (the config loads and the engine computes it: the parity
tests in test_model_families.py / test_loading.py check the numbers) and REFUSED (one-line
EngineInputError naming the config file, hence the folder, and the key). MALFORMED walks wrong
JSON types, zero/negative sizes and missing RoPE fields the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.config import ModelConfig
from engine.errors import EngineInputError

BASE = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
}
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}


def write_config(folder: Path, raw: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(raw))
    return folder


def config(model_type: str, **overrides) -> dict:
    return {"model_type": model_type, **BASE, **overrides}


def refused(folder: Path) -> str:
    with pytest.raises(EngineInputError) as info:
        ModelConfig.from_folder(folder)
    msg = str(info.value)
    assert msg and "\n" not in msg, f"not one line: {msg!r}"
    assert str(folder / "config.json") in msg, msg  # names the file, hence the folder
    return msg


# (id, config.json, ModelConfig attribute -> expected value)
IMPLEMENTED = [
    ("llama-gelu", config("llama", hidden_act="gelu"), {"hidden_act": "gelu"}),
    ("llama-gelu-tanh", config("llama", hidden_act="gelu_pytorch_tanh"), {"hidden_act": "gelu_pytorch_tanh"}),
    ("llama-relu", config("llama", hidden_act="relu"), {"hidden_act": "relu"}),
    ("llama-attention-bias", config("llama", attention_bias=True), {"attention_bias": True, "o_bias": True}),
    ("llama-mlp-bias", config("llama", mlp_bias=True), {"mlp_bias": True}),
    ("llama-tied", config("llama", tie_word_embeddings=True), {"tie_word_embeddings": True}),
    (
        "llama-linear-rope",
        config("llama", rope_scaling={"type": "linear", "factor": 2.0}),
        {"rope_scaling": {"type": "linear", "factor": 2.0, "rope_type": "linear"}},
    ),
    (
        "llama3-rope",
        config("llama", rope_parameters={**LLAMA3, "rope_theta": 500.0}),
        {"rope_theta": 500.0, "rope_scaling": {**LLAMA3, "rope_theta": 500.0}},
    ),
    ("llama-window-covers-context", config("llama", sliding_window=128), {"sliding_window": None}),
    ("qwen2-bias-always", config("qwen2", attention_bias=False), {"attention_bias": True, "o_bias": False}),
    (
        "qwen2-window-off",
        config("qwen2", use_sliding_window=False, sliding_window=4),
        {"sliding_window": None},
    ),
    (
        "qwen2-window-on",
        config("qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=1),
        {"sliding_window": 4, "sliding_layers": (1,)},
    ),
    (
        "qwen2-layer-types",
        config(
            "qwen2",
            use_sliding_window=True,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention"],
        ),
        {"sliding_window": 4, "sliding_layers": (0,)},
    ),
    ("qwen3-qk-norm", config("qwen3"), {"qk_norm": True, "attention_bias": False}),
    ("qwen3-bias", config("qwen3", attention_bias=True), {"attention_bias": True, "o_bias": True}),
    ("mistral-window", config("mistral", sliding_window=4), {"sliding_window": 4, "sliding_layers": (0, 1)}),
    ("mistral-window-default", config("mistral"), {"sliding_window": 4096, "sliding_layers": (0, 1)}),
    ("mistral-no-window", config("mistral", sliding_window=None), {"sliding_window": None}),
]

# (id, config.json, text the message must contain: the key)
REFUSED = [
    ("llama-gelu-fast", config("llama", hidden_act="gelu_fast"), "hidden_act"),
    ("llama-sliding-window", config("llama", sliding_window=4), "sliding_window"),
    ("llama-use-sliding-window", config("llama", use_sliding_window=True), "use_sliding_window"),
    (
        "rope-dynamic",
        config("llama", rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
        "rope_scaling.rope_type",
    ),
    (
        "rope-yarn",
        config("qwen3", rope_scaling={"rope_type": "yarn", "factor": 4.0}),
        "rope_scaling.rope_type",
    ),
    (
        "rope-longrope",
        config("llama", rope_parameters={"rope_type": "longrope"}),
        "rope_parameters.rope_type",
    ),
    (
        "rope-per-layer-type",
        config("qwen2", rope_parameters={"full_attention": {"rope_type": "default"}}),
        "rope_parameters.full_attention",
    ),
    ("final-softcap", config("llama", final_logit_softcapping=30.0), "final_logit_softcapping"),
    ("attn-softcap", config("qwen2", attn_logit_softcapping=50.0), "attn_logit_softcapping"),
    ("partial-rotary", config("llama", partial_rotary_factor=0.5), "partial_rotary_factor"),
    (
        "partial-rotary-in-rope",
        config("llama", rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.5}),
        "rope_parameters.partial_rotary_factor",
    ),
    ("llama-qk-norm", config("llama", qk_norm=True), "qk_norm"),
    ("mistral-qk-norm", config("mistral", use_qk_norm=True), "use_qk_norm"),
    ("chunked-attention", config("llama", attention_chunk_size=8192), "attention_chunk_size"),
    ("bidirectional", config("qwen3", use_bidirectional_attention=True), "use_bidirectional_attention"),
    (
        "mistral-layer-types",
        config("mistral", layer_types=["full_attention", "sliding_attention"]),
        "layer_types",
    ),
    (
        "qwen2-odd-layer-type",
        config(
            "qwen2",
            use_sliding_window=True,
            sliding_window=4,
            layer_types=["chunked_attention", "full_attention"],
        ),
        "layer_types",
    ),
    (
        "qwen2-null-window",
        config(
            "qwen2",
            use_sliding_window=True,
            sliding_window=None,
            layer_types=["sliding_attention", "full_attention"],
        ),
        "sliding_window",
    ),
    ("unsupported-model-type", config("gemma2"), "model_type"),
]

# (id, config.json, text the message must contain)
MALFORMED = [
    ("array", [], "must be a JSON object (got an array)"),
    ("null", None, "must be a JSON object (got null)"),
    ("string", "llama", "must be a JSON object (got a string)"),
    ("zero-heads", config("llama", num_attention_heads=0), "num_attention_heads"),
    ("negative-hidden", config("llama", hidden_size=-32), "hidden_size"),
    ("zero-layers", config("llama", num_hidden_layers=0), "num_hidden_layers"),
    ("zero-vocab", config("llama", vocab_size=0), "vocab_size"),
    ("zero-context", config("llama", max_position_embeddings=0), "max_position_embeddings"),
    ("string-size", config("llama", intermediate_size="64"), "intermediate_size"),
    ("float-layers", config("llama", num_hidden_layers=1.5), "num_hidden_layers"),
    ("bool-heads", config("llama", num_attention_heads=True), "num_attention_heads"),
    ("kv-heads-not-dividing", config("llama", num_key_value_heads=3), "num_key_value_heads"),
    ("odd-head-dim", config("llama", head_dim=7), "head_dim"),
    ("string-eps", config("llama", rms_norm_eps="tiny"), "rms_norm_eps"),
    ("zero-eps", config("llama", rms_norm_eps=0), "rms_norm_eps"),
    ("negative-theta", config("llama", rope_theta=-1.0), "rope_theta"),
    ("string-tie", config("llama", tie_word_embeddings="yes"), "tie_word_embeddings"),
    ("string-bias", config("qwen3", attention_bias="false"), "attention_bias"),
    ("string-eos", config("llama", eos_token_id="</s>"), "eos_token_id"),
    ("negative-bos", config("llama", bos_token_id=-1), "bos_token_id"),
    ("missing-hidden", {k: v for k, v in config("llama").items() if k != "hidden_size"}, "hidden_size"),
    ("llama3-without-factor", config("llama", rope_scaling={"rope_type": "llama3"}), "rope_scaling.factor"),
    (
        "llama3-without-low",
        config("llama", rope_scaling={k: v for k, v in LLAMA3.items() if k != "low_freq_factor"}),
        "rope_scaling.low_freq_factor",
    ),
    (
        "llama3-without-original",
        config(
            "llama",
            rope_parameters={k: v for k, v in LLAMA3.items() if k != "original_max_position_embeddings"},
        ),
        "rope_parameters.original_max_position_embeddings",
    ),
    (
        "llama3-high-below-low",
        config("llama", rope_scaling={**LLAMA3, "high_freq_factor": 0.5}),
        "rope_scaling.high_freq_factor",
    ),
    ("linear-without-factor", config("llama", rope_scaling={"rope_type": "linear"}), "rope_scaling.factor"),
    (
        "linear-string-factor",
        config("llama", rope_scaling={"rope_type": "linear", "factor": "2"}),
        "rope_scaling.factor",
    ),
    ("rope-scaling-string", config("llama", rope_scaling="linear"), "rope_scaling"),
    (
        "rope-theta-in-rope-zero",
        config("llama", rope_parameters={"rope_type": "default", "rope_theta": 0}),
        "rope_parameters.rope_theta",
    ),
    ("string-window", config("mistral", sliding_window="4k"), "sliding_window"),
    ("string-use-window", config("qwen2", use_sliding_window="yes"), "use_sliding_window"),
    (
        "layer-types-length",
        config("qwen3", use_sliding_window=True, sliding_window=4, layer_types=["sliding_attention"]),
        "layer_types",
    ),
]


@pytest.mark.parametrize("raw, expect", [r[1:] for r in IMPLEMENTED], ids=[r[0] for r in IMPLEMENTED])
def test_implemented_keys_load_with_their_meaning(tmp_path, raw, expect):
    cfg = ModelConfig.from_folder(write_config(tmp_path / "m", raw))
    for attr, value in expect.items():
        assert getattr(cfg, attr) == value, attr


@pytest.mark.parametrize("raw, key", [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_math_changing_keys_the_engine_lacks_are_refused(tmp_path, raw, key):
    assert key in refused(write_config(tmp_path / "m", raw))


@pytest.mark.parametrize("raw, text", [r[1:] for r in MALFORMED], ids=[r[0] for r in MALFORMED])
def test_malformed_configs_are_one_line_naming_file_and_key(tmp_path, raw, text):
    assert text in refused(write_config(tmp_path / "m", raw))


def test_binary_config_json_is_one_line(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_bytes(b"\xff\xfe\x00garbage")
    assert "not valid JSON" in refused(folder)


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3"])
def test_to_hf_dict_round_trips(model_type):
    cfg = ModelConfig.from_dict(config(model_type, sliding_window=None, hidden_act="gelu"))
    assert ModelConfig.from_dict(cfg.to_hf_dict()) == cfg
