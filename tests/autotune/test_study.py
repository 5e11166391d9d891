"""``autotune.search.study`` on its own: the search space and its stored form.

``run_tune`` end to end (study, re-measurement, store, exports) is in test_tune.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import optuna

from autotune.config import ModelsConfig, Range, SearchConfig, TuneConfig, WorkloadConfig
from autotune.knobs import Knobs
from autotune.search import study as study_mod

CFG = TuneConfig(
    ModelsConfig(Path("t"), Path("d"), device="cpu"),
    WorkloadConfig(Path("p"), concurrency=(1, 2)),
    SearchConfig(
        drafter=("model", "none"),
        gamma=Range(0, 8),
        gamma_schedule=("constant", "heuristic"),
        max_batch_size=(2, 4),
    ),
)


def with_search(**changes) -> TuneConfig:
    return dataclasses.replace(CFG, search=dataclasses.replace(CFG.search, **changes))


def test_space_json_keeps_the_stored_profile_keys() -> None:
    """The profile's ``study.space`` predates the field names: ``schedules`` and ``gamma_cap``."""
    space = study_mod.shape_space(with_search(gamma_cap=5), measurement={})
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
        with_search(gamma_cap="off"),
        measurement={},
        fixed={"confidence_threshold": 0.0, "gamma_schedule": "constant"},
    )
    assert (space.gamma_high, space.search_gamma_cap) == (8, None)
    assert (space.threshold_low, space.threshold_high, space.gamma_policies) == (0.0, 0.0, ("constant",))
    assert space.searched() == {"drafter", "gamma", "max_batch_size"}


def test_drafter_none_forces_gamma_zero_and_clip_stays_inside_the_space() -> None:
    space = study_mod.shape_space(with_search(gamma_cap=3), measurement={})
    trial = optuna.trial.FixedTrial(
        {
            "drafter": "none",
            "gamma": 3,
            "confidence_threshold": 0.2,
            "gamma_schedule": "heuristic",
            "max_batch_size": 4,
        }
    )
    # nothing drafts: threshold and policy are not suggested (they do nothing), so every such trial is
    # one configuration of the conditional space
    assert space.suggest(trial) == Knobs("none", 0, 0.0, "constant", 4)
    zero = optuna.trial.FixedTrial(
        {
            "drafter": "model",
            "gamma": 0,
            "confidence_threshold": 0.4,
            "gamma_schedule": "heuristic",
            "max_batch_size": 4,
        }
    )
    assert space.suggest(zero) == Knobs("model", 0, 0.0, "constant", 4)
    some = optuna.trial.FixedTrial(
        {
            "drafter": "model",
            "gamma": 2,
            "confidence_threshold": 0.4,
            "gamma_schedule": "heuristic",
            "max_batch_size": 4,
        }
    )
    assert space.suggest(some) == Knobs("model", 2, 0.4, "heuristic", 4)
    assert space.clip(Knobs("ngram", 12, 0.9, "x", 64)) == {
        "drafter": "model",
        "gamma": 3,
        "confidence_threshold": 0.5,
        "gamma_schedule": "constant",
        "max_batch_size": 2,
    }


def test_a_configuration_measured_already_is_answered_from_the_studys_record() -> None:
    """The conditional space makes every gamma-0 trial one configuration; a repeat suggested by the
    sampler runs nothing (the record answers), while an enqueued warm start runs (the in-stack
    baseline's second round is the host's noise, on purpose)."""
    from autotune.records import TrialResult

    space = study_mod.shape_space(with_search(gamma_cap=3, drafter=("model",)), measurement={})
    runs: list[Knobs] = []

    class Guard:
        def run(self, trial, knobs, seed, expected):  # noqa: ARG002 - TrialGuard.run's signature
            runs.append(knobs)
            level = {"tokens_per_second": 10.0 + knobs.gamma, "tpot_ms_p95": 5.0}
            return TrialResult.from_json(
                {"tokens_per_second": 10.0 + knobs.gamma, "latency_ms": 5.0, "per_level": {1: level}}
            )

    study = optuna.create_study(directions=["maximize", "minimize"])
    objective = study_mod.make_objective(CFG, Guard(), space, None)
    zero = {"gamma": 0, "confidence_threshold": 0.3, "gamma_schedule": "heuristic", "max_batch_size": 4}
    study.enqueue_trial(zero, user_attrs={"warm_start": "baseline"})
    study.enqueue_trial(zero, user_attrs={"warm_start": "baseline again"})
    study.enqueue_trial({**zero, "confidence_threshold": 0.1})  # sampled, say: the same configuration
    study.enqueue_trial({**zero, "gamma": 2})
    study.optimize(objective, n_trials=4)
    assert [k.gamma for k in runs] == [0, 0, 2]  # the third trial ran nothing
    third = study.trials[2]
    assert third.user_attrs["repeat_of"] == 0 and third.values == study.trials[0].values
    twin = study_mod.measured_twin(study, space.params(Knobs("model", 2, 0.3, "heuristic", 4)))
    assert twin is not None and twin.number == 3
    assert study_mod.measured_twin(study, space.params(Knobs("model", 1, 0.0, "constant", 4))) is None
