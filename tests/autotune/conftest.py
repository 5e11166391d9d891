"""Fixtures of the tuning tests: a tune.yaml writer and a database holding a real profiler measurement."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import yaml

from autotune import context
from autotune.config import load_config

PROMPTS = ["def add(a, b):\n", "for i in range(10):\n", "class Point:\n"]
N_TRIALS = 3


def write_config(folder: Path, pair: tuple[Path, Path], prompts: Path, db: Path, **overrides) -> Path:
    target, draft = pair
    raw = {
        "models": {
            "target": str(target),
            "draft": str(draft),
            "device": "cpu",
            "dtype": "float32",
            "compile": False,
        },
        "workload": {"prompts": str(prompts), "max_new_tokens": 6, "concurrency": [1, 2], "num_requests": 2},
        "search": {
            "drafter": ["model"],
            "gamma": {"low": 0, "high": 2},
            "confidence_threshold": {"low": 0.0, "high": 0.5},
            "max_batch_size": [2],
        },
        "budget": {"n_trials": N_TRIALS, "seed": 0, "remeasure_top": 1},
        "storage": {"url": f"sqlite:///{db}"},
        "export": {"formats": ["vllm", "yaml"], "dir": str(folder / "exports")},
        "profile": {"gamma_max": 2},
    }
    for section, values in overrides.items():
        raw[section] = {**raw.get(section, {}), **values}
    path = folder / "tune.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_pair_dirs):
    """A prompts file and a database holding a real profiler measurement for this workload."""
    root = tmp_path_factory.mktemp("study-template")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    db = root / "template.db"
    cfg = load_config(write_config(root, tiny_pair_dirs, prompts, db))
    ctx = context.build(cfg)
    _, reused = context.ensure_profile(ctx)
    ctx.store.close()
    assert not reused
    return prompts, db


@pytest.fixture
def tune_config(tmp_path, tiny_pair_dirs, template):
    """``tune_config(**overrides)`` -> a TuneConfig whose database starts as a copy of the template."""
    prompts, template_db = template
    db = tmp_path / "autotune.db"
    with sqlite3.connect(template_db) as src, sqlite3.connect(db) as dst:
        src.backup(dst)

    def make(**overrides):
        return load_config(write_config(tmp_path, tiny_pair_dirs, prompts, db, **overrides))

    return make
