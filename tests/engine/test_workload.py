"""Workload files: every malformed line is named by file and line."""

from __future__ import annotations

import json

import pytest

from engine.errors import EngineInputError
from engine.workload import fit_prompt_to_context, load_workload


def write(tmp_path, lines):
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_valid_workload_parses(tmp_path):
    path = write(
        tmp_path,
        [
            json.dumps({"prompt": "def f(", "max_new_tokens": 8, "source": "a.py"}),
            "",
            json.dumps({"prompt": "x = 1", "temperature": 0.5, "top_k": 3, "top_p": 0.9}),
        ],
    )
    items = load_workload(path)
    assert [i.prompt for i in items] == ["def f(", "x = 1"]
    assert items[0].max_new_tokens == 8 and items[1].max_new_tokens is None
    assert items[1].temperature == 0.5 and items[1].top_k == 3 and items[1].top_p == 0.9


@pytest.mark.parametrize(
    "line, needle",
    [
        ("{not json", "prompts.jsonl:2: malformed JSON"),
        (json.dumps({"prompt": ""}), "prompts.jsonl:2: prompt must be a non-empty string"),
        (json.dumps({"text": "x"}), "prompts.jsonl:2: prompt must be a non-empty string"),
        (
            json.dumps({"prompt": "x", "max_new_tokens": -3}),
            "prompts.jsonl:2: max_new_tokens must be >= 1 (got -3)",
        ),
        (
            json.dumps({"prompt": "x", "max_new_tokens": 2.5}),
            "prompts.jsonl:2: max_new_tokens must be an integer",
        ),
        (json.dumps({"prompt": "x", "top_p": 1.5}), "prompts.jsonl:2: top_p must be in [0.0, 1.0] (got 1.5)"),
        (json.dumps(["x"]), "prompts.jsonl:2: expected a JSON object"),
    ],
)
def test_bad_lines_are_named(tmp_path, line, needle):
    path = write(tmp_path, [json.dumps({"prompt": "ok"}), line])
    with pytest.raises(EngineInputError) as err:
        load_workload(path)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(EngineInputError, match="not found"):
        load_workload(tmp_path / "nope.jsonl")
    with pytest.raises(EngineInputError, match="no prompts"):
        load_workload(write(tmp_path, [""]))


def test_long_prompt_rejected_with_length_and_limit_or_truncated():
    ids = list(range(50))
    with pytest.raises(EngineInputError, match="50 tokens, longer than the limit of 20"):
        fit_prompt_to_context(ids, 20, "w.jsonl: prompt 3")
    assert fit_prompt_to_context(ids, 20, "w", truncate=True) == ids[-20:]
    assert fit_prompt_to_context(ids, 50, "w") == ids


@pytest.mark.parametrize("limit", [0, -5])
def test_no_room_left_by_max_new_tokens_is_refused_even_with_truncation(limit):
    """``ids[-0:]`` would keep the whole prompt: max_new_tokens alone fills the context."""
    with pytest.raises(EngineInputError, match=rf"limit of {limit} .*; lower max_new_tokens$"):
        fit_prompt_to_context([1, 2, 3], limit, "w.jsonl:2", truncate=True)


# ------------------------------------------------------------------------------------------
# Chat lines: ``messages`` instead of ``prompt``

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "def f("}]


def test_a_messages_line_parses_into_chat_turns(tmp_path):
    path = write(tmp_path, [json.dumps({"messages": CHAT, "max_new_tokens": 5}), json.dumps({"prompt": "x"})])
    chat, plain = load_workload(path)
    assert chat.prompt == "" and [m.as_dict() for m in chat.messages] == CHAT and chat.max_new_tokens == 5
    assert plain.prompt == "x" and plain.messages == ()


def test_a_plain_lines_identity_is_its_fields_alone(tmp_path):
    """Plain workloads keep the hash they had before chat lines existed: no ``messages`` key."""
    (plain,) = load_workload(write(tmp_path, [json.dumps({"prompt": "x", "top_k": 3})]))
    assert plain.identity() == {
        "prompt": "x",
        "max_new_tokens": None,
        "temperature": None,
        "top_k": 3,
        "top_p": None,
        "source": None,
        "line": 1,
    }
    (chat,) = load_workload(write(tmp_path, [json.dumps({"messages": CHAT})]))
    assert chat.identity()["messages"] == CHAT


@pytest.mark.parametrize(
    "line, needle",
    [
        (
            json.dumps({"prompt": "x", "messages": CHAT}),
            "prompts.jsonl:2: prompt, messages: give one of them, not both",
        ),
        (json.dumps({"messages": []}), "prompts.jsonl:2: messages must be a non-empty list of chat turns"),
        (json.dumps({"messages": "hi"}), "prompts.jsonl:2: messages must be a non-empty list of chat turns"),
        (json.dumps({"messages": ["hi"]}), "prompts.jsonl:2: messages[0]: expected a JSON object"),
        (
            json.dumps({"messages": [{"role": "bot", "content": "x"}]}),
            "prompts.jsonl:2: messages[0].role must be one of system, user, assistant (got 'bot')",
        ),
        (
            json.dumps({"messages": [{"role": "user", "content": ["x"]}]}),
            "prompts.jsonl:2: messages[0].content must be a string (got list)",
        ),
        (
            json.dumps({"messages": [{"role": "user", "content": "x", "name": "a"}]}),
            "prompts.jsonl:2: messages[0]: name: unknown key",
        ),
        (
            json.dumps({"messages": [*CHAT, {"role": "assistant", "content": "x"}]}),
            "prompts.jsonl:2: messages must end with a user turn",
        ),
    ],
)
def test_bad_messages_lines_are_named(tmp_path, line, needle):
    path = write(tmp_path, [json.dumps({"prompt": "ok"}), line])
    with pytest.raises(EngineInputError) as err:
        load_workload(path)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_the_demo_chat_workload_renders_with_the_demo_targets_template():
    from tokenizers import Tokenizer

    from engine.chat import read_chat_template
    from engine.demo import DEMO_DIR, DEMO_TARGET

    items = load_workload(DEMO_DIR / "chat.jsonl")
    template = read_chat_template(DEMO_TARGET)
    assert 10 <= len(items) <= 20 and all(i.messages for i in items) and template is not None
    tok = Tokenizer.from_file(str(DEMO_TARGET / "tokenizer.json"))
    for item in items:
        ids = template.encode(tok, item.messages)
        assert ids[0] == tok.token_to_id("<|endoftext|>") and len(ids) + item.max_new_tokens < 1024
