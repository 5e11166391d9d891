"""vLLM: the JSON object for ``vllm serve --speculative-config``.

``method`` is ``draft_model`` (with ``model`` = the draft folder), ``eagle3`` (with ``model`` =
the EAGLE-3 head folder, docs/eagle3.md) or ``ngram`` (vLLM fills ``model`` itself);
``num_speculative_tokens`` is the schedule's largest gamma; the schedule
becomes ``num_speculative_tokens_per_batch_size`` = ``[[lo, hi, k], ...]`` (inclusive ranges
from batch size 1, k = 0 turns speculation off for that range). vLLM keeps the last range's
k for batch sizes above the last range. A schedule with one gamma everywhere needs no table.

``SpeculativeConfig`` is a pydantic dataclass that forbids unknown keys, so provenance goes
to the ``.meta.json`` sidecar, with a ready ``vllm serve`` command. When the schedule is 0
everywhere, the file holds JSON ``null``: vLLM parses ``--speculative-config null`` as "no
speculative config", and num_speculative_tokens = 0 would be rejected.

Beside it, ``vllm-serve.yaml`` holds every flag of :func:`serve_args` for ``vllm serve --config``
(the model as ``model``, the deployment's dtype, tensor parallel size, max model length and memory
share, the speculative config as a nested mapping, ``max-num-seqs``, the user's flags): vLLM reads
each key as ``--key`` and a nested mapping as its JSON (``FlexibleArgumentParser.load_config_file``,
docs/stacks/vllm.md), so the file reads back as the trials' own arguments. Flags a YAML key cannot
carry (a short option, a repeated flag, a value that starts with ``-``) stay on the command line after
``--config``, in their order. The ready command, with the deployment's environment, is in the
sidecar (``config_command``) and the file's header.

A table whose k 0 ranges were measured with the spec-autotune vLLM plugin (the profile's
``table_decision.needs_plugin``: a k 0 range is speculation off only with it) says so in a note
(what to install, the vLLM it was tuned with; the command sets the plugin's switch), and beside it
``vllm-speculative-config.no-plugin.json`` holds the fallback measured live beside the table, for a
server without the plugin, with its own ready command in the sidecar (``fallback_command``). Without
the plugin a k 0 range still runs the drafter, and the note says that instead.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from collections.abc import Mapping, Sequence
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
    fail,
    is_int,
    json_lines,
    off_reason,
    read_json_file,
    schedule_text,
    sidecar_json,
    substitution_notes,
)
from profiles.profile import ExportInputs
from profiles.schema import MISSING, PluginNeed

STACK = StackTarget("vLLM", "--speculative-config JSON", "vllm-project/vllm@002e77c1f0ef")
FILENAME = "vllm-speculative-config.json"
CONFIG_FILENAME = "vllm-serve.yaml"
FALLBACK_FILENAME = "vllm-speculative-config.no-plugin.json"  # for a server without the K=0 skip plugin
CONFIG_SOURCE = "vllm-project/vllm@00da11e37d1f"  # vllm/utils/argparse_utils.py, load_config_file

# SpeculativeConfig fields at 002e77c1 (docs/stacks/vllm.md); anything else is rejected by pydantic.
KNOWN_KEYS = frozenset(
    {
        "num_speculative_tokens",
        "model",
        "method",
        "draft_tensor_parallel_size",
        "tensor_parallel_size",
        "enforce_eager",
        "quantization",
        "moe_backend",
        "attention_backend",
        "kv_cache_dtype",
        "max_model_len",
        "revision",
        "code_revision",
        "index_share_for_mtp_iteration",
        "disable_padded_drafter_batch",
        "disable_eagle_block_drop",
        "use_local_argmax_reduction",
        "use_heterogeneous_vocab",
        "prompt_lookup_max",
        "prompt_lookup_min",
        "parallel_drafting",
        "num_speculative_tokens_per_batch_size",
        "suffix_decoding_max_tree_depth",
        "suffix_decoding_max_cached_requests",
        "suffix_decoding_max_spec_factor",
        "suffix_decoding_min_token_prob",
        "draft_load_config",
        "rejection_sample_method",
        "synthetic_acceptance_rates",
        "synthetic_acceptance_length",
        "enable_adaptive_verification",
        "draft_sample_method",
        "dspark_draft_topk",
    }
)
METHODS = frozenset(
    {
        "ngram",
        "medusa",
        "mlp_speculator",
        "draft_model",
        "suffix",
        "custom_class",
        "eagle",
        "eagle3",
        "extract_hidden_states",
        "deepseek_mtp",
        "dots3_note_mtp",
        "mimo_mtp",
        "mimo_v2_mtp",
        "glm4_moe_mtp",
        "glm4_moe_lite_mtp",
        "glm_ocr_mtp",
        "ernie_mtp",
        "nemotron_h_mtp",
        "exaone_moe_mtp",
        "exaone4_5_mtp",
        "qwen3_next_mtp",
        "qwen4_exp_mtp",
        "qwen3_5_mtp",
        "longcat_flash_mtp",
        "bailing_hybrid_v3_mtp",
        "minimax_m3_mtp",
        "bailing_hybrid_mtp",
        "mtp",
        "kimi_k3_mtp",
        "pangu_ultra_moe_mtp",
        "step3p5_mtp",
        "hy_v3_mtp",
        "hy_v4_mtp",
        "gemma4_mtp",
        "inkling_mtp",
        "glm5_next_mtp",
        "dflash",
        "ngram_gpu",
        "dspark",
    }
)
NGRAM_METHODS = frozenset({"ngram", "ngram_gpu"})


def _validate_table(table: Any, num_tokens: int) -> None:
    if not isinstance(table, list) or not table:
        raise fail("vllm", "num_speculative_tokens_per_batch_size must be a non-empty list")
    previous_hi = 0
    for entry in table:
        if not isinstance(entry, (list, tuple)) or len(entry) != 3 or not all(is_int(v) for v in entry):
            raise fail(
                "vllm", f"num_speculative_tokens_per_batch_size entry {entry!r} must be [lo, hi, k] integers"
            )
        lo, hi, k = entry
        if lo <= 0 or hi <= 0 or lo > hi:
            raise fail("vllm", f"batch-size range {entry!r} needs 0 < lo <= hi")
        if k < 0:
            raise fail("vllm", f"batch-size range {entry!r} has k < 0")
        if k > num_tokens:
            raise fail(
                "vllm",
                f"batch-size range {entry!r} has k > num_speculative_tokens ({num_tokens}); "
                "vLLM would silently clamp it",
            )
        if previous_hi == 0 and lo != 1:
            raise fail("vllm", f"the first batch-size range must start at 1, got {entry!r}")
        if previous_hi and lo <= previous_hi:
            raise fail("vllm", f"batch-size ranges must be sorted and must not overlap at {entry!r}")
        previous_hi = hi


def validate(config: Mapping[str, Any] | None) -> None:
    """Check a ``--speculative-config`` object against vLLM's hard rules (None = no config, valid).

    Example:
        >>> validate({"method": "ngram", "num_speculative_tokens": 0})
        Traceback (most recent call last):
        ...
        profiles.errors.ProfileError: vllm export: num_speculative_tokens must be an integer > 0, got 0
    """
    if config is None:
        return
    if not isinstance(config, Mapping):
        raise fail("vllm", f"the speculative config must be a JSON object, got {config!r}")
    unknown = sorted(set(config) - KNOWN_KEYS)
    if unknown:
        raise fail("vllm", f"unknown SpeculativeConfig key(s) {', '.join(unknown)} (pydantic forbids extras)")
    if "tensor_parallel_size" in config:
        raise fail("vllm", "tensor_parallel_size is rejected; use draft_tensor_parallel_size")
    num_tokens = config.get("num_speculative_tokens")
    if not is_int(num_tokens) or num_tokens <= 0:
        raise fail("vllm", f"num_speculative_tokens must be an integer > 0, got {num_tokens!r}")
    method, model = config.get("method"), config.get("model")
    if method is None and model is None:
        raise fail("vllm", "num_speculative_tokens was provided but without speculative model or method")
    if method is not None and method not in METHODS:
        raise fail("vllm", f"unknown method {method!r}")
    if method == "draft_model" and (not isinstance(model, str) or not model):
        raise fail("vllm", "method draft_model needs 'model' (the draft model path)")
    if method == "eagle3" and (not isinstance(model, str) or not model):
        raise fail("vllm", "method eagle3 needs 'model' (the EAGLE-3 head folder)")
    lookup_min, lookup_max = config.get("prompt_lookup_min"), config.get("prompt_lookup_max")
    for name, value in (("prompt_lookup_min", lookup_min), ("prompt_lookup_max", lookup_max)):
        if value is not None and (not is_int(value) or value < 1):
            raise fail("vllm", f"{name} must be an integer >= 1, got {value!r}")
    if (
        method in NGRAM_METHODS
        and lookup_min is not None
        and lookup_max is not None
        and lookup_min > lookup_max
    ):
        raise fail("vllm", f"prompt_lookup_min ({lookup_min}) must be <= prompt_lookup_max ({lookup_max})")
    tp = config.get("draft_tensor_parallel_size")
    if tp is not None and (not is_int(tp) or tp < 1):
        raise fail("vllm", f"draft_tensor_parallel_size must be an integer >= 1, got {tp!r}")
    if config.get("num_speculative_tokens_per_batch_size") is not None:
        _validate_table(config["num_speculative_tokens_per_batch_size"], num_tokens)


def _vocab_size(folder: str) -> int | None:
    config = read_json_file(Path(folder) / "config.json")
    size = None if config is None else config.get("vocab_size")
    return size if is_int(size) else None


def speculative_config(inputs: ExportInputs) -> dict[str, Any] | None:
    """The ``--speculative-config`` object for a profile, or None when speculation is off.

    Example:
        >>> from profiles.profile import ExportInputs
        >>> inputs = ExportInputs("0.1.0", "2026-11-30T01:30:00+00:00", "H200", "k", "/m/t", "/m/d", "model",
        ...                       4, 0.0, "constant", None, None, ((1, 5), (2, 4), (4, 2), (8, 0)))
        >>> speculative_config(inputs)["num_speculative_tokens_per_batch_size"]
        [[1, 1, 5], [2, 2, 4], [3, 4, 2], [5, 8, 0]]
    """
    num_tokens = inputs.schedule_max
    if num_tokens == 0:
        return None
    config: dict[str, Any] = {}
    if inputs.drafter == "model":
        config.update(method="draft_model", model=inputs.draft)
    elif inputs.drafter == "eagle3":  # the head folder as vLLM's llama_eagle3.py loads it (docs/eagle3.md)
        config.update(method="eagle3", model=inputs.draft)
    else:
        config.update(
            method="ngram",
            prompt_lookup_max=inputs.prompt_lookup_max,
            prompt_lookup_min=inputs.prompt_lookup_min,
        )
    config["num_speculative_tokens"] = num_tokens
    ranges = batch_ranges(inputs.schedule)
    if len(ranges) > 1:
        config["num_speculative_tokens_per_batch_size"] = [list(r) for r in ranges]
    return config


def deployment_args(d: Deployment | None) -> list[str]:
    """The ``vllm serve`` flags of a :class:`~profiles.deployment.Deployment` (none without one).

    Example:
        >>> deployment_args(Deployment("vllm", "bfloat16", tensor_parallel_size=4, max_model_len=2048))
        ['--dtype', 'bfloat16', '--tensor-parallel-size', '4', '--max-model-len', '2048']
    """
    if d is None:
        return []
    args = ["--dtype", d.dtype]
    if d.tensor_parallel_size != 1:
        args += ["--tensor-parallel-size", str(d.tensor_parallel_size)]
    if d.max_model_len is not None:
        args += ["--max-model-len", str(d.max_model_len)]
    if d.gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", f"{d.gpu_memory_utilization:g}"]
    return args


def serve_args(inputs: ExportInputs) -> list[str]:
    """The arguments of ``vllm serve`` for a profile (the autotune vllm backend launches exactly these).

    The target, the deployment's flags (dtype, tensor parallel size, max model length, memory
    share) when the profile has them, ``--speculative-config`` when speculation is on,
    ``--max-num-seqs`` when the profile tuned the number of concurrent sequences, then the user's
    own flags as the trials ran them.

    Example:
        >>> from profiles.profile import ExportInputs
        >>> inputs = ExportInputs("0.1.0", "2026-11-30T01:30:00+00:00", "H200", "k", "/m/t", "/m/d", "model",
        ...                       3, 0.0, "constant", None, None, ((1, 3),), max_batch_size=4)
        >>> args = serve_args(inputs)
        >>> args[:3], args[4:]
        (['serve', '/m/t', '--speculative-config'], ['--max-num-seqs', '4'])
    """
    args = ["serve", inputs.target, *deployment_args(inputs.deployment)]
    config = speculative_config(inputs)
    if config is not None:
        args += ["--speculative-config", json.dumps(config)]
    if inputs.max_batch_size is not None:
        args += ["--max-num-seqs", str(inputs.max_batch_size)]
    if inputs.deployment is not None:
        args += list(inputs.deployment.extra_args)
    return args


def serve_command(inputs: ExportInputs) -> str:
    """The shell command that serves the profile: the deployment's environment, then ``vllm serve``."""
    return " ".join([*_env_words(inputs), shlex.join(["vllm", *serve_args(inputs)])])


def _env_words(inputs: ExportInputs) -> list[str]:
    """The deployment's environment as ``KEY=value`` words; with a plugin need, its switch set to 1."""
    env = dict(inputs.deployment.env if inputs.deployment is not None else ())
    if inputs.needs_plugin is not None:
        env[inputs.needs_plugin.env] = "1"
    return [shlex.quote(f"{k}={v}") for k, v in env.items()]


PLUGIN_INSTALL = (
    "install it with the pip of vLLM's environment, from a spec-autotune checkout: pip install "
    "autotune/vllm_plugin (tools/install_vllm_cpu.sh does so), or pip install 'spec-autotune[vllm-plugin]' "
    "(docs/stacks/vllm.md#the-k0-skip-plugin)"
)
"""How the spec-autotune vLLM plugin is installed (docs/stacks/vllm.md#the-k0-skip-plugin)."""
PLUGIN_VARS = "SPEC_AUTOTUNE_K0_"
"""The prefix of the plugin's environment variables, none of which a server without it needs."""


def fallback_inputs(inputs: ExportInputs, need: PluginNeed) -> ExportInputs:
    """``inputs`` as a server without the plugin serves them: the need's fallback schedule, and the
    plugin's variables (its switch, its hold rule's ``SPEC_AUTOTUNE_K0_HOLD_TOKENS``) dropped from
    the deployment's environment."""
    deployment = inputs.deployment
    if deployment is not None:
        env = tuple((k, v) for k, v in deployment.env if k != need.env and not k.startswith(PLUGIN_VARS))
        deployment = dataclasses.replace(deployment, env=env)
    return dataclasses.replace(inputs, schedule=need.fallback, deployment=deployment, needs_plugin=None)


def plugin_note(inputs: ExportInputs, need: PluginNeed, ranges: Sequence[Sequence[int]]) -> str:
    """The note of a table whose K=0 ranges are speculation off only with the spec-autotune plugin:
    what to install, the switch the command sets, and the file and command for a server without it."""
    off = ", ".join(f"{lo}-{hi}" if lo != hi else str(lo) for lo, hi, k in ranges if k == 0)
    tuned = f"tuned with vLLM {need.vllm_version}" if need.vllm_version else "the tuned vLLM version unknown"
    fallback = fallback_inputs(inputs, need)
    ks = {k for _, k in need.fallback}
    what = f"gamma {min(ks)} at every batch size" if len(ks) == 1 else schedule_text(need.fallback)
    if speculative_config(fallback) is None:
        what = "no speculation"
    why = f" ({need.fallback_reason})" if need.fallback_reason is not MISSING else ""
    return (
        f"The k 0 range (batch sizes {off}) is speculation off only with the spec-autotune vLLM plugin "
        f"({need.plugin}; {tuned}; the plugin refuses other vLLM release lines): {PLUGIN_INSTALL}. "
        f"{need.env}=1 switches it on (the command sets it). Without the plugin a k 0 range still runs "
        f"the drafter's forward every step, so a server without it serves {FALLBACK_FILENAME} instead: "
        f"{what}{why}; its command is the sidecar's fallback_command."
    )


CONFIG_STACK = StackTarget("vLLM", "vllm serve --config YAML", CONFIG_SOURCE)
_NUMBER = re.compile(r"-?\d+(\.\d*)?([eE][-+]?\d+)?")


def _is_flag(token: str) -> bool:
    """An option token: starts with ``-`` and is not a negative number."""
    return token.startswith("-") and not _NUMBER.fullmatch(token)


def _flag_groups(args: Sequence[str]) -> list[tuple[str, list[str]]]:
    """``["--a", "1", "--b"]`` -> ``[("--a", ["1"]), ("--b", [])]``: each option with its values."""
    groups: list[tuple[str, list[str]]] = []
    for token in args:
        if _is_flag(token) or not groups:
            groups.append((token, []))
        else:
            groups[-1][1].append(token)
    return groups


def _yaml_scalar(token: str) -> Any:
    """``token`` as the YAML scalar whose ``str()`` (how vLLM reads a key's value back) is ``token``."""
    for kind in (int, float):
        try:
            value = kind(token)
        except ValueError:
            continue
        if str(value) == token:
            return value
    return token


def _yaml_value(values: Sequence[str]) -> Any:
    """An option's values as one YAML value: a bare switch is ``true``, one value a scalar (a JSON object
    that ``json.dumps`` writes back byte for byte, a mapping), several values a list."""
    if not values:
        return True
    if len(values) > 1:
        return [_yaml_scalar(v) for v in values]
    token = values[0]
    if token.startswith("{"):
        try:
            obj = json.loads(token)
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict) and json.dumps(obj) == token:
            return obj
    return _yaml_scalar(token)


def serve_config(inputs: ExportInputs) -> tuple[dict[str, Any], list[str]]:
    """The ``vllm serve --config`` mapping of :func:`serve_args`, and the flags left for the command line.

    The mapping holds the model and every long option, in order, until the first one a key cannot
    carry (a short option, ``--flag=value``, a repeat); that one and every later flag stay on the
    command line, so vLLM still sees them in the trials' order.

    Example:
        >>> from profiles.profile import ExportInputs
        >>> d = Deployment("vllm", "bfloat16", extra_args=("--enforce-eager", "-O0"))
        >>> inputs = ExportInputs("0.1.0", "t", "H200", "k", "/m/t", "/m/d", "model", 3, 0.0, "constant",
        ...                       None, None, ((1, 3),), max_batch_size=4, deployment=d)
        >>> config, rest = serve_config(inputs)
        >>> config["model"], config["dtype"], config["max-num-seqs"], config["enforce-eager"], rest
        ('/m/t', 'bfloat16', 4, True, ['-O0'])
    """
    config: dict[str, Any] = {"model": inputs.target}
    rest: list[str] = []
    for flag, values in _flag_groups(serve_args(inputs)[2:]):
        key = flag[2:]
        if rest or not flag.startswith("--") or "=" in flag or key in config:
            rest += [flag, *values]
        else:
            config[key] = _yaml_value(values)
    return config, rest


def config_command(inputs: ExportInputs, rest: Sequence[str] = ()) -> str:
    """The ready command for ``vllm-serve.yaml``: the deployment's environment, ``vllm serve --config``,
    then the flags the file cannot carry (run from the folder that holds the file)."""
    return " ".join([*_env_words(inputs), shlex.join(["vllm", "serve", "--config", CONFIG_FILENAME, *rest])])


def config_yaml(inputs: ExportInputs, notes: Sequence[str] = ()) -> tuple[str, str]:
    """``(vllm-serve.yaml text, its ready command)``; the header carries provenance and ``notes``."""
    config, rest = serve_config(inputs)
    command = config_command(inputs, rest)
    header = comment_header(
        CONFIG_FILENAME,
        "vllm serve --config file with every flag the trials ran with",
        inputs,
        CONFIG_STACK,
        notes,
        usage=command,
    )
    body = yaml.safe_dump(config, sort_keys=False, default_flow_style=None, width=1 << 20, allow_unicode=True)
    return header + body, command


def max_num_seqs_note(max_batch_size: int) -> str:
    """How ``--max-num-seqs`` was chosen."""
    return (
        f"--max-num-seqs {max_batch_size} is the tuned max_batch_size (chosen.max_batch_size): the number of "
        "concurrent sequences the study chose among search.max_batch_size, measured with the rest of the "
        "chosen configuration; vLLM schedules at most this many requests per step."
    )


def export(inputs: ExportInputs) -> Exported:
    """Render, validate and describe the vLLM export (see the module docstring).

    Long because: the export's notes, one per case of the profile, in the order the file states them.
    """
    config = speculative_config(inputs)
    table = (config or {}).get("num_speculative_tokens_per_batch_size") or []
    need = inputs.needs_plugin if any(k == 0 for *_, k in table) else None  # off ranges by the plugin
    notes = []
    if config is None:
        why = off_reason(inputs, per_batch_size=True)
        notes.append(
            f"Speculation off: {why}. Serve without --speculative-config; this file holds JSON null, "
            "which vLLM reads as no speculative config (num_speculative_tokens must be > 0)."
        )
    else:
        last = inputs.schedule[-1][0]
        if "num_speculative_tokens_per_batch_size" in config:
            notes.append(
                f"Tuned schedule {schedule_text(inputs.schedule)}. Batch sizes between tuned points use "
                "the gamma of the next larger tuned batch size; above batch size "
                f"{last} vLLM keeps the last range's k "
                f"({config['num_speculative_tokens_per_batch_size'][-1][2]})."
            )
            ranges = config["num_speculative_tokens_per_batch_size"]
            if need is not None:
                notes.append(plugin_note(inputs, need, ranges))
            elif inputs.drafter != "ngram" and any(k == 0 for *_, k in ranges):
                notes.append(
                    "A range at k 0 drafts no token but still runs the drafter's forward every step (vLLM "
                    "keeps its KV cache in sync: llm_base_proposer.py, propose), so it costs more than no "
                    "speculation there; only a table measured in vLLM (autotune tune --backend vllm) "
                    "includes that cost."
                )
        else:
            notes.append(
                f"Gamma {config['num_speculative_tokens']} at every tuned batch size "
                f"({schedule_text(inputs.schedule)}), so no per-batch-size table is needed."
            )
        if inputs.drafter == "model":
            sizes = (_vocab_size(inputs.target), _vocab_size(inputs.draft or ""))
            if None not in sizes and sizes[0] != sizes[1]:
                raise ProfileError(
                    f"vllm export: target and draft vocab sizes differ ({sizes[0]} vs {sizes[1]}); "
                    "vLLM's draft_model method requires equal vocabularies"
                )
        if inputs.confidence_threshold > 0:
            notes.append(
                f"vLLM has no draft-confidence cutoff; confidence_threshold {inputs.confidence_threshold} "
                "is not exported."
            )
        method = "eagle3" if inputs.drafter == "eagle3" else "draft_model"
        separate = "" if inputs.drafter == "eagle3" else "; ngram and draft_model are separate methods"
        notes += substitution_notes(inputs, f"vLLM ({method}{separate})")
    validate(config)
    if inputs.max_batch_size is not None:
        notes.append(max_num_seqs_note(inputs.max_batch_size))
    command = serve_command(inputs)
    serve_yaml, ready = config_yaml(inputs, notes[-1:] if inputs.max_batch_size is not None else ())
    text = "null\n" if config is None else json_lines(config)
    extra_files = [(CONFIG_FILENAME, serve_yaml)]
    plugin: dict[str, Any] = {}
    if need is not None:
        fallback = fallback_inputs(inputs, need)
        fallback_config = speculative_config(fallback)
        validate(fallback_config)
        fallback_text = "null\n" if fallback_config is None else json_lines(fallback_config)
        extra_files.append((FALLBACK_FILENAME, fallback_text))
        plugin = {"needs_plugin": need.to_json(), "fallback_command": serve_command(fallback)}
    sidecar = sidecar_json(
        inputs,
        STACK,
        speculation=config is not None,
        notes=notes,
        command=command,
        config_command=ready,
        **plugin,
    )
    return Exported(
        "vllm",
        FILENAME,
        text,
        sidecar=sidecar,
        command=command,
        speculation=config is not None,
        notes=tuple(notes),
        extra_files=tuple(extra_files),
    )
