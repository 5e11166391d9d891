"""Re-tuning when the watch calls the profile stale: ``autotune watch --retune PROMPTS.jsonl``.

The watch (:mod:`autotune.watch`) says *that* the stored profile no longer holds and which K it
predicts better; a re-tune measures it. When the state turns stale, :func:`retune` runs the main
job (:func:`autotune.jobs.tune.run_tune`) once, with the user's tune.yaml changed in three keys only:

- ``workload.prompts``: the user's recent prompts (``--retune``, JSONL as ``workload.prompts``);
- ``workload.concurrency``: the live load, as the powers of two that bracket the window's mean
  requests running (:func:`live_levels`, capped at the largest ``search.max_batch_size``);
- ``backend.name``: the watched stack, so the K is measured where it is served.

It stores the new profile and writes the exports like ``autotune tune`` (same store, same
``export.dir``), prints the watched stack's new launch command, and never touches the user's
server: restarting it with the new flags is the operator's call.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.config import TuneConfig

Say = Callable[[str], None]
RunTune = Callable[..., dict]


def live_levels(batch: float, cap: int) -> tuple[int, ...]:
    """The load levels a re-tune measures: the powers of two around the live requests running.

    Example:
        >>> live_levels(1.0, 16), live_levels(3.2, 16), live_levels(4.0, 16), live_levels(11.5, 8)
        ((1,), (2, 4), (4,), (8,))
    """
    b = min(max(batch, 1.0), float(cap))
    low = 2 ** math.floor(math.log2(b))
    high = min(2 ** math.ceil(math.log2(b)), cap)
    return (low,) if high <= low else (low, high)


def retune_config(cfg: TuneConfig, prompts: Path, stack: str, batch: float) -> TuneConfig:
    """``cfg`` with the recent prompts, the live load levels and the watched stack (read like the file)."""
    levels = live_levels(batch, max(cfg.search.max_batch_size))
    return cfg.with_overrides(
        {
            "workload.prompts": str(Path(prompts).resolve()),
            "workload.concurrency": list(levels),
            "workload.rate": None,
            "backend.name": stack,
        }
    )


def launch_line(profile: dict[str, Any], stack: str) -> str:
    """The watched stack's launch command from the new profile (its exporter's own command line).

    The llama.cpp command names the pair's folders: ``autotune export --format llamacpp
    --target-model T.gguf`` names the GGUF files, as after any tune.
    """
    from profiles.exporters import export

    out = export(profile, stack)
    return f"new {stack} launch: {out.command}" + ("" if out.speculation else " (speculation off)")


def retune(
    cfg: TuneConfig, prompts: Path, stack: str, batch: float, say: Say, run: RunTune | None = None
) -> dict:
    """Run the main job on the live load and recent prompts; return the stored profile."""
    if run is None:
        from autotune.jobs.tune import run_tune

        run = run_tune
    new = retune_config(cfg, prompts, stack, batch)
    say(
        f"re-tuning on {stack}: prompts {prompts}, load levels {list(new.workload.concurrency or ())} "
        f"(live ~{batch:.1f} requests running); the watched server is left as it is"
    )
    profile = run(new, say=say)
    say(f"re-tuned: profile #{profile.get('id')} stored")
    say(launch_line(profile, stack))
    return profile
