"""The EAGLE-3 head trainer (tools/demo_pair/eagle3.py) on the tiny random pair of tests/conftest.py:
the training-time test lines up with the engine's drafter, training lowers the loss, and a run
writes a head that loads and keeps greedy output equal to the target's."""

from __future__ import annotations

import json
import sysconfig
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engine.eagle3 import load_eagle3
from engine.eagle3_drafter import Eagle3Drafter
from engine.generate import generate
from engine.loader import load_model, load_pair
from engine.sampling import BatchSampling
from engine.speculative import Request, SpecConfig
from tools.demo_pair import eagle3
from tools.demo_pair.onpolicy import pack, target_continuations

FILES = ("json/decoder.py", "json/encoder.py", "textwrap.py", "colorsys.py", "bisect.py", "shlex.py")
TINY = eagle3.HeadTrainConfig(
    train_prompts=8,
    val_prompts=4,
    context_tokens=24,
    max_new_tokens=16,
    gen_batch=8,
    batch_size=4,
    lr=3e-3,
    warmup_steps=2,
    check_prompts=3,
    check_new_tokens=12,
    threads=1,
)


@pytest.fixture(scope="module")
def target(tiny_pair_dirs):
    return load_model(tiny_pair_dirs[0], "float32")


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (n, length), generator=gen).tolist()


@pytest.mark.parametrize("draft_vocab", [None, 40])
def test_unrolled_steps_are_the_drafters_proposals(target, draft_vocab):
    """Step k at anchor a of the training-time test computes what Eagle3Drafter computes for draft
    position k + 1 of a row whose last target-fed position is a (prefill, staged feed, own outputs);
    with a reduced draft vocabulary, over its ids, the drafter giving every other id probability 0."""
    vocab = target.config.vocab_size
    ids = None if draft_vocab is None else torch.randperm(vocab, generator=torch.Generator().manual_seed(5))
    ids = None if ids is None else ids[:draft_vocab].sort().values
    head = eagle3.new_head(target, seed=1, std=0.3, ids=ids).eval().requires_grad_(False)
    assert head.remaps == (ids is not None)
    mapped = head.target_ids()
    layers, steps = head.config.layer_ids, 3
    lens = torch.tensor([5, 9, 2, 7])
    width = int(lens.max()) + 1
    seqs = torch.tensor(random_prompts(len(lens), width, vocab, seed=2))  # prompt + pending token
    prompts = seqs[:, :-1].clone()
    tokens = seqs.clone()
    for b, n in enumerate(lens.tolist()):
        prompts[b, n:] = 0
        tokens[b, n + 1 :] = 0
    drafter = Eagle3Drafter(head)
    drafter.reset(len(lens), width + steps + 1)
    sampling = BatchSampling(temperature=torch.ones(len(lens)))
    with torch.inference_mode():
        _, aux = target.forward_hidden(prompts, layers=layers)
        drafter.prefill(0, prompts, lens, prompts.shape[1], hidden=aux)
        gammas = torch.full((len(lens),), steps)
        toks, probs, _ = drafter.propose(
            tokens, lens + 1, gammas, steps, 0.0, sampling, width + steps, torch.Generator().manual_seed(3)
        )
        for b, n in enumerate(lens.tolist()):
            seq = torch.cat([tokens[b, : n + 1], toks[b, : steps - 1]])[None]  # the chain's tokens
            _, seq_aux = target.forward_hidden(seq, layers=layers)
            logits = eagle3.unroll(head, target.model.embed_tokens, seq, seq_aux, steps)
            for k in range(steps):
                want = probs[b, k]
                got = logits[k][0, n - 1].softmax(-1)  # anchor a = n - 1, the row's length - 2
                torch.testing.assert_close(got, want[mapped], atol=1e-5, rtol=1e-4)
                assert float(want[mapped].sum()) == pytest.approx(1.0, abs=1e-5)
    assert probs.shape == (len(lens), steps, vocab)


def test_training_lowers_the_unrolled_loss_on_a_fixed_batch(target):
    data = target_continuations(target, random_prompts(4, 10, target.config.vocab_size, 4), TINY.data(), 0)
    batch = pack(data, 26, 0, TINY.prompt_weight)
    head = eagle3.new_head(target, seed=0)
    trainer = eagle3.HeadTrainer(target, head, TINY)
    first = [t.item() for t in trainer.loss(*batch)[1]]
    for _ in range(12):
        trainer.step(batch)
    last = [t.item() for t in trainer.loss(*batch)[1]]
    assert len(trainer.losses) == 12 and trainer.losses[-1] < trainer.losses[0]
    assert all(b < 0.7 * a for a, b in zip(first, last, strict=True)), (first, last)
    assert all(not p.requires_grad for p in target.parameters())


@pytest.mark.parametrize("draft_vocab", [None, 48])
def test_run_writes_a_vllm_head_that_keeps_greedy_output(tiny_pair_dirs, target, tmp_path: Path, draft_vocab):
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [(rel, (root / rel).read_text()) for rel in FILES]
    splits = {"train": files[:4], "val": files[4:], "prompt": []}
    out = tmp_path / "eagle3"
    cfg = replace(TINY, draft_vocab=draft_vocab)
    log = eagle3.run(tiny_pair_dirs[0].parent, out, splits, cfg, fixed_steps=30, log=lambda _: None)

    assert log["phase"]["steps"] == 30 and len(log["losses"]) == 30
    assert log["greedy_check"]["equal"] and log["greedy_check"]["tokens"] > 0
    assert json.loads((out / "train_log.json").read_text()) == json.loads(json.dumps(log))
    by_pos = log["validation_by_position"]
    assert len(by_pos["greedy_match"]) == len(by_pos["expected_accept_t1"]) == 3 and by_pos["tokens"] > 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["torch_dtype"] == "bfloat16"
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]  # (2, L // 2, L - 3), L = 3
    tensors = load_file(out / "model.safetensors")
    assert "lm_head.weight" in tensors and "embed_tokens.weight" not in tensors
    head = load_eagle3(out, target)
    vocab = target.config.vocab_size
    if draft_vocab is None:
        assert "d2t" not in tensors and {t.dtype for t in tensors.values()} == {torch.bfloat16}
        assert head.config.draft_vocab_size == vocab
    else:  # the most frequent ids of the train continuations, in order, and the target's lm_head rows
        assert cfg["draft_vocab_size"] == draft_vocab == log["head"]["draft_vocab_size"]
        assert tensors["lm_head.weight"].shape == (draft_vocab, target.config.hidden_size)
        assert int(tensors["t2d"].sum()) == draft_vocab and tensors["d2t"].dtype == torch.int64
        ids = head.target_ids()
        assert torch.equal(ids, torch.nonzero(tensors["t2d"]).flatten()) and bool((ids.diff() > 0).all())
        assert head.remaps and bool((ids < vocab).all())
    pair = load_pair(tiny_pair_dirs[0], eagle3=out)
    reqs = [Request(p, 16, id=i) for i, p in enumerate(random_prompts(3, 6, target.config.vocab_size, 7))]
    want = generate(pair, reqs, SpecConfig(gamma=0), drafter="none").tokens
    got = generate(pair, reqs, SpecConfig(gamma=3), drafter="eagle3")
    assert got.tokens == want and got.metrics["acceptance_rate"] is not None


def test_a_draft_vocabulary_beyond_the_targets_is_refused_in_one_line(tiny_pair_dirs, capsys) -> None:
    vocab = json.loads((tiny_pair_dirs[0] / "config.json").read_text())["vocab_size"]
    pair = tiny_pair_dirs[0].parent
    assert eagle3.main(["--pair", str(pair), "--draft-vocab", str(vocab + 1)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"--draft-vocab {vocab + 1}" in err and f"vocab_size {vocab}" in err
    assert str(tiny_pair_dirs[0] / "config.json") in err
