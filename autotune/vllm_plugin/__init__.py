"""A vLLM general plugin: a by-batch-size table's K=0 skips the drafter, with an exact catch-up.

vLLM's ``num_speculative_tokens_per_batch_size`` accepts K=0, but at K=0 its proposer still runs
the drafter's forward over the step's tokens to keep the drafter's KV cache in sync
(``vllm/v1/spec_decode/llm_base_proposer.py``, ``SpecDecodeBaseProposer.propose``), so "off" in a
table range costs most of what speculating costs. With this plugin enabled, a step whose K is 0
does not run the drafter at all; each request's first position the drafter has not seen is kept,
and before the first K>0 step of that request the tokens committed meanwhile are fed to the
drafter in one batched prefill-style pass (their positions, their slots in the block table the
draft layers share with the target), so drafting resumes from the KV cache it would have had.
What it patches, the hazards it handles and the ones it refuses: docs/stacks/vllm.md#the-k0-skip-plugin.

Installed into vLLM's own environment (``tools/install_vllm_cpu.sh``, or
``pip install 'spec-autotune[vllm-plugin]'`` there), it is found through the
``vllm.general_plugins`` entry point in every vLLM process; it does nothing unless
``SPEC_AUTOTUNE_K0_SKIP=1`` is in the server's environment (``backend.vllm.k0_skip: true``).
It imports only vLLM and the standard library: it runs inside vLLM's interpreter, never in the
tool's, and no module of the tool imports it.
"""

from __future__ import annotations

import os
import sys

__all__ = ["ENV", "SUPPORTED", "enabled", "refusal", "register"]

ENV = "SPEC_AUTOTUNE_K0_SKIP"
"""The switch: ``1`` enables the plugin in a vLLM server's processes; anything else leaves vLLM as shipped."""
SUPPORTED = "0.32."
"""The vLLM release line the patches are written against and tested on (version prefix)."""


def enabled() -> bool:
    """Whether this process's environment asks for the plugin."""
    return os.environ.get(ENV) == "1"


def refusal(version: str) -> str | None:
    """The one-line reason the plugin refuses vLLM ``version``, or None where it is supported.

    Example:
        >>> refusal("0.32.0+cpu") is None, refusal("0.33.1")[:40]
        (True, 'spec-autotune k0 skip: vLLM 0.33.1 is no')
    """
    if version.startswith(SUPPORTED):
        return None
    return (
        f"spec-autotune k0 skip: vLLM {version} is not supported (tested on {SUPPORTED}x only); "
        f"unset {ENV} or install vLLM {SUPPORTED}x"
    )


def register() -> None:
    """vLLM's entry point: patch the proposer and the runner when :data:`ENV` is ``1``; refuse an
    untested vLLM with one line (RuntimeError, the server does not start)."""
    if not enabled():
        return
    import vllm

    reason = refusal(vllm.__version__)
    if reason is not None:
        raise RuntimeError(reason)
    from . import _engine_core, _k0_skip

    if "vllm.v1.engine.core" in sys.modules:  # the engine core's process: its EngineCore loads plugins
        _engine_core.install()
    _k0_skip.install_after_kernel_overrides()
