"""Text Generation Inference: ``text-generation-launcher --speculate N``.

TGI has no draft-model flag: ``--speculate N`` uses the model's Medusa heads when it is a
Medusa model and n-gram speculation otherwise. For the n-gram drafter N is the chosen gamma.
For a draft-model profile the export still sets ``--speculate`` to the chosen gamma, but TGI
will speculate with n-grams, whose acceptance was not measured: the header says so. Gamma 0
(or drafter none) leaves ``--speculate`` unset, TGI's default (off).

A profile measured in a serving stack carries its deployment: ``--num-shard`` (always: unset, TGI
shards over every visible GPU),
``--dtype`` (TGI takes float16 or bfloat16 only; any other dtype is left to TGI, with a note),
``--max-total-tokens`` = the trials' longest sequence and ``--max-input-tokens`` one less (TGI
requires input < total), docs/stacks/tgi.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from profiles.deployment import Deployment
from profiles.exporters._common import (
    Exported,
    StackTarget,
    comment_header,
    deployment_note,
    fail,
    is_int,
    max_length,
    off_reason,
    schedule_text,
    served_dtype,
    shell_script,
    substitution_notes,
)
from profiles.profile import ExportInputs

STACK = StackTarget(
    "TGI", "launcher flags (text-generation-launcher)", "huggingface/text-generation-inference@009c4e0b945b"
)
FILENAME = "tgi-args.sh"
PROGRAM = ("text-generation-launcher",)
DTYPES = frozenset({"float16", "bfloat16"})  # the launcher's Dtype value enum
_INT_FLAGS = ("--num-shard", "--max-input-tokens", "--max-total-tokens")


def validate(args: Mapping[str, Any]) -> None:
    """Check TGI launcher flags: ``--model-id`` required, ``--speculate`` a non-negative integer.

    Example:
        >>> validate({"--model-id": "/m/t", "--speculate": -1})
        Traceback (most recent call last):
        ...
        profiles.errors.ProfileError: tgi export: --speculate must be a non-negative integer, got -1
    """
    unknown = sorted(set(args) - {"--model-id", "--speculate", "--dtype", *_INT_FLAGS})
    if unknown:
        raise fail("tgi", f"unknown flag(s) {', '.join(unknown)} (TGI has no other speculation flags)")
    if not args.get("--model-id"):
        raise fail("tgi", "--model-id is required")
    if "--speculate" in args and (not is_int(args["--speculate"]) or args["--speculate"] < 0):
        raise fail("tgi", f"--speculate must be a non-negative integer, got {args['--speculate']!r}")
    for flag in _INT_FLAGS:
        if flag in args and (not is_int(args[flag]) or args[flag] < 1):
            raise fail("tgi", f"{flag} must be an integer >= 1, got {args[flag]!r}")
    if "--dtype" in args and args["--dtype"] not in DTYPES:
        raise fail("tgi", f"--dtype must be float16 or bfloat16, got {args['--dtype']!r}")
    prompt, total = args.get("--max-input-tokens"), args.get("--max-total-tokens")
    if prompt is not None and total is not None and prompt >= total:
        raise fail("tgi", f"--max-input-tokens ({prompt}) must be < --max-total-tokens ({total})")


def deployment_args(deployment: Deployment | None) -> dict[str, Any]:
    """TGI's flags for the trials' tensor parallel size, dtype and longest sequence (none without a
    deployment).

    Example:
        >>> deployment_args(Deployment("vllm", "bfloat16", tensor_parallel_size=2, max_model_len=2048))
        {'--num-shard': 2, '--dtype': 'bfloat16', '--max-input-tokens': 2047, '--max-total-tokens': 2048}
    """
    if deployment is None:
        return {}
    args: dict[str, Any] = {"--num-shard": deployment.tensor_parallel_size}  # unset: every visible GPU
    if served_dtype(deployment) in DTYPES:
        args["--dtype"] = served_dtype(deployment)
    length = max_length(deployment)
    if length is not None and length > 1:
        args.update({"--max-input-tokens": length - 1, "--max-total-tokens": length})
    return args


def launcher_args(inputs: ExportInputs) -> dict[str, Any]:
    """``{"--model-id": target, <deployment flags>, "--speculate": gamma}`` (no --speculate when
    speculation is off)."""
    args: dict[str, Any] = {"--model-id": inputs.target, **deployment_args(inputs.deployment)}
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
    if inputs.deployment is not None:
        written = [f"{flag} {value}" for flag, value in deployment_args(inputs.deployment).items()]
        dropped = (
            []
            if "--dtype" in args
            else [f"dtype {inputs.deployment.dtype} (TGI's --dtype takes float16 or bfloat16)"]
        )
        notes.insert(0, deployment_note(inputs.deployment, written, dropped))
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
