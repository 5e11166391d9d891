"""Continuous batching: batch invariance, completion, slot reuse, seeded arrivals, mixed rows."""

from __future__ import annotations

import pytest
import torch

from engine.drafters import ModelDrafter, NoDrafter
from engine.errors import EngineInputError
from engine.scheduler import LoadGenerator, Scheduler
from engine.speculative import Request, SpecConfig, SpecEngine


def make_engine(pair, slots, config=SpecConfig(gamma=3), drafter="model", max_seq_len=96, seed=0, eos=()):
    d = ModelDrafter(pair.draft) if drafter == "model" else NoDrafter()
    gen = torch.Generator().manual_seed(seed)
    return SpecEngine(pair.target, d, config, slots, max_seq_len, eos, gen)


def test_batch_invariance_under_concurrency(pair, prompts, make_requests):
    """Each request's greedy output under concurrency equals its output when run alone."""
    reqs = make_requests(prompts, 12)
    alone = []
    for r in reqs:
        run = Scheduler(make_engine(pair, 1)).run(LoadGenerator([r], 1, concurrency=1))
        alone.append(run.records[0].output_tokens)
    for slots, conc in ((4, 4), (3, 6), (8, 8)):
        run = Scheduler(make_engine(pair, slots)).run(LoadGenerator(reqs, len(reqs), concurrency=conc))
        assert [r.output_tokens for r in run.records] == alone, (slots, conc)
        assert all(len(t) == 12 for t in alone)


def test_open_loop_rows_share_verify_passes(pair, prompts, make_requests):
    """Poisson arrivals: requests join a running batch mid-flight and still match their solo output."""
    reqs = make_requests(prompts, 10)
    solo = Scheduler(make_engine(pair, 1)).run(LoadGenerator(reqs, len(reqs), concurrency=1))
    run = Scheduler(make_engine(pair, 4)).run(LoadGenerator(reqs, len(reqs), rate=2000.0, seed=3))
    assert [r.output_tokens for r in run.records] == [r.output_tokens for r in solo.records]
    assert run.metrics["mean_batch_size"] > 1.0  # rows at different stages did share steps


def test_thousand_requests_through_batch_of_eight_leak_no_slot(pair, make_requests):
    gen = torch.Generator().manual_seed(1)
    base = [
        Request(torch.randint(1, 32, (int(n),), generator=gen).tolist(), int(m), id=i)
        for i, (n, m) in enumerate(
            zip(
                torch.randint(1, 9, (25,), generator=gen),
                torch.randint(1, 5, (25,), generator=gen),
                strict=True,
            )
        )
    ]
    engine = make_engine(pair, 8, SpecConfig(gamma=2), max_seq_len=32)
    run = Scheduler(engine).run(LoadGenerator(base, 1000, concurrency=8), max_steps=20000)
    assert len(run.records) == 1000
    assert [r.id for r in run.records] == list(range(1000))
    assert engine.n == 0 and engine.free_slots() == 8
    for rec in run.records:
        want = base[rec.id % len(base)].max_new_tokens
        assert len(rec.output_tokens) == want and rec.reason == "length"
    assert run.metrics["steps"] < 1000 * 4  # finite: at most max_new_tokens steps per request


def test_eos_retires_rows_and_frees_slots(pair, prompts, make_requests):
    reqs = make_requests(prompts, 30)
    ref = Scheduler(make_engine(pair, 2)).run(LoadGenerator(reqs, len(reqs), concurrency=2))
    eos = ref.records[0].output_tokens[4]
    engine = make_engine(pair, 2, eos=(eos,))
    run = Scheduler(engine).run(LoadGenerator(reqs, len(reqs), concurrency=2))
    first = run.records[0]
    assert first.reason == "eos" and first.output_tokens[-1] == eos
    assert eos not in first.output_tokens[:-1]
    assert engine.n == 0


def test_seeded_arrivals_are_identical():
    reqs = [Request([1, 2], 4, id=0)]
    a = LoadGenerator(reqs, 50, rate=7.0, seed=11)
    b = LoadGenerator(reqs, 50, rate=7.0, seed=11)
    c = LoadGenerator(reqs, 50, rate=7.0, seed=12)
    assert a._times == b._times and a._times != c._times
    assert all(t2 > t1 for t1, t2 in zip(a._times, a._times[1:], strict=False))
    assert abs(a._times[-1] / 50 - 1 / 7.0) < 0.1  # mean gap ~ 1/rate


def test_seeded_runs_give_identical_schedules(pair, prompts, make_requests):
    reqs = make_requests(prompts, 8, temperature=1.0)
    runs = [
        Scheduler(make_engine(pair, 3, seed=5)).run(LoadGenerator(reqs, 9, concurrency=3)) for _ in range(2)
    ]
    assert [r.output_tokens for r in runs[0].records] == [r.output_tokens for r in runs[1].records]
    assert runs[0].metrics["steps"] == runs[1].metrics["steps"]


def test_adaptive_gamma_and_mixed_sampling_rows_coexist(pair, prompts, make_requests):
    """Heuristic gamma rows and greedy/sampled/top-k/top-p rows in one batch; greedy rows stay exact."""
    greedy = make_requests(prompts[:2], 10)
    mixed = greedy + [
        Request(prompts[2], 10, temperature=1.0, id=2),
        Request(prompts[3], 10, temperature=0.7, top_k=5, id=3),
        Request(prompts[0], 10, temperature=1.2, top_p=0.8, id=4),
    ]
    cfg = SpecConfig(gamma=2, gamma_schedule="heuristic", max_gamma=6)
    engine = make_engine(pair, 5, cfg)
    seen_gammas = set()
    orig_step = engine.step

    def step():
        seen_gammas.add(tuple(engine.state.gamma[: engine.n].tolist()))
        return orig_step()

    engine.step = step
    run = Scheduler(engine).run(LoadGenerator(mixed, len(mixed), concurrency=5))
    solo = Scheduler(make_engine(pair, 1, SpecConfig(gamma=0), drafter="none")).run(
        LoadGenerator(greedy, len(greedy), concurrency=1)
    )
    assert [r.output_tokens for r in run.records[:2]] == [r.output_tokens for r in solo.records]
    assert all(len(r.output_tokens) == 10 for r in run.records)
    assert any(len(set(g)) > 1 for g in seen_gammas)  # rows really ran different gammas in one step


def test_load_generator_rejects_bad_settings():
    reqs = [Request([1], 2)]
    with pytest.raises(EngineInputError, match="exactly one"):
        LoadGenerator(reqs, 3)
    with pytest.raises(EngineInputError, match="rate"):
        LoadGenerator(reqs, 3, rate=-1.0)
    with pytest.raises(EngineInputError, match="concurrency"):
        LoadGenerator(reqs, 3, concurrency=0)


def test_latency_metrics_are_consistent(pair, prompts, make_requests):
    reqs = make_requests(prompts, 6)
    run = Scheduler(make_engine(pair, 2)).run(LoadGenerator(reqs, len(reqs), concurrency=2))
    m = run.metrics
    for rec in run.records:
        assert rec.arrival_s <= rec.first_token_s <= rec.finish_s
        assert rec.tpot_ms is not None and rec.tpot_ms >= 0
    assert m["ttft_ms_p50"] <= m["ttft_ms_p95"] <= m["ttft_ms_p99"]
    assert m["e2e_ms_p50"] <= m["e2e_ms_p95"]
    assert m["generated_tokens"] == 6 * len(reqs)
    assert m["tokens_per_second"] == pytest.approx(m["generated_tokens"] / m["wall_s"])


def test_time_limit_stops_a_run_with_a_reason(pair, prompts, make_requests):
    ticks = iter(range(10**6))
    sched = Scheduler(make_engine(pair, 2), clock=lambda: float(next(ticks)))  # one "second" per clock read
    with pytest.raises(TimeoutError, match="time limit of 5 s"):
        sched.run(LoadGenerator(make_requests(prompts, 20), 4, concurrency=2), time_limit_s=5)


def test_prefill_token_budget_splits_admissions_and_keeps_outputs(pair, prompts, make_requests):
    """Prompt lengths 3, 9, 5, 14, 1, 7: with a budget of 20 padded token slots, admissions go
    [3, 9] (2 x 9 = 18), [5] (5 and 14 would be 2 x 14 = 28), [14], [1, 7] (2 x 7 = 14)."""
    reqs = make_requests(prompts, 10)
    free = Scheduler(make_engine(pair, 8)).run(LoadGenerator(reqs, len(reqs), concurrency=8))
    engine = make_engine(pair, 8)
    batches = []
    add = engine.add

    def recording_add(requests):
        batches.append([len(r.prompt_ids) for r in requests])
        add(requests)

    engine.add = recording_add
    capped = Scheduler(engine, max_prefill_tokens=20).run(LoadGenerator(reqs, len(reqs), concurrency=8))
    assert batches == [[3, 9], [5], [14], [1, 7]]
    assert all(len(b) == 1 or len(b) * max(b) <= 20 for b in batches)
    assert [r.output_tokens for r in capped.records] == [r.output_tokens for r in free.records]
    # a prompt longer than the budget is still admitted, alone
    one = Scheduler(make_engine(pair, 8), max_prefill_tokens=2).admissible([(0.0, r) for r in reqs], 8)
    assert one == 1
    with pytest.raises(EngineInputError, match="max_prefill_tokens"):
        Scheduler(make_engine(pair, 2), max_prefill_tokens=0)
