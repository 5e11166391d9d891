"""Workload files: JSONL prompts a load run replays.

One JSON object per line::

    {"prompt": "def parse(", "max_new_tokens": 64, "temperature": 0.0, "top_k": 0, "top_p": 1.0,
     "source": "json/decoder.py"}

or a conversation in OpenAI chat format, rendered with the target's chat template (engine.chat)::

    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}

Exactly one of ``prompt`` (non-empty text) and ``messages`` (system/user/assistant turns, the
last one the user's: the model writes the reply) is required; ``max_new_tokens`` (>= 1) and the
sampling keys are optional and default to the run's settings; ``source`` is informational. Every
problem is reported as ``<file>:<line>: <what>``. A prompt longer than the model's context is refused with
its length and the limit, unless the caller asked for truncation (keep the last tokens).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from engine.chat import ChatTurn, parse_turns
from engine.errors import EngineInputError


@dataclass(frozen=True)
class WorkloadItem:
    """One workload line: ``prompt`` text, or (``prompt`` empty) the chat turns in ``messages``."""

    prompt: str
    max_new_tokens: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    source: str | None = None
    line: int = 0  # line number in the workload file (for error messages)
    messages: tuple[ChatTurn, ...] = ()

    def identity(self) -> dict[str, object]:
        """The line as the workload hash reads it; ``messages`` appears only on a chat line, so a
        plain line hashes as its fields alone."""
        fields = {k: v for k, v in self.__dict__.items() if k != "messages"}
        return {**fields, "messages": [m.as_dict() for m in self.messages]} if self.messages else fields


def _prompt_or_messages(path: Path, lineno: int, obj: dict[str, object]) -> tuple[str, tuple[ChatTurn, ...]]:
    """The line's ``prompt`` text or its chat turns (exactly one of the two)."""
    where = f"{path}:{lineno}"
    if "messages" not in obj:
        prompt = obj.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise EngineInputError(
                f"{where}: prompt must be a non-empty string (or give messages, a list of chat turns)"
            )
        return prompt, ()
    if "prompt" in obj:
        raise EngineInputError(f"{where}: prompt, messages: give one of them, not both")
    turns = parse_turns(obj["messages"], where)
    if turns[-1].role != "user":
        raise EngineInputError(
            f"{where}: messages must end with a user turn (the model writes the reply; "
            f"got {turns[-1].role!r})"
        )
    return "", turns


_N = TypeVar("_N", int, float)


def _check_number(
    path: Path, lineno: int, key: str, value: object, kind: type[_N], lo: float, hi: float | None = None
) -> _N | None:
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (kind is int and not isinstance(value, int))
    ):
        raise EngineInputError(
            f"{path}:{lineno}: {key} must be {'an integer' if kind is int else 'a number'} (got {value!r})"
        )
    if value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise EngineInputError(f"{path}:{lineno}: {key} must be {bound} (got {value})")
    return kind(value)


def load_workload(path: str | Path) -> list[WorkloadItem]:
    """Parse and validate a JSONL workload file.

    Example:
        >>> items = load_workload("engine/demo/prompts.jsonl")  # doctest: +SKIP
    """
    path = Path(path)
    if not path.is_file():
        raise EngineInputError(f"{path}: workload file not found")
    items: list[WorkloadItem] = []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise EngineInputError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EngineInputError(f"{path}:{lineno}: malformed JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise EngineInputError(f"{path}:{lineno}: expected a JSON object")
        prompt, messages = _prompt_or_messages(path, lineno, obj)
        items.append(
            WorkloadItem(
                prompt=prompt,
                messages=messages,
                max_new_tokens=_check_number(
                    path, lineno, "max_new_tokens", obj.get("max_new_tokens"), int, 1
                ),
                temperature=_check_number(path, lineno, "temperature", obj.get("temperature"), float, 0.0),
                top_k=_check_number(path, lineno, "top_k", obj.get("top_k"), int, 0),
                top_p=_check_number(path, lineno, "top_p", obj.get("top_p"), float, 0.0, 1.0),
                source=obj.get("source"),
                line=lineno,
            )
        )
    if not items:
        raise EngineInputError(f"{path}: no prompts")
    return items


def fit_prompt_to_context(ids: list[int], limit: int, where: str, truncate: bool = False) -> list[int]:
    """Check a tokenized prompt against the context ``limit`` (or keep its last tokens).

    ``limit`` is the room the context leaves for the prompt (context minus max_new_tokens); when
    it leaves none, truncation cannot help and the prompt is refused.

    Example:
        >>> fit_prompt_to_context([1, 2, 3, 4], 3, "w.jsonl:1", truncate=True)
        [2, 3, 4]
    """
    if len(ids) <= limit:
        return ids
    if truncate and limit > 0:
        return ids[-limit:]
    fix = "shorten it or ask for truncation" if limit > 0 else "lower max_new_tokens"
    raise EngineInputError(
        f"{where}: prompt is {len(ids)} tokens, longer than the limit of {limit} "
        f"(context minus max_new_tokens); {fix}"
    )
