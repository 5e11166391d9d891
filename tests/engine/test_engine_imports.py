"""docs/architecture.md rule: ``engine`` never imports ``autotune`` or ``profiles``."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import engine


def test_importing_every_engine_module_pulls_in_no_autotune_or_profiles() -> None:
    modules = [m.name for m in pkgutil.walk_packages(engine.__path__, "engine.")]
    assert "engine.speculative" in modules
    code = (
        f"import importlib, sys; [importlib.import_module(m) for m in {modules!r}]; "
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in ('autotune', 'profiles'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
