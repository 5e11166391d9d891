"""``autotune workload import``: ShareGPT and OpenAI chat files to ``messages`` workloads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from autotune.cli import main
from engine.workload import load_workload

SHAREGPT = [
    {
        "id": "a",
        "conversations": [
            {"from": "system", "value": "You write Python."},
            {"from": "human", "value": "def add(a, b):"},
            {"from": "gpt", "value": "    return a + b"},
            {"from": "human", "value": "class Point:"},
            {"from": "gpt", "value": "    pass"},
        ],
    },
    {"id": "b", "conversations": [{"from": "human", "value": "import os"}]},
]
OPENAI = [
    {"messages": [{"role": "user", "content": "for i in range(3):"}, {"role": "assistant", "content": "x"}]},
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "while True:", "name": "dev"},
        ]
    },
]


def invoke(*args: object):
    return CliRunner().invoke(main, ["workload", "import", *(str(a) for a in args)])


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def one_line_error(result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ")
    return line


def messages(path: Path) -> list[list[dict]]:
    return [[m.as_dict() for m in item.messages] for item in load_workload(path)]


@pytest.mark.parametrize("layout", ["jsonl", "array"])
def test_sharegpt_conversations_end_at_their_last_user_turn(tmp_path, layout) -> None:
    src = tmp_path / "sharegpt.json"
    if layout == "array":  # the dataset as published: one JSON array
        src.write_text(json.dumps(SHAREGPT, indent=1))
    else:
        write_jsonl(src, SHAREGPT)
    out = tmp_path / "chat.jsonl"
    result = invoke(src, "--format", "sharegpt", "--out", out)
    assert result.exit_code == 0, result.output
    assert result.stdout == f"wrote 2 conversations (5 turns) to {out}\n"
    assert messages(out) == [
        [
            {"role": "system", "content": "You write Python."},
            {"role": "user", "content": "def add(a, b):"},
            {"role": "assistant", "content": "    return a + b"},
            {"role": "user", "content": "class Point:"},
        ],
        [{"role": "user", "content": "import os"}],
    ]
    where = f"{src}: item 1" if layout == "array" else f"{src}:2"
    assert load_workload(out)[1].source == where


def test_openai_chat_lines_keep_role_and_content(tmp_path) -> None:
    src = write_jsonl(tmp_path / "chat.jsonl", OPENAI)
    out = tmp_path / "w.jsonl"
    assert invoke(src, "--format", "openai-chat", "--out", out).exit_code == 0
    assert messages(out) == [
        [{"role": "user", "content": "for i in range(3):"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "while True:"}],
    ]


def test_sample_draws_n_conversations_by_seed_in_file_order(tmp_path) -> None:
    rows = [{"messages": [{"role": "user", "content": f"line {k}"}]} for k in range(20)]
    src = write_jsonl(tmp_path / "chat.jsonl", rows)

    def drawn(seed: int) -> list[str]:
        out = tmp_path / f"s{seed}.jsonl"
        assert (
            invoke(src, "--format", "openai-chat", "--sample", 5, "--seed", seed, "--out", out).exit_code == 0
        )
        return [m[0]["content"] for m in messages(out)]

    first = drawn(1)
    assert len(first) == 5 and first == sorted(first, key=lambda s: int(s.split()[1]))
    assert drawn(1) == first and drawn(2) != first
    line = one_line_error(
        invoke(src, "--format", "openai-chat", "--sample", 21, "--out", tmp_path / "x.jsonl")
    )
    assert "--sample must be in [1, 20]" in line


@pytest.mark.parametrize(
    "fmt, row, needle",
    [
        ("sharegpt", "{not json", "in.jsonl:2: malformed JSON"),
        (
            "sharegpt",
            {"conversations": [{"from": "bing", "value": "x"}]},
            "in.jsonl:2: conversations[0].from must be",
        ),
        ("sharegpt", {"messages": []}, 'in.jsonl:2: expected {"conversations"'),
        ("sharegpt", {"conversations": [{"from": "gpt", "value": "x"}]}, "in.jsonl:2: no user turn"),
        (
            "openai-chat",
            {"messages": [{"role": "tool", "content": "x"}]},
            "in.jsonl:2: messages[0].role must be",
        ),
        ("openai-chat", {"conversations": []}, 'in.jsonl:2: expected {"messages"'),
        (
            "openai-chat",
            {"messages": [{"role": "user", "content": None}]},
            "in.jsonl:2: messages[0].content must",
        ),
    ],
)
def test_a_bad_line_is_one_line_naming_it(tmp_path, fmt, row, needle) -> None:
    good = SHAREGPT[1] if fmt == "sharegpt" else OPENAI[0]
    src = write_jsonl(tmp_path / "in.jsonl", [good, row])
    out = tmp_path / "w.jsonl"
    assert needle in one_line_error(invoke(src, "--format", fmt, "--out", out))
    assert not out.exists()


def test_an_imported_workload_runs_in_bench(tiny_pair_dirs, tmp_path) -> None:
    """The imported file is a workload the engine renders with the target's chat template."""
    target = Path(shutil.copytree(tiny_pair_dirs[0], tmp_path / "target"))
    config = {
        "chat_template": "{% for m in messages %}{{ m['content'] }}\n{% endfor %}",
        "bos_token": "<|endoftext|>",
    }
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    src = write_jsonl(tmp_path / "chat.jsonl", OPENAI)
    out = tmp_path / "w.jsonl"
    assert invoke(src, "--format", "openai-chat", "--out", out).exit_code == 0
    args = ["bench", "--target", target, "--draft", tiny_pair_dirs[1], "--prompts", out, "--device", "cpu"]
    result = CliRunner().invoke(
        main, [str(a) for a in [*args, "--max-new-tokens", 4, "--num-requests", 2, "--json"]]
    )
    assert result.exit_code == 0, result.output
    bare = CliRunner().invoke(main, [str(a) for a in [*args[:2], tiny_pair_dirs[0], *args[3:]]])
    assert f"{tiny_pair_dirs[0]} has none" in one_line_error(bare)
