"""The on-policy phase of tools/demo_pair/train.py end to end on tiny models (no retraining of the
shipped pair: a few optimizer steps on stdlib files and a tiny tokenizer)."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import torch

from engine.config import ModelConfig
from engine.model import Transformer
from tools.demo_pair import train
from tools.demo_pair.onpolicy import OnPolicyConfig

FILES = ("json/decoder.py", "json/encoder.py", "textwrap.py", "colorsys.py", "bisect.py", "shlex.py")


def test_onpolicy_phase_deepens_and_trains_the_draft(tmp_path: Path) -> None:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [(rel, (root / rel).read_text()) for rel in FILES]
    splits = {"train": files[:4], "val": files[4:], "prompt": []}
    tok = train.train_tokenizer([t for _, t in files], 400)
    eot = tok.token_to_id(train.EOT)
    cfg = dict(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        eos_token_ids=(eot,),
        bos_token_id=eot,
    )
    torch.manual_seed(0)
    target = Transformer(ModelConfig(num_hidden_layers=2, **cfg))
    draft = Transformer(ModelConfig(num_hidden_layers=1, **cfg))
    train.init_weights(target)
    train.init_weights(draft)
    before = {k: v.clone() for k, v in draft.state_dict().items()}
    tc = train.TrainConfig(seq_len=48, batch_size=4, autocast_bf16=False, threads=1)
    oc = OnPolicyConfig(train_prompts=8, val_prompts=4, context_tokens=32, max_new_tokens=16, gen_batch=4)
    new, log = train.onpolicy_phase(target, draft, tok, splits, tc, oc, deadline=float("inf"), fixed_steps=12)

    assert new.config.num_hidden_layers == 2 and log["steps"] == 12
    assert log["train_prompts"] == 8 and 0 < log["generated_tokens"] <= 8 * 16
    assert set(log["validation_before"]) == {"greedy_match", "expected_accept_t1", "tokens"}
    assert log["validation_after"]["tokens"] == log["validation_before"]["tokens"] > 0
    json.dumps(log)  # goes into train_log.json as is
    changed = [k for k, v in new.state_dict().items() if k in before and not torch.equal(v, before[k])]
    assert changed  # the original layer trains too
    assert new.model.layers[1].self_attn.o_proj.weight.abs().sum() > 0  # the new layer left the identity
    assert all(not p.requires_grad for p in new.parameters()) and not new.training
