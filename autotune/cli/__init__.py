"""The ``autotune`` command line: the group, its error mapping, and the registration of every command.

Every user mistake (a bad flag value, a missing model folder, a malformed workload line, an
invalid tune.yaml key) ends with ``error: <one line naming it>`` on stderr and exit code 2.
Output is line-buffered even into a file or a pipe (``autotune tune > tune.log``, ``| tee``, a CI
log), so every progress line arrives as it is printed, not at exit.

One module per command family defines its commands without knowing the group; they are
registered here, explicitly, so no command module imports this one:

- ``bench``: :mod:`autotune.cli.bench`
- ``convert-head``: :mod:`autotune.cli.heads`
- ``init``: :mod:`autotune.cli.init`
- ``profile``, ``tune``: :mod:`autotune.cli.tuning`
- ``profiles list|show|delete``, ``export``, ``report``: :mod:`autotune.cli.profiles`
- ``watch``: :mod:`autotune.cli.watch`
- ``workload import``: :mod:`autotune.cli.workload`

Human output is rendered by :mod:`autotune.cli.render`; shared options live in
:mod:`autotune.cli.options`.
"""

from __future__ import annotations

import io
import sys

import click

from autotune.cli import bench, heads, init, profiles, tuning, watch, workload
from autotune.cli.render import _schedule_text, render_profile, render_tune
from autotune.errors import USER_ERRORS

__all__ = ["main", "render_profile", "render_tune", "_schedule_text"]


def _line_buffered() -> None:
    """Flush stdout and stderr at every newline, also when they are a file or a pipe."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and not stream.closed:
            stream.reconfigure(line_buffering=True)


def _one_line(exc: BaseException) -> str:
    text = exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
    return " ".join(text.split()) or type(exc).__name__


class _Group(click.Group):
    """Turns user errors raised anywhere below (and bad flags) into one line and exit code 2."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except USER_ERRORS as exc:
            click.echo(f"error: {_one_line(exc)}", err=True)
            sys.exit(2)

    def main(self, *args, **kwargs):
        _line_buffered()
        kwargs["standalone_mode"] = False
        try:
            rv = super().main(*args, **kwargs)
        except click.UsageError as exc:
            hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
            click.echo(f"error: {_one_line(exc)}{hint}", err=True)
            sys.exit(2)
        except click.ClickException as exc:
            click.echo(f"error: {_one_line(exc)}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("aborted", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="spec-autotune")
def main() -> None:
    """spec-autotune: measure speculative decoding on this host, tune it, export serving configs.

    \b
    Start here:
      autotune bench            speculative vs autoregressive on the bundled demo pair
      autotune init             write a commented tune.yaml (--target/--draft for your models)
      autotune tune             the main job: profile, Optuna study, store, export
    """


# Registration: the command modules never import this one, so there is no import circle.
for _command in (
    bench.bench,
    heads.convert_head,
    init.init,
    tuning.profile,
    tuning.tune,
    profiles.profiles,
    profiles.export_cmd,
    profiles.report,
    watch.watch,
    workload.workload,
):
    main.add_command(_command)
