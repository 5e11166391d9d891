"""The CLI package's shape: explicit registration, no import circle, both entry points."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import click

from autotune.cli import main

CLI = Path(__file__).resolve().parent.parent / "autotune" / "cli"


def test_command_modules_never_import_the_group() -> None:
    for path in sorted(CLI.glob("*.py")):
        if path.name == "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.module != "autotune.cli", f"{path.name} imports the group (an import circle)"
            if isinstance(node, ast.Import):
                assert all(a.name != "autotune.cli" for a in node.names), path.name


def test_every_command_is_registered() -> None:
    assert sorted(main.commands) == ["bench", "export", "init", "profile", "profiles", "report", "tune"]
    profiles = main.commands["profiles"]
    assert isinstance(profiles, click.Group) and sorted(profiles.commands) == ["delete", "list", "show"]


def test_python_dash_m_autotune_is_the_console_script() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "autotune", "--help"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Usage: autotune [OPTIONS] COMMAND [ARGS]...")


def test_pyproject_entry_point_names_the_group() -> None:
    text = (CLI.parent.parent / "pyproject.toml").read_text()
    assert 'autotune = "autotune.cli:main"' in text
