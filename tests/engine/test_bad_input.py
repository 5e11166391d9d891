"""Bad model folders raise EngineInputError with a one-line message naming the culprit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from engine.config import ModelConfig
from engine.errors import EngineInputError
from engine.loader import load_model, load_pair
from engine.model import Transformer


def write_folder(folder: Path, vocab: int = 32, **overrides) -> Path:
    """A valid tiny Llama folder (config.json + model.safetensors) written without transformers."""
    cfg = ModelConfig(
        vocab_size=vocab,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
    )
    folder.mkdir(parents=True, exist_ok=True)
    raw = {**cfg.to_hf_dict(), **overrides}
    (folder / "config.json").write_text(json.dumps(raw))
    torch.manual_seed(0)
    state = {k: v.contiguous() for k, v in Transformer(cfg).state_dict().items()}
    save_file(state, str(folder / "model.safetensors"))
    return folder


def raises_one_line(fn, *args, **kw) -> str:
    with pytest.raises(EngineInputError) as info:
        fn(*args, **kw)
    msg = str(info.value)
    assert msg and "\n" not in msg, f"not a one-line message: {msg!r}"
    return msg


def test_valid_folder_loads(tmp_path):
    model = load_model(write_folder(tmp_path / "ok"))
    assert model.config.vocab_size == 32


def test_missing_folder(tmp_path):
    missing = tmp_path / "no-such-model"
    assert str(missing) in raises_one_line(load_model, missing)


def test_folder_without_config_json(tmp_path):
    folder = write_folder(tmp_path / "m")
    (folder / "config.json").unlink()
    msg = raises_one_line(load_model, folder)
    assert str(folder) in msg and "config.json" in msg


def test_config_json_not_json(tmp_path):
    folder = write_folder(tmp_path / "m")
    (folder / "config.json").write_text("{ not json")
    assert str(folder / "config.json") in raises_one_line(load_model, folder)


def test_unsupported_model_type(tmp_path):
    folder = write_folder(tmp_path / "m", model_type="gpt2")
    msg = raises_one_line(load_model, folder)
    assert "gpt2" in msg and str(folder) in msg


def test_missing_config_key(tmp_path):
    folder = write_folder(tmp_path / "m")
    raw = json.loads((folder / "config.json").read_text())
    del raw["hidden_size"]
    (folder / "config.json").write_text(json.dumps(raw))
    assert "hidden_size" in raises_one_line(load_model, folder)


def test_vocab_mismatch_in_load_pair_names_both_sizes(tmp_path):
    target = write_folder(tmp_path / "target", vocab=32)
    draft = write_folder(tmp_path / "draft", vocab=48)
    msg = raises_one_line(load_pair, target, draft)
    assert "32" in msg and "48" in msg and str(draft) in msg


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupt_safetensors_names_the_file(tmp_path, damage):
    folder = write_folder(tmp_path / "m")
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes({"truncate": data[: len(data) // 2], "garbage": b"\x07" * 4096, "empty": b""}[damage])
    assert str(weights) in raises_one_line(load_model, folder)


def test_no_weights_file(tmp_path):
    folder = write_folder(tmp_path / "m")
    (folder / "model.safetensors").unlink()
    assert str(folder) in raises_one_line(load_model, folder)


def test_index_listing_a_missing_shard(tmp_path):
    folder = write_folder(tmp_path / "m")
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors"}})
    )
    assert "model-00002-of-00002.safetensors" in raises_one_line(load_model, folder)


def test_weights_not_matching_config(tmp_path):
    folder = write_folder(tmp_path / "m", intermediate_size=24)  # the weights were built with 32
    msg = raises_one_line(load_model, folder)
    assert str(folder) in msg and "mlp" in msg
