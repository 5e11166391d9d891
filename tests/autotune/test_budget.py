"""``budget.minutes``: one deadline for study, re-measurement, second look and table contest, on a clock
the tests drive (every backend run costs a fixed number of seconds), so what is cut is deterministic."""

from __future__ import annotations

import pytest

from autotune.jobs import tune as tune_mod
from autotune.jobs.tune import run_tune
from autotune.search.budget import RunBudget
from tests.autotune.fakes import FakeBackend, synthetic_run


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def clocked(clock: Clock, run_s: float):
    """``backend_for``: the synthetic backend whose every run advances ``clock`` by ``run_s``."""

    def run(cfg, knobs, seed):
        clock.t += run_s
        return synthetic_run(cfg, knobs, seed)

    return lambda ctx: FakeBackend(ctx, run)


def test_run_budget_fits_rounds_and_records_cuts() -> None:
    clock = Clock()
    b = RunBudget(100.0, clock=clock)
    b.run_s = 10.0
    assert b.rounds(5, 2, at_least=1) == 5  # 5 rounds x 2 configs x 10 s = 100 s fit
    clock.t = 70.0
    assert b.rounds(5, 2, at_least=1) == 1 and b.rounds(5, 2, at_least=0) == 1
    clock.t = 95.0
    assert b.rounds(5, 2, at_least=1) == 1 and b.rounds(5, 2, at_least=0) == 0
    assert b.cut("x") == "budget: x" and b.to_json()["cuts"] == ["x"]
    assert RunBudget(None, clock=clock).rounds(5, 2, 0) == 5 and RunBudget(None).left() is None
    assert "ETA 1.5 min" in b.eta(90.0)


def test_without_a_budget_nothing_is_cut(tune_config, monkeypatch) -> None:
    clock = Clock()
    monkeypatch.setattr(
        tune_mod.RunBudget, "of_minutes", classmethod(lambda cls, m: RunBudget(None, clock=clock))
    )
    profile = run_tune(
        tune_config(budget={"n_trials": 4}), say=lambda _: None, backend_for=clocked(clock, 10.0)
    )
    assert profile["study"]["run_budget"]["cuts"] == [] and profile["study"]["trials_run"] == 4
    assert profile["remeasure"]["repeats"] == 3


@pytest.mark.parametrize("minutes", [2.0, 3.0])
def test_a_budget_cuts_the_study_and_rounds_and_the_run_ends_within_it(
    tune_config, monkeypatch, minutes
) -> None:
    """Each run costs 10 s of the budget's clock: the study stops while one more trial and the
    re-measurement's rounds still fit, the re-measurement runs what fits, the second look and the
    table contest are skipped when they do not; the run's backend time stays within 1.1x the budget."""
    clock = Clock()
    monkeypatch.setattr(
        tune_mod.RunBudget, "of_minutes", classmethod(lambda cls, m: RunBudget(m * 60, clock=clock))
    )
    lines: list[str] = []
    cfg = tune_config(budget={"n_trials": 30, "minutes": minutes, "repeats": 3, "remeasure_top": 1})
    profile = run_tune(cfg, say=lines.append, backend_for=clocked(clock, 10.0))
    run_budget = profile["study"]["run_budget"]
    assert run_budget["minutes"] == minutes and run_budget["cuts"]
    assert profile["study"]["trials_run"] < 30
    assert run_budget["cuts"][0].startswith("study stopped after")
    assert clock.t <= 1.1 * minutes * 60
    assert any(line.startswith("budget: study stopped after") for line in lines)
    assert lines[-1 - len(profile["exports"])].startswith("budget: ") or any(
        line.startswith(f"budget: {clock.t / 60:.1f} min of {minutes:.1f} min") for line in lines
    )


def test_the_re_measurement_runs_the_rounds_that_fit_and_says_what_it_cut(tune_config) -> None:
    from types import SimpleNamespace

    from autotune.decide.decision import remeasure
    from autotune.knobs import Knobs

    cfg = tune_config()
    clock = Clock()
    backend = clocked(clock, 10.0)(SimpleNamespace(cfg=cfg))
    budget = RunBudget(75.0, clock=clock)
    budget.run_s = 10.0
    configs = [(Knobs("model", 0, max_batch_size=2), None), (Knobs("model", 2, max_batch_size=2), None)]
    lines: list[str] = []
    done = remeasure(cfg, backend, configs, lines.append, "re-measuring", repeats=5, budget=budget)
    assert done.repeats == 3 and clock.t == 60.0  # 3 rounds x 2 configs x 10 s fit in 75 s, a 4th does not
    assert budget.cuts == ["re-measuring: 3 of 5 rounds (the rest would pass budget.minutes)"]
    assert lines[0] == "budget: re-measuring: 3 of 5 rounds (the rest would pass budget.minutes)"
    progress = [line for line in lines if line.startswith("  re-measuring: ")]
    assert progress[0] == "  re-measuring: 1/6 runs [ETA 50 s, 1.1 min left of 1.2 min]"
    assert progress[-1] == "  re-measuring: 6/6 runs [ETA 0 s, 15 s left of 1.2 min]"
    late = RunBudget(5.0, clock=clock, run_s=10.0)  # nothing fits: one round still runs, a choice needs it
    assert remeasure(cfg, backend, configs, lines.append, "again", repeats=3, budget=late).repeats == 1


def test_a_servers_start_up_counts_for_the_next_trial_not_for_the_re_measurement(
    tune_config, monkeypatch
) -> None:
    """Each trial starts a server (20 s) and runs 10 s: the re-measurement's runs are sized at 10 s (a kept
    server does not start again), the next trial at 30 s."""
    import dataclasses

    clock = Clock()
    seen: list[float | None] = []

    def run(cfg, knobs, seed):
        clock.t += 30.0
        return dataclasses.replace(synthetic_run(cfg, knobs, seed), startup_s=20.0)

    real = RunBudget.rounds

    def spy(self, wanted, configs, at_least):
        seen.append(self.run_s)
        return real(self, wanted, configs, at_least)

    monkeypatch.setattr(RunBudget, "rounds", spy)
    monkeypatch.setattr(
        tune_mod.RunBudget, "of_minutes", classmethod(lambda cls, m: RunBudget(m * 60, clock=clock))
    )
    cfg = tune_config(budget={"n_trials": 30, "minutes": 5.0, "repeats": 2, "remeasure_top": 1})
    profile = run_tune(cfg, say=lambda _: None, backend_for=lambda ctx: FakeBackend(ctx, run))
    assert seen and seen[0] == 10.0
    cut = profile["study"]["run_budget"]["cuts"][0]
    assert cut.endswith("one more (30 s) and a re-measurement round (30 s) would pass budget.minutes")
