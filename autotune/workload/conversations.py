"""Chat datasets as workloads: ShareGPT and OpenAI chat files to ``messages`` workload lines.

``autotune workload import`` reads one conversation per JSONL line (a ShareGPT file may also be
one JSON array, as the dataset is published) and writes one workload line per conversation,
cut after its last user turn: the assistant's reply is what the model generates. Formats:

- ``sharegpt``: ``{"conversations": [{"from": "human"|"gpt"|"system", "value": text}, ...]}``
  (human is the user, gpt the assistant);
- ``openai-chat``: ``{"messages": [{"role": "system"|"user"|"assistant", "content": text}, ...]}``
  (a turn's other keys, such as ``name`` or ``weight``, are dropped).

A malformed conversation is refused in one line naming the file and its line (or array item).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal, get_args

from engine.chat import ChatTurn, parse_turns
from engine.errors import EngineInputError

Format = Literal["sharegpt", "openai-chat"]
FORMATS: tuple[str, ...] = get_args(Format)

SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "system": "system"}
"""ShareGPT's speaker names and the chat roles they become."""


def _sharegpt_turns(obj: object, where: str) -> tuple[ChatTurn, ...]:
    turns = obj.get("conversations") if isinstance(obj, dict) else None
    if not isinstance(turns, list) or not turns:
        raise EngineInputError(f'{where}: expected {{"conversations": [{{"from": ..., "value": ...}}, ...]}}')
    messages = []
    for k, turn in enumerate(turns):
        speaker = turn.get("from") if isinstance(turn, dict) else None
        if speaker not in SHAREGPT_ROLES:
            raise EngineInputError(
                f"{where}: conversations[{k}].from must be one of {', '.join(SHAREGPT_ROLES)} (got {speaker!r})"
            )
        messages.append({"role": SHAREGPT_ROLES[speaker], "content": turn.get("value")})
    return parse_turns(messages, where)


def _openai_turns(obj: object, where: str) -> tuple[ChatTurn, ...]:
    turns = obj.get("messages") if isinstance(obj, dict) else None
    if not isinstance(turns, list):
        raise EngineInputError(f'{where}: expected {{"messages": [{{"role": ..., "content": ...}}, ...]}}')
    kept = [
        {k: v for k, v in t.items() if k in ("role", "content")} if isinstance(t, dict) else t for t in turns
    ]
    return parse_turns(kept, where)


READERS: dict[str, Callable[[object, str], tuple[ChatTurn, ...]]] = {
    "sharegpt": _sharegpt_turns,
    "openai-chat": _openai_turns,
}


def up_to_last_user_turn(turns: tuple[ChatTurn, ...], where: str) -> tuple[ChatTurn, ...]:
    """The conversation up to its last user turn (the model answers it).

    Example:
        >>> t = (ChatTurn("user", "hi"), ChatTurn("assistant", "hello"))
        >>> up_to_last_user_turn(t, "f:1")
        (ChatTurn(role='user', content='hi'),)
    """
    last = max((k for k, t in enumerate(turns) if t.role == "user"), default=None)
    if last is None:
        raise EngineInputError(f"{where}: no user turn (nothing for the model to answer)")
    return turns[: last + 1]


def _records(path: Path) -> Iterator[tuple[str, object]]:
    """``(where, parsed JSON)`` per conversation: JSONL lines, or the items of one JSON array."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise EngineInputError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise EngineInputError(f"{path}:{exc.lineno}: malformed JSON ({exc.msg})") from None
        yield from ((f"{path}: item {k}", item) for k, item in enumerate(items))
        return
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield f"{path}:{lineno}", json.loads(line)
        except json.JSONDecodeError as exc:
            raise EngineInputError(f"{path}:{lineno}: malformed JSON ({exc.msg})") from None


def read_conversations(path: str | Path, fmt: Format) -> list[tuple[str, tuple[ChatTurn, ...]]]:
    """Every conversation of a chat dataset, each cut after its last user turn, with where it came from.

    Example:
        >>> read_conversations("sharegpt.json", "sharegpt")  # doctest: +SKIP
        [('sharegpt.json: item 0', (ChatTurn(role='user', content='Hi'),)), ...]
    """
    path = Path(path)
    if not path.is_file():
        raise EngineInputError(f"{path}: file not found")
    read = READERS[fmt]
    out = [(where, up_to_last_user_turn(read(obj, where), where)) for where, obj in _records(path)]
    if not out:
        raise EngineInputError(f"{path}: no conversations")
    return out


def sample_conversations(items: list, n: int | None, seed: int) -> list:
    """``n`` of ``items`` drawn with ``seed``, in file order (all of them when ``n`` is None).

    Example:
        >>> sample_conversations(list("abcdef"), 3, seed=0)
        ['a', 'd', 'f']
    """
    if n is None:
        return items
    if not 1 <= n <= len(items):
        raise EngineInputError(f"--sample must be in [1, {len(items)}] (the file's conversations; got {n})")
    return [items[k] for k in sorted(random.Random(seed).sample(range(len(items)), n))]


def workload_lines(conversations: list[tuple[str, tuple[ChatTurn, ...]]]) -> list[str]:
    """JSONL workload lines (``messages`` and ``source``: where the conversation was read)."""
    return [
        json.dumps({"messages": [t.as_dict() for t in turns], "source": where}, ensure_ascii=False)
        for where, turns in conversations
    ]
