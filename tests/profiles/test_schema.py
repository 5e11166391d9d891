"""``profiles.schema``: the typed profile reads and writes the stored JSON unchanged."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from profiles.errors import ProfileError
from profiles.profile import SCHEMA_VERSION
from profiles.reading import migrate
from profiles.schema import (
    MISSING,
    BatchSchedule,
    Chosen,
    LevelDecision,
    Profile,
    Ratio,
    ScheduleEntry,
    TableDecision,
)
from profiles.store import Store

# A profile `autotune tune --backend vllm` stored at schema version 1, as its store row held it (the
# profile the watch was held against in 87704fb:benchmarks/results/watch_drift_vllm_amx_saturation.json).
STORED_V1 = Path(__file__).parent / "data" / "stored_v1_vllm.json"


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


def _as_version_2(v1: dict) -> dict:
    """What version 2 stores for ``v1``, written out by hand: the version, and each level's
    ``over_chosen`` as ``{value, ci95, n}``."""
    out = copy.deepcopy(v1)
    out["schema_version"] = 2
    for level in out["table_decision"]["levels"]:
        if (over := level.get("over_chosen")) is not None:
            level["over_chosen"] = {
                "value": over["value"],
                "ci95": [over["low"], over["high"]],
                "n": over["n"],
            }
    return out


def test_a_stored_version_1_profile_reads_as_its_version_2_form(tmp_path) -> None:
    """The stored version-1 profile through every reader: the JSON, a store row written as it was
    (SQLite; Postgres rows hold the same JSON), and a profile.yaml as the version-1 export dumped it.
    Each is the version-2 profile: the typed ``table_decision`` with the measured ratios at batch 8
    and 16, everything else as stored."""
    v1 = json.loads(STORED_V1.read_text())
    assert v1["schema_version"] == 1
    typed = Profile.from_json(v1)
    assert typed.schema_version == SCHEMA_VERSION == 2
    levels = typed.table_decision.levels
    assert [lv.batch_size for lv in levels if lv.over_chosen is not MISSING] == [8, 16]
    over = v1["table_decision"]["levels"][3]["over_chosen"]
    assert levels[3].over_chosen == Ratio(over["value"], over["low"], over["high"], 6)
    out = typed.to_json()
    assert out == _as_version_2(v1) and json.dumps(out) == json.dumps(_as_version_2(v1))  # key order too
    assert Profile.from_json(out) == typed and Profile.from_json(out).to_json() == out
    with Store(f"sqlite:///{tmp_path / 'autotune.db'}") as store:
        pid = store.save_profile(v1)
        assert store.get_profile(pid)["schema_version"] == 1  # the row is not rewritten
        assert pid == v1["id"] and store.load_profile(pid) == typed
    exported = yaml.safe_dump(v1, sort_keys=False, allow_unicode=True, default_flow_style=False)
    assert Profile.from_json(yaml.safe_load(exported)) == typed
    assert v1["schema_version"] == 1 and "low" in over  # reading changed nothing of the input


def test_migrate_leaves_the_current_schema_and_refuses_an_unknown_old_one() -> None:
    current = {
        "schema_version": SCHEMA_VERSION,
        "table_decision": {"levels": [{"batch_size": 1, "gamma": 2}]},
    }
    assert migrate(current) is current and migrate({"chosen": {}}) == {"chosen": {}}
    with pytest.raises(ProfileError, match="schema_version 0 is older than any this spec-autotune reads"):
        migrate({"schema_version": 0})


def test_table_decision_round_trips_typed_and_names_a_bad_key() -> None:
    data = {
        "levels": [
            {"batch_size": 1, "gamma": 3, "tokens_per_second": 150.0, "reason": "faster"},
            {
                "batch_size": 4,
                "gamma": 0,
                "tokens_per_second": 200,
                "reason": "kept",
                "over_chosen": {"value": 1.2, "ci95": [1.1, 1.3], "n": 3},
                "note": "hand-written",
            },
        ],
        "table": [[1, 3], [4, 0]],
        "served": True,
        "won": False,
        "per_level": [],
        "reason": "one K",
    }
    typed = TableDecision.from_json(data)
    assert typed.table == ((1, 3), (4, 0)) and typed.won is False and typed.trace_tokens_per_second is MISSING
    assert typed.levels[1] == LevelDecision(
        4, 0, 200, "kept", Ratio(1.2, 1.1, 1.3, 3), {"note": "hand-written"}
    )
    assert typed.to_json() == data and json.dumps(typed.to_json()) == json.dumps(data)
    assert TableDecision.from_json({}).to_json() == {}
    bad = [
        ({"levels": [{"gamma": 1}]}, r"missing key 'table_decision.levels\[0\].batch_size'"),
        ({"levels": [{"batch_size": 1, "gamma": -1}]}, r"'table_decision.levels\[0\].gamma' must be >= 0"),
        ({"table": [[1, 2, 3]]}, r"'table_decision.table' must be \[batch_size, K\] pairs"),
        ({"won": "yes"}, r"'table_decision.won' must be bool"),
    ]
    ratio = {"value": 0.0, "ci95": [0.9, 1.1], "n": 3}
    bad.append(
        ({"levels": [{"batch_size": 1, "gamma": 1, "over_chosen": ratio}]}, r"over_chosen.value' must be > 0")
    )
    for decision, message in bad:
        with pytest.raises(ProfileError, match=message):
            TableDecision.from_json(decision)
