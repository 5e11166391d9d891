"""docs/architecture.md rule: ``profiles`` never imports torch, ``engine`` or ``autotune``."""

from __future__ import annotations

import subprocess
import sys


def test_importing_profiles_pulls_in_no_torch_engine_or_autotune() -> None:
    code = (
        "import sys, profiles, profiles.store, profiles.exporters, profiles.hashing, profiles.schema; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'engine', 'autotune', 'transformers')); "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
