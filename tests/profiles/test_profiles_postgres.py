"""The store and an Optuna study on PostgreSQL, unchanged (fleets share one database).

Runs when AUTOTUNE_TEST_PG_URL names a PostgreSQL database; `.ci/run` installs, starts and
exports one, so CI always runs it.
"""

from __future__ import annotations

import os
import uuid

import pytest

from profiles.store import SCHEMA_VERSION, Store

PG_URL = os.environ.get("AUTOTUNE_TEST_PG_URL")
pytestmark = pytest.mark.skipif(not PG_URL, reason="AUTOTUNE_TEST_PG_URL not set (.ci/run sets it)")


def profile(key: str) -> dict:
    return {
        "device": {"key": key, "label": "PG test device", "kind": "cpu"},
        "pair": {
            "target": "/m/t",
            "draft": "/m/d",
            "drafter": "model",
            "target_hash": key,
            "draft_hash": "d",
        },
        "workload": {"hash": "w"},
        "chosen": {"drafter": "model", "gamma": 3},
        "schedule": [{"batch_size": 1, "gamma": 3}],
        "metrics": {"tokens_per_second": 42.0},
    }


def test_store_round_trip_on_postgres():
    key = uuid.uuid4().hex[:16]
    with Store(PG_URL) as store:
        pid = store.save_profile(profile(key))
        got = store.get_profile(pid)
        assert got["chosen"]["gamma"] == 3 and got["device"]["key"] == key
        assert any(r["id"] == pid for r in store.list_profiles())
        assert store.current_profile(key, key, "d")["id"] == pid
        store.delete_profile(pid)
        assert all(r["id"] != pid for r in store.list_profiles())


def test_optuna_study_shares_the_database():
    import optuna

    name = f"pg-test-{uuid.uuid4().hex[:8]}"
    study = optuna.create_study(study_name=name, storage=PG_URL, directions=["maximize", "minimize"])
    study.optimize(lambda t: (t.suggest_int("gamma", 0, 4), 1.0), n_trials=3)
    again = optuna.load_study(study_name=name, storage=PG_URL)
    assert len(again.trials) == 3
    with Store(PG_URL) as store:  # our prefixed tables live beside Optuna's
        assert store.meta()["schema_version"] == str(SCHEMA_VERSION)
    optuna.delete_study(study_name=name, storage=PG_URL)
