"""The SQLite profile store: round trips, atomic saves, newest-profile lookups, WAL."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import event, func, select, update

from profiles.errors import ProfileError, ProfileNotFound
from profiles.store import SCHEMA_VERSION, DeviceRow, MetaRow, PairRow, ProfileRow, Store


def _count(store: Store, row_type: type) -> int:
    with store.engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(row_type)).scalar_one()


def _variant(profile: dict, created_at: str, **device: str) -> dict:
    out = {**profile, "created_at": created_at, "device": {**profile["device"], **device}}
    return out


def test_save_get_list_delete_round_trip(store: Store, profile: dict) -> None:
    profile_id = store.save_profile(profile)
    loaded = store.get_profile(profile_id)
    assert loaded == {**profile, "id": profile_id}

    rows = store.list_profiles()
    assert rows == [
        {
            "id": profile_id,
            "device": "NVIDIA H200 141GB",
            "pair": "llama-target / llama-draft",
            "workload_hash": "w" * 64,
            "gamma": 4,
            "tokens_per_second": 812.5,
            "created_at": "2026-11-30T01:30:00+00:00",
            "backend": "engine",
        }
    ]
    vllm_id = store.save_profile({**profile, "backend": {"name": "vllm", "version": "0.32.0"}})
    assert [r["backend"] for r in store.list_profiles() if r["id"] == vllm_id] == ["vllm"]
    store.delete_profile(vllm_id)

    store.delete_profile(profile_id)
    assert store.list_profiles() == []
    with pytest.raises(ProfileNotFound):
        store.get_profile(profile_id)


def test_round_trip_survives_reopening_the_file(tmp_path: Path, profile: dict) -> None:
    url = f"sqlite:///{tmp_path / 'nested' / 'dir' / 'autotune.db'}"
    with Store(url) as first:
        profile_id = first.save_profile(profile)
    assert (tmp_path / "nested" / "dir" / "autotune.db").is_file()
    with Store(url) as second:
        assert second.get_profile(profile_id)["metrics"] == profile["metrics"]
        assert second.meta() == {
            "schema_version": str(SCHEMA_VERSION),
            "tool_version": second.meta()["tool_version"],
        }


def test_saving_a_loaded_profile_again_drops_its_id(store: Store, profile: dict) -> None:
    first = store.save_profile(profile)
    second = store.save_profile(store.get_profile(first))
    with store.engine.connect() as conn:
        stored = conn.execute(select(ProfileRow.data).where(ProfileRow.id == second)).scalar_one()
    assert second != first and "id" not in stored
    assert store.get_profile(second)["id"] == second


def test_list_on_an_empty_store(store: Store) -> None:
    assert store.list_profiles() == []


def test_unknown_id_raises_profile_not_found(store: Store) -> None:
    with pytest.raises(ProfileNotFound, match="no profile with id 42"):
        store.get_profile(42)
    with pytest.raises(ProfileNotFound):
        store.delete_profile(42)
    assert issubclass(ProfileNotFound, ProfileError) and issubclass(ProfileError, ValueError)


@pytest.mark.parametrize(
    "drop, key",
    [
        ("device", "device"),
        ("pair", "pair.target"),
        ("workload", "workload.hash"),
        ("chosen", "chosen.gamma"),
    ],
)
def test_invalid_profile_leaves_no_rows(store: Store, profile: dict, drop: str, key: str) -> None:
    del profile[drop]
    with pytest.raises(ProfileError, match=f"missing key '{key}'"):
        store.save_profile(profile)
    assert [_count(store, t) for t in (DeviceRow, PairRow, ProfileRow)] == [0, 0, 0]


def test_failure_inside_the_transaction_rolls_back_device_and_pair(store: Store, profile: dict) -> None:
    def boom(*_args: object) -> None:
        raise RuntimeError("disk full")

    event.listen(ProfileRow, "before_insert", boom)
    try:
        with pytest.raises(RuntimeError, match="disk full"):
            store.save_profile(profile)
    finally:
        event.remove(ProfileRow, "before_insert", boom)
    assert [_count(store, t) for t in (DeviceRow, PairRow, ProfileRow)] == [0, 0, 0]


def test_profile_that_is_not_json_is_refused(store: Store, profile: dict) -> None:
    profile["metrics"]["oops"] = object()
    with pytest.raises(ProfileError, match="not JSON-serializable"):
        store.save_profile(profile)
    assert _count(store, DeviceRow) == 0


def test_profile_from_a_newer_schema_is_refused(store: Store, profile: dict) -> None:
    profile["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(ProfileError, match="newer"):
        store.save_profile(profile)


def test_store_from_a_newer_schema_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    with Store(url) as store, store.engine.begin() as conn:
        conn.execute(
            update(MetaRow).where(MetaRow.key == "schema_version").values(value=str(SCHEMA_VERSION + 1))
        )
    with pytest.raises(ProfileError, match="newer"):
        Store(url)


def test_missing_defaults_are_filled_in(store: Store, profile: dict) -> None:
    for key in ("schema_version", "tool_version", "created_at"):
        del profile[key]
    loaded = store.get_profile(store.save_profile(profile))
    assert loaded["schema_version"] == SCHEMA_VERSION
    assert isinstance(loaded["tool_version"], str) and loaded["created_at"].endswith("+00:00")


def test_device_and_pair_are_shared_between_profiles(store: Store, profile: dict) -> None:
    store.save_profile(profile)
    store.save_profile(_variant(profile, "2026-12-01T00:00:00+00:00"))
    assert (_count(store, DeviceRow), _count(store, PairRow), _count(store, ProfileRow)) == (1, 1, 2)


def test_pairs_without_a_draft_are_deduplicated(store: Store) -> None:
    first = store.upsert_pair("/m/t", None, "ngram", "th", None)
    assert store.upsert_pair("/moved/t", None, "ngram", "th", None) == first
    assert store.upsert_pair("/m/t", None, "none", "th", None) != first


def test_current_profile_picks_the_newest_for_host_and_pair(store: Store, profile: dict) -> None:
    old = store.save_profile(_variant(profile, "2026-11-01T00:00:00+00:00"))
    new = store.save_profile(_variant(profile, "2026-11-30T09:00:00+09:00"))  # 00:00 UTC, still newer
    store.save_profile(_variant(profile, "2026-12-31T00:00:00+00:00", key="other-host"))
    found = store.current_profile("ab12cd34ef56", "t" * 64, "d" * 64)
    assert found is not None and found["id"] == new and new != old
    assert store.current_profile("ab12cd34ef56", "t" * 64, None) is None
    assert store.current_profile("unknown", "t" * 64, "d" * 64) is None


def test_current_profile_breaks_time_ties_by_insertion(store: Store, profile: dict) -> None:
    store.save_profile(profile)
    second = store.save_profile(profile)
    assert store.current_profile("ab12cd34ef56", "t" * 64, "d" * 64)["id"] == second


def test_nearest_profile_matches_device_model_not_host(store: Store, profile: dict) -> None:
    here = store.save_profile(_variant(profile, "2026-12-02T00:00:00+00:00", key="this-host"))
    sibling = store.save_profile(_variant(profile, "2026-12-01T00:00:00+00:00", key="sibling"))
    store.save_profile(
        _variant(
            profile, "2026-12-03T00:00:00+00:00", key="a100", label="NVIDIA A100 80GB", name="NVIDIA A100"
        )
    )
    assert store.nearest_profile("NVIDIA H200 141GB")["id"] == here
    assert store.nearest_profile("nvidia h200", exclude_device_key="this-host")["id"] == sibling
    assert store.nearest_profile("NVIDIA H200", target_hash="t" * 64, draft_hash=None) is None
    assert store.nearest_profile("NVIDIA H200", target_hash="t" * 64, draft_hash="d" * 64)["id"] == here
    assert store.nearest_profile("AMD MI300X") is None


def test_measurements_round_trip_and_latest_wins(store: Store) -> None:
    store.upsert_device({"key": "k1", "label": "H200", "kind": "cuda"})
    pair = store.upsert_pair("/m/t", "/m/d", "model", "th", "dh")
    store.save_measurement("k1", pair, "wh", "profiler", {"t_target": [[1, 0.5]]})
    newest = store.save_measurement("k1", pair, "wh", "profiler", {"t_target": [[1, 0.4]]})
    found = store.latest_measurement("k1", pair, "wh", "profiler")
    assert found is not None and found["id"] == newest and found["data"] == {"t_target": [[1, 0.4]]}
    assert store.latest_measurement("k1", pair, "other", "profiler") is None


def test_measurement_needs_a_known_device_and_pair(store: Store) -> None:
    with pytest.raises(ProfileError, match="upsert_device"):
        store.save_measurement("nobody", 1, "wh", "profiler", {})
    store.upsert_device({"key": "k1", "label": "H200", "kind": "cuda"})
    with pytest.raises(ProfileError, match="upsert_pair"):
        store.save_measurement("k1", 99, "wh", "profiler", {})


def test_upsert_device_refreshes_the_fingerprint(store: Store) -> None:
    first = store.upsert_device({"key": "k1", "label": "H200", "kind": "cuda", "driver": "560"})
    assert store.upsert_device({"key": "k1", "label": "H200", "kind": "cuda", "driver": "570"}) == first
    with store.engine.connect() as conn:
        assert conn.execute(select(DeviceRow.fingerprint)).scalar_one()["driver"] == "570"
    with pytest.raises(ProfileError, match="fingerprint.label"):
        store.upsert_device({"key": "k2", "kind": "cuda"})


def test_sqlite_runs_in_wal_mode_with_a_busy_timeout(store: Store) -> None:
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 1000
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def test_tables_are_prefixed_for_sharing_with_optuna(store: Store) -> None:
    with store.engine.connect() as conn:
        names = {row[0] for row in conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE type='table'")}
    assert names == {
        "autotune_meta",
        "autotune_devices",
        "autotune_model_pairs",
        "autotune_measurements",
        "autotune_profiles",
    }


def test_study_name_column_comes_from_the_study_section(store: Store, profile: dict) -> None:
    profile["study"] = {"name": "h200-llama-20261130", "n_trials": 40}
    profile_id = store.save_profile(profile)
    with store.engine.connect() as conn:
        name = conn.execute(select(ProfileRow.study_name).where(ProfileRow.id == profile_id)).scalar_one()
    assert name == "h200-llama-20261130"


def test_bad_urls_and_missing_drivers_are_one_line_errors(tmp_path):
    from profiles.store import redact_url

    with pytest.raises(ProfileError, match=r"driver is not installed") as err:
        Store("mysql+pymysql://u:secret@localhost/db")
    assert "secret" not in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ProfileError, match="cannot open the database"):
        Store("nosuchdialect://u:secret@localhost/db")
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ProfileError, match="cannot open the database"):
        Store(f"sqlite:///{tmp_path}/afile/sub/autotune.db")
    assert redact_url("postgresql://user:pw@host/db") == "postgresql://user:***@host/db"


def test_a_typed_profile_is_stored_as_its_json_and_loads_typed(store, profile) -> None:
    from profiles.schema import Chosen, Profile

    typed = Profile.from_json(profile)
    pid = store.save_profile(typed)
    assert store.get_profile(pid) == {**profile, "id": pid}
    loaded = store.load_profile(pid)
    assert loaded.id == pid and loaded.chosen == Chosen("model", 4, 0.3, "constant", 8, 2, 4)
    assert loaded.to_json() == {**profile, "id": pid}


def test_a_profile_on_a_real_fingerprint_round_trips_and_fills_the_device_row(
    store, real_device_profile
) -> None:
    from profiles.schema import Profile

    fp = real_device_profile["device"]
    pid = store.save_profile(Profile.from_json(real_device_profile))
    assert store.load_profile(pid).to_json() == {**real_device_profile, "id": pid}
    with store.engine.connect() as conn:
        row = conn.execute(
            select(DeviceRow.key, DeviceRow.label, DeviceRow.kind, DeviceRow.fingerprint)
        ).one()
    assert tuple(row) == (fp["key"], fp["label"], "cpu", fp)
    assert store.current_profile(fp["key"], "t" * 64, "d" * 64)["id"] == pid
    assert store.nearest_profile(fp["label"].upper())["id"] == pid  # tune's warm start looks up by label


@pytest.mark.parametrize("version", [SCHEMA_VERSION + 1, 99])
def test_a_stored_profile_of_an_unknown_schema_is_refused_on_load_naming_it(store, profile, version) -> None:
    pid = store.save_profile(profile)
    with store.engine.begin() as conn:  # written by a newer spec-autotune sharing this database
        conn.execute(
            update(ProfileRow).where(ProfileRow.id == pid).values(data={**profile, "schema_version": version})
        )
    with pytest.raises(ProfileError) as err:
        store.load_profile(pid)
    assert str(err.value) == (
        f"profile: schema_version {version} is newer than this spec-autotune reads "
        f"({SCHEMA_VERSION}); upgrade spec-autotune"
    )
