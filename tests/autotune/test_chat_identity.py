"""The workload identity of a chat workload: keyed by the target's chat template; plain ones unchanged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from autotune.config import load_config
from autotune.context import workload_identity
from engine.workload import load_workload
from profiles.hashing import hash_json
from tests.autotune.conftest import write_config

TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"


def identity(tmp_path: Path, pair: tuple[Path, Path], line: dict) -> dict:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps(line) + "\n")
    cfg = load_config(write_config(tmp_path, pair, prompts, tmp_path / "db.sqlite"))
    return workload_identity(cfg, load_workload(prompts))


def test_chat_lines_add_the_template_hash_and_plain_lines_do_not(tiny_pair_dirs, tmp_path) -> None:
    target = Path(shutil.copytree(tiny_pair_dirs[0], tmp_path / "target"))
    (target / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    pair = (target, tiny_pair_dirs[1])
    plain = identity(tmp_path, pair, {"prompt": "def f("})
    assert "chat_template_sha256" not in plain
    assert plain["prompts_sha256"] == hash_json(
        [
            {"prompt": "def f(", "max_new_tokens": None, "temperature": None, "top_k": None, "top_p": None}
            | {"source": None, "line": 1}
        ]
    )
    chat = identity(tmp_path, pair, {"messages": [{"role": "user", "content": "def f("}]})
    assert chat["chat_template_sha256"] == hash_json(TEMPLATE)
    assert chat["prompts_sha256"] != plain["prompts_sha256"]
    assert chat["format"] == "chat" and "format" not in plain


def test_a_chat_tune_records_and_shows_that_its_workload_is_chat(tiny_pair_dirs, tmp_path) -> None:
    """``autotune tune`` on a ``messages`` workload: the stored profile's workload says ``format:
    chat`` with the template's hash, and the summary says so in words; a plain run prints no such line."""
    from autotune.cli.render import render_tune
    from autotune.jobs.tune import run_tune
    from profiles.store import Store

    target = Path(shutil.copytree(tiny_pair_dirs[0], tmp_path / "target"))
    (target / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    prompts = tmp_path / "chat.jsonl"
    turns = [{"role": "user", "content": "def add(a, b):"}], [{"role": "user", "content": "for i in"}]
    prompts.write_text("".join(json.dumps({"messages": t}) + "\n" for t in turns))
    cfg = load_config(write_config(tmp_path, (target, tiny_pair_dirs[1]), prompts, tmp_path / "db.sqlite"))
    profile = run_tune(cfg, say=lambda line: None)
    with Store(cfg.storage.url) as store:
        stored = store.get_profile(profile["id"])
    assert stored["workload"]["format"] == "chat"
    assert stored["workload"]["chat_template_sha256"] == hash_json(TEMPLATE)
    shown = render_tune(stored).splitlines()
    sha = hash_json(TEMPLATE)[:12]
    assert f"workload    chat: {prompts}'s messages in the target's chat template (sha256 {sha})" in shown
    stored["workload"] = {
        k: v for k, v in stored["workload"].items() if k not in ("format", "chat_template_sha256")
    }
    assert not any(line.startswith("workload") for line in render_tune(stored).splitlines())
