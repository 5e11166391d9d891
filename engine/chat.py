"""Chat-formatted prompts: the target's chat template, rendered as transformers renders it.

A workload line may hold ``messages`` (OpenAI chat turns) instead of ``prompt`` text. The engine
turns them into the token ids an instruct model is served with: the target folder's chat template
(``chat_template.jinja``, else tokenizer_config.json ``chat_template``: a string, or a list of
``{name, template}`` of which ``default`` is used) rendered in a jinja2 sandbox with the globals
and filters of transformers' ``apply_chat_template`` (``raise_exception``, ``tojson`` without HTML
escaping, ``strftime_now``, loop controls), the special tokens tokenizer_config.json names
(``bos_token``, ``eos_token``, ...) and ``add_generation_prompt=True``. The rendered text is
encoded without adding special tokens: the template writes the ones the model expects (BOS
included), as ``apply_chat_template(tokenize=True)`` and vLLM's ``/v1/chat/completions`` encode it
(docs/decisions.md#chat-template-encoding).

A request built from such a line (``autotune.workload.runner.ChatRequest``) carries both forms:
the rendered ids for the engine, the turns for a serving stack, which applies its own copy of the
template. This module imports neither torch nor the engine, so reading a workload stays light.

References: transformers ``utils/chat_template_utils.py`` (``_compile_jinja_template``), vLLM
``ChatCompletionRequest.add_special_tokens`` (default false).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast, get_args

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.errors import EngineInputError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

Role = Literal["system", "user", "assistant"]
ROLES: tuple[str, ...] = get_args(Role)

SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
"""The tokenizer_config.json keys a template sees as variables (transformers' ``special_tokens_map``)."""


@dataclass(frozen=True)
class ChatTurn:
    """One message of a conversation."""

    role: Role
    content: str

    def as_dict(self) -> dict[str, str]:
        """The OpenAI wire form, ``{"role": ..., "content": ...}``."""
        return {"role": self.role, "content": self.content}


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: object,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    """The template in the sandbox transformers renders chat templates in."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


@dataclass(frozen=True)
class ChatTemplate:
    """A model folder's chat template and the special tokens it may print."""

    source: str
    special_tokens: tuple[tuple[str, str], ...]
    folder: Path

    def render(self, messages: Sequence[ChatTurn]) -> str:
        """The conversation as the model reads it, ending with the assistant's generation prompt.

        A template that refuses the turns (``raise_exception``, an undefined call) raises
        :class:`EngineInputError` with the template's message.

        Example:
            >>> t = ChatTemplate("{% for m in messages %}{{ m.role }}: {{ m.content }}\\n{% endfor %}"
            ...                  "{% if add_generation_prompt %}assistant:{% endif %}", (), Path("."))
            >>> t.render([ChatTurn("user", "hi")])
            'user: hi\\nassistant:'
        """
        try:
            template = _compile(self.source)
            return template.render(
                messages=[m.as_dict() for m in messages],
                add_generation_prompt=True,
                **dict(self.special_tokens),
            )
        except jinja2.exceptions.TemplateError as exc:
            raise EngineInputError(f"{self.folder}: the chat template refused the messages: {exc}") from None

    def encode(self, tokenizer: Tokenizer, messages: Sequence[ChatTurn]) -> list[int]:
        """The rendered conversation's token ids, without special tokens added on top of the template's."""
        return tokenizer.encode(self.render(messages), add_special_tokens=False).ids


def _token_text(value: object) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _template_source(folder: Path, config: dict[str, object]) -> str | None:
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    source = config.get("chat_template")
    if isinstance(source, list):  # named templates: the default one is the chat template
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    if source is not None and not isinstance(source, str):
        raise EngineInputError(
            f"{folder}/tokenizer_config.json: chat_template must be a string or named templates"
        )
    return source or None


def read_chat_template(folder: str | Path) -> ChatTemplate | None:
    """The folder's chat template, or None when it has none.

    Example:
        >>> read_chat_template("engine/demo/pair/target").folder.name  # doctest: +SKIP
        'target'
    """
    folder = Path(folder)
    config_file = folder / "tokenizer_config.json"
    config: dict[str, object] = {}
    if config_file.is_file():
        try:
            config = json.loads(config_file.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise EngineInputError(f"{config_file}: not valid JSON ({exc})") from None
        if not isinstance(config, dict):
            raise EngineInputError(f"{config_file}: expected a JSON object")
    source = _template_source(folder, config)
    if source is None:
        return None
    tokens = tuple(
        (key, text) for key in SPECIAL_TOKEN_KEYS if (text := _token_text(config.get(key))) is not None
    )
    return ChatTemplate(source, tokens, folder)


def parse_turns(value: object, where: str) -> tuple[ChatTurn, ...]:
    """Validate OpenAI chat turns (a non-empty list of ``{"role", "content"}``); ``where`` prefixes
    each one-line error (``file:line``).

    Example:
        >>> parse_turns([{"role": "user", "content": "hi"}], "w.jsonl:1")
        (ChatTurn(role='user', content='hi'),)
    """
    if not isinstance(value, list) or not value:
        raise EngineInputError(f"{where}: messages must be a non-empty list of chat turns")
    turns = []
    for k, turn in enumerate(value):
        at = f"{where}: messages[{k}]"
        if not isinstance(turn, dict):
            raise EngineInputError(f"{at}: expected a JSON object with role and content")
        unknown = sorted(set(turn) - {"role", "content"})
        if unknown:
            raise EngineInputError(f"{at}: {unknown[0]}: unknown key (keys: role, content)")
        role, content = turn.get("role"), turn.get("content")
        if role not in ROLES:
            raise EngineInputError(f"{at}.role must be one of {', '.join(ROLES)} (got {role!r})")
        if not isinstance(content, str):
            raise EngineInputError(f"{at}.content must be a string (got {type(content).__name__})")
        turns.append(ChatTurn(cast(Role, role), content))
    return tuple(turns)
