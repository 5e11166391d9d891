"""Fixtures for the demo-pair tooling tests: the same tiny random Llama models as tests/engine/conftest.py."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from engine.config import ModelConfig
from engine.model import Transformer


@pytest.fixture(scope="session")
def model_factory() -> Callable[..., Transformer]:
    """``model_factory(seed, vocab=..., layers=..., std=...)`` builds a tiny random model (every parameter N(0, std))."""

    def make(seed: int, vocab: int = 32, layers: int = 2, std: float = 0.5, **kw) -> Transformer:
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
        gen = torch.Generator().manual_seed(seed)
        model = Transformer(ModelConfig(**base))
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * std)
        return model.eval().requires_grad_(False)

    return make
