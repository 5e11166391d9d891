"""Every profile a real tiny ``autotune tune`` stores reads back typed and unchanged, and renders.

tests/autotune/test_tune.py checks the one profile of a ``run_tune`` call field by field; this
runs the command line twice on one database (the second run a new study, ``-run2``) and holds
every stored profile to ``Profile.from_json(p).to_json() == p``, key order included at every
depth, through the store (``load_profile``) and the CLI (``profiles show``, with and without ``--json``).
"""

from __future__ import annotations

import json

from click.testing import CliRunner

from autotune.cli import main
from autotune.cli.render import render_show
from profiles.schema import Profile
from profiles.store import Store


def test_every_stored_profile_round_trips_through_the_typed_profile(tune_config, tmp_path) -> None:
    cfg = tune_config()
    config = tmp_path / "tune.yaml"  # what tune_config wrote
    for trials in ("3", "2"):
        result = CliRunner().invoke(main, ["tune", "--config", str(config), "--trials", trials])
        assert result.exit_code == 0, result.output
    with Store(cfg.storage.url) as store:
        ids = [row["id"] for row in store.list_profiles()]
        assert sorted(ids) == [1, 2]
        for pid in ids:
            stored = store.get_profile(pid)
            typed = Profile.from_json(stored)
            again = typed.to_json()
            assert again == stored and json.dumps(again) == json.dumps(stored), pid  # order at every depth
            assert store.load_profile(pid) == typed and typed.id == pid
            assert typed.device["kind"] == "cpu" and "software" in typed.device  # hardware.fingerprint's own
            show = CliRunner().invoke(
                main, ["profiles", "show", str(pid), "--storage", cfg.storage.url, "--json"]
            )
            assert show.exit_code == 0 and show.stdout == json.dumps(stored, indent=2, default=str) + "\n"
            show = CliRunner().invoke(main, ["profiles", "show", str(pid), "--storage", cfg.storage.url])
            assert show.exit_code == 0 and show.stdout == render_show(typed) + "\n"
