"""llama.cpp: a ``llama-server`` launch script with the ``--spec-*`` flags.

A draft model: ``--spec-type draft-simple -md DRAFT --spec-draft-n-max gamma
--spec-draft-n-min 0 --spec-draft-p-min threshold`` (p-min is the draft-confidence cutoff, the
same meaning as the profile's confidence_threshold). An EAGLE-3 head: the same flags with
``--spec-type draft-eagle3`` and ``-md HEAD.gguf`` (the head converted with
``convert_hf_to_gguf.py --target-model-dir TARGET``; docs/eagle3.md). The n-gram drafter: ``--spec-type
ngram-simple --spec-ngram-simple-size-n prompt_lookup_min --spec-ngram-simple-size-m gamma``.
The removed ``--draft``/``--draft-max``/``--draft-min`` flags stop llama-server at start-up
and are never written. llama.cpp loads GGUF files: pass ``--target-model``/``--draft-model``
with converted ``.gguf`` paths (the header warns when the paths are not ``.gguf``).
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
    is_number,
    off_reason,
    one_length_note,
    shell_script,
    substitution_notes,
)
from profiles.profile import ExportInputs

STACK = StackTarget("llama.cpp", "llama-server flags", "ggml-org/llama.cpp@0017d6fb63f9")
FILENAME = "llamacpp-args.sh"
PROGRAM = ("llama-server",)
SPEC_TYPES = frozenset(
    {
        "none",
        "draft-simple",
        "draft-eagle3",
        "draft-mtp",
        "draft-dflash",
        "draft-dspark",
        "ngram-simple",
        "ngram-map-k",
        "ngram-map-k4v",
        "ngram-mod",
        "ngram-cache",
    }
)
# Removed flag -> its replacement; a removed flag stops llama-server at start-up.
REMOVED_FLAGS = {
    "--draft": "--spec-draft-n-max",
    "--draft-n": "--spec-draft-n-max",
    "--draft-max": "--spec-draft-n-max",
    "--draft-min": "--spec-draft-n-min",
    "--draft-n-min": "--spec-draft-n-min",
    "--spec-ngram-size-n": "--spec-ngram-<type>-size-n",
    "--spec-ngram-size-m": "--spec-ngram-<type>-size-m",
    "--spec-ngram-min-hits": "--spec-ngram-<type>-min-hits",
}
KNOWN_FLAGS = frozenset(
    {
        "-m",
        "-np",
        "--spec-type",
        "-md",
        "--spec-draft-n-max",
        "--spec-draft-n-min",
        "--spec-draft-p-min",
        "--spec-ngram-simple-size-n",
        "--spec-ngram-simple-size-m",
        "--spec-ngram-simple-min-hits",
    }
)
_RANGES = {
    "--spec-ngram-simple-size-n": (1, 1024),
    "--spec-ngram-simple-size-m": (1, 1024),
    "--spec-ngram-simple-min-hits": (1, None),
    "--spec-draft-n-max": (1, None),
    "--spec-draft-n-min": (0, None),
    "-np": (1, None),
}


def validate(args: Mapping[str, Any]) -> None:
    """Check llama-server flags: no removed flags, known spec types, values in range.

    Example:
        >>> validate({"-m": "t.gguf", "--draft-max": 8})  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        profiles.errors.ProfileError: llamacpp export: --draft-max was removed
            (llama-server refuses to start); use --spec-draft-n-max
    """
    for flag in args:
        if flag in REMOVED_FLAGS:
            raise fail(
                "llamacpp", f"{flag} was removed (llama-server refuses to start); use {REMOVED_FLAGS[flag]}"
            )
    unknown = sorted(set(args) - KNOWN_FLAGS)
    if unknown:
        raise fail("llamacpp", f"unknown flag(s) {', '.join(unknown)}")
    if not args.get("-m"):
        raise fail("llamacpp", "-m (the target model) is required")
    types = [t.strip() for t in str(args.get("--spec-type", "none")).split(",")]
    bad = [t for t in types if t not in SPEC_TYPES]
    if bad:
        raise fail("llamacpp", f"unknown --spec-type value(s) {', '.join(bad)}")
    for flag, (low, high) in _RANGES.items():
        if flag in args:
            value = args[flag]
            if not is_int(value) or value < low or (high is not None and value > high):
                bound = f"in {low}..{high}" if high is not None else f">= {low}"
                raise fail("llamacpp", f"{flag} must be an integer {bound}, got {value!r}")
    if args.get("--spec-draft-n-min", 0) > args.get("--spec-draft-n-max", 3):
        raise fail("llamacpp", "--spec-draft-n-min exceeds --spec-draft-n-max")
    p_min = args.get("--spec-draft-p-min")
    if p_min is not None and (not is_number(p_min) or not 0.0 <= p_min <= 1.0):
        raise fail("llamacpp", f"--spec-draft-p-min must be in [0, 1], got {p_min!r}")
    for kind, what in (("draft-simple", "the draft model"), ("draft-eagle3", "the EAGLE-3 head's GGUF")):
        if kind in types and not args.get("-md"):
            raise fail("llamacpp", f"--spec-type {kind} needs -md ({what})")


def server_args(inputs: ExportInputs) -> dict[str, Any]:
    """The llama-server flags (flag -> value) for a profile, target model included.

    ``-np`` (server slots) is the profile's tuned ``max_batch_size`` when it has one.

    Example:
        >>> from profiles.profile import ExportInputs
        >>> inputs = ExportInputs("0.1.0", "t", "H200", "k", "t.gguf", "d.gguf", "model", 4, 0.25, "constant",
        ...                       None, None, ((1, 4),))
        >>> server_args(inputs)["--spec-draft-p-min"]
        0.25
    """
    args: dict[str, Any] = {"-m": inputs.target}
    if inputs.max_batch_size is not None:
        args["-np"] = inputs.max_batch_size
    if inputs.drafter == "none" or inputs.gamma == 0:
        return args
    if inputs.drafter in ("model", "eagle3"):
        args.update(
            {
                "--spec-type": "draft-simple" if inputs.drafter == "model" else "draft-eagle3",
                "-md": inputs.draft,
                "--spec-draft-n-max": inputs.gamma,
                "--spec-draft-n-min": 0,
                "--spec-draft-p-min": inputs.confidence_threshold,
            }
        )
    else:
        args.update(
            {
                "--spec-type": "ngram-simple",
                "--spec-ngram-simple-size-n": inputs.prompt_lookup_min,
                "--spec-ngram-simple-size-m": inputs.gamma,
            }
        )
    return args


def export(inputs: ExportInputs) -> Exported:
    """Render, validate and describe the llama-server launch script."""
    args = server_args(inputs)
    validate(args)
    speculation = "--spec-type" in args
    notes = []
    if "-np" in args:
        notes.append(
            f"-np {args['-np']}: the tuned number of concurrent sequences; give llama-server a context "
            "of -np x the per-request context with -c."
        )
    if not speculation:
        why = off_reason(inputs)
        notes.append(f"Speculation off: {why}, so no --spec-* flags.")
    else:
        notes.append(one_length_note(inputs, "llama-server"))
        if inputs.drafter == "ngram":
            notes.append(
                f"ngram-simple looks up one n-gram size: the profile's prompt_lookup_min "
                f"{inputs.prompt_lookup_min} (the engine tried {inputs.prompt_lookup_max} down to "
                f"{inputs.prompt_lookup_min})."
            )
        if inputs.gamma_schedule != "constant":
            notes.append(
                f"gamma_schedule {inputs.gamma_schedule!r} has no llama.cpp equivalent; the draft "
                "length stays at most --spec-draft-n-max."
            )
        spec_type = "draft-eagle3" if inputs.drafter == "eagle3" else "draft-simple"
        notes += substitution_notes(inputs, f"llama-server ({spec_type})")
    paths = [inputs.target] + ([inputs.draft] if speculation and inputs.draft else [])
    if any(not path.endswith(".gguf") for path in paths):
        notes.append(
            "llama.cpp loads GGUF files: convert the models (convert_hf_to_gguf.py) and export again "
            "with --target-model/--draft-model naming the .gguf files."
        )
    header = comment_header(
        FILENAME,
        "llama-server launch with the tuned speculative decoding flags",
        inputs,
        STACK,
        notes,
        usage=f"sh {FILENAME} [more llama-server flags]",
    )
    values = [
        (flag, format(value, "g") if isinstance(value, float) else value) for flag, value in args.items()
    ]
    text, command = shell_script(header, PROGRAM, values)
    return Exported("llamacpp", FILENAME, text, command=command, speculation=speculation, notes=tuple(notes))
