"""``autotune profiles list|show|delete``, ``autotune export`` and ``autotune report``.

Profiles are addressed by id (see ``profiles list``) or ``current``: the newest profile for
this host's fingerprint and the pair configured in tune.yaml. A stored profile is read typed
(:class:`profiles.schema.Profile`, via ``Store.load_profile`` / ``Profile.from_json``), so one
written by a newer schema is refused in one line; ``--json`` and the exporters get its JSON
back (``Profile.to_json``, the stored JSON unchanged, key order included).
"""

from __future__ import annotations

from pathlib import Path

import click

from autotune.cli.options import CONFIG_OPTION, STORAGE_OPTION, print_json
from autotune.cli.render import render_profile_list, render_show
from profiles.errors import ProfileError
from profiles.exporters import FORMATS as EXPORT_FORMATS
from profiles.schema import Profile


def _open_store(config_path: Path, storage: str | None):
    from autotune.config import load_config
    from profiles.store import Store

    url = storage or load_config(config_path).storage.url
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        db = Path(url[len("sqlite:///") :])
        if not db.is_file():
            raise ProfileError(f"{db}: no profile database yet (run `autotune tune` first)")
    return Store(url)


def _read_profile_file(path: Path) -> Profile:
    """A profile from a file (JSON, or the `yaml` export: JSON is YAML), read typed; one line when it is not one."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ProfileError(f"{path}: not a readable profile file ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: not a profile (a mapping of its sections), got {type(data).__name__}")
    return Profile.from_json(data)


def _resolve(store, ref: str, config_path: Path) -> Profile:
    if ref != "current":
        if not ref.isdigit():
            raise ProfileError(f"profile id must be an integer or 'current' (got {ref!r})")
        return store.load_profile(int(ref))
    from autotune.config import load_config
    from autotune.context import profile_keys

    fp, target_hash, draft_hash = profile_keys(load_config(config_path))
    found = store.current_profile(fp["key"], target_hash, draft_hash)
    if found is None:
        raise ProfileError(
            f"no profile yet for this host ({fp['label']}) and the pair in {config_path}; run `autotune tune`"
        )
    return Profile.from_json(found)


@click.group()
def profiles() -> None:
    """List, show and delete stored per-device profiles."""


@profiles.command("list")
@CONFIG_OPTION
@STORAGE_OPTION
@click.option("--json", "as_json", is_flag=True)
def list_cmd(config_path, storage, as_json):
    """One line per stored profile, newest first."""
    rows = _open_store(config_path, storage).list_profiles()
    if as_json:
        print_json(rows)
        return
    click.echo(render_profile_list(rows))


@profiles.command("show")
@click.argument("ref")
@CONFIG_OPTION
@STORAGE_OPTION
@click.option("--json", "as_json", is_flag=True)
def show_cmd(ref, config_path, storage, as_json):
    """Everything measured for profile REF (an id or 'current')."""
    prof = _resolve(_open_store(config_path, storage), ref, config_path)
    if as_json:
        print_json(prof.to_json())
        return
    click.echo(render_show(prof))


@profiles.command("delete")
@click.argument("profile_id", type=int)
@CONFIG_OPTION
@STORAGE_OPTION
@click.option("--json", "as_json", is_flag=True)
def delete_cmd(profile_id, config_path, storage, as_json):
    """Delete profile PROFILE_ID."""
    _open_store(config_path, storage).delete_profile(profile_id)
    if as_json:
        print_json({"deleted": profile_id})
    else:
        click.echo(f"deleted profile #{profile_id}")


@click.command("export")
@click.argument("ref")
@click.option("--format", "fmt", required=True, type=click.Choice(EXPORT_FORMATS))
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    default=None,
    help="File or folder to write (atomically); default: print to stdout.",
)
@click.option("--target-model", default=None, help="Target model path as the serving host sees it.")
@click.option("--draft-model", default=None, help="Draft model path as the serving host sees it.")
@CONFIG_OPTION
@STORAGE_OPTION
def export_cmd(ref, fmt, output, target_model, draft_model, config_path, storage):
    """Write profile REF (an id or 'current') as a serving stack's config."""
    from profiles.exporters import export, write_export

    prof = _resolve(_open_store(config_path, storage), ref, config_path)
    out = export(prof.to_json(), fmt, target_model, draft_model)
    if output is None:
        click.echo(out.text, nl=False)
        return
    for path in write_export(out, output):
        click.echo(f"wrote {path}", err=True)


@click.command()
@click.argument("ref")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("report"), show_default=True)
@click.option(
    "--html", "page", is_flag=True, help="Also write report.html: one self-contained page, the PNGs embedded."
)
@CONFIG_OPTION
@STORAGE_OPTION
def report(ref, output, page, config_path, storage):
    """PNG plots and a Markdown summary of profile REF (needs matplotlib: pip install '.[plot]').

    REF is a stored profile's id, `current`, or a profile file: the JSON of `profiles show --json`
    or the `yaml` export's profile.yaml. The plots: the Pareto front; tokens/s over no speculation
    per load level with its 95% interval and the re-measured finalists; a served gamma-by-level
    table against the best constant (stack backends); acceptance per draft position; throughput
    per batch size and gamma; verify cost and knee.
    """
    from autotune.cli.report import write_report

    if Path(ref).is_file():
        prof = _read_profile_file(Path(ref))
    else:
        prof = _resolve(_open_store(config_path, storage), ref, config_path)
    for path in write_report(prof, output, page=page):
        click.echo(f"wrote {path}")
