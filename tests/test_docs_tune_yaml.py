"""docs/tune-yaml.md is what tools/tune_yaml_doc.py makes of the typed config and tune.yaml, so it
cannot drift: a key added, renamed, re-defaulted or re-commented changes the page, and this test
fails until ``python -m tools.tune_yaml_doc`` is rerun and the page committed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from autotune.config import TuneConfig
from tools import tune_yaml_doc


def test_committed_page_is_the_generated_one() -> None:
    committed = tune_yaml_doc.PAGE.read_text(encoding="utf-8")
    assert committed == tune_yaml_doc.render(), (
        "docs/tune-yaml.md is stale: run python -m tools.tune_yaml_doc"
    )


def test_every_key_of_the_typed_config_has_a_row_with_a_default() -> None:
    page = tune_yaml_doc.PAGE.read_text(encoding="utf-8")
    keys = [path for path, _, f in tune_yaml_doc.walk(TuneConfig) if f is not None]
    assert len(keys) > 50
    for path in keys:
        rows = [line for line in page.splitlines() if line.startswith(f"| `{path}` |")]
        assert len(rows) == 1, path
        assert rows[0].split(" | ")[1].strip(), path  # a default (or "required")
    top = {f.name for f in dataclasses.fields(TuneConfig)} - {"source", "raw"}
    assert {p.split(".")[0] for p in keys} == top


def test_defaults_are_the_parsed_ones() -> None:
    """The defaults column is what parse gives for a key left out, not the bundled file's value."""
    d = tune_yaml_doc.defaults()
    assert d["workload.concurrency"] == "[1, 4]" and d["budget.n_trials"] == "20"
    assert d["storage.url"] == "sqlite:///autotune.db" and d["models.target"] == "required"
    assert d["search.max_batch_size"].startswith("[4] (the largest `workload.concurrency`")
    assert d["backend.vllm.cache_dir"] == "~/.cache/spec-autotune/vllm-cache"


def test_comments_join_continuation_lines_and_keep_quoted_hashes() -> None:
    intro, comments = tune_yaml_doc.yaml_comments(
        "# the opening\n\n"
        "a:\n"
        "  b: 1            # first line\n"
        "                  # second line\n"
        "  c: '#not' # why\n"
        "d: x              # engine: in process\n"
        "                  # vllm: a server\n"
    )
    assert intro == ["the opening"]
    assert comments == {
        "a": "",
        "a.b": "first line second line",
        "a.c": "why",
        "d": "engine: in process; vllm: a server",
    }


def test_a_key_no_dataclass_declares_stops_the_generator(tmp_path: Path, monkeypatch) -> None:
    bundled = tune_yaml_doc.TUNE_YAML.read_text(encoding="utf-8")
    extra = tmp_path / "tune.yaml"
    extra.write_text(bundled + "\nsearch_typo:\n  gamma: 3   # a misspelt section\n", encoding="utf-8")
    monkeypatch.setattr(tune_yaml_doc, "TUNE_YAML", extra)
    with pytest.raises(SystemExit, match="search_typo"):
        tune_yaml_doc.render()
