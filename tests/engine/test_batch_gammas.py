"""A by-batch-size K table (``SpecConfig.batch_gammas``, vLLM's ``num_speculative_tokens_per_batch_size``).

Each step drafts the K of the smallest tuned batch size >= the running rows (above the largest, the
last point's K); a step whose K is 0 verifies the pending token alone while the draft model reads
the emitted tokens (``Drafter.catch_up``). Checked here: the lookup and the config's validation,
greedy output equal to the target's token for token while the running rows cross every boundary
of the table (K 4 -> 2 -> 0 -> 2 -> 4, for every drafter, sync-free and not), the K each step
really drafts, the caches after K = 0 steps, one device read per sync-free step, the target's
exact sampled distribution across a K = 0 step and a drafting step, and no compile after the
compiled decode's warm-up.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from engine.drafters import HybridDrafter, ModelDrafter, NgramDrafter
from engine.errors import EngineInputError
from engine.generate import generate
from engine.loader import ModelPair
from engine.sampling import process_logits
from engine.speculative import Request, SpecConfig, SpecEngine
from tests.engine.test_kv_cache import check_caches

N_NEW = 20  # tokens per request; the conftest `reference` fixture reads it

TABLE = ((1, 4), (2, 2), (4, 0))
CONFIG = SpecConfig(gamma=4, batch_gammas=TABLE)
BUDGETS = [20, 5, 9, 3, 12, 7]  # ragged: rows retire one by one, the first one last
ADMIT = {0: 1, 2: 1, 4: 2}  # step -> requests admitted before it (then: whenever a slot is free)


# ---------------------------------------------------------------------------- the table itself


def test_gamma_at_takes_the_smallest_tuned_batch_size_at_or_above():
    config = SpecConfig(gamma=4, batch_gammas=TABLE)
    assert [config.gamma_at(b) for b in range(1, 7)] == [4, 2, 0, 0, 0, 0]  # 3: between 2 and 4
    sparse = SpecConfig(gamma=3, batch_gammas=((2, 3), (8, 1), (32, 2)))
    at = {b: sparse.gamma_at(b) for b in (1, 2, 3, 8, 9, 32, 33, 1000)}
    assert at == {1: 3, 2: 3, 3: 1, 8: 1, 9: 2, 32: 2, 33: 2, 1000: 2}  # below the first, above the last
    assert SpecConfig(gamma=3).gamma_at(64) == 3  # no table: gamma at every batch size


def test_the_table_follows_the_vllm_exports_ranges():
    from profiles.exporters._common import batch_ranges

    table = ((1, 5), (2, 4), (4, 2), (8, 0))
    config = SpecConfig(gamma=5, batch_gammas=table)
    for lo, hi, k in batch_ranges(table):
        assert {config.gamma_at(b) for b in range(lo, hi + 1)} == {k}


def test_points_are_normalised_to_a_tuple_of_tuples():
    config = SpecConfig(gamma=2, batch_gammas=[[1, 2], [4, 0]])  # as JSON or YAML gives them
    assert config.batch_gammas == ((1, 2), (4, 0))
    assert hash(config) == hash(SpecConfig(gamma=2, batch_gammas=((1, 2), (4, 0))))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(gamma=2, batch_gammas=((2, 2), (1, 1))), "strictly increasing"),
        (dict(gamma=2, batch_gammas=((1, 2), (1, 1))), "strictly increasing"),
        (dict(gamma=2, batch_gammas=((0, 2),)), r"batch sizes must be >= 1 .*\[\[0, 2\]\]"),
        (dict(gamma=2, batch_gammas=((1, 2), (4, -1))), r"every K must be >= 0 .*\[4, -1\]"),
        (dict(gamma=4, batch_gammas=((1, 2), (4, 0))), "gamma must be the table's largest K .*gamma 4"),
        (dict(gamma=2, batch_gammas=((1, 2.5),)), r"two ints \(got \[1, 2.5\]"),
        (dict(gamma=2, batch_gammas=((1, 2, 3),)), "each point is"),
        (dict(gamma=1, batch_gammas=(4,)), "each point is"),
        (dict(gamma=1, batch_gammas=((True, 1),)), "each point is"),
        (
            dict(gamma=2, gamma_schedule="heuristic", max_gamma=6, batch_gammas=((1, 2),)),
            "gamma_schedule 'constant'",
        ),
        (dict(gamma=2, tree_topk=(2, 1), batch_gammas=((1, 2),)), "chains, not trees"),
    ],
)
def test_bad_tables_are_refused_naming_the_value(kwargs, message):
    with pytest.raises(EngineInputError, match=message) as err:
        SpecConfig(**kwargs)
    assert str(err.value).startswith("batch_gammas: ") and "\n" not in str(err.value)


def test_a_table_with_a_threshold_is_allowed():
    config = SpecConfig(gamma=3, confidence_threshold=0.2, batch_gammas=((1, 3), (2, 0)))
    assert config.lookahead == config.max_row_gamma == 3


# ---------------------------------------------------------------------------- runs


def make_drafter(kind: str, draft):
    return {"model": ModelDrafter(draft), "ngram": NgramDrafter(), "hybrid": HybridDrafter(draft)}[kind]


def drive(target, drafter, config, prompts, budgets, sync_free: bool, check_cache: bool = False):
    """Run the engine with a scripted admission (ADMIT, then continuous batching) at 4 slots.

    Returns each request's tokens and, per step: the running rows, the verify width (drafted
    tokens per row), the drafter calls made (``("propose", gamma_max, per-row gammas)`` or
    ``("catch_up",)``) and, right after the step, each row's draft-cache lag.
    """
    reqs = [Request(list(p), n, id=i) for i, (p, n) in enumerate(zip(prompts, budgets, strict=True))]
    max_seq = max(len(r.prompt_ids) + r.max_new_tokens for r in reqs) + config.lookahead + 3
    engine = SpecEngine(target, drafter, config, 4, max_seq, eos_ids=(), sync_free=sync_free)
    calls: list[tuple] = []
    propose, catch_up = drafter.propose, drafter.catch_up

    def spy_propose(tokens, length, gammas, gamma_max, *args, **kw):
        calls.append(("propose", gamma_max, gammas.tolist()))
        return propose(tokens, length, gammas, gamma_max, *args, **kw)

    def spy_catch_up(*args, **kw):
        calls.append(("catch_up",))
        return catch_up(*args, **kw)

    drafter.propose, drafter.catch_up = spy_propose, spy_catch_up
    model = drafter.model if isinstance(drafter, HybridDrafter) else drafter
    out, steps, waiting = {}, [], list(reqs)
    with torch.inference_mode():
        while waiting or engine.n:
            k = ADMIT.get(len(steps), 0 if len(steps) < max(ADMIT) else len(waiting))
            k = min(max(k, int(engine.n == 0)), engine.free_slots(), len(waiting))
            engine.add(waiting[:k])
            waiting = waiting[k:]
            out.update((f.id, f) for f in engine.retire())
            if not engine.n:
                continue
            n, slots, calls[:] = engine.n, engine.stats.verify_slots, []
            engine.step()
            lag = None
            if isinstance(model, ModelDrafter):
                lag = (engine.state.length[:n] - model.draft_len[:n]).tolist()
            steps.append((n, (engine.stats.verify_slots - slots) // n - 1, list(calls), lag))
            if check_cache:
                check_caches(engine, target, drafter)
            assert len(steps) < 200, "no progress"
    return [out[r.id].tokens for r in reqs], steps, engine


@pytest.mark.parametrize("sync_free", [False, True], ids=["cpu-default", "sync-free"])
@pytest.mark.parametrize("kind", ["model", "ngram", "hybrid"])
def test_greedy_output_equals_the_targets_across_every_boundary(
    target, draft, prompts, reference, kind, sync_free
):
    tokens, steps, engine = drive(
        target, make_drafter(kind, draft), CONFIG, prompts, BUDGETS, sync_free, check_cache=True
    )
    assert tokens == [r[:n] for r, n in zip(reference, BUDGETS, strict=True)]
    rows = [n for n, *_ in steps]
    assert set(rows) == {1, 2, 3, 4}
    ks = [CONFIG.gamma_at(n) for n in rows]
    first_zero = ks.index(0)
    assert 4 in ks[:first_zero] and 2 in ks[:first_zero]  # grew through K 4 and 2 before K 0
    assert 2 in ks[first_zero:] and ks[-1] == 4  # shrank back to B = 1 after the K = 0 steps
    assert int(engine.stats.accepted) > 0


@pytest.mark.parametrize("sync_free", [False, True], ids=["cpu-default", "sync-free"])
@pytest.mark.parametrize("kind", ["model", "ngram", "hybrid"])
def test_each_step_drafts_the_tables_k_for_its_running_rows(target, draft, prompts, kind, sync_free):
    _, steps, engine = drive(target, make_drafter(kind, draft), CONFIG, prompts, BUDGETS, sync_free)
    for n, width, calls, lag in steps:
        k = CONFIG.gamma_at(n)
        assert width == k, (n, width)  # verify: the pending token + K drafts per row
        if k:
            assert calls == [("propose", k, [k] * n)], (n, calls)
        else:
            assert calls == [("catch_up",)], (n, calls)
            if lag is not None:  # the draft read every token but the new pending one
                assert lag == [1] * n, (n, lag)
    assert engine.stats.verify_slots == sum(n * (CONFIG.gamma_at(n) + 1) for n, *_ in steps)
    assert engine.stats.draft_forwards >= sum(1 for n, *_ in steps if CONFIG.gamma_at(n) == 0) * (
        kind != "ngram"
    )
    if kind == "hybrid":
        src = engine.stats.source_summary()
        assert src is not None and src["none"]["row_steps"] >= sum(n for n, *_ in steps if n >= 3)


def test_model_drafter_lag_stays_within_the_sync_free_width(target, draft, prompts):
    """Sync-free, the draft is fed a fixed PENDING_MAX = 2 tokens: no row may lag more, ever."""
    _, steps, _ = drive(target, ModelDrafter(draft), CONFIG, prompts, BUDGETS, sync_free=True)
    assert max(max(lag) for *_, lag in steps) <= 2
    assert any(CONFIG.gamma_at(n) == 0 for n, *_ in steps)


def test_a_table_of_zeros_is_plain_decoding(target, draft, prompts, reference):
    config = SpecConfig(gamma=0, batch_gammas=((1, 0), (8, 0)))
    tokens, steps, engine = drive(target, ModelDrafter(draft), config, prompts, BUDGETS, sync_free=True)
    assert tokens == [r[:n] for r, n in zip(reference, BUDGETS, strict=True)]
    assert not engine.speculate and all(w == 0 and c == [] for _, w, c, _ in steps)


def test_sync_free_steps_read_the_device_once_at_every_k(target, draft, prompts, counted):
    config = SpecConfig(gamma=3, confidence_threshold=0.2, batch_gammas=((1, 3), (2, 1), (3, 0)))
    engine = SpecEngine(target, ModelDrafter(draft), config, 4, 64, sync_free=True)
    temps = [0.0, 1.0, 0.0, 1.0]
    rows = zip(prompts[:4], BUDGETS[:4], temps, strict=True)
    reqs = [Request(p, n, temperature=t, id=i) for i, (p, n, t) in enumerate(rows)]
    per_step: dict[int, list[int]] = {}
    with torch.inference_mode():
        engine.add(reqs)
        while engine.n:
            counted.ops.clear()
            n = engine.n
            with counted:
                engine.step()
            per_step.setdefault(config.gamma_at(n), []).append(len(counted.ops))
            engine.retire()
    assert set(per_step) == {0, 1, 3}
    assert all(reads == [1] * len(reads) for reads in per_step.values()), per_step


# ---------------------------------------------------------------------------- sampled


V = 8
N = 20_000
PROMPT = [3, 1, 4, 1]
P_OK = 1e-3


def test_sampled_output_has_the_targets_joint_across_a_k0_step(small_pair, chi2):
    """All rows start together; half stop after 2 tokens. Step 1 runs N rows at K = 0 (a plain
    decode, the draft catching up), step 2 the N/2 others at K = 2 (drafted on the caught-up
    cache): their first four tokens must follow the target's exact joint (T = 1)."""
    config = SpecConfig(gamma=2, batch_gammas=((N // 2, 2), (N, 0)))
    reqs = [Request(PROMPT, 2 if i % 2 else 4, temperature=1.0, id=i) for i in range(N)]
    out = generate(small_pair, reqs, config, "model", max_batch_size=N, seed=5, eos_ids=())
    stats = out.engine.stats
    assert stats.verify_steps >= 3 and stats.batch_rows > N + N // 2  # some rows needed a third step
    assert stats.verify_slots == N * 1 + (stats.batch_rows - N) * 3  # step 1 at K = 0, then K = 2
    assert 0 < int(stats.accepted) < int(stats.proposed)
    long_rows = torch.tensor([t for t, r in zip(out.tokens, reqs, strict=True) if r.max_new_tokens == 4])
    assert long_rows.shape == (N // 2, 4)
    target = small_pair.target

    def next_probs(prefixes: torch.Tensor) -> torch.Tensor:  # (M, T) -> (M, V)
        with torch.inference_mode():
            return process_logits(target(prefixes)[:, -1:], torch.ones(prefixes.shape[0]))[:, 0]

    prompt, joint = torch.tensor(PROMPT), torch.ones(1)
    for depth in range(4):  # p(t1) p(t2 | t1) ...: (V,) * depth grid of prefixes
        grid = torch.cartesian_prod(*[torch.arange(V)] * depth) if depth > 1 else torch.arange(V)[:, None]
        prefixes = torch.cat([prompt.expand(V**depth, -1), grid[: V**depth, :depth]], 1)
        joint = (joint[:, None] * next_probs(prefixes)).flatten()
    codes = ((long_rows[:, 0] * V + long_rows[:, 1]) * V + long_rows[:, 2]) * V + long_rows[:, 3]
    assert bool((joint[codes] > 0).all())
    assert chi2(codes, joint) > P_OK
    # the K = 2 step's tokens given the K = 0 step's: (t3, t4) against p(t3, t4 | t1, t2) weighted
    head = long_rows[:, 0] * V + long_rows[:, 1]
    weights = torch.bincount(head, minlength=V * V).double() / (N // 2)
    cond = joint.view(V * V, V * V) / joint.view(V * V, V * V).sum(1, keepdim=True).clamp(min=1e-30)
    assert chi2(codes, (weights[:, None] * cond).flatten()) > P_OK


# ---------------------------------------------------------------------------- compiled decode


def test_compiled_decode_warm_up_covers_every_width_of_a_table(model_factory, perturb, prompts):
    """K = 0 verifies one token and the draft catches up over its pending width; K > 0 verifies
    1 + K: all of them shapes the warm-up compiles (width 1 or more), so a table compiles nothing."""
    target = model_factory(seed=37, vocab=43)  # a shape no other test compiles: the warm-up is ours
    pair = ModelPair(target, perturb(target, seed=38, sigma=0.05), None, None, None)
    reference = [
        generate(pair, [Request(p, n)], SpecConfig(gamma=0), "none", eos_ids=()).tokens[0]
        for p, n in zip(prompts, BUDGETS, strict=True)
    ]
    pair.compile_decode()
    before = counters["frames"]["ok"]
    for kind in ("model", "hybrid"):
        for sync_free in (False, True):
            tokens, steps, _ = drive(
                pair.target, make_drafter(kind, pair.draft), CONFIG, prompts, BUDGETS, sync_free
            )
            assert tokens == reference
            assert {CONFIG.gamma_at(n) for n, *_ in steps} == {0, 2, 4}
    assert counters["frames"]["ok"] == before
