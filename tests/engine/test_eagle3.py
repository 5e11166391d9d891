"""The ``eagle3`` drafter: vLLM's EAGLE-3 head format, its math, and the engine's guarantees with it.

Heads are random (a short fit makes the greedy one agree with the target often enough for both
acceptance and rejection to happen) and always reach the engine through a folder written with
vLLM's tensor names and loaded by ``load_eagle3``. A reduced draft vocabulary (``d2t``) is covered
by the greedy and the distribution tests.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

from engine.config import ModelConfig
from engine.eagle3 import Eagle3Config, Eagle3Head, load_eagle3, save_eagle3
from engine.eagle3_drafter import Eagle3Drafter
from engine.errors import EngineInputError
from engine.generate import generate, make_drafter
from engine.loader import ModelPair, load_pair
from engine.sampling import process_logits
from engine.speculative import Request, SpecConfig, SpecEngine
from tests.engine.conftest import SMALL_TARGETS, SMALL_VOCAB, naive_greedy

N_NEW = 20
IDS = [0, 1, 2]  # aux layers of the 2-layer tiny target: embeddings, after layer 0, after layer 1
# The tensors of an EAGLE-3 checkpoint as vLLM's llama_eagle3 loads them (yuhuili/EAGLE3-* layout).
VLLM_NAMES = [
    "fc.weight",
    "midlayer.hidden_norm.weight",
    "midlayer.input_layernorm.weight",
    "midlayer.mlp.down_proj.weight",
    "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight",
    "midlayer.post_attention_layernorm.weight",
    "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.o_proj.weight",
    "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.v_proj.weight",
    "norm.weight",
    "lm_head.weight",
]
TOL = dict(atol=1e-5, rtol=1e-5)
# fused target states and pre-norm outputs reach |x| ~ 25-50 (the 0.5-std target's residual stream):
# fp32 rounding of a 96-wide fc there is ~1e-5; a wrong position or input differs by O(1)
STATE_TOL = dict(atol=1e-4, rtol=1e-4)


def head_config(target: ModelConfig, draft_vocab: int, ids: list[int] = IDS, **over) -> dict:
    """An EAGLE-3 config.json (vLLM's keys) for a head on ``target``."""
    raw = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "vocab_size": target.vocab_size,
        "draft_vocab_size": draft_vocab,
        "hidden_size": target.hidden_size,
        "target_hidden_size": target.hidden_size,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(ids)},
    }
    raw.update(over)
    return raw


def random_head(target, raw: dict, targets: list[int] | None, seed: int, std: float = 0.5) -> Eagle3Head:
    """A head for ``target`` with N(0, std) weights; ``targets``: the draft vocabulary's target ids."""
    head = Eagle3Head(Eagle3Config.from_dict(raw, target.config, "config.json")).bind(target)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * std)
        if targets is not None:
            head.d2t = torch.tensor(targets) - torch.arange(len(targets))
    return head


def write_vllm_folder(folder: Path, raw: dict, head: Eagle3Head, extra: dict | None = None) -> Path:
    """``head`` as an EAGLE-3 checkpoint: config.json and the VLLM_NAMES tensors (+ d2t, t2d)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(raw))
    tensors = {name: head.get_parameter(name).detach().clone() for name in VLLM_NAMES}
    if raw["draft_vocab_size"] < raw["vocab_size"]:
        tensors["d2t"] = head.d2t.clone()
        t2d = torch.zeros(raw["vocab_size"], dtype=torch.bool)
        t2d[torch.arange(raw["draft_vocab_size"]) + head.d2t] = True
        tensors["t2d"] = t2d
    tensors.update(extra or {})
    save_file({k: v for k, v in tensors.items() if v is not None}, str(folder / "model.safetensors"))
    return folder


def greedy_sequences(target, n: int, length: int, seed: int) -> torch.Tensor:
    """(n, length) target-greedy continuations of random 4-token prompts."""
    gen = torch.Generator().manual_seed(seed)
    seq = torch.randint(1, target.config.vocab_size, (n, 4), generator=gen)
    with torch.inference_mode():
        while seq.shape[1] < length:
            seq = torch.cat([seq, target(seq)[:, -1].argmax(-1, keepdim=True)], 1)
    return seq


def fit_head(head: Eagle3Head, target, steps: int = 150) -> Eagle3Head:
    """A few Adam steps on (token i+1, target state i) -> target-greedy token i+2 (EAGLE's first
    draft step), so the head agrees with the target often; the guarantees never depend on it."""
    seq = greedy_sequences(target, 48, 28, seed=5)
    with torch.no_grad():
        _, aux = target.forward_hidden(seq, layers=head.config.layer_ids)
    inp, aux, labels = seq[:, 1:-1], aux[:, :-2], seq[:, 2:]  # (N, T)
    in_vocab = torch.zeros(target.config.vocab_size, dtype=torch.bool)
    in_vocab[torch.arange(head.config.draft_vocab_size) + head.d2t] = True
    keep = in_vocab[labels]
    opt = torch.optim.Adam(head.parameters(), lr=1e-2)
    start = torch.zeros(seq.shape[0], dtype=torch.long)
    for _ in range(steps):
        cache = head.new_cache(seq.shape[0], inp.shape[1])
        logits, _ = head(inp, head.fc(aux), cache, start, inp.shape[1])
        loss = F.cross_entropy(logits[keep], labels[keep])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return head.eval().requires_grad_(False)


def frequent_tokens(target, k: int) -> list[int]:
    """The ``k`` target ids most frequent in its greedy outputs (how EAGLE-3 picks a draft vocabulary)."""
    counts = torch.bincount(greedy_sequences(target, 48, 28, seed=5)[:, 4:].flatten(), minlength=32)
    return sorted(counts.argsort(descending=True, stable=True)[:k].tolist())


@pytest.fixture(scope="module")
def heads(eager_target, tmp_path_factory) -> dict[int, Eagle3Head]:
    """draft_vocab_size -> a fitted head on the tiny target, written in vLLM's format and loaded back."""
    out = {}
    for dv in (32, 24):
        targets = None if dv == 32 else frequent_tokens(eager_target, dv)
        raw = head_config(eager_target.config, dv)
        head = fit_head(random_head(eager_target, raw, targets, seed=dv, std=0.3), eager_target)
        folder = write_vllm_folder(tmp_path_factory.mktemp(f"eagle3-{dv}"), raw, head)
        out[dv] = load_eagle3(folder, eager_target)
    return out


@pytest.fixture(scope="module")
def expected(eager_target, ragged_prompts) -> list[list[int]]:
    return [naive_greedy(eager_target, p, N_NEW) for p in ragged_prompts]


def run(target, head, config, prompts, batch, sync_free=False, eos=(), n_new=N_NEW, **request_kw):
    """generate()'s loop with an explicit sync-free setting; returns tokens and the engine."""
    reqs = [Request(list(p), n_new, id=i, **request_kw) for i, p in enumerate(prompts)]
    max_seq = max(len(p) for p in prompts) + n_new + config.lookahead + 3
    engine = SpecEngine(target, Eagle3Drafter(head), config, batch, max_seq, eos, sync_free=sync_free)
    return drain(engine, reqs), engine


def drain(engine: SpecEngine, reqs: list[Request]) -> list[list[int]]:
    """generate()'s loop: admit into free slots, step, retire until every request finished; each
    request's tokens, in order."""
    out, waiting = {}, list(reqs)
    with torch.inference_mode():
        while waiting or engine.n:
            admit, waiting = waiting[: engine.free_slots()], waiting[engine.free_slots() :]
            engine.add(admit)
            out.update((f.id, f.tokens) for f in engine.retire())
            if engine.n:
                engine.step()
                out.update((f.id, f.tokens) for f in engine.retire())
    return [out[r.id] for r in reqs]


# ------------------------------------------------------------------ (a) greedy equals the target's


@pytest.mark.parametrize("sync_free", [False, True])
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("gamma", [1, 3, 5])
@pytest.mark.parametrize("draft_vocab", [32, 24])
def test_greedy_output_equals_the_target_greedy(
    eager_target, heads, ragged_prompts, expected, draft_vocab, gamma, batch, sync_free
):
    tokens, engine = run(
        eager_target, heads[draft_vocab], SpecConfig(gamma=gamma), ragged_prompts, batch, sync_free
    )
    assert tokens == expected
    stats = engine.stats
    assert 0 < int(stats.accepted) < int(stats.proposed), "both acceptance and rejection must happen"


CONFIGS = {
    "heuristic+threshold": SpecConfig(
        gamma=2, gamma_schedule="heuristic", max_gamma=6, confidence_threshold=0.3
    ),
    "batch-table-with-K0": SpecConfig(gamma=3, batch_gammas=((3, 0), (8, 3))),  # K = 0: catch_up
}


@pytest.mark.parametrize("sync_free", [False, True])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_equals_target_under_schedules_and_eos(
    eager_target, heads, ragged_prompts, expected, name, sync_free
):
    eos = expected[3][9]
    want = [r[: r.index(eos) + 1] if eos in r else r for r in expected]
    assert sum(r[-1] == eos for r in want) >= 2
    tokens, engine = run(eager_target, heads[24], CONFIGS[name], ragged_prompts, 8, sync_free, eos=(eos,))
    assert tokens == want
    assert 0 < int(engine.stats.accepted) < int(engine.stats.proposed)


def test_compiled_target_greedy_equals_target(eager_target, compiled, heads, ragged_prompts, expected):
    """The verify pass through the compiled decode_hidden (torch.compile) changes nothing."""
    target = compiled(eager_target)
    tokens, _ = run(target, heads[24], SpecConfig(gamma=3), ragged_prompts, 8)
    assert tokens == expected


def test_make_drafter_and_load_pair_build_the_eagle3_drafter(
    tmp_path, eager_target, heads, ragged_prompts, expected
):
    folder = tmp_path / "target"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(eager_target.config.to_hf_dict()))
    save_file(
        {k: v.contiguous() for k, v in eager_target.state_dict().items()}, str(folder / "model.safetensors")
    )
    head_dir = save_eagle3(heads[24], tmp_path / "head")
    pair = load_pair(folder, eagle3=head_dir)
    assert isinstance(make_drafter("eagle3", pair), Eagle3Drafter)
    reqs = [Request(p, N_NEW, id=i) for i, p in enumerate(ragged_prompts)]
    out = generate(pair, reqs, SpecConfig(gamma=3), "eagle3", max_batch_size=4, eos_ids=())
    assert out.tokens == expected
    with pytest.raises(EngineInputError, match="drafter 'eagle3' needs an EAGLE-3 head folder"):
        make_drafter("eagle3", ModelPair(eager_target, None, None, folder, None))


# ------------------------------------------------------------------ (b) sampled output is the target's

V = SMALL_VOCAB
N = 20_000
PROMPT = [3, 1, 4, 1]
P_OK = 1e-3


def exact_joint(model, top_k: int, top_p: float) -> torch.Tensor:
    """(V, V, V) probabilities of the first three generated tokens under ``model``'s processing."""

    def next_probs(prefixes: torch.Tensor) -> torch.Tensor:  # (M, T) -> (M, V)
        with torch.inference_mode():
            logits = model(prefixes)[:, -1:]
        m = prefixes.shape[0]
        k = torch.full((m,), top_k) if top_k else None
        p = torch.full((m,), top_p) if top_p < 1 else None
        return process_logits(logits, torch.ones(m), k, p)[:, 0]

    prompt, t = torch.tensor(PROMPT), torch.arange(V)
    p1 = next_probs(prompt[None])[0]
    p2 = next_probs(torch.cat([prompt.expand(V, -1), t[:, None]], 1))
    grid = torch.cartesian_prod(t, t)
    p3 = next_probs(torch.cat([prompt.expand(V * V, -1), grid], 1)).view(V, V, V)
    return p1[:, None, None] * p2[:, :, None] * p3


def sample_three(target, head, gamma, top_k, top_p, n=N, seed=0):
    reqs = [Request(PROMPT, 3, temperature=1.0, top_k=top_k, top_p=top_p, id=i) for i in range(n)]
    pair = ModelPair(target, None, None, None, None)
    out = generate(
        pair, reqs, SpecConfig(gamma=gamma), Eagle3Drafter(head), max_batch_size=4096, seed=seed, eos_ids=()
    )
    toks = torch.tensor(out.tokens)
    assert toks.shape == (n, 3)
    return (toks[:, 0] * V + toks[:, 1]) * V + toks[:, 2], out.metrics


@pytest.mark.parametrize(
    ("draft_vocab", "gamma", "top_k", "top_p"),
    [(5, 2, 0, 1.0), (5, 3, 4, 1.0), (5, 2, 0, 0.8), (V, 3, 0, 1.0)],
)
def test_sampled_first_three_tokens_have_the_target_joint(
    small_target, small_heads, chi2, draft_vocab, gamma, top_k, top_p
):
    codes, metrics = sample_three(small_target, small_heads[draft_vocab], gamma, top_k, top_p)
    joint = exact_joint(small_target, top_k, top_p).flatten()
    assert bool((joint[codes] > 0).all()), "a token outside the top-k / top-p support"
    assert chi2(codes, joint) > P_OK
    assert 0.05 < metrics["acceptance_rate"] < 0.95  # acceptance and recovery both happened often


def test_the_check_fails_for_a_wrong_acceptance_rule(small_target, small_heads, chi2, monkeypatch):
    from tests.engine.test_distribution_e2e import wrong_accept

    monkeypatch.setattr("engine.speculative.accept", wrong_accept)
    codes, _ = sample_three(small_target, small_heads[5], 3, 0, 1.0, n=N // 4)
    assert chi2(codes, exact_joint(small_target, 0, 1.0).flatten()) < P_OK


def test_reduced_vocabulary_proposes_only_draft_tokens(small_target, small_heads):
    drafter = Eagle3Drafter(small_heads[5])
    engine = SpecEngine(small_target, drafter, SpecConfig(gamma=3), 64, 32)
    with torch.inference_mode():
        engine.add([Request(PROMPT, 8, temperature=1.0, id=i) for i in range(64)])
        st = engine.state
        drafts, probs, _ = drafter.propose(
            st.tokens[:64], st.length[:64], st.gamma[:64], 3, 0.0, st.sampling(slice(0, 64)), 16, None
        )
    outside = [t for t in range(V) if t not in SMALL_TARGETS]
    assert set(drafts.flatten().tolist()) <= set(SMALL_TARGETS)
    assert probs is not None and float(probs[..., outside].abs().max()) == 0.0


# ------------------------------------------------------------------ (c) the head's cache after rollbacks


def fresh_head_state(head: Eagle3Head, target, tokens: torch.Tensor, head_len: int, upto: int):
    """A one-slot head cache prefilled from scratch with positions 0..head_len-1 and the fused target
    states of positions 0..upto-1 (the staged ones included), from no-cache forwards."""
    with torch.inference_mode():
        _, aux = target.forward_hidden(tokens[None, :upto], layers=head.config.layer_ids)
        fused = head.fc(aux)  # (1, upto, H)
        cache = head.new_cache(1, max(head_len, 1))
        if head_len:
            head(
                tokens[None, 1 : head_len + 1],
                fused[:, :head_len],
                cache,
                torch.zeros(1, dtype=torch.long),
                head_len,
            )
    return cache, fused[0]


def check_head(engine: SpecEngine, drafter: Eagle3Drafter, target) -> int:
    """Assert every row's head cache and staged states; returns the rows that staged the widest
    block the last verify allowed (1 + G: every draft accepted, the sync-free width's bound)."""
    full = 0
    for row in range(engine.n):
        length = int(engine.state.length[row])
        hl = int(drafter.head_len[row])
        if not bool(engine.state.finished[row]):
            assert length - 2 - engine.config.max_row_gamma <= hl <= length - 2
        ref, fused = fresh_head_state(drafter.head, target, engine.state.tokens[row], hl, length - 1)
        for name in ("k", "v"):
            got = getattr(drafter.cache, name)[0][row, :, :hl]
            torch.testing.assert_close(got, getattr(ref, name)[0][0, :, :hl], **TOL)
        staged = length - 1 - hl
        torch.testing.assert_close(drafter._staged[row, :staged], fused[hl : length - 1], **STATE_TOL)
        full += staged == drafter._width > 1
    return full


ROLLBACK = {
    "constant-2": SpecConfig(gamma=2),
    "heuristic+threshold": SpecConfig(
        gamma=2, gamma_schedule="heuristic", max_gamma=5, confidence_threshold=0.2
    ),
    "batch-table-with-K0": SpecConfig(gamma=3, batch_gammas=((1, 3), (2, 0), (4, 2))),
}


def random_steps(
    target, drafter: Eagle3Drafter, config: SpecConfig, seed: int, sync_free: bool, after_step
) -> SpecEngine:
    """Rows join, finish and move at random (greedy and sampled, 20 requests in 4 slots); the head's
    cache is checked against a fresh prefill (:func:`check_head`) after every admission and retire,
    and ``after_step(engine)`` after every step. Returns the engine after the last row retired,
    having asserted progress and that a row was moved."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(3)
    engine = SpecEngine(target, drafter, config, 4, 48, (5,), gen, sync_free=sync_free)
    waiting = [
        Request(
            [rng.randrange(1, 32) for _ in range(rng.randint(1, 12))],
            rng.randint(3, 18),
            rng.choice([0.0, 1.0]),
            id=i,
        )
        for i in range(20)
    ]
    steps = moved = 0
    with torch.inference_mode():
        while waiting or engine.n:
            if waiting and engine.free_slots() and (rng.random() < 0.6 or engine.n == 0):
                k = rng.randint(1, min(engine.free_slots(), len(waiting)))
                engine.add(waiting[:k])
                waiting = waiting[k:]
                check_head(engine, drafter, target)
            engine.retire()
            if engine.n == 0:
                continue
            engine.step()
            steps += 1
            assert steps < 400, "no progress"
            after_step(engine)
            done = engine.state.finished[: engine.n].nonzero().flatten().tolist()
            moved += any(s < engine.n - 1 and not bool(engine.state.finished[engine.n - 1]) for s in done)
            engine.retire()
            check_head(engine, drafter, target)
    assert steps > 10 and moved > 0
    assert 0 < int(engine.stats.accepted) < int(engine.stats.proposed)
    return engine


@pytest.mark.parametrize("sync_free", [False, True])
@pytest.mark.parametrize("name", list(ROLLBACK))
def test_head_cache_equals_fresh_prefill_after_random_steps(eager_target, heads, name, sync_free):
    drafter = Eagle3Drafter(heads[24])
    full = []
    seed = list(ROLLBACK).index(name) + 10 * sync_free
    random_steps(
        eager_target,
        drafter,
        ROLLBACK[name],
        seed,
        sync_free,
        lambda e: full.append(check_head(e, drafter, eager_target)),
    )
    assert sum(full) > 0, "no row accepted a whole block: the widest staged block went untested"


# ------------------------------------------------------------------ the math: vLLM's, from scratch


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def vllm_reference(sd: dict, raw: dict, embed: torch.Tensor, tokens: torch.Tensor, fused: torch.Tensor):
    """llama_eagle3's LlamaDecoderLayer (layer 0) + norm + compute_logits, written from vLLM's code
    with plain tensor ops on the checkpoint's tensors: (T, V) logits and (T, H) pre-norm output."""
    eps, nh, nkv, hd = (
        raw["rms_norm_eps"],
        raw["num_attention_heads"],
        raw["num_key_value_heads"],
        raw["head_dim"],
    )
    t = tokens.shape[0]
    residual = fused  # _norm_after_residual
    x = torch.cat(
        [
            rms(embed[tokens], sd["midlayer.input_layernorm.weight"], eps),
            rms(fused, sd["midlayer.hidden_norm.weight"], eps),
        ],
        -1,
    )
    q = (x @ sd["midlayer.self_attn.q_proj.weight"].T).view(t, nh, hd).transpose(0, 1)
    k = (x @ sd["midlayer.self_attn.k_proj.weight"].T).view(t, nkv, hd).transpose(0, 1)
    v = (x @ sd["midlayer.self_attn.v_proj.weight"].T).view(t, nkv, hd).transpose(0, 1)
    inv = 1.0 / raw["rope_theta"] ** (torch.arange(0, hd, 2).double() / hd)
    ang = torch.arange(t).double()[:, None] * inv  # neox-style rotary, positions 0..T-1
    cos, sin = torch.cat([ang, ang], -1).cos().float(), torch.cat([ang, ang], -1).sin().float()

    def rope(z):
        z1, z2 = z.chunk(2, -1)
        return z * cos + torch.cat([-z2, z1], -1) * sin

    q, k = rope(q), rope(k)
    k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
    scores = (q @ k.transpose(-1, -2)) / hd**0.5 + torch.full((t, t), float("-inf")).triu(1)
    attn = (scores.softmax(-1) @ v).transpose(0, 1).reshape(t, nh * hd) @ sd[
        "midlayer.self_attn.o_proj.weight"
    ].T
    residual = attn + residual  # post_attention_layernorm(hidden, residual): fused add
    h = rms(residual, sd["midlayer.post_attention_layernorm.weight"], eps)
    mlp = (
        F.silu(h @ sd["midlayer.mlp.gate_proj.weight"].T) * (h @ sd["midlayer.mlp.up_proj.weight"].T)
    ) @ sd["midlayer.mlp.down_proj.weight"].T
    prenorm = mlp + residual  # norm(hidden, residual): fused add; aux output = pre-norm
    logits = rms(prenorm, sd["norm.weight"], eps) @ sd["lm_head.weight"].T
    full = torch.full((t, raw["vocab_size"]), float("-inf"))
    full[
        :,
        torch.arange(raw["draft_vocab_size"])
        + sd.get("d2t", torch.zeros(raw["draft_vocab_size"], dtype=torch.long)),
    ] = logits
    return full, prenorm


@pytest.mark.parametrize("draft_vocab", [32, 24])
def test_head_forward_matches_vllm_math_from_the_checkpoint(eager_target, heads, tmp_path, draft_vocab):
    head = heads[draft_vocab]
    folder = save_eagle3(head, tmp_path)
    sd, raw = load_file(str(folder / "model.safetensors")), json.loads((folder / "config.json").read_text())
    tokens = torch.tensor([3, 17, 9, 9, 2, 30, 11, 4, 1, 22])
    with torch.inference_mode():
        _, aux = eager_target.forward_hidden(tokens[None], layers=(0, 1, 2))
        fused = aux[0] @ sd["fc.weight"].T
        want, want_pre = vllm_reference(sd, raw, eager_target.model.embed_tokens.weight, tokens, fused)
        cache = head.new_cache(1, 16)
        got, pre = head(tokens[None], head.fc(aux), cache, torch.zeros(1, dtype=torch.long), 10)
    assert want.isfinite().sum() == 10 * draft_vocab
    torch.testing.assert_close(got[0], want, **TOL)
    torch.testing.assert_close(pre[0], want_pre, **STATE_TOL)


def test_captured_layers_are_vllm_aux_hidden_states():
    """Layer id i is the residual stream entering layer i (transformers' hidden_states[i] for i < L),
    id L the last layer's output before the final norm (transformers' last entry is after it)."""
    hf_cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    hf = LlamaForCausalLM(hf_cfg).float().eval()
    from engine.model import Transformer

    ours = Transformer(ModelConfig.from_dict(hf_cfg.to_dict())).eval()
    ours.load_state_dict(hf.state_dict(), strict=False)
    tokens = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        states = hf(input_ids=tokens, output_hidden_states=True).hidden_states
        logits, aux = ours.forward_hidden(tokens, layers=(0, 1, 2, 3))
        plain = ours(tokens)
    parts = aux.chunk(4, -1)
    for i in range(3):
        torch.testing.assert_close(parts[i], states[i], atol=1e-5, rtol=0)
    torch.testing.assert_close(ours.model.norm(parts[3]), states[3], atol=1e-5, rtol=0)
    assert torch.equal(logits, plain)
    assert ours.forward_hidden(tokens)[1] is None


# ------------------------------------------------------------------ (e) the checkpoint round trip


@pytest.mark.parametrize("draft_vocab", [32, 24])
def test_saved_head_has_vllm_names_and_loads_with_identical_tensors(
    eager_target, heads, tmp_path, draft_vocab
):
    head = heads[draft_vocab]
    folder = save_eagle3(head, tmp_path / "saved")
    stored = load_file(str(folder / "model.safetensors"))
    assert sorted(stored) == sorted(VLLM_NAMES + (["d2t", "t2d"] if draft_vocab < 32 else []))
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == draft_vocab
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == IDS
    back = load_eagle3(folder, eager_target)
    for name, tensor in head.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
    assert back.config == head.config
    # vLLM also reads the layer as ``layers.0.*`` (its own naming): the same head
    renamed = {k.replace("midlayer.", "layers.0."): v for k, v in stored.items()}
    save_file(renamed, str(folder / "model.safetensors"))
    again = load_eagle3(folder, eager_target)
    assert all(torch.equal(again.state_dict()[k], v) for k, v in head.state_dict().items())


def test_own_embedding_table_is_used(eager_target, tmp_path):
    raw = head_config(eager_target.config, 32)
    head = random_head(eager_target, raw, None, seed=3)
    table = torch.randn(32, 32, generator=torch.Generator().manual_seed(4))
    loaded = load_eagle3(write_vllm_folder(tmp_path, raw, head, {"embed_tokens.weight": table}), eager_target)
    assert loaded.embed_tokens is not None and torch.equal(loaded.embed_tokens.weight, table)
    tokens, hidden = torch.tensor([[1, 2, 3]]), torch.randn(1, 3, 32)
    with torch.inference_mode():
        start = torch.zeros(1, dtype=torch.long)
        own, _ = loaded(tokens, hidden, loaded.new_cache(1, 4), start, 3)
        shared, _ = head(tokens, hidden, head.new_cache(1, 4), start, 3)
    assert not torch.allclose(own, shared)


# ------------------------------------------------------------------ (d) refusals, one per key


def cfg_case(**over):
    return lambda raw, tensors: raw.update(over)


def eagle_case(**over):
    return lambda raw, tensors: raw["eagle_config"].update(over)


def drop(*names):
    def edit(raw, tensors):
        for n in names:
            tensors.pop(n)

    return edit


def put(name, value):
    return lambda raw, tensors: tensors.__setitem__(name, value)


def both(first, second):
    def edit(raw, tensors):
        first(raw, tensors)
        second(raw, tensors)

    return edit


REFUSALS = {  # case -> (draft vocab, edit(raw config, tensors), key the message names)
    "architecture": (24, cfg_case(architectures=["LlamaForCausalLM"]), "architectures"),
    "model_type": (24, cfg_case(model_type="qwen2"), "model_type"),
    "norm_before_fc": (24, eagle_case(norm_before_fc=True), "eagle_config.norm_before_fc"),
    "fc_norm": (24, cfg_case(fc_norm=True), "fc_norm"),
    "norm_output": (24, cfg_case(norm_output=True), "norm_output"),
    "norm_before_residual": (24, cfg_case(norm_before_residual=True), "norm_before_residual"),
    "logit_scale": (24, cfg_case(logit_scale=2.0), "logit_scale"),
    "no_aux_states": (24, eagle_case(use_aux_hidden_state=False), "eagle_config.use_aux_hidden_state"),
    "speculators_format": (24, cfg_case(speculators_model_type="eagle3"), "speculators_model_type"),
    "two_layers": (24, cfg_case(num_hidden_layers=2), "num_hidden_layers"),
    "activation": (24, cfg_case(hidden_act="gelu"), "hidden_act"),
    "rope_type": (24, cfg_case(rope_scaling={"rope_type": "yarn", "factor": 2.0}), "rope_scaling.rope_type"),
    "vocab_size": (24, cfg_case(vocab_size=30), "vocab_size"),
    "draft_vocab_size": (24, cfg_case(draft_vocab_size=40), "draft_vocab_size"),
    "target_hidden_size": (24, cfg_case(target_hidden_size=48), "target_hidden_size"),
    "hidden_size": (24, cfg_case(hidden_size=48), "hidden_size"),
    "layer_id_range": (
        24,
        eagle_case(eagle_aux_hidden_state_layer_ids=[0, 1, 3]),
        "eagle_aux_hidden_state_layer_ids",
    ),
    "layer_id_twice": (
        24,
        eagle_case(eagle_aux_hidden_state_layer_ids=[0, 2, 2]),
        "eagle_aux_hidden_state_layer_ids",
    ),
    "default_layer_ids": (24, cfg_case(eagle_config={}), "eagle_config.eagle_aux_hidden_state_layer_ids"),
    "layer_ids_disagree": (24, cfg_case(eagle_aux_hidden_state_layer_ids=[2, 1]), "eagle_config.eagle_aux"),
    "num_aux_hidden_states": (24, cfg_case(num_aux_hidden_states=2), "num_aux_hidden_states"),
    "missing_d2t": (24, drop("d2t", "t2d"), "'d2t'"),
    "d2t_with_full_vocab": (32, put("d2t", torch.zeros(32, dtype=torch.long)), "'d2t'"),
    "d2t_out_of_range": (24, put("d2t", torch.full((24,), 20)), "'d2t'"),
    "d2t_not_one_to_one": (24, put("d2t", -torch.arange(24)), "'d2t'"),
    "t2d_disagrees": (24, put("t2d", torch.ones(32, dtype=torch.bool)), "'t2d'"),
    "missing_lm_head": (24, drop("lm_head.weight"), "'lm_head.weight'"),
    "missing_hidden_norm": (24, drop("midlayer.hidden_norm.weight"), "'midlayer.hidden_norm.weight'"),
    "parallel_drafting_mask": (24, put("mask_hidden", torch.zeros(96)), "'mask_hidden'"),
    "fc_bias": (24, put("fc.bias", torch.zeros(32)), "'fc.bias'"),
    "fc_shape": (24, put("fc.weight", torch.zeros(32, 64)), "'fc.weight'"),
    "layer_named_twice": (
        24,
        put("layers.0.hidden_norm.weight", torch.ones(32)),
        "'layers.0.hidden_norm.weight'",
    ),
    "other_fusion": (
        24,
        both(eagle_case(eagle_aux_hidden_state_layer_ids=[0, 2]), put("fc.weight", torch.zeros(32, 96))),
        "'fc.weight'",
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_unsupported_head_is_refused_naming_folder_and_key(eager_target, heads, tmp_path, case):
    dv, edit, key = REFUSALS[case]
    raw = head_config(eager_target.config, dv)
    folder = write_vllm_folder(tmp_path / "head", raw, heads[dv])
    tensors = load_file(str(folder / "model.safetensors"))
    edit(raw, tensors)
    (folder / "config.json").write_text(json.dumps(raw))
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(EngineInputError) as err:
        load_eagle3(folder, eager_target)
    message = str(err.value)
    assert str(folder) in message and key in message, message
    assert "\n" not in message


def test_missing_folder_config_and_weights_are_refused(eager_target, tmp_path):
    with pytest.raises(EngineInputError, match="EAGLE-3 head folder not found"):
        load_eagle3(tmp_path / "nowhere", eager_target)
    (tmp_path / "head").mkdir()
    with pytest.raises(EngineInputError, match="no config.json"):
        load_eagle3(tmp_path / "head", eager_target)
    (tmp_path / "head" / "config.json").write_text(json.dumps(head_config(eager_target.config, 32)))
    (tmp_path / "head" / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(EngineInputError, match="pickled .bin checkpoints are not loaded"):
        load_eagle3(tmp_path / "head", eager_target)
