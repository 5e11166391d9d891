"""Arrival traces (``workload.trace``): the JSONL reader, the built-in phases, replay in both load
generators, the trace run after a trial's levels, its place in TrialResult, the config key."""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from autotune import context
from autotune.backends.base import TRIAL_CUT, run_levels
from autotune.backends.engine import EngineBackend
from autotune.backends.openai_load import Endpoint, run_http_load
from autotune.config import PHASES, LoadLevel, ModelsConfig, SearchConfig, TuneConfig, WorkloadConfig, parse
from autotune.errors import ConfigError
from autotune.knobs import Knobs
from autotune.records import LEVEL_KEYS, LevelMetrics, TrialResult
from autotune.workload.runner import LoadSpec, Sampling, run_load
from autotune.workload.trace import (
    PHASE_BURST_FACTOR,
    PHASE_LOW_RATE,
    PHASE_LOW_REQUESTS,
    phase_trace,
    read_trace,
)
from engine.errors import EngineInputError
from engine.loader import load_pair
from engine.scheduler import LoadGenerator, RequestRecord
from engine.speculative import Request, SpecConfig
from tests.autotune.conftest import write_config
from tests.conftest import make_tokenizer

TOKENIZER = make_tokenizer()
SAMPLING = Sampling(max_new_tokens=7, temperature=0.5, top_k=3, top_p=0.9)
CONTEXT = 128


def write_trace(folder: Path, lines: list[object], name: str = "trace.jsonl") -> Path:
    path = folder / name
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def read(path: Path, truncate: bool = False):
    return read_trace(path, TOKENIZER, SAMPLING, CONTEXT, truncate)


# ------------------------------------------------------------------------------------------
# the JSONL reader


def test_a_trace_file_is_read_sorted_by_arrival_with_the_workload_defaults(tmp_path) -> None:
    path = write_trace(
        tmp_path,
        [
            {"arrival_s": 2.5, "prompt": "def add(a, b):\n", "max_new_tokens": 4, "source": "log"},
            {"arrival_s": 0.0, "prompt_tokens": [5, 6, 7], "temperature": 0.0, "top_k": 0, "top_p": 1.0},
            "",
            {"arrival_s": 1, "prompt": "class Point:\n"},
        ],
    )
    arrivals = read(path)
    assert [t for t, _ in arrivals] == [0.0, 1.0, 2.5]  # sorted, ints read as seconds
    assert [r.id for _, r in arrivals] == [0, 1, 2]  # numbered in arrival order
    first, second, third = (r for _, r in arrivals)
    assert first.prompt_ids == [5, 6, 7] and (first.temperature, first.top_k, first.top_p) == (0.0, 0, 1.0)
    assert first.max_new_tokens == 7  # the workload's default
    assert second.prompt_ids == TOKENIZER.encode("class Point:\n").ids
    assert (second.max_new_tokens, second.temperature, second.top_k, second.top_p) == (7, 0.5, 3, 0.9)
    assert third.prompt_ids == TOKENIZER.encode("def add(a, b):\n").ids and third.max_new_tokens == 4


def test_equal_arrival_times_keep_the_file_order(tmp_path) -> None:
    path = write_trace(tmp_path, [{"arrival_s": 1.0, "prompt_tokens": [k + 1]} for k in range(4)])
    assert [r.prompt_ids for _, r in read(path)] == [[1], [2], [3], [4]]


LONG = "x = 1\n" * 200  # longer than the 128-token context leaves for the prompt


@pytest.mark.parametrize(
    ("line", "key", "problem"),
    [
        ('{"arrival_s": 0, "prompt": "a"', "", "malformed JSON"),
        ("[1, 2]", "", "expected a JSON object"),
        ({"prompt": "a"}, "arrival_s", "required"),
        ({"arrival_s": -0.5, "prompt": "a"}, "arrival_s", "must be >= 0"),
        ({"arrival_s": "soon", "prompt": "a"}, "arrival_s", "must be a number"),
        ({"arrival_s": True, "prompt": "a"}, "arrival_s", "must be a number"),
        ({"arrival_s": 0}, "prompt, prompt_tokens", "one of them is required"),
        ({"arrival_s": 0, "prompt": "a", "prompt_tokens": [1]}, "prompt, prompt_tokens", "not both"),
        ({"arrival_s": 0, "prompt": ""}, "prompt", "non-empty string"),
        ({"arrival_s": 0, "prompt": 3}, "prompt", "non-empty string"),
        ({"arrival_s": 0, "prompt_tokens": []}, "prompt_tokens", "non-empty list"),
        ({"arrival_s": 0, "prompt_tokens": "1 2"}, "prompt_tokens", "non-empty list"),
        ({"arrival_s": 0, "prompt_tokens": [1, 1.5]}, "prompt_tokens", "integer in"),
        ({"arrival_s": 0, "prompt_tokens": [1, 10**6]}, "prompt_tokens", "vocabulary"),
        ({"arrival_s": 0, "prompt_tokens": [-1]}, "prompt_tokens", "integer in"),
        ({"arrival_s": 0, "prompt": "a", "max_new_tokens": 0}, "max_new_tokens", "must be >= 1"),
        ({"arrival_s": 0, "prompt": "a", "max_new_tokens": 2.5}, "max_new_tokens", "an integer"),
        ({"arrival_s": 0, "prompt": "a", "temperature": -1}, "temperature", "must be >= 0"),
        ({"arrival_s": 0, "prompt": "a", "top_k": -1}, "top_k", "must be >= 0"),
        ({"arrival_s": 0, "prompt": "a", "top_p": 0}, "top_p", r"in \(0.0, 1.0\]"),
        ({"arrival_s": 0, "prompt": "a", "top_p": 1.5}, "top_p", r"in \(0.0, 1.0\]"),
        ({"arrival_s": 0, "prompt": "a", "max_tokens": 8}, "max_tokens", "unknown key"),
        ({"arrival_s": 0, "prompt": LONG}, "prompt", "longer than the limit"),
        ({"arrival_s": 0, "prompt_tokens": [1] * 200}, "prompt_tokens", "longer than the limit"),
    ],
)
def test_every_bad_line_is_one_config_error_naming_file_line_and_key(tmp_path, line, key, problem) -> None:
    path = write_trace(tmp_path, [{"arrival_s": 0, "prompt": "ok"}, "", line])
    with pytest.raises(ConfigError) as err:
        read(path)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{path}:3: {key}"), message
    assert re.search(problem, message), message


def test_truncation_keeps_the_last_tokens_of_a_long_prompt(tmp_path) -> None:
    path = write_trace(tmp_path, [{"arrival_s": 0, "prompt_tokens": list(range(1, 201))}])
    ((_, req),) = read(path, truncate=True)
    limit = CONTEXT - SAMPLING.max_new_tokens - 20
    assert req.prompt_ids == list(range(201 - limit, 201))


def test_an_empty_or_missing_trace_file_is_one_line(tmp_path) -> None:
    empty = write_trace(tmp_path, ["", "  "])
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(empty))}: no arrivals"):
        read(empty)
    with pytest.raises(ConfigError, match=r"nope.jsonl: trace file not found"):
        read(tmp_path / "nope.jsonl")


# ------------------------------------------------------------------------------------------
# the built-in phases


REQS = [Request([1, 2, 3], 5, id=7), Request([4, 5], 6, id=8), Request([6], 4, id=9)]


def _phases(arrivals):
    """(low, burst, low) split of a phase trace: the burst is the run of equal offsets."""
    times = [t for t, _ in arrivals]
    start = next(k for k in range(len(times) - 1) if times[k] == times[k + 1])
    end = start + times.count(times[start])
    return times[:start], times[start:end], times[end:]


def test_phase_trace_is_low_load_then_a_burst_past_the_largest_concurrency_then_low_load() -> None:
    arrivals = phase_trace(REQS, max_concurrency=4, seed=3)
    low1, burst, low2 = _phases(arrivals)
    assert len(low1) == len(low2) == PHASE_LOW_REQUESTS
    assert len(burst) == PHASE_BURST_FACTOR * 4 > 4  # more than the largest level keeps in flight
    assert low1 == sorted(low1) and low2 == sorted(low2) and max(low1) < burst[0] < min(low2)
    assert burst[0] - low1[-1] == pytest.approx(1 / PHASE_LOW_RATE)
    assert min(low2) - burst[0] == pytest.approx(len(burst) / PHASE_LOW_RATE)  # time to drain
    gaps = [b - a for a, b in zip([0.0, *low1], low1, strict=False)]
    assert len(set(gaps)) == len(gaps) and all(g > 0 for g in gaps)  # Poisson, not a fixed pace
    assert [r.prompt_ids for _, r in arrivals[:4]] == [[1, 2, 3], [4, 5], [6], [1, 2, 3]]  # cycled
    assert [r.id for _, r in arrivals] == list(range(len(arrivals)))
    assert [r.max_new_tokens for _, r in arrivals[:3]] == [5, 6, 4]


def test_phase_trace_is_seeded_and_sized_by_its_parameters() -> None:
    assert phase_trace(REQS, 2, seed=1) == phase_trace(REQS, 2, seed=1)
    assert [t for t, _ in phase_trace(REQS, 2, seed=1)] != [t for t, _ in phase_trace(REQS, 2, seed=2)]
    small = phase_trace(REQS, 8, seed=0, low_requests=2, low_rate=4.0, burst=10)
    low1, burst, low2 = _phases(small)
    assert (len(low1), len(burst), len(low2)) == (2, 10, 2)
    assert burst[0] - low1[-1] == pytest.approx(0.25) and low2[0] - burst[0] == pytest.approx(2.5)
    with pytest.raises(ValueError, match="no requests"):
        phase_trace([], 2)


# ------------------------------------------------------------------------------------------
# replay in the engine's load generator and the HTTP load driver


ARRIVALS = [(0.0, Request([1], 3)), (0.5, Request([2, 2], 4)), (0.5, Request([3], 5)), (2.0, Request([4], 6))]


def test_load_generator_releases_each_replayed_request_at_its_offset() -> None:
    gen = LoadGenerator.replay(ARRIVALS)
    assert gen.next_arrival(0.0) == 0.0
    got = gen.poll(0.0, in_flight=0)
    assert [(t, r.prompt_ids, r.id) for t, r in got] == [(0.0, [1], 0)]
    assert gen.poll(0.49, in_flight=10) == [] and gen.next_arrival(0.49) == 0.5
    got = gen.poll(0.7, in_flight=50)  # open loop: however many are in flight
    assert [(t, r.prompt_ids, r.max_new_tokens, r.id) for t, r in got] == [
        (0.5, [2, 2], 4, 1),
        (0.5, [3], 5, 2),
    ]  # released with its scheduled time, not the poll's
    assert not gen.exhausted(1.0) and gen.next_arrival(1.0) == 2.0
    assert [(t, r.id) for t, r in gen.poll(5.0, 0)] == [(2.0, 3)]
    assert gen.exhausted(5.0) and gen.next_arrival(5.0) is None


def test_load_generator_replay_is_a_third_mode_and_the_others_are_unchanged() -> None:
    with pytest.raises(EngineInputError, match="exactly one of concurrency"):
        LoadGenerator([], 2, concurrency=1, arrivals=ARRIVALS)
    with pytest.raises(EngineInputError, match="sorted"):
        LoadGenerator.replay(list(reversed(ARRIVALS)))
    first_two = LoadGenerator([], 2, arrivals=ARRIVALS)
    assert len(first_two.poll(10.0, 0)) == 2 and first_two.exhausted(10.0)
    closed = LoadGenerator(REQS, 4, concurrency=2)
    assert [r.id for _, r in closed.poll(0.0, 0)] == [0, 1] and closed.next_arrival(0.0) is None
    assert LoadGenerator(REQS, 3, rate=5.0, seed=1).next_arrival(0.0) > 0


def test_run_load_replays_a_trace_through_the_scheduler(tiny_pair_dirs) -> None:
    """The engine run records each request's scheduled arrival; greedy outputs match a closed loop's."""
    pair = load_pair(*tiny_pair_dirs, device="cpu")
    reqs = [Request(TOKENIZER.encode(p).ids, 5, id=i) for i, p in enumerate(["def add(", "class P", "for i"])]
    arrivals = ((0.0, reqs[0]), (0.0, reqs[1]), (0.15, reqs[2]))
    spec = SpecConfig(gamma=2)
    replay = run_load(pair, [], spec, "model", LoadSpec(max_batch_size=2, arrivals=arrivals), warmup=False)
    closed = run_load(pair, reqs, spec, "model", LoadSpec(max_batch_size=2, num_requests=3), warmup=False)
    assert [r.arrival_s for r in replay.records] == [0.0, 0.0, 0.15]
    assert replay.records[2].first_token_s >= 0.15
    assert [r.output_tokens for r in replay.records] == [r.output_tokens for r in closed.records]
    assert replay.metrics["num_requests"] == 3


def test_run_http_load_sends_each_arrival_at_its_offset() -> None:
    sent: list[tuple[int, list[int], int, float, float]] = []
    lock = threading.Lock()

    def send(endpoint, req, seed, arrival):  # noqa: ARG001 - the HTTP call's signature
        now = time.perf_counter()
        with lock:
            sent.append((req.id, list(req.prompt_ids), req.max_new_tokens, arrival, now))
        return RequestRecord(req.id, arrival, now, now + 0.01, len(req.prompt_ids), [1] * 2, "length")

    t0 = time.perf_counter()
    run = run_http_load(Endpoint("http://x:1", "m"), [], 99, arrivals=ARRIVALS[:3], send=send, seed=1)
    sent.sort()
    assert [(k, ids, n) for k, ids, n, _, _ in sent] == [(0, [1], 3), (1, [2, 2], 4), (2, [3], 5)]
    offsets = [arrival - t0 for _, _, _, arrival, _ in sent]
    assert offsets == pytest.approx([0.0, 0.5, 0.5], abs=0.05)  # the scheduled time is the arrival
    assert all(now >= arrival - 1e-3 for *_, arrival, now in sent)  # never sent early
    assert [r.id for r in run.records] == [0, 1, 2] and run.metrics["num_requests"] == 3
    with pytest.raises(ValueError, match="exactly one of concurrency, rate and arrivals"):
        run_http_load(Endpoint("http://x:1", "m"), [], 1, rate=1.0, arrivals=ARRIVALS, send=send)


# ------------------------------------------------------------------------------------------
# a trial: the trace after the levels, kept apart


CFG = TuneConfig(
    ModelsConfig(Path("t"), device="cpu"),
    WorkloadConfig(Path("p"), concurrency=(1, 2), trace=PHASES),
    SearchConfig(drafter=("ngram",)),
)
TRACE = tuple(phase_trace(REQS, 2))


def fake_level(seen: list[LoadLevel]):
    def level(level: LoadLevel, left: float | None) -> dict:  # noqa: ARG001
        seen.append(level)
        if level.trace is not None:  # slow and bursty: must not touch the objectives
            return {"generated_tokens": 1000, "wall_s": 1.0, "tpot_ms_p95": 999.0, "tokens_per_second": 1e3}
        c = level.concurrency or 0
        return {"generated_tokens": 10 * c, "wall_s": 1.0, "tpot_ms_p95": 5.0 * c, "tokens_per_second": 1.0}

    return level


def test_run_levels_runs_the_trace_after_the_levels_and_keeps_it_out_of_the_objectives() -> None:
    seen: list[LoadLevel] = []
    result = run_levels(CFG, 4, fake_level(seen), trace=TRACE)
    assert [lv.concurrency for lv in seen] == [1, 2, None] and seen[-1].trace == TRACE
    assert sorted(result.per_level) == [1, 2]  # the trace is no batch-size level
    assert result.tokens_per_second == pytest.approx(30 / 2.0) and result.latency_ms == 10.0
    assert result.trace == LevelMetrics.from_metrics(
        {"generated_tokens": 1000, "wall_s": 1.0, "tpot_ms_p95": 999.0, "tokens_per_second": 1e3}
    )
    plain = dataclasses.replace(CFG, workload=dataclasses.replace(CFG.workload, trace=None))
    untraced = run_levels(plain, 4, fake_level([]))
    assert untraced.trace is None and "trace" not in untraced.to_json()
    assert (untraced.tokens_per_second, untraced.latency_ms) == (result.tokens_per_second, result.latency_ms)
    assert run_levels(CFG, 4, fake_level([])).trace is None  # study trials run without the trace
    with pytest.raises(ValueError, match="workload.trace is not set"):
        run_levels(plain, 4, fake_level([]), trace=TRACE)


def test_the_trace_shares_the_trial_time_limit() -> None:
    cfg = dataclasses.replace(CFG, budget=dataclasses.replace(CFG.budget, trial_timeout_s=1.0))
    now = [0.0]
    limits = []

    def level(level: LoadLevel, left: float | None) -> dict:
        limits.append(left)
        now[0] += 0.4
        if level.trace is not None:
            raise TimeoutError("run exceeded its time limit")
        return {"generated_tokens": 4, "wall_s": 0.4, "tpot_ms_p95": 1.0}

    with pytest.raises(TimeoutError, match=r"trial_timeout_s=1 s \(all 2 load levels done, not the workload"):
        run_levels(cfg, 2, level, clock=lambda: now[0], trace=TRACE)
    assert limits == [pytest.approx(1.0), pytest.approx(0.6), pytest.approx(0.2)]
    assert TRIAL_CUT.get() is None


def test_trial_result_trace_round_trips_and_takes_the_median_over_repeats() -> None:
    result = run_levels(CFG, 4, fake_level([]), trace=TRACE)
    data = json.loads(json.dumps(result.to_json()))  # stored form: string keys
    assert data["trace"] == result.trace.to_json() and set(data["trace"]) == set(LEVEL_KEYS)
    back = TrialResult.from_json(result.to_json())
    assert back == result and back.extra == {}
    assert TrialResult.from_json(data).trace == result.trace
    rounds = [
        dataclasses.replace(result, trace=dataclasses.replace(result.trace, tokens_per_second=v))
        for v in (3.0, 1.0, 2.0)
    ]
    assert TrialResult.median(rounds).trace.tokens_per_second == 2.0
    assert TrialResult.median([dataclasses.replace(r, trace=None) for r in rounds]).trace is None


# ------------------------------------------------------------------------------------------
# tune.yaml, the context and the engine backend


def _raw(root: Path, trace: object) -> dict:
    for d in ("target", "draft"):
        (root / d).mkdir(exist_ok=True)
    (root / "prompts.jsonl").write_text('{"prompt": "x"}\n')
    return {
        "models": {"target": "target", "draft": "draft"},
        "workload": {"prompts": "prompts.jsonl", "trace": trace},
    }


def test_workload_trace_parses_phases_a_relative_path_and_null(tmp_path) -> None:
    assert parse(_raw(tmp_path, "phases"), tmp_path).workload.trace == PHASES
    assert parse(_raw(tmp_path, None), tmp_path).workload.trace is None
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "t.jsonl").write_text('{"arrival_s": 0, "prompt": "x"}\n')
    cfg = parse(_raw(tmp_path, "logs/t.jsonl"), tmp_path, tmp_path / "tune.yaml")
    assert cfg.workload.trace == tmp_path / "logs" / "t.jsonl"
    assert cfg.with_overrides({"workload.trace": "phases"}).workload.trace == PHASES


@pytest.mark.parametrize(("value", "problem"), [("gone.jsonl", "does not exist"), ("logs", "is not a file")])
def test_a_missing_trace_path_is_one_line_naming_the_key_and_the_path(tmp_path, value, problem) -> None:
    (tmp_path / "logs").mkdir()
    with pytest.raises(ConfigError) as err:
        parse(_raw(tmp_path, value), tmp_path)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"workload.trace: {value} {problem}"), message
    assert str(tmp_path / value) in message
    with pytest.raises(ConfigError, match=r"^workload.trace: must be a path"):
        parse(_raw(tmp_path, 3), tmp_path)


def _config(tmp_path: Path, tiny_pair_dirs, trace: object):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("def add(", "class P", "for i")))
    from autotune.config import load_config

    path = write_config(
        tmp_path,
        tiny_pair_dirs,
        prompts,
        tmp_path / "autotune.db",
        workload={"trace": trace, "max_new_tokens": 4},
    )
    return load_config(path)


def test_a_bad_trace_line_stops_the_context_before_the_compile(tmp_path, tiny_pair_dirs, monkeypatch) -> None:
    trace = write_trace(tmp_path, [{"arrival_s": 0, "prompt": "x"}, {"arrival_s": 1, "prompt": ""}])
    compiled = []
    monkeypatch.setattr(context, "_compile", lambda *a, **k: compiled.append(1) or "")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(trace))}:2: prompt: must be a non-empty"):
        context.build(_config(tmp_path, tiny_pair_dirs, str(trace)))
    assert compiled == []


def test_an_engine_trial_runs_the_trace_from_the_context(tmp_path, tiny_pair_dirs) -> None:
    trace = write_trace(
        tmp_path,
        [
            {"arrival_s": 0.1, "prompt": "class P", "max_new_tokens": 3},
            {"arrival_s": 0.0, "prompt_tokens": [5, 6, 7]},
        ],
    )
    ctx = context.build(_config(tmp_path, tiny_pair_dirs, str(trace)))
    try:
        assert ctx.trace is not None and [t for t, _ in ctx.trace] == [0.0, 0.1]
        assert [r.max_new_tokens for _, r in ctx.trace] == [4, 3]  # workload.max_new_tokens by default
        result = EngineBackend(ctx).run(Knobs("model", 2, max_batch_size=2), 0, with_trace=True)
        assert EngineBackend(ctx).run(Knobs("model", 2, max_batch_size=2), 0).trace is None  # a study trial
    finally:
        ctx.store.close()
    assert sorted(result.per_level) == [1, 2]
    assert result.trace is not None and result.trace.generated_tokens == 7
    assert TrialResult.from_json(result.to_json()).trace == result.trace


def test_the_phases_trace_of_the_context_is_sized_from_the_largest_concurrency(
    tmp_path, tiny_pair_dirs
) -> None:
    ctx = context.build(_config(tmp_path, tiny_pair_dirs, "phases"))
    ctx.store.close()
    assert ctx.trace is not None
    _, burst, _ = _phases(ctx.trace)
    assert len(burst) == PHASE_BURST_FACTOR * max(ctx.cfg.workload.concurrency)
    assert ctx.trace == tuple(phase_trace(ctx.requests, max(ctx.cfg.batch_sizes), ctx.cfg.budget.seed))


def test_bench_replays_a_trace_file(tmp_path, tiny_pair_dirs) -> None:
    from autotune.cli import main

    target, draft = tiny_pair_dirs
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "def add("}) + "\n")
    trace = write_trace(tmp_path, [{"arrival_s": 0.0, "prompt": "for i"}, {"arrival_s": 0.05, "prompt": "x"}])
    common = ["bench", "--target", str(target), "--draft", str(draft), "--prompts", str(prompts)]
    common += ["--max-new-tokens", "3", "--device", "cpu", "--gamma", "2"]
    result = CliRunner().invoke(main, [*common, "--trace", str(trace), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["num_requests"] == 2 and out["baseline_num_requests"] == 2
    refused = CliRunner().invoke(main, [*common, "--trace", "phases", "--rate", "2"])
    assert refused.exit_code == 2 and "--trace replaces" in refused.output
    missing = CliRunner().invoke(main, [*common, "--trace", str(tmp_path / "none.jsonl")])
    assert missing.exit_code == 2 and "none.jsonl" in missing.output


def test_the_bundled_tune_yaml_documents_workload_trace() -> None:
    raw = yaml.safe_load((Path(__file__).resolve().parents[2] / "tune.yaml").read_text())
    assert "trace" in raw["workload"] and raw["workload"]["trace"] is None
