"""benchmarks/_common.py writes results without the machine's absolute paths (repo root, home)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from benchmarks import _common

REPO = Path(__file__).resolve().parents[2]


def test_portable_rewrites_repo_and_home_only_at_path_boundaries() -> None:
    text = '"/srv/app/engine/x", "/srv/app", "/srv/app2/y", "/home/u/.cache", "/home/user"'
    assert (
        _common.portable(text, Path("/srv/app"), "/home/u") == '"<repo>/engine/x", "<repo>", "/srv/app2/y", '
        '"~/.cache", "/home/user"'
    )


def test_write_json_names_no_absolute_machine_path(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    args = argparse.Namespace(
        target=REPO / "engine" / "demo" / "pair" / "target",
        dtype="float32",
        cache=Path(os.path.expanduser("~")) / ".cache" / "x",
        out_dir=tmp_path,
    )
    bench = _common.Bench("probe", args)

    path = _common.write_json(bench, {"where": str(REPO / "benchmarks" / "results")})

    text = path.read_text()
    assert str(REPO) not in text and os.path.expanduser("~") + "/" not in text
    out = json.loads(text)
    assert out["args"]["target"] == "<repo>/engine/demo/pair/target" and out["cwd"] == "<repo>"
    assert out["args"]["cache"] == "~/.cache/x" and out["where"] == "<repo>/benchmarks/results"


def test_committed_results_name_no_path_of_this_machine() -> None:
    home = os.path.expanduser("~")
    for path in (REPO / "benchmarks" / "results").rglob("*"):
        if path.is_file() and path.suffix in (".json", ".txt", ".sh", ".yaml", ".md"):
            text = path.read_text(encoding="utf-8")
            assert str(REPO) not in text and f"{home}/" not in text, f"{path} names a path of this machine"
