"""``autotune profile`` (measure the device) and ``autotune tune`` (the main job)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click

from autotune.cli.options import COMPILE_OPTION, CONFIG_OPTION, print_json, say_err, with_compile
from autotune.cli.render import render_profile, render_tune
from autotune.config import BACKENDS
from autotune.records import Measurement
from profiles.schema import Profile


def _from_here(url: str) -> str:
    """A relative SQLite path given on the command line is relative to the working folder (tune.yaml's
    own storage.url is relative to the file)."""
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////") and url != "sqlite:///:memory:":
        return "sqlite:///" + str(Path(url[len("sqlite:///") :]).resolve())
    return url


@click.command()
@CONFIG_OPTION
@COMPILE_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def profile(config_path, compile_flag, as_json):
    """Fingerprint the device, measure ceilings and verify/draft curves, classify, and store."""
    from autotune import context
    from autotune.config import load_config

    cfg = with_compile(load_config(config_path), compile_flag)
    ctx = context.build(cfg)
    data, _ = context.ensure_profile(ctx, reprofile=True, progress=lambda s: say_err(f"  measured: {s}"))
    data = context.extend_for_trees(ctx, data, say_err)  # search.tree_topk: the widths and ranks trees need
    if as_json:
        print_json(data)
        return
    click.echo(render_profile(Measurement.from_json(data)))


def parse_minutes(text: str) -> float:
    """``45m`` / ``1.5h`` / ``90s`` / ``90`` (minutes) -> minutes; a bad value is a one-line usage error.

    Example:
        >>> parse_minutes("45m"), parse_minutes("1.5h"), parse_minutes("90")
        (45.0, 90.0, 90.0)
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|min|h)?\s*", text)
    if match is None or float(match.group(1)) <= 0:
        raise click.BadParameter(f"{text!r} is not a duration like 45m, 1.5h or 90s", param_hint="--budget")
    value, unit = float(match.group(1)), match.group(2) or "m"
    return value * {"s": 1 / 60, "m": 1.0, "min": 1.0, "h": 60.0}[unit]


@click.command()
@CONFIG_OPTION
@click.option(
    "--trials",
    type=click.IntRange(min=1),
    default=None,
    help="Override budget.n_trials (backend.n_trials with a serving-stack backend).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Override budget.timeout_s (backend.timeout_s with a serving-stack backend).",
)
@click.option(
    "--budget",
    "budget_text",
    default=None,
    metavar="DURATION",
    help="Override budget.minutes: the whole run (profiling, study, re-measurement) in 45m, 1.5h or 90 (minutes).",
)
@click.option("--storage", default=None, help="Override storage.url (any SQLAlchemy URL).")
@click.option("--study", "study_name", default=None, help="Override storage.study_name.")
@click.option("--resume", is_flag=True, help="Continue the latest study for this device, pair and workload.")
@click.option(
    "--reprofile", is_flag=True, help="Measure the device again instead of reusing the stored profile."
)
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    default=None,
    help="Where trials run (overrides backend.name): engine (in process), or a real vllm / llamacpp "
    "server per trial.",
)
@click.option("--strict", is_flag=True, help="Refuse to store a profile measured on a busy host (exit 2).")
@COMPILE_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the stored profile as one JSON object.")
def tune(
    config_path,
    trials,
    timeout,
    budget_text,
    storage,
    study_name,
    resume,
    reprofile,
    backend,
    strict,
    compile_flag,
    as_json,
):
    """The main job: profile this host, run the Optuna study, store the profile, write exports."""
    from autotune.config import load_config
    from autotune.jobs.tune import Interrupted, run_tune

    cfg = with_compile(load_config(config_path), compile_flag)
    backend = backend or cfg.backend.name
    server = backend != "engine"
    section = "backend" if server else "budget"  # a serving stack's trials are server starts
    overrides = {
        k: v
        for k, v in {
            f"{section}.n_trials": trials,
            f"{section}.timeout_s": timeout,
            "storage.study_name": study_name,
            "backend.name": backend,
            "budget.minutes": parse_minutes(budget_text) if budget_text is not None else None,
        }.items()
        if v is not None
    }
    if storage is not None:
        if "://" not in storage:
            raise click.BadParameter(f"not an SQLAlchemy URL: {storage!r}", param_hint="--storage")
        overrides["storage.url"] = _from_here(storage)
    cfg = cfg.with_overrides(overrides)
    try:
        prof = run_tune(cfg, resume=resume, reprofile=reprofile, say=say_err, strict=strict)
    except Interrupted as exc:
        click.echo(str(exc), err=True)
        sys.exit(130)
    except KeyboardInterrupt:  # after the study (re-measuring): the trials are kept, no profile was stored
        click.echo(
            "interrupted before the profile was stored; finished trials are kept "
            "(`autotune tune --resume` continues)",
            err=True,
        )
        sys.exit(130)
    if as_json:
        print_json(prof)
        return
    click.echo(render_tune(Profile.from_json(prof)))
