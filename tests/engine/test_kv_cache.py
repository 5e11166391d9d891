"""After any sequence of speculative steps, rollbacks and compactions, the caches hold exactly a
fresh prefill of each row's committed prefix (docs/architecture.md, The engine)."""

from __future__ import annotations

import random

import pytest
import torch

from engine.drafters import HybridDrafter, ModelDrafter, NgramDrafter
from engine.speculative import Request, SpecConfig, SpecEngine

TOL = dict(atol=1e-5, rtol=1e-5)


def fresh_prefill(model, prefix: torch.Tensor):
    """A one-slot cache filled by a no-padding prefill of ``prefix`` (L,)."""
    length = prefix.shape[0]
    cache = model.new_cache(1, length)
    model(prefix[None], cache=cache, start=torch.zeros(1, dtype=torch.long), kv_len=length)
    return cache


def assert_cache_matches_prefill(
    model, cache, tokens: torch.Tensor, row: int, length: int, what: str
) -> None:
    ref = fresh_prefill(model, tokens[row, :length])
    for layer in range(model.config.num_hidden_layers):
        for name in ("k", "v"):
            got = getattr(cache, name)[layer][row, :, :length]
            want = getattr(ref, name)[layer][0, :, :length]
            where = f"{what} row {row} layer {layer} {name}"
            torch.testing.assert_close(got, want, **TOL, msg=lambda m, where=where: f"{where}: {m}")


def check_caches(engine: SpecEngine, target, drafter) -> None:
    for row in range(engine.n):
        committed = int(engine.state.length[row]) - 1  # the pending token is not in the target cache yet
        assert_cache_matches_prefill(target, engine.cache, engine.state.tokens, row, committed, "target")
        model_drafter = drafter.model if isinstance(drafter, HybridDrafter) else drafter
        if isinstance(model_drafter, ModelDrafter) and engine.speculate:
            dlen = int(model_drafter.draft_len[row])
            if not isinstance(drafter, HybridDrafter):  # the hybrid's model may skip steps (n-gram rows)
                assert committed - 1 <= dlen <= committed  # at most the bonus token is left to feed
            assert dlen <= committed
            assert_cache_matches_prefill(
                model_drafter.model, model_drafter.cache, engine.state.tokens, row, dlen, "draft"
            )


def random_requests(rng: random.Random, n: int) -> list[Request]:
    reqs = []
    for i in range(n):
        prompt = [rng.randrange(1, 32) for _ in range(rng.randint(1, 12))]
        temperature = rng.choice([0.0, 1.0, 1.0])
        reqs.append(Request(prompt, rng.randint(3, 18), temperature=temperature, id=i))
    return reqs


CONFIGS = {
    "constant-3": SpecConfig(gamma=3),
    "constant-6": SpecConfig(gamma=6),
    "heuristic": SpecConfig(gamma=2, gamma_schedule="heuristic", max_gamma=6),
    "heuristic+threshold": SpecConfig(
        gamma=3, gamma_schedule="heuristic", max_gamma=6, confidence_threshold=0.15
    ),
    "tree-3-2-1": SpecConfig(
        gamma=3, tree_topk=(3, 2, 1)
    ),  # token trees: the accepted path compacted in place
    "tree-2-1-2-1-topk": SpecConfig(gamma=4, tree_topk=(2, 1, 2, 1), tree_sampling="topk"),
    # dynamic trees: per-row structures; an accepted node the draft was never fed ends the fed prefix
    "dynamic-2x4-5": SpecConfig(gamma=4, tree_topk=(2,) * 4, tree_nodes=5, tree_sampling="topk"),
    "dynamic-3x3-9": SpecConfig(gamma=3, tree_topk=(3,) * 3, tree_nodes=9, tree_sampling="topk"),
}


# Every config with the model drafter; the chains with the n-gram drafter (trees need the model
# drafter and are refused otherwise); the hybrid drafter on two chains.
CASES = (
    [("model", c) for c in CONFIGS]
    + [("ngram", c) for c in CONFIGS if CONFIGS[c].tree is None]
    + [("hybrid", "constant-3"), ("hybrid", "heuristic+threshold")]
)


@pytest.mark.parametrize(("drafter_kind", "config_name"), CASES)
def test_caches_equal_fresh_prefill_after_random_steps(target, draft, drafter_kind, config_name):
    config = CONFIGS[config_name]
    rng = random.Random(10 * list(CONFIGS).index(config_name) + len(drafter_kind))
    drafter = {
        "model": ModelDrafter(draft),
        "ngram": NgramDrafter(1, 3),
        "hybrid": HybridDrafter(draft, 1, 3),
    }[drafter_kind]
    gen = torch.Generator().manual_seed(7)
    engine = SpecEngine(target, drafter, config, 4, 48, eos_ids=(5,), generator=gen)
    waiting = random_requests(rng, 12)
    compactions = steps = 0
    with torch.inference_mode():
        while waiting or engine.n:
            if waiting and engine.free_slots() and (rng.random() < 0.6 or engine.n == 0):
                k = rng.randint(1, min(engine.free_slots(), len(waiting)))
                engine.add(waiting[:k])  # admitted while other rows are mid-generation
                waiting = waiting[k:]
                check_caches(engine, target, drafter)
            engine.retire()
            if engine.n == 0:
                continue
            engine.step()
            steps += 1
            assert steps < 400, "no progress"
            check_caches(engine, target, drafter)  # finished rows too: they keep a valid prefix
            done = engine.state.finished[: engine.n].nonzero().flatten().tolist()
            compactions += any(
                slot < engine.n - 1 and not bool(engine.state.finished[engine.n - 1]) for slot in done
            )
            engine.retire()
            check_caches(engine, target, drafter)
    assert steps > 10
    assert compactions > 0, "no retired row had a live row moved into its slot"


def test_compaction_moves_last_row_into_retired_slot(target, draft):
    drafter = ModelDrafter(draft)
    engine = SpecEngine(target, drafter, SpecConfig(gamma=3), 3, 64)
    reqs = [
        Request([3, 4, 5, 6], 30, id=0),
        Request([7, 8], 2, id=1),
        Request([9, 10, 11, 12, 13, 14, 15], 30, id=2),
    ]
    with torch.inference_mode():
        engine.add(reqs)
        engine.step()
        engine.step()
        pre_move = engine.state.tokens[2, : int(engine.state.length[2])].clone()
        done = engine.retire()
        assert [f.id for f in done] == [1]
        assert engine.n == 2 and engine.state.ids[:2] == [0, 2]
        assert torch.equal(engine.state.tokens[1, : int(engine.state.length[1])], pre_move)
        check_caches(engine, target, drafter)
        for _ in range(3):
            engine.step()
            check_caches(engine, target, drafter)
