"""Shared fixtures: a tiny draft/target pair on disk, in the real checkpoint format.

The pair is random (built here, never downloaded); the draft is the target's first layer
plus its head, so it agrees with the target often enough for speculation to do something.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from autotune.device import hardware
from engine.config import ModelConfig
from engine.model import Transformer

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i)\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "import os\nimport sys\n\nif __name__ == '__main__':\n    main()\n",
]


def make_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    return tok


def write_model(folder: Path, model: Transformer, tokenizer: Tokenizer) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(model.config.to_hf_dict()))
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight")
    save_file(state, str(folder / "model.safetensors"))
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def tiny_models(vocab: int, seed: int = 0) -> tuple[Transformer, Transformer]:
    torch.manual_seed(seed)
    cfg = ModelConfig(
        vocab_size=vocab,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=12,
        max_position_embeddings=512,
        eos_token_ids=(0,),
        bos_token_id=0,
    )
    target = Transformer(cfg).eval()
    for p in target.parameters():
        p.data.normal_(0, 0.3)
    dcfg = ModelConfig(**{**cfg.__dict__, "num_hidden_layers": 1})
    draft = Transformer(dcfg).eval()
    state = {
        k: v
        for k, v in target.state_dict().items()
        if not k.startswith("model.layers.") or k.startswith("model.layers.0.")
    }
    draft.load_state_dict(state)
    return target, draft


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """Tiny models on a shared 2-core machine: intra-op threads fighting a busy core slow them ~20x."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def quiet_host_while_running(monkeypatch):
    """The host readings a run takes as it goes (around each trial, before compiling) read quiet unless
    a test scripts them (tests/autotune/fakes.py: ScriptedHost): other test runs on this shared
    machine must not re-run or prune a test's trials, nor change its compile decision."""
    from autotune.device import hostnoise
    from autotune.search import guard as disturbance
    from tests.autotune.fakes import ScriptedHost

    monkeypatch.setattr(disturbance, "open_watch", ScriptedHost)
    monkeypatch.setattr(
        hostnoise,
        "others_now",
        lambda window_s=hostnoise.WINDOW_S, proc="/proc": ScriptedHost.reading(0.0, window_s),
    )


@pytest.fixture(scope="session")
def tiny_pair_dirs(tmp_path_factory) -> tuple[Path, Path]:
    """(target_dir, draft_dir) of a tiny random Llama pair with a BPE tokenizer."""
    root = tmp_path_factory.mktemp("pair")
    tok = make_tokenizer()
    target, draft = tiny_models(tok.get_vocab_size())
    return write_model(root / "target", target, tok), write_model(root / "draft", draft, tok)


@pytest.fixture(scope="session")
def tiny_prompts(tmp_path_factory) -> Path:
    """A JSONL workload of short code prompts."""
    path = tmp_path_factory.mktemp("workload") / "prompts.jsonl"
    lines = [json.dumps({"prompt": p, "max_new_tokens": 12, "source": "test"}) for p in CORPUS]
    path.write_text("\n".join(lines) + "\n")
    return path


# Fixed stand-ins for what ``autotune.device.hardware`` reads from this host, with exactly the fields it reads.
CPU_DEVICE_FIELDS: dict[str, Any] = {
    "model_name": "Test CPU",
    "physical_cores": 2,
    "logical_cpus": 2,
    "affinity_cpus": 2,
    "torch_threads": 1,
    "isa": "AVX2",
    "memory_total_bytes": 16 * hardware.GIB,
    "architecture": "x86_64",
}
SOFTWARE_FIELDS: dict[str, Any] = {
    "torch": "2.5.0",
    "cuda": None,
    "cudnn": None,
    "python": "3.11.7",
    "platform": "linux",
}


def make_cpu_fingerprint(dtype: str = "float32", **device: Any) -> dict[str, Any]:
    """A CPU fingerprint made by :func:`autotune.device.hardware.fingerprint` itself, from fixed host facts.

    Only the two readers of the host (``_cpu_device_fields``, ``_software_fields``) are replaced,
    so the shape, the label and the key are the real code's. ``device`` overrides CPU fields,
    e.g. ``model_name="Other CPU"``. tests/test_fixture_shapes.py checks that the stand-ins have
    exactly the fields the real readers return.
    """
    fields = {**CPU_DEVICE_FIELDS, **device}
    with (
        mock.patch.object(hardware, "_cpu_device_fields", return_value=dict(fields)),
        mock.patch.object(hardware, "_software_fields", return_value={**SOFTWARE_FIELDS, "dtype": dtype}),
    ):
        return hardware.fingerprint("cpu", dtype)


@pytest.fixture
def cpu_fingerprint() -> Callable[..., dict[str, Any]]:
    """``cpu_fingerprint(**device)`` -> a real-shaped CPU fingerprint (see :func:`make_cpu_fingerprint`)."""
    return make_cpu_fingerprint
