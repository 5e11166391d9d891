"""``autotune.study`` on its own: the search space, its stored form, and one trial's time budget.

``run_tune`` end to end (study, re-measurement, store, exports) is in test_tune.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest

from autotune import study as study_mod
from autotune.config import Range, TuneConfig

CFG = TuneConfig(
    target=Path("t"),
    draft=None,
    device="cpu",
    concurrency=(1, 2),
    gamma=Range(0, 8),
    drafters=("model", "none"),
    gamma_policies=("constant", "heuristic"),
    max_batch_size=(2, 4),
)
PARAMS = {
    "drafter": "model",
    "gamma": 1,
    "confidence_threshold": 0.0,
    "gamma_schedule": "constant",
    "max_batch_size": 2,
}


def test_trial_timeout_covers_the_whole_trial_not_each_load_level(monkeypatch) -> None:
    """Each load level gets what is left of budget.trial_timeout_s (a fake clock: 0.2 s per level)."""
    cfg = dataclasses.replace(CFG, trial_timeout_s=0.3)
    now = [0.0]
    limits = []

    def slow_run_load(pair, requests, spec, drafter, load, seed, time_limit_s=None):  # noqa: ARG001
        limits.append(time_limit_s)
        now[0] += 0.2
        if time_limit_s is not None and time_limit_s < 0.2:
            raise TimeoutError(f"run exceeded its time limit of {time_limit_s:g} s")
        return SimpleNamespace(metrics={"generated_tokens": 4, "wall_s": 0.2, cfg.latency: 1.0})

    monkeypatch.setattr(study_mod, "run_load", slow_run_load)
    ctx = SimpleNamespace(cfg=cfg, pair=None, requests=[])
    with pytest.raises(
        TimeoutError, match=r"trial exceeded trial_timeout_s=0.3 s \(1 of 2 load levels done\)"
    ):
        study_mod.evaluate(ctx, PARAMS, 0, clock=lambda: now[0])
    assert limits == [pytest.approx(0.3), pytest.approx(0.1)]  # the second level got what was left


def test_a_spent_trial_budget_stops_before_the_next_level(monkeypatch) -> None:
    cfg = dataclasses.replace(CFG, trial_timeout_s=0.2)
    now = [0.0]
    calls = []

    def run_load(pair, requests, spec, drafter, load, seed, time_limit_s=None):  # noqa: ARG001
        calls.append(time_limit_s)
        now[0] += 0.25  # the level finished, but past the whole trial's budget
        return SimpleNamespace(metrics={"generated_tokens": 4, "wall_s": 0.25, cfg.latency: 1.0})

    monkeypatch.setattr(study_mod, "run_load", run_load)
    with pytest.raises(TimeoutError, match=r"\(1 of 2 load levels done\)"):
        study_mod.evaluate(SimpleNamespace(cfg=cfg, pair=None, requests=[]), PARAMS, 0, clock=lambda: now[0])
    assert calls == [pytest.approx(0.2)]


def test_space_json_keeps_the_stored_profile_keys() -> None:
    """The profile's ``study.space`` predates the field names: ``schedules`` and ``gamma_cap``."""
    space = study_mod.shape_space(dataclasses.replace(CFG, search_gamma_cap=5), measurement={})
    assert space.to_json() == {
        "drafters": ("model", "none"),
        "gamma_low": 0,
        "gamma_high": 5,
        "threshold_low": 0.0,
        "threshold_high": 0.5,
        "schedules": ("constant", "heuristic"),
        "max_batch_sizes": (2, 4),
        "gamma_cap": 5,
    }


def test_search_gamma_cap_off_keeps_the_configured_range_and_fixed_knobs_pin() -> None:
    space = study_mod.shape_space(
        dataclasses.replace(CFG, search_gamma_cap="off"),
        measurement={},
        fixed={"confidence_threshold": 0.0, "gamma_schedule": "constant"},
    )
    assert (space.gamma_high, space.search_gamma_cap) == (8, None)
    assert (space.threshold_low, space.threshold_high, space.gamma_policies) == (0.0, 0.0, ("constant",))
    assert space.searched() == {"drafter", "gamma", "max_batch_size"}


def test_drafter_none_forces_gamma_zero_and_clip_stays_inside_the_space() -> None:
    space = study_mod.shape_space(dataclasses.replace(CFG, search_gamma_cap=3), measurement={})
    trial = optuna.trial.FixedTrial(
        {
            "drafter": "none",
            "gamma": 3,
            "confidence_threshold": 0.2,
            "gamma_schedule": "heuristic",
            "max_batch_size": 4,
        }
    )
    assert space.suggest(trial) == {
        "drafter": "none",
        "gamma": 0,
        "confidence_threshold": 0.2,
        "gamma_schedule": "heuristic",
        "max_batch_size": 4,
    }
    assert space.clip(
        {
            "drafter": "ngram",
            "gamma": 12,
            "confidence_threshold": 0.9,
            "gamma_schedule": "x",
            "max_batch_size": 64,
        }
    ) == {
        "drafter": "model",
        "gamma": 3,
        "confidence_threshold": 0.5,
        "gamma_schedule": "constant",
        "max_batch_size": 2,
    }
