"""transformers: a ``generation_config.json`` with the tuned assisted-generation settings.

The target folder's own ``generation_config.json`` (bos/eos/pad ids, sampling defaults) is
the base when it exists. A draft model adds ``num_assistant_tokens`` (the chosen gamma),
``num_assistant_tokens_schedule`` (constant | heuristic) and ``assistant_confidence_threshold``
(0.0 disables the early stop; left unset transformers would use 0.4). transformers reads
these three from the ASSISTANT model's generation config, so load this file into the draft
model (see the sidecar's ``usage``). The n-gram drafter sets ``prompt_lookup_num_tokens``
(which selects prompt-lookup decoding) and ``max_matching_ngram_size`` instead. Speculation
off leaves only the base fields. Provenance goes to the ``.meta.json`` sidecar.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from profiles.exporters._common import (
    Exported,
    StackTarget,
    fail,
    is_int,
    is_number,
    off_reason,
    read_json_file,
    schedule_text,
    sidecar_json,
    substitution_notes,
)
from profiles.profile import ExportInputs

STACK = StackTarget(
    "transformers", "GenerationConfig (generation_config.json)", "huggingface/transformers@6120704a01bd"
)
FILENAME = "generation_config.json"
SCHEDULES = frozenset({"constant", "heuristic", "heuristic_transient"})
_SPECULATIVE_KEYS = (
    "num_assistant_tokens",
    "num_assistant_tokens_schedule",
    "assistant_confidence_threshold",
    "prompt_lookup_num_tokens",
    "max_matching_ngram_size",
    "assistant_early_exit",
)


def validate(config: Mapping[str, Any]) -> None:
    """Check the assisted-generation fields the way transformers uses them.

    Example:
        >>> validate({"prompt_lookup_num_tokens": 0})
        Traceback (most recent call last):
        ...
        profiles.errors.ProfileError: hf export: prompt_lookup_num_tokens must be an integer > 0, got 0
    """
    if not isinstance(config, Mapping):
        raise fail("hf", "generation config must be a JSON object")
    if "assistant_model" in config:
        raise fail("hf", "assistant_model cannot be set in a GenerationConfig (pass it to generate())")
    for key in ("num_assistant_tokens", "prompt_lookup_num_tokens", "max_matching_ngram_size"):
        if key in config and config[key] is not None and (not is_int(config[key]) or config[key] <= 0):
            raise fail("hf", f"{key} must be an integer > 0, got {config[key]!r}")
    schedule = config.get("num_assistant_tokens_schedule")
    if schedule is not None and schedule not in SCHEDULES:
        raise fail(
            "hf",
            f"num_assistant_tokens_schedule must be one of {', '.join(sorted(SCHEDULES))}, got {schedule!r}",
        )
    threshold = config.get("assistant_confidence_threshold")
    if threshold is not None and (not is_number(threshold) or not 0.0 <= threshold <= 1.0):
        raise fail("hf", f"assistant_confidence_threshold must be a number in [0, 1], got {threshold!r}")


def generation_config(inputs: ExportInputs) -> dict[str, Any]:
    """The generation config dict: the target's own fields plus the tuned assisted-generation keys.

    Example:
        >>> from profiles.profile import ExportInputs
        >>> inputs = ExportInputs("0.1.0", "t", "H200", "k", "/nonexistent/t", "/m/d", "model", 4, 0.3,
        ...                       "heuristic", None, None, ((1, 4),))
        >>> generation_config(inputs)  # doctest: +NORMALIZE_WHITESPACE
        {'num_assistant_tokens': 4, 'num_assistant_tokens_schedule': 'heuristic',
         'assistant_confidence_threshold': 0.3}
    """
    base = read_json_file(Path(inputs.target) / FILENAME) or {}
    config = {
        key: value
        for key, value in base.items()
        if key not in _SPECULATIVE_KEYS and key != "transformers_version"
    }
    if inputs.drafter == "none" or inputs.gamma == 0:
        return config
    if inputs.drafter == "model":
        config.update(
            num_assistant_tokens=inputs.gamma,
            num_assistant_tokens_schedule=inputs.gamma_schedule,
            assistant_confidence_threshold=inputs.confidence_threshold,
        )
    else:
        config.update(prompt_lookup_num_tokens=inputs.gamma, max_matching_ngram_size=inputs.prompt_lookup_max)
    return config


def export(inputs: ExportInputs) -> Exported:
    """Render, validate and describe the generation_config.json export (with a sidecar)."""
    config = generation_config(inputs)
    validate(config)
    speculation = inputs.drafter != "none" and inputs.gamma > 0
    notes = []
    if not speculation:
        why = off_reason(inputs)
        notes.append(
            f"Speculation off: {why}. Call generate() without assistant_model or prompt_lookup_num_tokens."
        )
        usage = (
            "model.generate(..., generation_config=GenerationConfig.from_pretrained(<folder of this file>))"
        )
    elif inputs.drafter == "model":
        usage = (
            "assistant = AutoModelForCausalLM.from_pretrained(<draft>); assistant.generation_config = "
            "GenerationConfig.from_pretrained(<folder of this file>); model.generate(..., assistant_model="
            "assistant). transformers reads num_assistant_tokens, num_assistant_tokens_schedule and "
            "assistant_confidence_threshold from the assistant's generation config."
        )
    else:
        usage = (
            "model.generate(..., "
            "generation_config=GenerationConfig.from_pretrained(<folder of this file>)), "
            "or copy the file into the target folder; "
            "prompt_lookup_num_tokens selects prompt-lookup decoding."
        )
    if speculation:
        notes.append(
            f"transformers assisted generation runs one sequence at a time; it uses the chosen gamma "
            f"{inputs.gamma}. Tuned per-batch-size schedule, for reference: {schedule_text(inputs.schedule)}."
        )
        if inputs.drafter == "ngram" and inputs.prompt_lookup_min and inputs.prompt_lookup_min > 1:
            notes.append(
                f"transformers matches n-grams from max_matching_ngram_size down to 1; the profile's "
                f"prompt_lookup_min {inputs.prompt_lookup_min} has no equivalent."
            )
        notes += substitution_notes(inputs, "transformers assisted generation")
    text = json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    sidecar = sidecar_json(
        inputs,
        STACK,
        speculation=speculation,
        notes=notes,
        usage=usage,
        target=inputs.target,
        draft=inputs.draft,
    )
    return Exported("hf", FILENAME, text, sidecar=sidecar, speculation=speculation, notes=tuple(notes))
