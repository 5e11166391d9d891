"""Content hashes of model folders and workloads."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from profiles.errors import ProfileError
from profiles.hashing import hash_folder, hash_json


def _model(folder: Path, weights: bytes = b"weights") -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"vocab_size": 32}')
    (folder / "model.safetensors").write_bytes(weights)
    (folder / "tokenizer.json").write_text("{}")
    return folder


def test_hash_follows_contents_not_location(tmp_path: Path) -> None:
    original = _model(tmp_path / "a")
    copy = Path(shutil.copytree(original, tmp_path / "b"))
    assert hash_folder(original) == hash_folder(copy)
    (copy / "tokenizer.json").write_text('{"changed": true}')  # not hashed
    assert hash_folder(original) == hash_folder(copy)


def test_hash_changes_when_weights_change(tmp_path: Path) -> None:
    folder = _model(tmp_path / "m")
    before = hash_folder(folder)
    (folder / "model.safetensors").write_bytes(b"retrained weights")
    assert hash_folder(folder) != before


def test_renaming_a_shard_changes_the_hash(tmp_path: Path) -> None:
    folder = _model(tmp_path / "m")
    before = hash_folder(folder)
    (folder / "model.safetensors").rename(folder / "model-00001.safetensors")
    assert hash_folder(folder) != before


@pytest.mark.parametrize(
    "remove, message",
    [("config.json", "no config.json"), ("model.safetensors", "no"), (None, "not a folder")],
)
def test_bad_folders_raise_profile_error(tmp_path: Path, remove: str | None, message: str) -> None:
    folder = _model(tmp_path / "m")
    if remove:
        (folder / remove).unlink()
    with pytest.raises(ProfileError, match=message):
        hash_folder(folder if remove else folder / "config.json")


def test_hash_json_ignores_key_order_and_refuses_non_json() -> None:
    assert hash_json({"a": 1, "b": [1, 2]}) == hash_json({"b": [1, 2], "a": 1})
    assert hash_json({"a": 1}) != hash_json({"a": 2})
    with pytest.raises(ProfileError):
        hash_json({"a": object()})
    with pytest.raises(ProfileError):
        hash_json({"a": float("nan")})
