"""``autotune init``: write a commented tune.yaml."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.option(
    "--target",
    type=click.Path(path_type=Path),
    default=None,
    help="Target model folder (default: the bundled demo target, written as `demo`).",
)
@click.option(
    "--draft",
    type=click.Path(path_type=Path),
    default=None,
    help="Draft model folder (required with --target; default: the demo draft).",
)
@click.option(
    "--prompts",
    type=click.Path(path_type=Path),
    default=None,
    help="JSONL workload (default: the demo prompts, written as `demo`).",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    default=Path("tune.yaml"),
    show_default=True,
    help="Where to write the tune.yaml.",
)
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
def init(target, draft, prompts, output, force):
    """Write a commented tune.yaml for your models (the bundled one, with absolute paths)."""
    from autotune.init import write_tune_yaml

    path = write_tune_yaml(output, target, draft, prompts, force)
    click.echo(f"wrote {path}")
    click.echo(f"next: autotune tune --config {path}")
