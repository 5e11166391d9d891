"""Text Generation Inference: ``text-generation-launcher --speculate N``.

TGI has no draft-model flag: ``--speculate N`` uses the model's Medusa heads when it is a
Medusa model and n-gram speculation otherwise. For the n-gram drafter N is the chosen gamma.
For a draft-model profile the export still sets ``--speculate`` to the chosen gamma, but TGI
will speculate with n-grams, whose acceptance was not measured: the header says so. Gamma 0
(or drafter none) leaves ``--speculate`` unset, TGI's default (off).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from profiles.exporters._common import (
    Exported,
    StackTarget,
    comment_header,
    fail,
    is_int,
    off_reason,
    schedule_text,
    shell_script,
    substitution_notes,
)
from profiles.profile import ExportInputs

STACK = StackTarget(
    "TGI", "launcher flags (text-generation-launcher)", "huggingface/text-generation-inference@009c4e0b945b"
)
FILENAME = "tgi-args.sh"
PROGRAM = ("text-generation-launcher",)


def validate(args: Mapping[str, Any]) -> None:
    """Check TGI launcher flags: ``--model-id`` required, ``--speculate`` a non-negative integer.

    Example:
        >>> validate({"--model-id": "/m/t", "--speculate": -1})
        Traceback (most recent call last):
        ...
        profiles.errors.ProfileError: tgi export: --speculate must be a non-negative integer, got -1
    """
    unknown = sorted(set(args) - {"--model-id", "--speculate"})
    if unknown:
        raise fail("tgi", f"unknown flag(s) {', '.join(unknown)} (TGI has no other speculation flags)")
    if not args.get("--model-id"):
        raise fail("tgi", "--model-id is required")
    if "--speculate" in args and (not is_int(args["--speculate"]) or args["--speculate"] < 0):
        raise fail("tgi", f"--speculate must be a non-negative integer, got {args['--speculate']!r}")


def launcher_args(inputs: ExportInputs) -> dict[str, Any]:
    """``{"--model-id": target, "--speculate": gamma}`` (no --speculate when speculation is off)."""
    args: dict[str, Any] = {"--model-id": inputs.target}
    if inputs.drafter != "none" and inputs.gamma > 0:
        args["--speculate"] = inputs.gamma
    return args


def export(inputs: ExportInputs) -> Exported:
    """Render, validate and describe the TGI launch script."""
    args = launcher_args(inputs)
    validate(args)
    speculation = "--speculate" in args
    if not speculation:
        why = off_reason(inputs)
        notes = [f"Speculation off: {why}, so no --speculate."]
    else:
        notes = [
            f"TGI uses one speculation length at every batch size: the chosen gamma {inputs.gamma}. "
            f"Tuned per-batch-size schedule, for reference: {schedule_text(inputs.schedule)}."
        ]
        if inputs.drafter == "model":
            notes.append(
                f"TGI cannot load a separate draft model ({inputs.draft}): --speculate makes it speculate "
                "with n-grams (or Medusa heads, for a Medusa model), whose acceptance this profile did "
                "not measure. Re-tune with the ngram drafter for a TGI-faithful gamma."
            )
        notes += substitution_notes(inputs, "TGI")
    header = comment_header(
        FILENAME,
        "TGI launch with the tuned speculation length",
        inputs,
        STACK,
        notes,
        usage=f"sh {FILENAME} [more text-generation-launcher flags]",
    )
    text, command = shell_script(header, PROGRAM, list(args.items()))
    return Exported("tgi", FILENAME, text, command=command, speculation=speculation, notes=tuple(notes))
