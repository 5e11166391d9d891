"""``profiles.schema``: the typed profile reads and writes the stored JSON unchanged."""

from __future__ import annotations

import copy
import json

import pytest

from profiles.errors import ProfileError
from profiles.profile import SCHEMA_VERSION
from profiles.schema import MISSING, BatchSchedule, Chosen, Profile, ScheduleEntry


def test_the_sample_profile_round_trips_with_its_key_order(profile) -> None:
    typed = Profile.from_json(profile)
    assert typed.chosen == Chosen("model", 4, 0.3, "constant", 8, 2, 4)
    assert (
        typed.schedule.pairs() == ((1, 5), (2, 4), (4, 2), (8, 0))
        and typed.schedule.crossover_batch_size == 8
    )
    out = typed.to_json()
    assert out == profile and list(out) == list(profile)
    assert json.dumps(out) == json.dumps(profile)


def test_a_profile_built_from_types_has_the_stored_key_order() -> None:
    entries = (
        ScheduleEntry(1, 4, 20.0, 10.0, {"value": 2.0, "ci95": [1.5, 2.5], "n": 3}, True),
        ScheduleEntry(8, 0, None, None),
    )
    typed = Profile(
        tool_version="0.1.0",
        created_at="2026-11-30T00:00:00+00:00",
        device={"key": "k", "label": "cpu"},
        chosen=Chosen("ngram", 3, 0.0, "heuristic", 4, 2, 4),
        schedule=BatchSchedule(entries, 8),
        metrics={"tokens_per_second": 1.0},
        knee_tokens=None,
        id=7,
    )
    out = typed.to_json()
    assert list(out) == [
        "schema_version",
        "tool_version",
        "created_at",
        "device",
        "chosen",
        "schedule",
        "crossover_batch_size",
        "metrics",
        "knee_tokens",
        "id",
    ]
    assert out["schema_version"] == SCHEMA_VERSION and out["knee_tokens"] is None
    # a null is kept (no gamma-0 measurement there), an absent key stays absent (no paired repeats)
    assert out["schedule"] == [
        {
            "batch_size": 1,
            "gamma": 4,
            "tokens_per_second": 20.0,
            "baseline_tokens_per_second": 10.0,
            "ratio": {"value": 2.0, "ci95": [1.5, 2.5], "n": 3},
            "significant": True,
        },
        {"batch_size": 8, "gamma": 0, "tokens_per_second": None, "baseline_tokens_per_second": None},
    ]
    assert Profile.from_json(out) == typed


def test_absent_keys_stay_absent_and_unknown_keys_are_kept(profile) -> None:
    old = copy.deepcopy(profile)
    del old["schema_version"], old["crossover_batch_size"]
    old["chosen"] = {"drafter": "model", "gamma": 2, "note": "hand-written"}
    old["future_section"] = {"x": 1}
    typed = Profile.from_json(old)
    assert typed.schema_version is MISSING and typed.schedule.crossover_batch_size is MISSING
    assert typed.chosen.confidence_threshold is MISSING and typed.chosen.threshold == 0.0
    assert typed.chosen.gamma_policy == "constant" and typed.chosen.extra == {"note": "hand-written"}
    assert typed.extra == {"future_section": {"x": 1}}
    assert typed.to_json() == old and list(typed.to_json()) == list(old)


def test_a_newer_schema_is_refused(profile) -> None:
    with pytest.raises(ProfileError, match=f"schema_version {SCHEMA_VERSION + 1} is newer"):
        Profile.from_json({**profile, "schema_version": SCHEMA_VERSION + 1})


@pytest.mark.parametrize(
    ("chosen", "message"),
    [
        ({"gamma": 4}, "missing key 'chosen.drafter'"),
        (
            {"drafter": "eagle", "gamma": 4},
            "'chosen.drafter' must be one of model, ngram, hybrid, eagle3, none",
        ),
        ({"drafter": "model", "gamma": -1}, "'chosen.gamma' must be >= 0"),
        (
            {"drafter": "model", "gamma": 1, "confidence_threshold": 1.5},
            r"'chosen.confidence_threshold' must be in \[0, 1\]",
        ),
        (
            {"drafter": "model", "gamma": 1, "gamma_schedule": "adaptive"},
            "'chosen.gamma_schedule' must be one of",
        ),
        (
            {"drafter": "ngram", "gamma": 1, "prompt_lookup_min": 5, "prompt_lookup_max": 2},
            "prompt_lookup_min",
        ),
        ({"drafter": "model", "gamma": 1, "max_batch_size": 0}, "'chosen.max_batch_size' must be >= 1"),
    ],
)
def test_chosen_refuses_what_exporters_cannot_use(chosen: dict, message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        Chosen.from_json(chosen)


def test_a_schedule_entry_needs_batch_size_and_gamma() -> None:
    with pytest.raises(ProfileError, match=r"missing key 'schedule\[1\].gamma'"):
        BatchSchedule.from_json([{"batch_size": 1, "gamma": 2}, {"batch_size": 4}])
