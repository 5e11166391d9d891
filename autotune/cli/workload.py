"""``autotune workload import``: a chat dataset as a ``messages`` workload (tune.yaml ``workload.prompts``).

The work is :mod:`autotune.workload.conversations`; this module reads the flags and writes the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import click

from autotune.workload.conversations import FORMATS, Format


@click.group()
def workload() -> None:
    """Prepare workload files (JSONL prompts or chat conversations)."""


@workload.command("import")
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    required=True,
    help="sharegpt: {conversations: [{from: human|gpt|system, value}]}; "
    "openai-chat: {messages: [{role, content}]}. One conversation per JSONL line "
    "(ShareGPT also as one JSON array).",
)
@click.option(
    "--sample",
    type=click.IntRange(min=1),
    default=None,
    help="Keep N conversations drawn at random (file order).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of --sample's draw.")
@click.option(
    "--out",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    help="The workload JSONL to write (one {messages: [...]} line per conversation).",
)
def import_cmd(file: Path, fmt: str, sample: int | None, seed: int, out: Path) -> None:
    """Turn a chat dataset FILE into a workload of conversations.

    Each conversation becomes one line that ends at its last user turn: the model writes the
    assistant's reply, rendered with the target's chat template by the engine and sent as
    messages to /v1/chat/completions by a serving stack.

    \b
    Example:
      autotune workload import sharegpt.json --format sharegpt --sample 200 --out chat.jsonl
    """
    from autotune.workload.conversations import read_conversations, sample_conversations, workload_lines

    conversations = sample_conversations(read_conversations(file, cast(Format, fmt)), sample, seed)
    out.write_text("".join(line + "\n" for line in workload_lines(conversations)), encoding="utf-8")
    turns = sum(len(t) for _, t in conversations)
    click.echo(f"wrote {len(conversations)} conversations ({turns} turns) to {out}")
