"""Options and output helpers shared by the command modules (no command lives here)."""

from __future__ import annotations

import json
from pathlib import Path

import click

CONFIG_OPTION = click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    default="tune.yaml",
    show_default=True,
    help="The tuning config (see the bundled tune.yaml).",
)
STORAGE_OPTION = click.option(
    "--storage", default=None, help="SQLAlchemy URL of the profile store (default: storage.url of --config)."
)
COMPILE_OPTION = click.option(
    "--compile/--no-compile",
    "compile_flag",
    default=None,
    help="Override models.compile: torch.compile the decode/verify forward (an error in "
    "one line where it cannot run here) or run it eager (default: models.compile, "
    "auto).",
)


def with_compile(cfg, compile_flag: bool | None):
    """``cfg`` with ``--compile/--no-compile`` applied over ``models.compile`` (unchanged when not given)."""
    return (
        cfg
        if compile_flag is None
        else cfg.with_overrides({"models.compile": "true" if compile_flag else "false"})
    )


def print_json(obj: object) -> None:
    click.echo(json.dumps(obj, indent=2, default=str))


def say_err(msg: str) -> None:
    click.echo(msg, err=True)
