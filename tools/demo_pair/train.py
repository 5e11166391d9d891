"""Reproducible training of the demo draft/target pair shipped in ``engine/demo/pair``.

Run::

    python -m tools.demo_pair.train [--out engine/demo/pair] [--budget-minutes 45] [--seed 0]

Everything is offline and CPU-only. The steps:

1. **Corpus.** The ``*.py`` sources of the running interpreter's standard library
   (``sysconfig.get_paths()["stdlib"]``), paths sorted. Skipped: any path with a component
   ``test``, ``tests``, ``idle_test``, ``site-packages``, ``dist-packages`` or ``__pycache__``;
   ``pydoc_data/`` (generated help text); files over 256 KB; files that are not valid UTF-8.
2. **Split, by file.** ``bucket = int(sha256(relpath)[:8 hex], 16) % 100`` where ``relpath`` is
   the POSIX path relative to the stdlib root (e.g. ``json/decoder.py``):
   ``bucket < 5`` -> held-out prompt files, ``5 <= bucket < 10`` -> validation,
   otherwise train. The rule depends only on the path, so it is stable across runs and machines.
3. **Tokenizer.** Byte-level BPE (``tokenizers``: ByteLevel pre-tokenizer and decoder) trained on
   the train files, with one special token ``<|endoftext|>`` (id 0) used as BOS/EOS: the training
   stream is ``<|endoftext|> file_1 <|endoftext|> file_2 ...``.
4. **Joint phase.** The target (deep Llama) trains on next-token cross-entropy while the draft
   (one layer) trains on ``KL(target || draft)`` against the detached target logits at
   temperature 1, plus a little cross-entropy. Random windows of the train stream; AdamW, linear
   warmup then cosine decay, gradient clipping, bf16 autocast on CPU.
5. **Distill phase.** The target is frozen; the draft alone keeps distilling so it matches the
   final target.
6. **On-policy phase** (:mod:`tools.demo_pair.onpolicy`). Speculation asks the draft to predict the
   target's *own* continuations, not stdlib text: the draft is deepened to two layers (a
   function-preserving stack: the new layer starts as the identity) and distilled on the frozen
   target's greedy and temperature-1 continuations of prompts cut from the train files.
7. **Export.** Hugging Face style folders ``target/`` and ``draft/`` (``config.json``,
   bf16 ``model.safetensors``, ``tokenizer.json``, ``generation_config.json``), reloaded with
   :func:`engine.loader.load_model` to compute the reported figures; ``train_log.json`` holds the
   hyper-parameters, validation losses, teacher-forced acceptance estimates and the measured
   per-token latency of both models.
8. **Prompts.** ``prompts.jsonl``: function headers with their docstrings and plain runs of lines,
   32-384 tokens long, cut from the held-out prompt files only (seeded); no line sets its own
   ``max_new_tokens``, so tune.yaml's ``workload.max_new_tokens`` applies to all of them.

``--draft-only`` runs phase 6 alone on the pair already in ``--out`` (target, tokenizer and
prompts untouched). The shipped pair was made in two invocations on a 2-core CPU: phases 1-5
with the one-layer draft (68 min; before phase 6 existed) and then ``--draft-only
--budget-minutes 55`` (68 min with data generation and evaluation). ``train_log.json`` keeps the
step counts of every phase; ``--joint-steps 1023 --distill-steps 593 --onpolicy-steps 0`` followed
by ``--draft-only --onpolicy-steps 2364`` (each with a budget large enough not to cut them) replays it.

The number of optimizer steps is sized from a short throughput calibration so the run fits
``--budget-minutes``; phases also stop on a wall-clock deadline, and outputs are always written.
``--joint-steps``/``--distill-steps`` replay a run with fixed step counts (see ``train_log.json``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import random
import re
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from engine.config import ModelConfig
from engine.errors import EngineInputError
from engine.loader import load_model, load_tokenizer
from engine.model import Transformer
from tools.demo_pair.onpolicy import (
    OnPolicyConfig,
    OnPolicyData,
    acceptance_figures,
    grow,
    pack,
    tails,
    target_continuations,
    weighted_kl,
)

EOT = "<|endoftext|>"
EXCLUDED_PARTS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
EXCLUDED_PREFIXES = ("pydoc_data/",)
MAX_FILE_BYTES = 256_000
PROMPT_BUCKETS = 5  # bucket < 5: held-out prompt files
VAL_BUCKETS = 10  # 5 <= bucket < 10: validation files

PROMPT_MIN_TOKENS, PROMPT_MAX_TOKENS = 32, 384
PROMPTS_PER_KIND = 130
PROMPTS_PER_FILE_PER_KIND = 8


@dataclass
class TrainConfig:
    """Hyper-parameters of a run (all written to ``train_log.json``)."""

    seed: int = 0
    budget_minutes: float = 45.0
    vocab_size: int = 4096
    seq_len: int = 256
    batch_size: int = 16
    target_lr: float = 1.5e-3
    draft_lr: float = 2e-3
    distill_lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 40
    distill_warmup_steps: int = 10  # >= calib_steps of run_phase
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    draft_ce_weight: float = 0.1
    distill_fraction: float = 0.1  # share of the training time spent in the distill phase
    onpolicy_fraction: float = 0.35  # share spent in the on-policy phase (data generation included)
    reserve_seconds: float = 120.0  # kept back for evaluation and export
    autocast_bf16: bool = True
    val_windows: int = 64
    threads: int = 2


def target_config(vocab: int, eot: int) -> ModelConfig:
    return ModelConfig(
        vocab_size=vocab,
        hidden_size=320,
        intermediate_size=960,
        num_hidden_layers=12,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=40,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        model_type="llama",
        bos_token_id=eot,
        eos_token_ids=(eot,),
    )


def draft_config(vocab: int, eot: int) -> ModelConfig:
    return ModelConfig(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=1,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        model_type="llama",
        bos_token_id=eot,
        eos_token_ids=(eot,),
    )


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------- corpus


def split_of(rel: str) -> str:
    """``"prompt"``, ``"val"`` or ``"train"`` from a hash of the stdlib-relative path."""
    bucket = int(hashlib.sha256(rel.encode()).hexdigest()[:8], 16) % 100
    if bucket < PROMPT_BUCKETS:
        return "prompt"
    return "val" if bucket < VAL_BUCKETS else "train"


def collect_corpus(root: Path) -> dict[str, list[tuple[str, str]]]:
    """``{split: [(relpath, text), ...]}`` over the stdlib sources, paths sorted."""
    splits: dict[str, list[tuple[str, str]]] = {"train": [], "val": [], "prompt": []}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if EXCLUDED_PARTS.intersection(rel.split("/")[:-1]) or rel.startswith(EXCLUDED_PREFIXES):
            continue
        if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
            continue
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            continue
        if text.strip():
            splits[split_of(rel)].append((rel, text))
    return splits


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def token_stream(tok: Tokenizer, texts: list[str], eot: int) -> torch.Tensor:
    """``<eot> file_1 <eot> file_2 ...`` as one int64 tensor."""
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.append(eot)
        ids.extend(enc.ids)
    return torch.tensor(ids, dtype=torch.long)


# ---------------------------------------------------------------------------- prompts

DEF_RE = re.compile(r"^\s*(async\s+)?def\s+\w+\s*\(")
DOC_OPEN_RE = re.compile(r'^\s*[rRuU]?("""|\'\'\')')


def _docstring_end(lines: list[str], def_line: int) -> int | None:
    """Index of the last line of the docstring right after the ``def`` at ``def_line``."""
    i = def_line
    while i < len(lines) and i < def_line + 12 and not lines[i].rstrip().endswith(":"):
        i += 1
    i += 1
    if i >= len(lines):
        return None
    m = DOC_OPEN_RE.match(lines[i])
    if not m:
        return None
    quote = m.group(1)
    rest = lines[i][m.end() :]
    if quote in rest:
        return i
    for j in range(i + 1, min(len(lines), i + 80)):
        if quote in lines[j]:
            return j
    return None


def build_prompts(
    files: list[tuple[str, str]], tok: Tokenizer, seed: int, kind_limit: int = PROMPTS_PER_KIND
) -> list[dict[str, object]]:
    """Prompts cut from the held-out files: ``def`` + docstring (with some preceding context) and
    plain runs of lines, each 32-384 tokens, ending at a line boundary without its newline (the
    model's first token is then the newline-plus-indent token BPE learned, as in training)."""
    rng = random.Random(seed)

    def n_tokens(text: str) -> int:
        return len(tok.encode(text).ids)

    def_cands: list[dict[str, object]] = []
    line_cands: list[dict[str, object]] = []
    for rel, text in files:
        lines = text.splitlines(keepends=True)
        per_kind = {"def": 0, "lines": 0}
        def_starts = [i for i, line in enumerate(lines) if DEF_RE.match(line)]
        rng.shuffle(def_starts)
        for start in def_starts:
            if per_kind["def"] >= PROMPTS_PER_FILE_PER_KIND:
                break
            end = _docstring_end(lines, start)
            if end is None:
                continue
            want = math.exp(rng.uniform(math.log(PROMPT_MIN_TOKENS), math.log(PROMPT_MAX_TOKENS)))
            first = start
            while first > 0 and n_tokens("".join(lines[first - 1 : end + 1])) <= want:
                first -= 1
            prompt = "".join(lines[first : end + 1])
            if PROMPT_MIN_TOKENS <= n_tokens(prompt) <= PROMPT_MAX_TOKENS:
                def_cands.append({"prompt": prompt.rstrip("\n"), "source": rel})
                per_kind["def"] += 1
        starts = [i for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("#")]
        rng.shuffle(starts)
        for start in starts[: 3 * PROMPTS_PER_FILE_PER_KIND]:
            if per_kind["lines"] >= PROMPTS_PER_FILE_PER_KIND:
                break
            want = math.exp(rng.uniform(math.log(PROMPT_MIN_TOKENS), math.log(PROMPT_MAX_TOKENS)))
            end = start + 1
            while end < len(lines) and n_tokens("".join(lines[start : end + 1])) <= want:
                end += 1
            prompt = "".join(lines[start:end])
            if PROMPT_MIN_TOKENS <= n_tokens(prompt) <= PROMPT_MAX_TOKENS:
                line_cands.append({"prompt": prompt.rstrip("\n"), "source": rel})
                per_kind["lines"] += 1
    rng.shuffle(def_cands)
    rng.shuffle(line_cands)
    seen: set[str] = set()
    out: list[dict[str, object]] = []
    for cand in def_cands[:kind_limit] + line_cands[:kind_limit]:
        if cand["prompt"] not in seen:
            seen.add(str(cand["prompt"]))
            out.append(cand)
    return out


# ---------------------------------------------------------------------------- training


def init_weights(model: Transformer) -> None:
    """GPT-2/Llama style init: N(0, 0.02); residual output projections scaled by 1/sqrt(2L)."""
    n_layers = model.config.num_hidden_layers
    for name, p in model.named_parameters():
        if p.dim() == 2:
            std = (
                0.02 / math.sqrt(2 * n_layers)
                if name.endswith(("o_proj.weight", "down_proj.weight"))
                else 0.02
            )
            torch.nn.init.normal_(p, mean=0.0, std=std)
        elif name.endswith("bias"):
            torch.nn.init.zeros_(p)


def make_optimizer(model: Transformer, lr: float, tc: TrainConfig) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": tc.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=tc.betas)


def lr_factor(step: int, total: int, warmup: int, min_ratio: float, time_frac: float = 0.0) -> float:
    """Linear warmup, then cosine decay to ``min_ratio``; the decay follows whichever of the step
    fraction and the elapsed share of the phase's time budget is further along."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, max(time_frac, (step - warmup) / max(1, total - warmup)))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr


def sample_batch(stream: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(stream) - seq_len - 1, (batch,), generator=gen)
    return torch.stack([stream[s : s + seq_len + 1] for s in starts.tolist()])


def kl_target_draft(t_logits: torch.Tensor, d_logits: torch.Tensor) -> torch.Tensor:
    """Mean over positions of KL(p_target || p_draft), temperature 1."""
    return weighted_kl(t_logits, d_logits, torch.ones(t_logits.shape[:-1], device=t_logits.device))


class Trainer:
    def __init__(self, target: Transformer, draft: Transformer, tc: TrainConfig) -> None:
        self.target, self.draft, self.tc = target, draft, tc
        self.opt_t = make_optimizer(target, tc.target_lr, tc)
        self.opt_d = make_optimizer(draft, tc.draft_lr, tc)

    def _autocast(self) -> torch.autocast:
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.tc.autocast_bf16)

    def joint_step(self, batch: torch.Tensor) -> dict[str, float]:
        tc, vocab = self.tc, self.target.config.vocab_size
        x, y = batch[:, :-1], batch[:, 1:].reshape(-1)
        with self._autocast():
            t_logits = self.target(x)
            d_logits = self.draft(x)
        ce_t = F.cross_entropy(t_logits.float().view(-1, vocab), y)
        ce_d = F.cross_entropy(d_logits.float().view(-1, vocab), y)
        kl = kl_target_draft(t_logits.detach().view(-1, vocab), d_logits.view(-1, vocab))
        (ce_t + kl + tc.draft_ce_weight * ce_d).backward()
        gn_t = torch.nn.utils.clip_grad_norm_(self.target.parameters(), tc.grad_clip)
        gn_d = torch.nn.utils.clip_grad_norm_(self.draft.parameters(), tc.grad_clip)
        self.opt_t.step()
        self.opt_d.step()
        self.opt_t.zero_grad(set_to_none=True)
        self.opt_d.zero_grad(set_to_none=True)
        return {
            "ce_t": ce_t.item(),
            "ce_d": ce_d.item(),
            "kl": kl.item(),
            "gn_t": gn_t.item(),
            "gn_d": gn_d.item(),
        }

    def distill_step(self, batch: torch.Tensor) -> dict[str, float]:
        tc, vocab = self.tc, self.target.config.vocab_size
        x, y = batch[:, :-1], batch[:, 1:].reshape(-1)
        with self._autocast():
            with torch.no_grad():
                t_logits = self.target(x)
            d_logits = self.draft(x)
        ce_d = F.cross_entropy(d_logits.float().view(-1, vocab), y)
        kl = kl_target_draft(t_logits.view(-1, vocab), d_logits.view(-1, vocab))
        (kl + tc.draft_ce_weight * ce_d).backward()
        gn_d = torch.nn.utils.clip_grad_norm_(self.draft.parameters(), tc.grad_clip)
        self.opt_d.step()
        self.opt_d.zero_grad(set_to_none=True)
        return {"ce_d": ce_d.item(), "kl": kl.item(), "gn_d": gn_d.item()}

    def onpolicy_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, float]:
        tc = self.tc
        tokens, weights = batch
        x = tokens[:, :-1]
        with self._autocast():
            with torch.no_grad():
                t_logits = self.target(x)
            d_logits = self.draft(x)
        kl = weighted_kl(t_logits, d_logits, weights)
        kl.backward()
        gn_d = torch.nn.utils.clip_grad_norm_(self.draft.parameters(), tc.grad_clip)
        self.opt_d.step()
        self.opt_d.zero_grad(set_to_none=True)
        return {"kl": kl.item(), "gn_d": gn_d.item()}


def run_phase(
    name: str,
    step_fn: Callable[[object], dict[str, float]],
    opts: list[tuple[torch.optim.Optimizer, float, int]],
    time_budget: float,
    deadline: float,
    tc: TrainConfig,
    next_batch: Callable[[], object],
    val_fn: Callable[[], str],
    fixed_steps: int | None = None,
    calib_steps: int = 8,
) -> dict[str, object]:
    """Train until the planned step count (or ``deadline``); ``opts`` = (optimizer, peak lr, warmup).

    Without ``fixed_steps`` the phase runs until ``time_budget`` seconds have passed and the cosine
    decay follows elapsed time, so a shared CPU that speeds up or slows down mid-run still uses the
    whole budget and ends with a decayed LR. ``train_log.json`` records the steps actually taken,
    which ``--joint-steps/--distill-steps`` replay exactly on any machine.
    """
    assert all(warmup >= calib_steps for _, _, warmup in opts)
    t0 = time.time()
    total = 10**9 if fixed_steps is None else fixed_steps
    done, last, t_calib = 0, {}, t0
    tokens_per_step = tc.batch_size * tc.seq_len
    if fixed_steps is None:
        deadline = min(deadline, t0 + time_budget)
    while done < total:
        time_frac = 0.0 if fixed_steps is not None else (time.time() - t0) / max(time_budget, 1e-9)
        if time.time() > deadline:
            log(f"{name}: wall-clock deadline reached after {done} of {total} steps")
            break
        for opt, peak, warmup in opts:
            set_lr(opt, peak * lr_factor(done, total, warmup, tc.min_lr_ratio, time_frac))
        last = step_fn(next_batch())
        done += 1
        if done == 2:
            t_calib = time.time()
        if fixed_steps is None and done == calib_steps:
            per_step = (time.time() - t_calib) / (calib_steps - 2)
            log(
                f"{name}: {per_step:.2f} s/step ({tokens_per_step / per_step:.0f} tok/s) -> about "
                f"{int(time_budget / per_step)} steps in {time_budget / 60:.1f} min (the clock decides)"
            )
        if done % 10 == 0 or done == total or done == 1:
            el = time.time() - t0
            stats = " ".join(f"{k} {v:.3f}" for k, v in last.items())
            log(
                f"{name} step {done}/{total if total < 10**9 else '?'} {stats} "
                f"lr {opts[0][0].param_groups[0]['lr']:.2e} {done * tokens_per_step / el:.0f} tok/s "
                f"elapsed {el / 60:.1f} min"
            )
        if done % 200 == 0:
            log(f"{name} step {done} val: {val_fn()}")
    wall = time.time() - t0
    return {
        "steps": done,
        "planned_steps": total,
        "tokens": done * tokens_per_step,
        "wall_s": round(wall, 1),
        "tokens_per_s": round(done * tokens_per_step / max(wall, 1e-9), 1),
        "last": last,
    }


def onpolicy_phase(
    target: Transformer,
    draft: Transformer,
    tok: Tokenizer,
    splits: dict[str, list[tuple[str, str]]],
    tc: TrainConfig,
    oc: OnPolicyConfig,
    deadline: float,
    fixed_steps: int | None = None,
) -> tuple[Transformer, dict[str, object]]:
    """Deepen the draft and distill it on the target's own continuations (see ``onpolicy.py``);
    trains until ``deadline`` (or ``fixed_steps``). Returns the new draft and the phase's log."""
    t0 = time.time()
    eot = target.config.eos_token_ids[0]
    assert oc.context_tokens + oc.max_new_tokens <= tc.seq_len
    target.eval().requires_grad_(False)
    train_prompts = build_prompts(splits["train"], tok, tc.seed + 1, kind_limit=oc.train_prompts // 2)
    val_prompts = build_prompts(splits["val"], tok, tc.seed + 2, kind_limit=oc.val_prompts // 2)
    log(f"onpolicy: {len(train_prompts)} train-file prompts, {len(val_prompts)} validation-file prompts")
    data = target_continuations(target, tails(train_prompts, tok, oc.context_tokens), oc, tc.seed, log)
    val = target_continuations(
        target, tails(val_prompts, tok, oc.context_tokens), oc, tc.seed + 10**6, lambda _: None
    )
    gen_s = time.time() - t0
    before = acceptance_figures(target, draft.eval(), val)
    draft = grow(draft, oc.draft_layers)
    grown = acceptance_figures(target, draft, val)
    log(
        f"onpolicy: data in {gen_s / 60:.1f} min; validation before {before}, after growing to "
        f"{oc.draft_layers} layers {grown}"
    )
    tokens, weights = pack(data, tc.seq_len + 1, eot, oc.prompt_weight)
    trainer = Trainer(target, draft, replace(tc, draft_lr=oc.lr))
    draft.train()
    quick = val[:24]

    def quick_val() -> str:
        draft.eval()
        r = acceptance_figures(target, draft, quick)
        draft.train()
        return " ".join(f"{k} {v}" for k, v in r.items())

    phase = run_phase(
        "onpolicy",
        trainer.onpolicy_step,
        [(trainer.opt_d, oc.lr, oc.warmup_steps)],
        deadline - time.time(),
        deadline,
        tc,
        OnPolicyData(tokens, weights, tc.batch_size, tc.seed),
        quick_val,
        fixed_steps=fixed_steps,
    )
    draft.eval().requires_grad_(False)
    after = acceptance_figures(target, draft, val)
    log(f"onpolicy: validation after training {after}")
    return draft, phase | {
        "config": asdict(oc),
        "train_prompts": len(data),
        "generated_tokens": sum(len(c) for _, c, _ in data),
        "data_seconds": round(gen_s, 1),
        "validation_prompts": len(val),
        "validation_before": before,
        "validation_after": after,
    }


# ---------------------------------------------------------------------------- evaluation


def val_windows(stream: torch.Tensor, seq_len: int, limit: int) -> torch.Tensor:
    n = min(limit, (len(stream) - 1) // seq_len)
    return torch.stack([stream[i * seq_len : i * seq_len + seq_len + 1] for i in range(n)])


@torch.no_grad()
def evaluate(
    target: Transformer, draft: Transformer, windows: torch.Tensor, autocast: bool = False
) -> dict[str, float]:
    """Validation loss of both models and teacher-forced acceptance estimates."""
    totals = {"target_loss": 0.0, "draft_loss": 0.0, "greedy_match": 0.0, "expected_accept_t1": 0.0}
    count = 0
    for chunk in windows.split(8):
        x, y = chunk[:, :-1], chunk[:, 1:].reshape(-1)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            t_logits = target(x).float()
            d_logits = draft(x).float()
        vocab = t_logits.shape[-1]
        t_logits, d_logits = t_logits.view(-1, vocab), d_logits.view(-1, vocab)
        n = y.numel()
        totals["target_loss"] += F.cross_entropy(t_logits, y, reduction="sum").item()
        totals["draft_loss"] += F.cross_entropy(d_logits, y, reduction="sum").item()
        totals["greedy_match"] += (t_logits.argmax(-1) == d_logits.argmax(-1)).sum().item()
        totals["expected_accept_t1"] += torch.minimum(t_logits.softmax(-1), d_logits.softmax(-1)).sum().item()
        count += n
    return {k: v / count for k, v in totals.items()}


@torch.no_grad()
def per_token_latency(model: Transformer, positions: int = 100, warmup: int = 10) -> float:
    """Median seconds of a single-token forward with a KV cache at batch 1."""
    cache = model.new_cache(1, 512)
    tok = torch.tensor([[0]])
    times = []
    for pos in range(warmup + positions):
        t0 = time.perf_counter()
        model(tok, cache=cache, start=torch.tensor([pos]), kv_len=pos + 1)
        if pos >= warmup:
            times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


# ---------------------------------------------------------------------------- export


def save_model(model: Transformer, folder: Path, tokenizer_json: Path, max_new_tokens: int = 128) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    cfg = model.config
    hf = cfg.to_hf_dict()
    hf["torch_dtype"] = "bfloat16"
    (folder / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    state = {
        k: v.detach().to(torch.bfloat16).contiguous().clone()
        for k, v in model.state_dict().items()
        if not (cfg.tie_word_embeddings and k == "lm_head.weight")
    }
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "model.safetensors").chmod(0o644)
    (folder / "tokenizer.json").write_bytes(tokenizer_json.read_bytes())
    eos = cfg.eos_token_ids[0]
    gen = {
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": eos,
        "do_sample": False,
        "max_new_tokens": max_new_tokens,
    }
    (folder / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


# ---------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Train the demo draft/target pair on the Python stdlib (CPU).")
    p.add_argument(
        "--out", type=Path, default=Path("engine/demo/pair"), help="output folder (target/, draft/)"
    )
    p.add_argument("--prompts", type=Path, default=None, help="prompt file (default: <out>/../prompts.jsonl)")
    p.add_argument("--budget-minutes", type=float, default=45.0, help="wall-clock budget for the whole run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--joint-steps", type=int, default=None, help="fixed joint-phase steps (default: fit budget)"
    )
    p.add_argument(
        "--distill-steps", type=int, default=None, help="fixed distill-phase steps (default: fit budget)"
    )
    p.add_argument(
        "--onpolicy-steps", type=int, default=None, help="fixed on-policy-phase steps (default: fit budget)"
    )
    p.add_argument(
        "--draft-only",
        action="store_true",
        help="keep the target and tokenizer in --out; run only the on-policy phase on its draft",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wall0 = time.time()
    end_time = wall0 + args.budget_minutes * 60
    tc = TrainConfig(seed=args.seed, budget_minutes=args.budget_minutes)
    torch.set_num_threads(tc.threads)
    torch.manual_seed(tc.seed)
    out: Path = args.out
    root = Path(sysconfig.get_paths()["stdlib"])
    splits = collect_corpus(root)
    log(f"corpus {root}: " + ", ".join(f"{k} {len(v)} files" for k, v in splits.items()))
    if args.draft_only:
        try:
            return draft_only(args, tc, splits, wall0, end_time)
        except EngineInputError as exc:  # no pair in --out, or a broken one
            print(f"error: {exc} (--draft-only needs a trained pair in --out)", file=sys.stderr)
            return 2
    prompts_path: Path = args.prompts or out.parent / "prompts.jsonl"
    out.mkdir(parents=True, exist_ok=True)

    tok = train_tokenizer([t for _, t in splits["train"]], tc.vocab_size)
    eot = tok.token_to_id(EOT)
    vocab = tok.get_vocab_size()
    tok_path = out / "tokenizer.json"
    tok.save(str(tok_path))
    train_stream = token_stream(tok, [t for _, t in splits["train"]], eot)
    val_stream = token_stream(tok, [t for _, t in splits["val"]], eot)
    chars = sum(len(t) for _, t in splits["train"])
    log(
        f"tokenizer: vocab {vocab}, eot id {eot}; train {len(train_stream)} tokens "
        f"({chars / len(train_stream):.2f} chars/token), val {len(val_stream)} tokens"
    )

    prompts = build_prompts(splits["prompt"], tok, tc.seed)
    prompts_path.parent.mkdir(parents=True, exist_ok=True)
    prompts_path.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    log(
        f"wrote {len(prompts)} prompts from {len({p['source'] for p in prompts})} held-out files "
        f"to {prompts_path}"
    )

    tcfg, dcfg = target_config(vocab, eot), draft_config(vocab, eot)
    target, draft = Transformer(tcfg), Transformer(dcfg)
    init_weights(target)
    init_weights(draft)
    n_t = sum(p.numel() for p in target.parameters())
    n_d = sum(p.numel() for p in draft.parameters())
    log(f"target {n_t / 1e6:.2f}M params, draft {n_d / 1e6:.2f}M params")

    windows = val_windows(val_stream, tc.seq_len, tc.val_windows)
    quick = windows[:8]

    def quick_val() -> str:
        target.eval()
        draft.eval()
        r = evaluate(target, draft, quick, autocast=tc.autocast_bf16)
        target.train()
        draft.train()
        return " ".join(f"{k} {v:.3f}" for k, v in r.items())

    train_seconds = max(0.0, end_time - time.time() - tc.reserve_seconds)
    joint_time = train_seconds * (1 - tc.distill_fraction - tc.onpolicy_fraction)
    distill_time = train_seconds * tc.distill_fraction
    onpolicy_time = train_seconds * tc.onpolicy_fraction
    log(
        f"plan: {train_seconds / 60:.1f} min of training: {joint_time / 60:.1f} joint, "
        f"{distill_time / 60:.1f} distill, {onpolicy_time / 60:.1f} on-policy"
    )
    gen = torch.Generator().manual_seed(tc.seed)

    def next_batch() -> torch.Tensor:
        return sample_batch(train_stream, tc.batch_size, tc.seq_len, gen)

    trainer = Trainer(target, draft, tc)
    target.train()
    draft.train()
    train_end = end_time - tc.reserve_seconds
    joint = run_phase(
        "joint",
        trainer.joint_step,
        [(trainer.opt_t, tc.target_lr, tc.warmup_steps), (trainer.opt_d, tc.draft_lr, tc.warmup_steps)],
        joint_time,
        train_end - 0.5 * (distill_time + onpolicy_time),
        tc,
        next_batch,
        quick_val,
        fixed_steps=args.joint_steps,
    )
    target.eval().requires_grad_(False)
    distill = run_phase(
        "distill",
        trainer.distill_step,
        [(trainer.opt_d, tc.distill_lr, tc.distill_warmup_steps)],
        distill_time,
        train_end - 0.5 * onpolicy_time,
        tc,
        next_batch,
        quick_val,
        fixed_steps=args.distill_steps,
    )
    onpolicy = None  # --onpolicy-steps 0: the draft stays as phases 4-5 left it
    if args.onpolicy_steps != 0:
        draft, onpolicy = onpolicy_phase(
            target, draft, tok, splits, tc, OnPolicyConfig(), train_end, args.onpolicy_steps
        )

    save_model(target, out / "target", tok_path)
    save_model(draft, out / "draft", tok_path)
    tok_path.unlink()
    log(
        f"saved {out}/target ({folder_bytes(out / 'target') / 1e6:.1f} MB), "
        f"{out}/draft ({folder_bytes(out / 'draft') / 1e6:.1f} MB)"
    )
    result = {
        "wall_seconds": None,
        **final_figures(out, windows),
        "joint_phase": joint,
        "distill_phase": distill,
        "onpolicy_phase": onpolicy,
        "train_config": asdict(tc),
        "target_config": tcfg.to_hf_dict(),
        "params": {"target": n_t},
        "corpus": {
            "stdlib": str(root).replace(str(Path.home()), "~", 1),  # no machine's home in a shipped log
            "files": {k: len(v) for k, v in splits.items()},
            "split_rule": "bucket = int(sha256(relpath).hexdigest()[:8], 16) % 100; "
            "<5 prompt, <10 val, else train",
            "train_tokens": len(train_stream),
            "val_tokens": len(val_stream),
        },
        "tokenizer": {"type": "byte-level BPE", "vocab_size": vocab, "eot": EOT, "eot_id": eot},
        "prompts": {"file": str(prompts_path), "count": len(prompts)},
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
    }
    result["wall_seconds"] = round(time.time() - wall0, 1)
    write_log(out, result)
    return 0


def final_figures(out: Path, windows: torch.Tensor) -> dict[str, object]:
    """Validation and latency figures of the shipped (bf16 -> fp32) weights, reloaded through the
    engine's loader."""
    tgt, drf = load_model(out / "target", "float32"), load_model(out / "draft", "float32")
    metrics = evaluate(tgt, drf, windows)
    lat_t, lat_d = per_token_latency(tgt), per_token_latency(drf)
    log(f"validation: target loss {metrics['target_loss']:.4f}, draft loss {metrics['draft_loss']:.4f}")
    log(
        f"acceptance (teacher-forced on validation text): greedy argmax match {metrics['greedy_match']:.3f}, "
        f"expected at T=1 sum min(p,q) {metrics['expected_accept_t1']:.3f}"
    )
    log(
        f"per-token latency batch 1 fp32: target {lat_t * 1e3:.2f} ms, draft {lat_d * 1e3:.2f} ms, "
        f"ratio {lat_d / lat_t:.3f}"
    )
    return {
        "validation": {k: round(v, 4) for k, v in metrics.items()} | {"tokens": int(windows[:, 1:].numel())},
        "latency_fp32_batch1_ms": {
            "target": round(lat_t * 1e3, 3),
            "draft": round(lat_d * 1e3, 3),
            "draft_over_target": round(lat_d / lat_t, 4),
        },
        "draft_config": drf.config.to_hf_dict(),
        "draft_params": sum(p.numel() for p in drf.parameters()),
        "output_bytes": folder_bytes(out),
    }


def write_log(out: Path, result: dict[str, object]) -> None:
    (out / "train_log.json").write_text(json.dumps(result, indent=2) + "\n")
    log(f"wall time {float(result['wall_seconds']) / 60:.1f} min; wrote {out / 'train_log.json'}")


def draft_only(
    args: argparse.Namespace,
    tc: TrainConfig,
    splits: dict[str, list[tuple[str, str]]],
    wall0: float,
    end_time: float,
) -> int:
    """``--draft-only``: the on-policy phase on the pair in ``--out``; the target, tokenizer and
    prompts stay as they are, ``train_log.json`` keeps the earlier phases and gains this one."""
    out: Path = args.out
    target, draft = load_model(out / "target", "float32"), load_model(out / "draft", "float32")
    tok = load_tokenizer(out / "target")
    log_path = out / "train_log.json"
    previous = json.loads(log_path.read_text()) if log_path.is_file() else {}
    draft, onpolicy = onpolicy_phase(
        target, draft, tok, splits, tc, OnPolicyConfig(), end_time - tc.reserve_seconds, args.onpolicy_steps
    )
    save_model(draft, out / "draft", out / "target" / "tokenizer.json")
    eot = target.config.eos_token_ids[0]
    windows = val_windows(token_stream(tok, [t for _, t in splits["val"]], eot), tc.seq_len, tc.val_windows)
    result = (
        previous
        | final_figures(out, windows)
        | {
            "onpolicy_phase": onpolicy | {"run": "--draft-only", "budget_minutes": args.budget_minutes},
            "wall_seconds_draft_only": round(time.time() - wall0, 1),
        }
    )
    result.setdefault("wall_seconds", result["wall_seconds_draft_only"])
    write_log(out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
