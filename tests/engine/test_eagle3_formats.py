"""EAGLE-3 heads as they are published: the ``speculators`` layout, the EAGLE-3 authors' layout
shipped as ``pytorch_model.bin`` (converted by ``autotune convert-head``), and their refusals.

The ``speculators`` package (0.9) pins transformers <= 5.19 and pulls torchaudio, torchvision and
datasets, so it is not a test dependency: :func:`write_speculators_folder` writes exactly the files
``Eagle3DraftModel.save_pretrained`` writes (config keys and tensor names read from
``speculators/models/eagle3/{config,core}.py`` and ``speculators/model.py`` of the 0.9.0 wheel, and
checked against a folder that version wrote; docs/eagle3.md, "Formats read").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from autotune.cli import main
from autotune.device.capacity import read_checkpoint
from autotune.errors import ConfigError
from engine.checkpoint import convert_pickled
from engine.eagle3 import Eagle3Head, load_eagle3
from engine.errors import EngineInputError
from engine.speculative import SpecConfig
from tests.engine.conftest import SMALL_TARGETS, naive_greedy
from tests.engine.test_eagle3 import (
    P_OK,
    VLLM_NAMES,
    exact_joint,
    fit_head,
    frequent_tokens,
    head_config,
    random_head,
    run,
    sample_three,
)

N_NEW = 20
LAYER_KEYS = (  # the engine's layer config keys, as the library nests them in transformer_layer_config
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "rms_norm_eps",
    "max_position_embeddings",
)


def speculators_config(raw: dict, **over) -> dict:
    """The config.json speculators 0.9 writes for the head ``raw`` (vLLM's keys) describes."""
    layer = {key: raw[key] for key in LAYER_KEYS}
    layer.update(
        model_type="llama",
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=False,
        rope_parameters={"rope_theta": raw["rope_theta"], "rope_type": "default"},
        pad_token_id=None,
        use_cache=True,
    )
    out = {
        "architectures": ["Eagle3DraftModel"],
        "auto_map": {"": "config.Eagle3SpeculatorConfig"},
        "draft_vocab_size": raw["draft_vocab_size"],
        "dtype": "float32",
        "eagle_aux_hidden_state_layer_ids": raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"],
        "embed_requires_grad": False,
        "fc_norm": False,
        "norm_before_fc": False,
        "norm_before_residual": False,
        "norm_output": False,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {
                    "accept_tolerance": 0.0,
                    "proposal_type": "greedy",
                    "speculative_tokens": 3,
                    "verifier_accept_k": 1,
                }
            ],
            "verifier": {"architectures": ["LlamaForCausalLM"], "name_or_path": "tiny-target"},
        },
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",
        "target_hidden_size": None,
        "tie_word_embeddings": False,
        "transformer_layer_config": layer,
    }
    out.update(over)
    return out


def speculators_tensors(head: Eagle3Head, target) -> dict[str, torch.Tensor]:
    """``head``'s tensors as the library names them: the layer under ``layers.0.``, the verifier's
    embedding table saved with it, ``d2t`` and ``t2d`` only for a reduced vocabulary."""
    out = {
        name.replace("midlayer.", "layers.0."): head.get_parameter(name).detach().clone()
        for name in VLLM_NAMES
    }
    out["embed_tokens.weight"] = target.model.embed_tokens.weight.detach().clone()
    if head.remaps:
        out["d2t"] = head.d2t.clone()
        t2d = torch.zeros(head.config.layer.vocab_size, dtype=torch.bool)
        t2d[head.target_ids()] = True
        out["t2d"] = t2d
    return out


def write_speculators_folder(folder: Path, raw: dict, head: Eagle3Head, target, **over) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(speculators_config(raw, **over), indent=2))
    save_file(speculators_tensors(head, target), str(folder / "model.safetensors"))
    return folder


def original_config(raw: dict) -> dict:
    """The authors' config.json (SafeAILab/EAGLE eagle/traineagle3/config.json keys, with the
    architecture name their published heads carry): no layer ids, so the target's default ones."""
    keys = (*LAYER_KEYS, "draft_vocab_size", "model_type", "tie_word_embeddings")
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        **{k: raw[k] for k in keys},
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "torch_dtype": "float32",
        "use_cache": True,
    }


def write_original_bin(folder: Path, raw: dict, head: Eagle3Head) -> Path:
    """The authors' layout as they ship it: config.json and a pickled pytorch_model.bin."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(original_config(raw)))
    state = {name: head.get_parameter(name).detach().clone() for name in VLLM_NAMES}
    state["d2t"] = head.d2t.clone()
    t2d = torch.zeros(raw["vocab_size"], dtype=torch.bool)
    t2d[head.target_ids()] = True
    state["t2d"] = t2d
    torch.save(state, folder / "pytorch_model.bin")
    return folder


@pytest.fixture(scope="module")
def speculators_head(eager_target, tmp_path_factory) -> Eagle3Head:
    raw = head_config(eager_target.config, 24)
    head = fit_head(
        random_head(eager_target, raw, frequent_tokens(eager_target, 24), seed=7, std=0.3), eager_target
    )
    folder = write_speculators_folder(tmp_path_factory.mktemp("speculators"), raw, head, eager_target)
    return load_eagle3(folder, eager_target)


@pytest.fixture(scope="module")
def deep_target(model_factory):
    """A 7-layer target: the default layer ids (2, L // 2, L - 3) = (2, 3, 4) are valid on it."""
    return model_factory(seed=3, layers=7)


@pytest.fixture(scope="module")
def converted_head(deep_target, tmp_path_factory) -> Eagle3Head:
    raw = head_config(deep_target.config, 24, ids=[2, 3, 4])
    head = fit_head(
        random_head(deep_target, raw, frequent_tokens(deep_target, 24), seed=8, std=0.3), deep_target
    )
    folder = write_original_bin(tmp_path_factory.mktemp("original"), raw, head)
    result = CliRunner().invoke(
        main, ["convert-head", str(folder), "--out", str(folder.parent / "converted")]
    )
    assert result.exit_code == 0, result.output
    return load_eagle3(folder.parent / "converted", deep_target)


# ------------------------------------------------------------------ each layout drafts exactly


@pytest.mark.parametrize("batch", [1, 8])
def test_speculators_head_greedy_equals_the_target_greedy(
    eager_target, speculators_head, ragged_prompts, batch
):
    assert speculators_head.config.layer_ids == (0, 1, 2) and speculators_head.embed_tokens is not None
    want = [naive_greedy(eager_target, p, N_NEW) for p in ragged_prompts]
    tokens, engine = run(eager_target, speculators_head, SpecConfig(gamma=3), ragged_prompts, batch)
    assert tokens == want
    assert 0 < int(engine.stats.accepted) < int(engine.stats.proposed)


@pytest.mark.parametrize("batch", [1, 8])
def test_converted_original_head_greedy_equals_the_target_greedy(
    deep_target, converted_head, ragged_prompts, batch
):
    assert converted_head.config.layer_ids == (2, 3, 4)  # the target's default: no ids in the file
    want = [naive_greedy(deep_target, p, N_NEW) for p in ragged_prompts]
    tokens, engine = run(deep_target, converted_head, SpecConfig(gamma=3), ragged_prompts, batch)
    assert tokens == want
    assert 0 < int(engine.stats.accepted) < int(engine.stats.proposed)


def test_speculators_head_computes_what_the_vllm_layout_computes(eager_target, tmp_path):
    """The same weights in both layouts give the same head (the layout changes names, not math)."""
    raw = head_config(eager_target.config, 24)
    head = random_head(eager_target, raw, frequent_tokens(eager_target, 24), seed=9)
    loaded = load_eagle3(write_speculators_folder(tmp_path, raw, head, eager_target), eager_target)
    tokens, hidden = (
        torch.tensor([[1, 5, 9, 2]]),
        torch.randn(1, 4, 32, generator=torch.Generator().manual_seed(0)),
    )
    start = torch.zeros(1, dtype=torch.long)
    with torch.inference_mode():
        want, _ = head(tokens, hidden, head.new_cache(1, 4), start, 4)
        got, _ = loaded(tokens, hidden, loaded.new_cache(1, 4), start, 4)
    assert torch.equal(got, want)


def test_speculators_head_samples_the_target_joint(small_target, chi2, tmp_path):
    raw = head_config(small_target.config, len(SMALL_TARGETS))
    head = random_head(small_target, raw, SMALL_TARGETS, seed=31)
    loaded = load_eagle3(write_speculators_folder(tmp_path, raw, head, small_target), small_target)
    codes, metrics = sample_three(small_target, loaded, 3, 0, 1.0)
    joint = exact_joint(small_target, 0, 1.0).flatten()
    assert bool((joint[codes] > 0).all())
    assert chi2(codes, joint) > P_OK
    assert 0.05 < metrics["acceptance_rate"] < 0.95


# ------------------------------------------------------------------ convert-head


class _Trap:
    """Unpickling this would create ``marker``: the weights-only reader must refuse it unrun."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_convert_keeps_every_tensor_exactly_and_copies_the_config(tmp_path):
    state = {"fc.weight": torch.randn(4, 6), "d2t": torch.arange(3), "t2d": torch.tensor([True, False])}
    state["norm.weight"] = state["fc.weight"][0]  # shares storage: written as its own tensor
    (tmp_path / "head").mkdir()
    torch.save(state, tmp_path / "head" / "pytorch_model.bin")
    (tmp_path / "head" / "config.json").write_text('{"draft_vocab_size": 3}')
    dest = convert_pickled(tmp_path / "head", tmp_path / "out")
    back = load_file(str(dest))
    assert sorted(back) == sorted(state) and all(torch.equal(back[k], v) for k, v in state.items())
    assert all(back[k].dtype == v.dtype for k, v in state.items())
    assert json.loads((tmp_path / "out" / "config.json").read_text()) == {"draft_vocab_size": 3}
    with pytest.raises(EngineInputError, match="already exists"):
        convert_pickled(tmp_path / "head", tmp_path / "out")
    in_place = convert_pickled(tmp_path / "head", tmp_path / "head")  # default --out: the folder itself
    assert in_place == tmp_path / "head" / "model.safetensors" and sorted(load_file(str(in_place))) == sorted(
        state
    )


def test_convert_refuses_code_and_non_tensor_tables(tmp_path):
    marker = tmp_path / "ran"
    cases = {
        "code": ({"w": torch.zeros(2), "x": _Trap(marker)}, "not a weights-only tensor checkpoint"),
        "nested": ({"state_dict": {"w": torch.zeros(2)}}, "entry 'state_dict' is a dict"),
        "empty": ({}, "non-empty table"),
    }
    for name, (state, why) in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        torch.save(state, folder / "pytorch_model.bin")
        (folder / "config.json").write_text("{}")
        with pytest.raises(EngineInputError, match=why) as err:
            convert_pickled(folder, folder)
        assert str(folder) in str(err.value) and "\n" not in str(err.value)
        assert not (folder / "model.safetensors").exists()
    assert not marker.exists(), "the pickle's code ran"


def test_convert_head_command_errors_are_one_line(tmp_path):
    result = CliRunner().invoke(main, ["convert-head", str(tmp_path)])
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {tmp_path}: no pytorch_model.bin to convert"


def test_a_bin_head_is_refused_with_the_command_to_convert_it(eager_target, tmp_path):
    raw = head_config(eager_target.config, 32)
    folder = tmp_path / "head"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(raw))
    torch.save({"fc.weight": torch.zeros(32, 96)}, folder / "pytorch_model.bin")
    with pytest.raises(EngineInputError) as engine_err:
        load_eagle3(folder, eager_target)
    with pytest.raises(ConfigError) as tuner_err:  # the tuner reads a head's files before any backend
        read_checkpoint(folder)
    for err in (engine_err, tuner_err):
        message = str(err.value)
        assert f"`autotune convert-head {folder}`" in message and "\n" not in message, message


# ------------------------------------------------------------------ speculators refusals


def layer_case(**over):
    return lambda cfg, tensors: cfg["transformer_layer_config"].update(over)


def top_case(**over):
    return lambda cfg, tensors: cfg.update(over)


def remove(key):
    return lambda cfg, tensors: cfg.pop(key)


def tensor_case(name, value):
    return lambda cfg, tensors: tensors.__setitem__(name, value)


def drop_tensor(name):
    return lambda cfg, tensors: tensors.pop(name)


SPECULATORS_REFUSALS = {  # case -> (edit(config, tensors), the key the message names)
    "other_algorithm": (top_case(speculators_model_type="peagle"), "'speculators_model_type'"),
    "no_layer_config": (remove("transformer_layer_config"), "'transformer_layer_config'"),
    "qwen3_layer": (layer_case(model_type="qwen3"), "'transformer_layer_config.model_type'"),
    "residual_default": (remove("norm_before_residual"), "'norm_before_residual'"),
    "norm_before_residual": (top_case(norm_before_residual=True), "'norm_before_residual'"),
    "norm_before_fc": (top_case(norm_before_fc=True), "'norm_before_fc'"),
    "fc_norm": (top_case(fc_norm=True), "'fc_norm'"),
    "norm_output": (top_case(norm_output=True), "'norm_output'"),
    "two_layers": (layer_case(num_hidden_layers=2), "'transformer_layer_config.num_hidden_layers'"),
    "activation": (layer_case(hidden_act="gelu"), "'transformer_layer_config.hidden_act'"),
    "vocab_size": (layer_case(vocab_size=30), "'transformer_layer_config.vocab_size'"),
    "missing_layer_key": (
        lambda cfg, tensors: cfg["transformer_layer_config"].pop("intermediate_size"),
        "transformer_layer_config: missing key 'intermediate_size'",
    ),
    "draft_vocab_size": (top_case(draft_vocab_size=40), "'draft_vocab_size'"),
    "layer_ids": (top_case(eagle_aux_hidden_state_layer_ids=[0, 1, 3]), "'eagle_aux_hidden_state_layer_ids'"),
    "target_hidden_size": (top_case(target_hidden_size=48), "'target_hidden_size'"),
    "missing_d2t": (drop_tensor("d2t"), "'d2t'"),
    "input_norm": (tensor_case("input_norm.weight", torch.ones(96)), "'input_norm.weight'"),
}


@pytest.mark.parametrize("case", list(SPECULATORS_REFUSALS))
def test_unsupported_speculators_head_is_refused_naming_folder_and_key(
    eager_target, speculators_head, tmp_path, case
):
    edit, key = SPECULATORS_REFUSALS[case]
    raw = head_config(eager_target.config, 24)
    folder = write_speculators_folder(tmp_path / "head", raw, speculators_head, eager_target)
    cfg, tensors = (
        json.loads((folder / "config.json").read_text()),
        load_file(str(folder / "model.safetensors")),
    )
    edit(cfg, tensors)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(EngineInputError) as err:
        load_eagle3(folder, eager_target)
    message = str(err.value)
    assert str(folder) in message and key in message, message
    assert "\n" not in message
