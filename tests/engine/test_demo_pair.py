"""The bundled demo pair: real checkpoint format, loads in transformers with matching logits."""

from __future__ import annotations

import json

import pytest
import torch

from engine.demo import DEMO_DRAFT, DEMO_PROMPTS, DEMO_TARGET
from engine.loader import load_pair


@pytest.fixture(scope="module")
def pair():
    return load_pair(DEMO_TARGET, DEMO_DRAFT, dtype="float32")


@pytest.mark.parametrize("folder", [DEMO_TARGET, DEMO_DRAFT], ids=["target", "draft"])
def test_logits_match_transformers(pair, folder):
    transformers = pytest.importorskip("transformers")
    hf = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ours = pair.target if folder == DEMO_TARGET else pair.draft
    line = json.loads(DEMO_PROMPTS.read_text().splitlines()[0])
    ids = torch.tensor([pair.tokenizer.encode(line["prompt"]).ids[:96]])
    with torch.inference_mode():
        want = hf(ids).logits
        got = ours(ids)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


VLLM_CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def test_files_prompts_and_size():
    for folder in (DEMO_TARGET, DEMO_DRAFT):
        cfg = json.loads((folder / "config.json").read_text())
        assert cfg["model_type"] == "llama"
        for name in ("model.safetensors", "tokenizer.json", "generation_config.json"):
            assert (folder / name).is_file()
        assert cfg["head_dim"] in VLLM_CPU_HEAD_DIMS  # every stack can serve the pair (vLLM's CPU attention)
    size = sum(p.stat().st_size for p in DEMO_TARGET.parent.rglob("*") if p.is_file())
    assert size < 48 * 2**20  # 38.7 MB trained; the head_dim 40 -> 64 zero padding adds 7.6 MB
    lines = [json.loads(x) for x in DEMO_PROMPTS.read_text().splitlines() if x.strip()]
    assert len(lines) >= 200
    assert all(x["prompt"] and x["source"].endswith(".py") for x in lines)
    assert len({len(x["prompt"]) for x in lines}) > 50  # varied lengths


def test_tokenizer_round_trips_code(pair):
    text = "def f(x):\n    return {'a': x ** 2}  # comment\n"
    assert pair.tokenizer.decode(pair.tokenizer.encode(text).ids) == text
