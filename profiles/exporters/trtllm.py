"""TensorRT-LLM: the LLM-API options YAML for ``trtllm-serve --extra_llm_api_options FILE``.

``speculative_config`` holds ``decoding_type`` (``Draft_Target`` with ``speculative_model``,
``Eagle3`` with ``speculative_model`` = the EAGLE-3 head folder, or ``NGram`` with
``max_matching_ngram_size``), ``max_draft_len`` and ``draft_len_schedule``
= ``{batch-size threshold: draft length}``: batch sizes up to and including a key (and above
the previous key) use its value, batch sizes above the largest key get 0.

Rules kept (llm_args.py): the value at the smallest key equals ``max_draft_len`` > 0, every
value <= ``max_draft_len``, keys >= 1, values >= 0, never with ``max_concurrency``. So
``max_draft_len`` is the gamma at the smallest batch size, and a later, larger gamma is
clamped to it (noted in the header). Key 1 is always present (older releases require it);
trailing zero ranges are dropped (above the largest key is 0 anyway).

Target version: the "up to key" lookup of NVIDIA/TensorRT-LLM at 0004396720054fd8 (llm_args.py's
documented meaning; the standalone ``get_draft_len_for_batch_size`` under tensorrt_llm/_torch/speculative/,
``bisect_left``). Older releases whose ``Drafter.get_draft_len_for_batch_size`` uses ``bisect_right``
("from key on") read the same file as another schedule and are not targeted (docs/stacks/trtllm.md).

EAGLE-3 (``Eagle3DecodingConfig``, ``decoding_type: Eagle3``, llm_args.py at the same commit): a
linear chain (no ``eagle_choices``, no dynamic tree), so ``max_total_draft_tokens`` is
``max_draft_len``; one-model EAGLE-3 (the only mode left) takes a dynamic draft length, so the
schedule is written as for a draft model. ``eagle3_layers_to_capture`` is written from the head's
``eagle_config.eagle_aux_hidden_state_layer_ids`` when its config.json is readable here: without the
key TensorRT-LLM captures {1, L/2 - 1, L - 4} of an L-layer target, not the layers the head was
trained on (a note says so when the folder cannot be read).

A profile measured in a serving stack carries its deployment as top-level LLM-API options
(``BaseLlmArgs``, llm_args.py at the same commit): ``tensor_parallel_size`` (when not 1), ``dtype``
and ``max_seq_len`` (the trials' longest sequence); the options file overrides trtllm-serve's own
``--tp_size``/``--max_seq_len`` (docs/stacks/trtllm.md).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from profiles.deployment import Deployment
from profiles.errors import ProfileError
from profiles.exporters._common import (
    Exported,
    StackTarget,
    batch_ranges,
    comment_header,
    deployment_note,
    fail,
    is_int,
    is_number,
    max_length,
    off_reason,
    read_json_file,
    schedule_text,
    served_dtype,
    substitution_notes,
)
from profiles.profile import ExportInputs

STACK = StackTarget(
    "TensorRT-LLM",
    "LLM-API options YAML (trtllm-serve --extra_llm_api_options)",
    "NVIDIA/TensorRT-LLM@000439672005",
)
FILENAME = "trtllm-extra-options.yaml"
BASE_KEYS = frozenset(
    {
        "decoding_type",
        "max_draft_len",
        "max_total_draft_tokens",
        "speculative_model",
        "speculative_model_dir",
        "max_concurrency",
        "draft_len_schedule",
        "load_format",
        "acceptance_rate_window_size",
        "acceptance_rate_threshold",
        "use_rejection_sampling",
        "allow_advanced_sampling",
        "advanced_sampling_mode",
        "enable_penalty",
    }
)
DTYPES = frozenset({"auto", "float16", "bfloat16", "float32"})
_DEPLOYMENT_KEYS = ("tensor_parallel_size", "dtype", "max_seq_len")
TYPE_KEYS = {
    "Draft_Target": frozenset(),
    "Eagle3": frozenset(
        {"eagle3_layers_to_capture", "eagle3_one_model", "eagle_choices", "use_dynamic_tree"}
    ),
    "NGram": frozenset({"max_matching_ngram_size", "is_keep_all", "is_use_oldest", "is_public_pool"}),
}


def _validate_schedule(schedule: Any, max_draft_len: int) -> None:
    if not isinstance(schedule, Mapping) or not schedule:
        raise fail("trtllm", "draft_len_schedule must be a non-empty mapping {batch size: draft length}")
    for batch, length in schedule.items():
        if not is_int(batch) or batch < 1:
            raise fail("trtllm", f"draft_len_schedule key {batch!r} must be a batch size >= 1")
        if not is_int(length) or length < 0:
            raise fail("trtllm", f"draft_len_schedule[{batch}] must be a draft length >= 0, got {length!r}")
        if length > max_draft_len:
            raise fail(
                "trtllm", f"draft_len_schedule[{batch}] = {length} exceeds max_draft_len {max_draft_len}"
            )
    smallest = min(schedule)
    if schedule[smallest] != max_draft_len:
        raise fail(
            "trtllm",
            f"draft_len_schedule[{smallest}] (the smallest key) must equal max_draft_len "
            f"{max_draft_len}, got {schedule[smallest]}",
        )


def validate(options: Mapping[str, Any]) -> None:
    """Check an options mapping against TensorRT-LLM's speculative_config rules.

    Example:
        >>> options = {"speculative_config": {"decoding_type": "Draft_Target", "max_draft_len": 4,
        ...            "speculative_model": "/m/d", "draft_len_schedule": {1: 3, 8: 1}}}
        >>> validate(options)  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        profiles.errors.ProfileError: trtllm export: draft_len_schedule[1] (the smallest key)
            must equal max_draft_len 4, got 3
    """
    if not isinstance(options, Mapping):
        raise fail("trtllm", "the options file root must be a mapping")
    unknown = sorted(set(options) - {"speculative_config", *_DEPLOYMENT_KEYS})
    if unknown:
        raise fail("trtllm", f"unexpected option(s) {', '.join(unknown)}")
    for key in ("tensor_parallel_size", "max_seq_len"):
        if key in options and (not is_int(options[key]) or options[key] < 1):
            raise fail("trtllm", f"{key} must be an integer >= 1, got {options[key]!r}")
    if "dtype" in options and options["dtype"] not in DTYPES:
        raise fail("trtllm", f"dtype must be one of {', '.join(sorted(DTYPES))}, got {options['dtype']!r}")
    if "speculative_config" not in options:
        return
    config = options["speculative_config"]
    if not isinstance(config, Mapping):
        raise fail("trtllm", "speculative_config must be a mapping")
    decoding_type = config.get("decoding_type")
    if decoding_type not in TYPE_KEYS:
        raise fail("trtllm", f"decoding_type must be one of {', '.join(TYPE_KEYS)}, got {decoding_type!r}")
    extra = sorted(set(config) - BASE_KEYS - TYPE_KEYS[decoding_type])
    if extra:
        raise fail("trtllm", f"unknown {decoding_type} key(s) {', '.join(extra)} (extra keys are forbidden)")
    max_draft_len = config.get("max_draft_len")
    if not is_int(max_draft_len) or max_draft_len <= 0:
        raise fail("trtllm", f"{decoding_type} needs max_draft_len > 0, got {max_draft_len!r}")
    if decoding_type in ("Draft_Target", "Eagle3") and not (
        config.get("speculative_model") or config.get("speculative_model_dir")
    ):
        raise fail("trtllm", f"{decoding_type} needs speculative_model")
    layers = config.get("eagle3_layers_to_capture")
    if layers is not None and (
        not isinstance(layers, list) or not layers or not all(is_int(x) and x >= 0 for x in layers)
    ):
        raise fail("trtllm", f"eagle3_layers_to_capture must be a list of layer ids >= 0, got {layers!r}")
    if config.get("eagle_choices") is not None and config.get("use_dynamic_tree"):
        raise fail("trtllm", "eagle_choices and use_dynamic_tree are mutually exclusive")
    size = config.get("max_matching_ngram_size")
    if size is not None and (not is_int(size) or size < 1):
        raise fail("trtllm", f"max_matching_ngram_size must be a positive integer, got {size!r}")
    threshold = config.get("acceptance_rate_threshold")
    if threshold is not None and (not is_number(threshold) or not 0.0 <= threshold <= 1.0):
        raise fail("trtllm", f"acceptance_rate_threshold must be in [0, 1], got {threshold!r}")
    if config.get("draft_len_schedule") is not None:
        if config.get("max_concurrency") is not None:
            raise fail("trtllm", "max_concurrency and draft_len_schedule are mutually exclusive")
        _validate_schedule(config["draft_len_schedule"], max_draft_len)


def draft_len_schedule(schedule: tuple[tuple[int, int], ...]) -> tuple[int, dict[int, int], list[str]]:
    """Tuned ``(batch_size, gamma)`` points -> ``(max_draft_len, draft_len_schedule, notes)``.

    Example:
        >>> draft_len_schedule(((1, 5), (2, 4), (4, 2), (8, 0)))[:2]
        (5, {1: 5, 2: 4, 4: 2})
        >>> draft_len_schedule(((1, 2), (4, 5)))  # doctest: +NORMALIZE_WHITESPACE
        (2, {1: 2, 4: 2}, ['Gamma 5 for batch sizes 2-4 clamped to max_draft_len 2
                            (the gamma at the smallest batch size).'])
    """
    ranges = batch_ranges(schedule)
    max_draft_len = ranges[0][2]
    notes = []
    for lo, hi, gamma in ranges[1:]:
        if gamma > max_draft_len:
            notes.append(
                f"Gamma {gamma} for batch sizes {lo}-{hi} clamped to max_draft_len {max_draft_len} "
                "(the gamma at the smallest batch size)."
            )
    clamped = batch_ranges(tuple((hi, min(gamma, max_draft_len)) for _, hi, gamma in ranges))
    while len(clamped) > 1 and clamped[-1][2] == 0:
        clamped.pop()
    table = {hi: gamma for _, hi, gamma in clamped}
    if 1 not in table:
        table = {1: max_draft_len, **table}
    return max_draft_len, table, notes


def head_layer_ids(folder: str | None) -> list[int] | None:
    """The target layers an EAGLE-3 head reads (its config.json's
    ``eagle_config.eagle_aux_hidden_state_layer_ids``), None when the folder or key is not readable here."""
    if not folder:
        return None
    try:
        config = read_json_file(Path(folder) / "config.json")
    except ProfileError:
        return None
    ids = ((config or {}).get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if isinstance(ids, list) and ids and all(is_int(x) and x >= 0 for x in ids):
        return [int(x) for x in ids]
    return None


def deployment_options(deployment: Deployment | None) -> dict[str, Any]:
    """The LLM-API options for the trials' tensor parallel size, dtype and longest sequence (none
    without a deployment; a GGUF type TensorRT-LLM does not load leaves ``dtype`` out).

    Example:
        >>> deployment_options(Deployment("vllm", "bfloat16", tensor_parallel_size=4, max_model_len=2048))
        {'tensor_parallel_size': 4, 'dtype': 'bfloat16', 'max_seq_len': 2048}
    """
    if deployment is None:
        return {}
    options: dict[str, Any] = {}
    if deployment.tensor_parallel_size != 1:
        options["tensor_parallel_size"] = deployment.tensor_parallel_size
    dtype, length = served_dtype(deployment), max_length(deployment)
    if dtype is not None:
        options["dtype"] = dtype
    if length is not None:
        options["max_seq_len"] = length
    return options


def extra_options(inputs: ExportInputs) -> tuple[dict[str, Any], list[str]]:
    """The options mapping (``{}`` when speculation is off) and the notes that explain it."""
    if inputs.schedule_max == 0:
        why = off_reason(inputs, per_batch_size=True)
        return {}, [f"Speculation off: {why}; no speculative_config."]
    max_draft_len, table, notes = draft_len_schedule(inputs.schedule)
    if max_draft_len == 0:
        return {}, [
            "Speculation off: gamma is 0 at the smallest tuned batch size "
            f"({schedule_text(inputs.schedule)}) "
            "and TensorRT-LLM needs the smallest draft_len_schedule key to map to max_draft_len > 0."
        ]
    config: dict[str, Any] = {}
    if inputs.drafter == "model":
        config.update(
            decoding_type="Draft_Target", max_draft_len=max_draft_len, speculative_model=inputs.draft
        )
    elif inputs.drafter == "eagle3":
        config.update(decoding_type="Eagle3", max_draft_len=max_draft_len, speculative_model=inputs.draft)
        layers = head_layer_ids(inputs.draft)
        if layers is not None:
            config["eagle3_layers_to_capture"] = layers
        else:
            notes.append(
                f"{inputs.draft}/config.json could not be read here: set eagle3_layers_to_capture to the "
                "head's "
                "eagle_config.eagle_aux_hidden_state_layer_ids (TensorRT-LLM's default {1, L/2-1, L-4} of an "
                "L-layer target is not what the head was trained on)."
            )
    else:
        config.update(
            decoding_type="NGram",
            max_draft_len=max_draft_len,
            max_matching_ngram_size=inputs.prompt_lookup_max,
        )
    config["draft_len_schedule"] = table
    notes.insert(
        0,
        f"Tuned schedule {schedule_text(inputs.schedule)}. Batch sizes up to each key use its draft "
        f"length; batch sizes above {max(table)} get 0 (speculation off). TensorRT-LLM applies "
        "draft_len_schedule only in modes that support a dynamic draft length; elsewhere max_draft_len "
        "holds at every batch size.",
    )
    if inputs.drafter in ("model", "eagle3") and inputs.confidence_threshold > 0:
        notes.append(
            f"{config['decoding_type']} has no draft-confidence cutoff; confidence_threshold "
            f"{inputs.confidence_threshold} is not exported."
        )
    notes += substitution_notes(inputs, f"TensorRT-LLM's {config['decoding_type']}")
    return {"speculative_config": config}, notes


def export(inputs: ExportInputs) -> Exported:
    """Render, validate and describe the TensorRT-LLM options file."""
    speculative, notes = extra_options(inputs)
    deployed = deployment_options(inputs.deployment)
    options = {**deployed, **speculative}
    if inputs.deployment is not None:
        dtype = inputs.deployment.dtype
        dropped = [] if "dtype" in deployed else [f"the {dtype} GGUF weights (no TensorRT-LLM dtype)"]
        written = [f"{key}: {value}" for key, value in deployed.items()]
        notes.insert(0, deployment_note(inputs.deployment, written, dropped))
    validate(options)
    command = f"trtllm-serve {shlex.quote(inputs.target)} --extra_llm_api_options {FILENAME}"
    header = comment_header(
        FILENAME,
        "TensorRT-LLM LLM-API options with the tuned speculative decoding config",
        inputs,
        STACK,
        notes,
        usage=command,
    )
    body = yaml.safe_dump(options, sort_keys=False, default_flow_style=False) if options else "{}\n"
    return Exported(
        "trtllm",
        FILENAME,
        header + body,
        command=command,
        speculation=bool(speculative),
        notes=tuple(notes),
    )
