"""The CLI package's shape: explicit registration, no import circle, both entry points."""

from __future__ import annotations

import ast
import os
import select
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
    assert sorted(main.commands) == [
        "bench",
        "convert-head",
        "export",
        "init",
        "profile",
        "profiles",
        "report",
        "tune",
        "watch",
        "workload",
    ]
    profiles = main.commands["profiles"]
    assert isinstance(profiles, click.Group) and sorted(profiles.commands) == ["delete", "list", "show"]


def test_python_dash_m_autotune_is_the_console_script() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "autotune", "--help"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Usage: autotune [OPTIONS] COMMAND [ARGS]...")


# A command that prints a line with a plain print (click.echo flushes by itself; print, a library's
# write, do not) and waits on stdin before printing the next: the first line must reach the pipe
# while the command still runs.
TALKER = """
import sys
from autotune.cli import main

@main.command("talk")
def talk():
    print("first line")
    sys.stdin.readline()
    print("second line")

main(prog_name="autotune", args=["talk"])
"""


def test_output_reaches_a_pipe_line_by_line_while_the_command_runs() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    child = subprocess.Popen(
        [sys.executable, "-c", TALKER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        ready, _, _ = select.select([child.stdout], [], [], 60)
        assert ready, "no line on the pipe after 60 s: stdout is block-buffered"
        assert child.stdout.readline() == "first line\n" and child.poll() is None
        out, err = child.communicate("go\n", timeout=60)
    finally:
        child.kill()
    assert child.returncode == 0 and out == "second line\n", err


def test_pyproject_entry_point_names_the_group() -> None:
    text = (CLI.parent.parent / "pyproject.toml").read_text()
    assert 'autotune = "autotune.cli:main"' in text
