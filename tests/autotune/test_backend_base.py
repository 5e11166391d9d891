"""``autotune.backends.base.run_levels``: the one loop every backend runs a trial's load levels with."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from autotune.backends.base import run_levels
from autotune.config import LoadLevel, ModelsConfig, SearchConfig, TuneConfig, WorkloadConfig

CFG = TuneConfig(
    ModelsConfig(Path("t"), device="cpu"),
    WorkloadConfig(Path("p"), concurrency=(1, 2)),
    SearchConfig(drafter=("ngram",)),
)


def with_budget(**changes) -> TuneConfig:
    return dataclasses.replace(CFG, budget=dataclasses.replace(CFG.budget, **changes))


def test_trial_timeout_covers_the_whole_trial_not_each_load_level() -> None:
    """Each load level gets what is left of budget.trial_timeout_s (a fake clock: 0.2 s per level)."""
    cfg = with_budget(trial_timeout_s=0.3)
    now = [0.0]
    limits = []

    def slow_level(level: LoadLevel, left: float | None) -> dict:  # noqa: ARG001
        limits.append(left)
        now[0] += 0.2
        if left is not None and left < 0.2:
            raise TimeoutError(f"run exceeded its time limit of {left:g} s")
        return {"generated_tokens": 4, "wall_s": 0.2, cfg.objectives.latency: 1.0}

    with pytest.raises(
        TimeoutError, match=r"trial exceeded trial_timeout_s=0.3 s \(1 of 2 load levels done\)"
    ):
        run_levels(cfg, 2, slow_level, clock=lambda: now[0])
    assert limits == [pytest.approx(0.3), pytest.approx(0.1)]  # the second level got what was left


def test_a_spent_trial_budget_stops_before_the_next_level() -> None:
    cfg = with_budget(trial_timeout_s=0.2)
    now = [0.0]
    calls = []

    def level(level: LoadLevel, left: float | None) -> dict:  # noqa: ARG001
        calls.append(left)
        now[0] += 0.25  # the level finished, but past the whole trial's budget
        return {"generated_tokens": 4, "wall_s": 0.25, cfg.objectives.latency: 1.0}

    with pytest.raises(TimeoutError, match=r"\(1 of 2 load levels done\)"):
        run_levels(cfg, 2, level, clock=lambda: now[0])
    assert calls == [pytest.approx(0.2)]


def test_levels_are_keyed_by_batch_size_and_aggregated_over_all_levels() -> None:
    """tokens/s is all tokens over all wall time; latency the worst level's; a rate level is keyed by the rows."""
    seen = []

    def level(level: LoadLevel, left: float | None) -> dict:  # noqa: ARG001
        seen.append(level)
        c = level.concurrency or 0
        return {
            "generated_tokens": 10 * (c + 1),
            "wall_s": 1.0,
            "tpot_ms_p95": 5.0 * (c + 1),
            "tokens_per_second": 1.0,
        }

    result = run_levels(CFG, 4, level)
    assert seen == [LoadLevel(concurrency=1), LoadLevel(concurrency=2)]
    assert sorted(result.per_level) == [1, 2]
    assert result.tokens_per_second == pytest.approx((20 + 30) / 2.0) and result.latency_ms == 15.0
    rate = run_levels(
        dataclasses.replace(CFG, workload=dataclasses.replace(CFG.workload, rate=3.0)), 4, level
    )
    assert list(rate.per_level) == [4]


def test_only_runs_the_levels_of_those_batch_sizes_and_aggregates_over_them() -> None:
    """A second look's round: ``only={2}`` runs concurrency 2 alone; an empty selection is refused."""
    seen = []

    def level(level: LoadLevel, left: float | None) -> dict:  # noqa: ARG001
        seen.append(level.concurrency)
        c = level.concurrency or 0
        return {"generated_tokens": 10 * c, "wall_s": 1.0, "tpot_ms_p95": 5.0 * c, "tokens_per_second": 1.0}

    result = run_levels(CFG, 4, level, only={2})
    assert seen == [2] and list(result.per_level) == [2]
    assert result.tokens_per_second == 20.0 and result.latency_ms == 10.0
    with pytest.raises(ValueError, match=r"no load level at batch sizes \[8\]"):
        run_levels(CFG, 4, level, only={8})


def test_the_median_of_rounds_some_at_some_levels_only() -> None:
    """Per level: every round that ran the level; the sweep's aggregate: the rounds that ran every level."""
    from autotune.records import LEVEL_KEYS, LevelMetrics, TrialResult

    def lv(tps: float) -> LevelMetrics:
        return LevelMetrics(**{**dict.fromkeys(LEVEL_KEYS, 1.0), "tokens_per_second": tps})

    full = [TrialResult(t, 9.0, {1: lv(t), 2: lv(2 * t)}) for t in (10.0, 12.0, 14.0)]
    second_look = [TrialResult(99.0, 1.0, {2: lv(t)}) for t in (40.0, 50.0)]
    med = TrialResult.median([*full, *second_look])
    assert med.tokens_per_second == 12.0 and med.latency_ms == 9.0  # not pulled by the partial rounds
    assert med.per_level[1].tokens_per_second == 12.0
    assert med.per_level[2].tokens_per_second == 28.0  # median of 20, 24, 28, 40, 50
