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

A profile tuned in llama-server carries its deployment: the script then also holds the trials'
``-c`` (``-np`` x the workload's longest sequence), ``-t``, ``-ngl``/``-ngld`` and their own flags
(``--metrics``, ``backend.llamacpp.args``). :func:`server_argv` builds them, and the llama.cpp
backend launches every trial with it, so the script runs what was measured.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from profiles.deployment import Deployment
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
        "-c",
        "-t",
        "-ngl",
        "-ngld",
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
    "-c": (1, None),
    "-t": (1, None),
    "-ngl": (0, None),
    "-ngld": (0, None),
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


def deployment_args(deployment: Deployment | None, slots: int) -> dict[str, Any]:
    """The llama-server flags of a :class:`~profiles.deployment.Deployment` (none without one).

    ``-c`` is ``slots`` x the deployment's context per slot: llama-server divides ``-c`` evenly among
    its ``-np`` slots (``n_ctx_seq = n_ctx / n_seq_max``, docs/stacks/llamacpp.md), so every slot holds
    the workload's longest sequence.

    Example:
        >>> deployment_args(Deployment("llamacpp", "f32", context_size=300, threads=8, gpu_layers=99), 4)
        {'-c': 1200, '-t': 8, '-ngl': 99}
    """
    if deployment is None:
        return {}
    args: dict[str, Any] = {}
    if deployment.context_size is not None:
        args["-c"] = slots * deployment.context_size
    for flag, value in (
        ("-t", deployment.threads),
        ("-ngl", deployment.gpu_layers),
        ("-ngld", deployment.draft_gpu_layers),
    ):
        if value is not None:
            args[flag] = value
    return args


def server_args(inputs: ExportInputs) -> dict[str, Any]:
    """The llama-server flags (flag -> value) for a profile, target model included.

    ``-np`` (server slots) is the profile's tuned ``max_batch_size`` when it has one; then the
    deployment's flags (:func:`deployment_args`) and the speculative ones.

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
    args.update(deployment_args(inputs.deployment, inputs.max_batch_size or 1))
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


def server_argv(inputs: ExportInputs) -> list[str]:
    """The llama-server arguments of a profile, program name excluded: :func:`server_args` (validated),
    then the deployment's own flags as the trials ran them. The llama.cpp backend launches every
    trial with exactly these, plus its address.

    Example:
        >>> from profiles.profile import ExportInputs
        >>> inputs = ExportInputs("0.1.0", "t", "H200", "k", "t.gguf", None, "none", 0, 0.0, "constant",
        ...                       None, None, ((2, 0),), max_batch_size=2,
        ...                       deployment=Deployment("llamacpp", "f32", context_size=300, threads=2,
        ...                                             extra_args=("--metrics",)))
        >>> server_argv(inputs)
        ['-m', 't.gguf', '-np', '2', '-c', '600', '-t', '2', '--metrics']
    """
    args = server_args(inputs)
    validate(args)
    extra = inputs.deployment.extra_args if inputs.deployment is not None else ()
    return [part for flag, value in args.items() for part in (flag, _text(value))] + list(extra)


def _text(value: Any) -> str:
    return format(value, "g") if isinstance(value, float) else str(value)


def _slots_note(args: Mapping[str, Any], deployment: Deployment | None) -> str:
    slots = args["-np"]
    if deployment is None or deployment.context_size is None:
        return (
            f"-np {slots}: the tuned number of concurrent sequences; give llama-server a context "
            "of -np x the per-request context with -c."
        )
    return (
        f"-np {slots}: the tuned max_batch_size (chosen.max_batch_size); -c {args['-c']} = -np x "
        f"{deployment.context_size}, the workload's longest prompt + output: llama-server divides -c "
        "evenly among its slots, so each slot holds one such request."
    )


def export(inputs: ExportInputs) -> Exported:
    """Render, validate and describe the llama-server launch script."""
    args = server_args(inputs)
    argv = server_argv(inputs)
    speculation = "--spec-type" in args
    notes = []
    if "-np" in args:
        notes.append(_slots_note(args, inputs.deployment))
    if inputs.deployment is not None:
        notes.append(
            f"The trials loaded {inputs.deployment.dtype} GGUF weights"
            + (
                f" with -t {args['-t']} threads (the tuning host's; on another host pass -t with its "
                "physical cores: a later flag wins)"
                if "-t" in args
                else ""
            )
            + "."
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
    values: list[tuple[str, Any]] = [(flag, _text(value)) for flag, value in args.items()]
    values += [(shlex.quote(arg), None) for arg in argv[2 * len(args) :]]
    text, command = shell_script(header, PROGRAM, values)
    return Exported("llamacpp", FILENAME, text, command=command, speculation=speculation, notes=tuple(notes))
