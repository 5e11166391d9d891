"""Shared fixtures for the engine tests: tiny random Llama models (fp32) and a chi-square helper.

Weights are re-initialised N(0, 0.5) so the logits are peaked: greedy argmaxes are far from
ties (fp32 noise never flips them) and sampled distributions are far from uniform.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

import engine.speculative
from engine.config import ModelConfig
from engine.loader import ModelPair
from engine.model import Transformer
from engine.speculative import Request


def tiny_config(vocab: int = 32, layers: int = 2, **kw) -> ModelConfig:
    base = dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
    )
    base.update(kw)
    return ModelConfig(**base)


def random_model(cfg: ModelConfig, seed: int, std: float = 0.5) -> Transformer:
    """A Transformer with every parameter drawn N(0, std) from ``seed`` (fp32, eval, no grad)."""
    gen = torch.Generator().manual_seed(seed)
    model = Transformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * std)
    return model.eval().requires_grad_(False)


def perturbed_copy(model: Transformer, seed: int, sigma: float) -> Transformer:
    """A draft that mostly agrees with ``model``: its weights plus N(0, sigma) noise."""
    gen = torch.Generator().manual_seed(seed)
    out = copy.deepcopy(model)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * sigma)
    return out.eval().requires_grad_(False)


def chi2_pvalue(samples: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """Chi-square goodness-of-fit p-value of integer ``samples`` against ``probs`` (K,).

    Bins with an expected count below ``min_expected`` are pooled into one bin. Samples in a
    bin of probability zero make the p-value 0 (callers also assert that directly).
    """
    probs = probs.double().flatten()
    probs = probs / probs.sum()
    n = samples.numel()
    observed = torch.bincount(samples.flatten(), minlength=probs.numel()).double()
    if bool((observed[probs == 0] > 0).any()):
        return 0.0
    expected = probs * n
    big = expected >= min_expected
    obs = [*observed[big].tolist()]
    exp = [*expected[big].tolist()]
    small_exp = float(expected[~big & (probs > 0)].sum())
    if small_exp > 0:
        obs.append(float(observed[~big].sum()))
        exp.append(small_exp)
    if len(obs) < 2:
        return 1.0
    exp_arr = np.array(exp)
    exp_arr *= sum(obs) / exp_arr.sum()  # exact float normalisation for scipy's sum check
    return float(chisquare(np.array(obs), exp_arr).pvalue)


@pytest.fixture(scope="session")
def eager_target() -> Transformer:
    """The tiny target: vocab 32, 2 layers, GQA (4 query heads, 2 KV heads)."""
    return random_model(tiny_config(), seed=0)


@pytest.fixture(scope="session")
def eager_draft() -> Transformer:
    """A draft close to the target: accepts some blocks fully, rejects others (partial acceptance)."""
    return perturbed_copy(random_model(tiny_config(), seed=0), seed=1, sigma=0.03)


@pytest.fixture(scope="module")
def in_mode(request: pytest.FixtureRequest, compiled: Callable[[Transformer], Transformer]) -> Callable:
    """``in_mode(model)``: ``model`` as the requesting module's engine mode runs it: a compiled copy
    in ENGINE_MODES' "compiled" mode, else the model itself (modules that do not opt in: eager)."""
    mode = request.getfixturevalue("engine_mode") if "engine_mode" in request.fixturenames else "eager"
    return compiled if mode == "compiled" else (lambda model: model)


@pytest.fixture(scope="module")
def target(eager_target: Transformer, in_mode: Callable) -> Transformer:
    """The tiny target, in the module's engine mode (see ``in_mode``)."""
    return in_mode(eager_target)


@pytest.fixture(scope="module")
def draft(eager_draft: Transformer, in_mode: Callable) -> Transformer:
    """The draft, in the module's engine mode."""
    return in_mode(eager_draft)


@pytest.fixture(scope="module")
def pair(target: Transformer, draft: Transformer) -> ModelPair:
    return ModelPair(target, draft, None, None, None)


@pytest.fixture(scope="module")
def small_pair(model_factory: Callable, perturb: Callable, in_mode: Callable) -> ModelPair:
    """A vocab-8 pair whose exact joint distributions are cheap to enumerate (distribution tests)."""
    target = model_factory(seed=11, vocab=8)
    return ModelPair(in_mode(target), in_mode(perturb(target, seed=12, sigma=0.08)), None, None, None)


@pytest.fixture(scope="session")
def ragged_prompts() -> list[list[int]]:
    """Eight prompts of 1-14 tokens from the small vocabulary: rows of a batch that differ in length."""
    gen = torch.Generator().manual_seed(321)
    return [torch.randint(1, 32, (n,), generator=gen).tolist() for n in (3, 9, 5, 14, 1, 7, 11, 2)]


@pytest.fixture(scope="session")
def prompts() -> list[list[int]]:
    """Prompts of different lengths (so rows are ragged and accept different lengths)."""
    gen = torch.Generator().manual_seed(123)
    return [torch.randint(1, 32, (n,), generator=gen).tolist() for n in (3, 9, 5, 14, 1, 7)]


def naive_greedy(model: Transformer, prompt: list[int], n_new: int) -> list[int]:
    """The ground truth of greedy decoding: full forward without a cache, argmax, ``n_new`` times."""
    seq = torch.tensor([prompt])
    with torch.inference_mode():
        for _ in range(n_new):
            seq = torch.cat([seq, model(seq)[0, -1].argmax().view(1, 1)], 1)
    return seq[0, len(prompt) :].tolist()


@pytest.fixture(scope="module")
def reference(
    request: pytest.FixtureRequest, target: Transformer, prompts: list[list[int]]
) -> list[list[int]]:
    """Each prompt's greedy tokens under ``target`` (the module's, if it overrides it), as many as
    the requesting module's ``N_NEW``."""
    return [naive_greedy(target, p, request.module.N_NEW) for p in prompts]


@pytest.fixture(scope="session")
def make_requests() -> Callable[..., list[Request]]:
    def make(prompts: list[list[int]], max_new_tokens: int, **kw) -> list[Request]:
        return [Request(list(p), max_new_tokens, id=i, **kw) for i, p in enumerate(prompts)]

    return make


@pytest.fixture(scope="session")
def chi2() -> Callable[..., float]:
    return chi2_pvalue


@pytest.fixture(scope="session")
def model_factory() -> Callable[..., Transformer]:
    """``model_factory(seed, vocab=..., layers=..., std=...)`` builds a tiny random model."""

    def make(seed: int, vocab: int = 32, layers: int = 2, std: float = 0.5, **kw) -> Transformer:
        return random_model(tiny_config(vocab, layers, **kw), seed, std)

    return make


@pytest.fixture(scope="session")
def perturb() -> Callable[..., Transformer]:
    return perturbed_copy


# The engine's three ways to run a step on this CPU: eager with the cheap device reads the CPU
# default keeps, eager sync-free (the CUDA default: fixed widths, no early draft exit), and
# compiled decode (torch.compile, what `autotune tune` runs by default). Suites that guarantee
# exactness run under each: a module opts in with
# ``pytestmark = pytest.mark.usefixtures("apply_engine_mode")``, and its target/draft/pair/small_pair
# are then the mode's (``in_mode``).
ENGINE_MODES = ("eager", "sync-free", "compiled")


@pytest.fixture(scope="session")
def compiled() -> Callable[[Transformer], Transformer]:
    """``compiled(model)``: a compiled copy of ``model`` (made once per model and session)."""
    made: dict[int, Transformer] = {}

    def get(model: Transformer) -> Transformer:
        if id(model) not in made:
            twin = copy.deepcopy(model)
            twin.compile_decode()
            made[id(model)] = twin
        return made[id(model)]

    return get


@pytest.fixture(scope="module", params=ENGINE_MODES)
def engine_mode(request: pytest.FixtureRequest) -> str:
    """Parametrises a module over ENGINE_MODES (modules opt in by requesting it)."""
    return request.param


@pytest.fixture
def apply_engine_mode(engine_mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make SpecEngine default to the sync-free step in the "sync-free" mode."""
    if engine_mode == "sync-free":
        monkeypatch.setattr(engine.speculative, "default_sync_free", lambda device: True)


@pytest.fixture
def counted(monkeypatch):
    """A :class:`tests.engine.test_host_syncs.HostReads` whose ``ops`` also records ``Tensor.tolist``
    calls (the host reads a sync-free step must not make)."""
    from tests.engine.test_host_syncs import HostReads

    reads = HostReads()
    original = torch.Tensor.tolist

    def tolist(self):
        if reads.active:
            reads.ops.append("tolist")
        return original(self)

    monkeypatch.setattr(torch.Tensor, "tolist", tolist)
    return reads


SMALL_VOCAB = 8
SMALL_TARGETS = [0, 2, 3, 5, 7]  # a 5-token draft vocabulary inside the small target's 8


@pytest.fixture(scope="module")
def small_target(model_factory):
    """A target with an 8-token vocabulary: the chi-square tests of the EAGLE-3 head enumerate its joints."""
    return model_factory(seed=11, vocab=SMALL_VOCAB)


@pytest.fixture(scope="module")
def small_heads(small_target, tmp_path_factory) -> dict:
    """EAGLE-3 heads on ``small_target``, by draft vocabulary size: the full 8 tokens and
    :data:`SMALL_TARGETS`, each written in vLLM's format and loaded back."""
    from engine.eagle3 import load_eagle3
    from tests.engine.test_eagle3 import head_config, random_head, write_vllm_folder

    out = {}
    for dv, targets in ((SMALL_VOCAB, None), (len(SMALL_TARGETS), SMALL_TARGETS)):
        raw = head_config(small_target.config, dv)
        head = random_head(small_target, raw, targets, seed=20 + dv)
        out[dv] = load_eagle3(
            write_vllm_folder(tmp_path_factory.mktemp(f"small-{dv}"), raw, head), small_target
        )
    return out
