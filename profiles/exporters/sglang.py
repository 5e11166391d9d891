"""SGLang: a launch script with the ``--speculative-*`` server flags.

A draft model runs as ``STANDALONE`` with ``--speculative-eagle-topk 1`` (a chain):
``--speculative-num-steps`` = gamma and ``--speculative-num-draft-tokens`` = gamma + 1 (the
count includes the verified token; with topk 1 SGLang forces exactly steps + 1). The n-gram
drafter runs as ``NGRAM``: topk is taken from ``--speculative-ngram-max-bfs-breadth`` (set to
1 for a chain, ``--speculative-eagle-topk`` would be overridden) and num-draft-tokens =
gamma + 1. SGLang has one draft length for all batch sizes, so the profile's chosen gamma is
used; gamma 0 exports no speculative flags.

A chosen token tree is exported as a STANDALONE tree: SGLang's eagle-family argument handling
(``_handle_eagle_family`` in python/sglang/srt/arg_groups/speculative_hook.py, which STANDALONE
goes through) rejects ``--speculative-eagle-topk`` > 1 only with the trtllm_mha attention
backend, with rejection sampling, and with page size > 1 outside flashinfer/fa3/triton
(docs/stacks/sglang.md). SGLang's tree takes one top-k for every step and keeps the draft's best
``num_draft_tokens - 1`` nodes (EAGLE-2's best-first selection) of ``topk + (steps - 1) * topk^2``
candidates, so the export is ``--speculative-num-steps`` = depth, ``--speculative-eagle-topk`` =
the largest per-depth top-k and ``--speculative-num-draft-tokens`` = the tree's nodes (capped at
the candidates) + 1; a note says that the shape is SGLang's selection, not the static one measured.
A dynamic tree ("KxD/N") is that selection itself, so it maps one to one: num-steps D,
eagle-topk K, num-draft-tokens N + 1.

An EAGLE-3 head (drafter ``eagle3``) runs as ``EAGLE3`` with ``--speculative-draft-model-path`` = the
head folder (the format vLLM loads, docs/eagle3.md: SGLang's ``llama_eagle3.py`` registers the same
``LlamaForCausalLMEagle3`` architecture and its model runner reads the same
``eagle_config.eagle_aux_hidden_state_layer_ids``): a chain as num-steps gamma, topk 1,
num-draft-tokens gamma + 1 (the same forced relation as STANDALONE's chain), a chosen tree (static
or dynamic) with the same three flags as the draft model's tree above (EAGLE3 is the eagle family
those flags were made for).

A profile measured in a serving stack carries its deployment: ``--tp-size`` (when not 1),
``--dtype`` and ``--context-length`` repeat the trials' tensor parallel size, dtype and longest
sequence (docs/stacks/sglang.md).
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
    one_length_note,
    schedule_text,
    served_dtype,
    shell_script,
    substitution_notes,
    tree_text,
)
from profiles.profile import ExportInputs

STACK = StackTarget(
    "SGLang", "server args (python -m sglang.launch_server)", "sgl-project/sglang@001067fffe33"
)
FILENAME = "sglang-args.sh"
PROGRAM = ("python", "-m", "sglang.launch_server")
ALGORITHMS = frozenset({"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK"})
KNOWN_FLAGS = frozenset(
    {
        "--model-path",
        "--tp-size",
        "--dtype",
        "--context-length",
        "--speculative-algorithm",
        "--speculative-draft-model-path",
        "--speculative-num-steps",
        "--speculative-eagle-topk",
        "--speculative-num-draft-tokens",
        "--speculative-ngram-min-bfs-breadth",
        "--speculative-ngram-max-bfs-breadth",
    }
)
DTYPES = frozenset({"auto", "half", "float16", "bfloat16", "float", "float32"})
_INT_FLAGS = (
    "--tp-size",
    "--context-length",
    "--speculative-num-steps",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
    "--speculative-ngram-min-bfs-breadth",
    "--speculative-ngram-max-bfs-breadth",
)


def validate(args: Mapping[str, Any]) -> None:
    """Check SGLang server flags (flag -> value) against the hard and auto-adjust rules.

    Example:
        >>> args = {"--model-path": "/m/t", "--speculative-algorithm": "STANDALONE",
        ...         "--speculative-draft-model-path": "/m/d", "--speculative-num-steps": 4,
        ...         "--speculative-eagle-topk": 1, "--speculative-num-draft-tokens": 4}
        >>> validate(args)  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        profiles.errors.ProfileError: sglang export: with topk 1 --speculative-num-draft-tokens
            must be num-steps + 1 (5), got 4

    Long because: one check per SGLang flag the export writes, in the order the stack reads them.
    """
    unknown = sorted(set(args) - KNOWN_FLAGS)
    if unknown:
        raise fail("sglang", f"unknown flag(s) {', '.join(unknown)}")
    if not args.get("--model-path"):
        raise fail("sglang", "--model-path is required")
    for flag in _INT_FLAGS:
        if flag in args and (not is_int(args[flag]) or args[flag] < 1):
            raise fail("sglang", f"{flag} must be an integer >= 1, got {args[flag]!r}")
    if "--dtype" in args and args["--dtype"] not in DTYPES:
        raise fail("sglang", f"--dtype must be one of {', '.join(sorted(DTYPES))}, got {args['--dtype']!r}")
    algorithm = args.get("--speculative-algorithm")
    if algorithm is None:
        spec = sorted(flag for flag in args if flag.startswith("--speculative-"))
        if spec:
            raise fail("sglang", f"{', '.join(spec)} without --speculative-algorithm")
        return
    if str(algorithm).upper() not in ALGORITHMS:
        raise fail("sglang", f"unknown speculative algorithm {algorithm!r}")
    algorithm = str(algorithm).upper()
    steps, topk = args.get("--speculative-num-steps"), args.get("--speculative-eagle-topk")
    draft_tokens = args.get("--speculative-num-draft-tokens")
    if algorithm in ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE"):
        if algorithm in ("STANDALONE", "EAGLE3") and not args.get("--speculative-draft-model-path"):
            raise fail("sglang", f"{algorithm} needs --speculative-draft-model-path")
        if steps is None and (topk is not None or draft_tokens is not None):
            raise fail(
                "sglang",
                "--speculative-eagle-topk/--speculative-num-draft-tokens need --speculative-num-steps",
            )
        if topk == 1 and steps is not None and draft_tokens != steps + 1:
            raise fail(
                "sglang",
                f"with topk 1 --speculative-num-draft-tokens must be num-steps + 1 "
                f"({steps + 1}), got {draft_tokens}",
            )
        if topk is not None and topk > 1 and steps is not None:
            if draft_tokens is None:
                raise fail(
                    "sglang", "with topk > 1 set --speculative-num-draft-tokens (the tree's verified tokens)"
                )
            if draft_tokens - 1 > tree_candidates(topk, steps):
                raise fail(
                    "sglang",
                    f"--speculative-num-draft-tokens {draft_tokens} exceeds the tree's "
                    f"{tree_candidates(topk, steps)} candidate nodes + 1 (topk {topk}, num-steps {steps})",
                )
    if algorithm == "NGRAM":
        if "--speculative-eagle-topk" in args:
            raise fail(
                "sglang",
                "NGRAM takes topk from --speculative-ngram-max-bfs-breadth; "
                "--speculative-eagle-topk would be overridden",
            )
        if draft_tokens is not None and draft_tokens < 2:
            raise fail("sglang", f"NGRAM needs --speculative-num-draft-tokens >= 2, got {draft_tokens}")
        low = args.get("--speculative-ngram-min-bfs-breadth", 1)
        high = args.get("--speculative-ngram-max-bfs-breadth", 10)
        if low > high:
            raise fail("sglang", f"ngram min BFS breadth {low} exceeds max {high}")


def tree_candidates(topk: int, steps: int) -> int:
    """Draft nodes an SGLang eagle-family tree chooses from: topk at the first step, topk^2 at each
    later one."""
    return topk + (steps - 1) * topk * topk


def tree_args(topk_per_depth: tuple[int, ...], dynamic_nodes: int = 0) -> tuple[int, int, int]:
    """``(num_steps, eagle_topk, num_draft_tokens)`` for a static tree (per-depth top-k) or a dynamic
    tree (``dynamic_nodes`` > 0: SGLang's own selection, one to one).

    Example:
        >>> tree_args((2, 1, 1))  # 6 nodes, 2 + 2 * 4 = 10 candidates
        (3, 2, 7)
        >>> tree_args((2, 2, 2))  # 14 nodes, capped at 10 candidates
        (3, 2, 11)
        >>> tree_args((2, 2, 2, 2, 2, 2), 10)  # dynamic 2x6/10
        (6, 2, 11)
    """
    steps, topk = len(topk_per_depth), max(topk_per_depth)
    if dynamic_nodes:
        return steps, topk, dynamic_nodes + 1
    nodes, width = 0, 1
    for k in topk_per_depth:
        width *= k
        nodes += width
    return steps, topk, min(nodes, tree_candidates(topk, steps)) + 1


def deployment_args(deployment: Deployment | None) -> dict[str, Any]:
    """SGLang's flags for the trials' tensor parallel size, dtype and max length (none without a
    deployment; a GGUF type SGLang does not load leaves ``--dtype`` out).

    Example:
        >>> deployment_args(Deployment("vllm", "bfloat16", tensor_parallel_size=4, max_model_len=2048))
        {'--tp-size': 4, '--dtype': 'bfloat16', '--context-length': 2048}
    """
    if deployment is None:
        return {}
    args: dict[str, Any] = {}
    if deployment.tensor_parallel_size != 1:
        args["--tp-size"] = deployment.tensor_parallel_size
    dtype, length = served_dtype(deployment), max_length(deployment)
    if dtype is not None:
        args["--dtype"] = dtype
    if length is not None:
        args["--context-length"] = length
    return args


def server_args(inputs: ExportInputs) -> dict[str, Any]:
    """The SGLang flags (flag -> value) for a profile, target path included: the deployment's
    (:func:`deployment_args`), then the speculative ones.

    Example:
        >>> from profiles.profile import ExportInputs
        >>> inputs = ExportInputs("0.1.0", "t", "H200", "k", "/m/t", None, "ngram", 3, 0.0, "constant", 2, 4,
        ...                       ((1, 3),))
        >>> server_args(inputs)["--speculative-num-draft-tokens"]
        4
    """
    args: dict[str, Any] = {"--model-path": inputs.target, **deployment_args(inputs.deployment)}
    gamma = 0 if inputs.drafter == "none" else inputs.gamma
    if gamma == 0:
        return args
    if inputs.drafter in ("model", "eagle3") and inputs.tree_topk:
        steps, topk, draft_tokens = tree_args(inputs.tree_topk, inputs.tree_nodes)
        args.update(
            {
                "--speculative-algorithm": "STANDALONE" if inputs.drafter == "model" else "EAGLE3",
                "--speculative-draft-model-path": inputs.draft,
                "--speculative-num-steps": steps,
                "--speculative-eagle-topk": topk,
                "--speculative-num-draft-tokens": draft_tokens,
            }
        )
    elif inputs.drafter in ("model", "eagle3"):
        args.update(
            {
                "--speculative-algorithm": "STANDALONE" if inputs.drafter == "model" else "EAGLE3",
                "--speculative-draft-model-path": inputs.draft,
                "--speculative-num-steps": gamma,
                "--speculative-eagle-topk": 1,
                "--speculative-num-draft-tokens": gamma + 1,
            }
        )
    else:
        args.update(
            {
                "--speculative-algorithm": "NGRAM",
                "--speculative-num-draft-tokens": gamma + 1,
                "--speculative-ngram-max-bfs-breadth": 1,
            }
        )
    return args


def export(inputs: ExportInputs) -> Exported:
    """Render, validate and describe the SGLang launch script.

    Long because: the export's notes, one per case of the profile, in the order the file states them.
    """
    args = server_args(inputs)
    validate(args)
    speculation = "--speculative-algorithm" in args
    notes = []
    if inputs.deployment is not None:
        written = [f"{flag} {value}" for flag, value in deployment_args(inputs.deployment).items()]
        dtype = inputs.deployment.dtype
        dropped = [] if "--dtype" in args else [f"the {dtype} GGUF weights (no SGLang --dtype)"]
        notes.append(deployment_note(inputs.deployment, written, dropped))
    if not speculation:
        why = off_reason(inputs)
        notes.append(f"Speculation off: {why}, so no --speculative-* flags.")
    else:
        if inputs.tree_topk:
            notes.append(
                f"SGLang uses one tree at every batch size. Tuned chain schedule, for reference: "
                f"{schedule_text(inputs.schedule)}."
            )
        else:
            notes.append(one_length_note(inputs, "SGLang"))
        if inputs.drafter in ("model", "eagle3") and inputs.confidence_threshold > 0 and not inputs.tree_topk:
            notes.append(
                f"SGLang has no draft-confidence early stop; confidence_threshold "
                f"{inputs.confidence_threshold} is not exported."
            )
        if inputs.drafter == "eagle3":
            notes.append(
                "EAGLE3: the head folder is loaded as LlamaForCausalLMEagle3 with the target's hidden states "
                "of its eagle_config.eagle_aux_hidden_state_layer_ids; SGLang caps --max-running-requests at "
                "48 for the EAGLE family when it is not set."
            )
        if inputs.drafter == "ngram":
            notes.append(
                "NGRAM matches against its own trie (--speculative-ngram-max-trie-depth), not the "
                f"profile's prompt_lookup {inputs.prompt_lookup_min}..{inputs.prompt_lookup_max} window."
            )
        if inputs.gamma_schedule != "constant" and not inputs.tree_topk:
            notes.append(
                f"gamma_schedule {inputs.gamma_schedule!r} has no SGLang equivalent; gamma stays constant."
            )
        if inputs.tree_topk:
            steps, topk, draft_tokens = tree_args(inputs.tree_topk, inputs.tree_nodes)
            same = (
                "the engine measured this selection (scores: the draft's summed log-probabilities along each "
                "path, as SGLang's cumulative probabilities order them). "
                if inputs.tree_nodes
                else "not this exact static shape; the engine measured the static one. "
            )
            algorithm = args["--speculative-algorithm"]
            notes.append(
                f"Token tree {tree_text(inputs.tree_topk, inputs.tree_nodes)}: {algorithm} accepts "
                f"--speculative-eagle-topk > 1 "
                f"(speculative_hook.py _handle_eagle_family). SGLang drafts {steps} steps with top-{topk} "
                f"at every step and verifies the draft's best {draft_tokens - 1} nodes (EAGLE-2 selection), "
                + same
                + ("Best measured chain" if inputs.best_chain_measured else "A chain of the tree's depth")
                + f", for a chain launch: --speculative-num-steps {inputs.gamma} --speculative-eagle-topk 1 "
                f"--speculative-num-draft-tokens {inputs.gamma + 1}."
            )
        notes += substitution_notes(inputs, "SGLang", tree_exported=True)
    header = comment_header(
        FILENAME,
        "SGLang server launch with the tuned speculative decoding flags",
        inputs,
        STACK,
        notes,
        usage=f"sh {FILENAME} [more sglang.launch_server flags]",
    )
    flags = [(flag, value) for flag, value in args.items()]
    text, command = shell_script(header, PROGRAM, flags)
    return Exported("sglang", FILENAME, text, command=command, speculation=speculation, notes=tuple(notes))
