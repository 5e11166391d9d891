"""A request must fit the target's context: prompt + max_new_tokens <= max_position_embeddings.

Past it the engine would generate at positions the model was never trained on, without a word;
the engine refuses such a request in one line naming it, or (``generate(truncate_prompts=True)``)
keeps the last tokens of its prompt that fit.
"""

from __future__ import annotations

import pytest
import torch

from engine.drafters import ModelDrafter
from engine.errors import EngineInputError
from engine.generate import generate
from engine.speculative import Request, SpecConfig, SpecEngine

N_NEW = 10


@pytest.fixture(scope="module")
def context(target) -> int:
    return target.config.max_position_embeddings  # 256 for the tiny target


def prompt_of(n: int) -> list[int]:
    return torch.randint(1, 32, (n,), generator=torch.Generator().manual_seed(n)).tolist()


def test_a_request_past_the_context_is_refused_in_one_line_naming_it(target, draft, context):
    engine = SpecEngine(target, ModelDrafter(draft), SpecConfig(gamma=3), 2, 2 * context)
    fits = Request(prompt_of(context - N_NEW - 4), N_NEW, id=6)
    over = Request(
        prompt_of(context - N_NEW + 4), N_NEW, id=7
    )  # the prompt alone fits; with N_NEW it does not
    with pytest.raises(EngineInputError) as err:
        engine.add([fits, over])
    msg = str(err.value)
    assert msg.startswith("request 7: ") and "\n" not in msg, msg
    assert f"{context - N_NEW + 4} tokens" in msg and f"limit of {context - N_NEW}" in msg, msg
    assert engine.n == 0  # nothing was admitted


def test_generate_refuses_too_and_a_request_that_fills_the_context_runs(pair, context):
    with pytest.raises(EngineInputError, match="request 0: prompt is"):
        generate(pair, [Request(prompt_of(context - N_NEW + 1), N_NEW)], SpecConfig(gamma=3), eos_ids=())
    full = [Request(prompt_of(context - N_NEW), N_NEW)]
    out = generate(pair, full, SpecConfig(gamma=3), eos_ids=())
    assert out.tokens == generate(pair, full, SpecConfig(gamma=0), "none", eos_ids=()).tokens
    assert len(out.tokens[0]) == N_NEW


def test_generate_truncates_when_asked_keeping_the_prompts_end(pair, context):
    long, short = prompt_of(context + 40), prompt_of(12)
    out = generate(
        pair,
        [Request(long, N_NEW, id=0), Request(short, N_NEW, id=1)],
        SpecConfig(gamma=3),
        eos_ids=(),
        truncate_prompts=True,
    )
    kept = long[-(context - N_NEW) :]  # as if the caller had passed the prompt's last tokens
    as_passed = generate(
        pair, [Request(kept, N_NEW, id=0), Request(short, N_NEW, id=1)], SpecConfig(gamma=3), eos_ids=()
    )
    assert out.tokens == as_passed.tokens and all(len(t) == N_NEW for t in out.tokens)
