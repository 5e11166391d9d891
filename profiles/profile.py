"""The profile dict: versions, typed access with one-line errors, and what exporters read.

A profile is a plain JSON-able dict (see the store and ``autotune``); most of it (metrics,
classification, Pareto front, ...) is opaque here. Exporters read only ``tool_version``,
``created_at``, ``device``, ``pair``, ``chosen`` and ``schedule``; :func:`export_inputs`
validates exactly those and returns them typed, raising :class:`ProfileError` that names the
missing or bad key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from profiles.errors import ProfileError

SCHEMA_VERSION = 1
# Copies of the engine's enumerations (engine.generate.DRAFTERS, engine.speculative.GAMMA_POLICIES):
# profiles never imports engine; tests/test_enumerations.py checks that the copies match.
DRAFTERS = ("model", "ngram", "hybrid", "none")
GAMMA_POLICIES = ("constant", "heuristic")  # the per-row gamma policies


def _tool_version() -> str:
    try:
        return version("spec-autotune")
    except PackageNotFoundError:
        return "0.0.0+local"


TOOL_VERSION = _tool_version()

_MISSING = object()
_KIND_NAMES = {int: "an integer", float: "a number", str: "a string", list: "a list", dict: "a mapping"}


def _check_kind(value: Any, kind: type, where: str) -> Any:
    if kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif kind is dict:
        ok = isinstance(value, Mapping)
    elif kind is str:
        ok = isinstance(value, str) and value != ""
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise ProfileError(
            f"profile: {where!r} must be {_KIND_NAMES.get(kind, kind.__name__)}, got {value!r}"
        )
    return value


def get(
    profile: Mapping[str, Any], dotted: str, kind: type, *, default: Any = _MISSING, nullable: bool = False
) -> Any:
    """``profile["a"]["b"]`` for ``dotted="a.b"``, type-checked; ProfileError names the key.

    ``int`` refuses booleans, ``float`` accepts ints (returned as float), ``str`` refuses "".
    A missing key returns ``default`` when one is given; ``nullable`` lets ``None`` through.

    Example:
        >>> get({"chosen": {"gamma": 4}}, "chosen.gamma", int)
        4
        >>> get({"chosen": {}}, "chosen.gamma", int)
        Traceback (most recent call last):
        ...
        profiles.errors.ProfileError: profile: missing key 'chosen.gamma'
    """
    node: Any = profile
    parts = dotted.split(".")
    for depth, part in enumerate(parts):
        if not isinstance(node, Mapping):
            raise ProfileError(f"profile: {'.'.join(parts[:depth])!r} must be a mapping, got {node!r}")
        if part not in node:
            if default is not _MISSING:
                return default
            raise ProfileError(f"profile: missing key {dotted!r}")
        node = node[part]
    if node is None and nullable:
        return None
    return _check_kind(node, kind, dotted)


def check_schema_version(profile: Mapping[str, Any]) -> None:
    """Refuse a profile written by a newer schema than this tool reads.

    Example:
        >>> check_schema_version({"schema_version": 1})
    """
    found = get(profile, "schema_version", int, default=SCHEMA_VERSION)
    if found > SCHEMA_VERSION:
        raise ProfileError(
            f"profile: schema_version {found} is newer than this spec-autotune reads "
            f"({SCHEMA_VERSION}); upgrade spec-autotune"
        )


def parse_schedule(profile: Mapping[str, Any]) -> tuple[tuple[int, int], ...]:
    """``schedule`` as ``((batch_size, gamma), ...)`` sorted by batch size; refuses duplicates.

    Example:
        >>> parse_schedule({"schedule": [{"batch_size": 4, "gamma": 2}, {"batch_size": 1, "gamma": 5}]})
        ((1, 5), (4, 2))
    """
    entries = get(profile, "schedule", list)
    if not entries:
        raise ProfileError("profile: 'schedule' is empty (need at least one batch size)")
    pairs: dict[int, int] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise ProfileError(f"profile: 'schedule[{i}]' must be a mapping, got {entry!r}")
        for key in ("batch_size", "gamma"):
            if key not in entry:
                raise ProfileError(f"profile: missing key 'schedule[{i}].{key}'")
        batch = _check_kind(entry["batch_size"], int, f"schedule[{i}].batch_size")
        gamma = _check_kind(entry["gamma"], int, f"schedule[{i}].gamma")
        if batch < 1:
            raise ProfileError(f"profile: 'schedule[{i}].batch_size' must be >= 1, got {batch}")
        if gamma < 0:
            raise ProfileError(f"profile: 'schedule[{i}].gamma' must be >= 0, got {gamma}")
        if batch in pairs:
            raise ProfileError(f"profile: 'schedule' lists batch size {batch} twice")
        pairs[batch] = gamma
    return tuple(sorted(pairs.items()))


@dataclass(frozen=True)
class ExportInputs:
    """The validated, typed part of a profile that exporters read (paths already overridden)."""

    tool_version: str
    created_at: str
    device_label: str
    device_key: str
    target: str
    draft: str | None
    drafter: str
    gamma: int
    confidence_threshold: float
    gamma_schedule: str
    prompt_lookup_min: int | None
    prompt_lookup_max: int | None
    schedule: tuple[tuple[int, int], ...]
    max_batch_size: int | None = None  # the tuned number of concurrent sequences, when the profile has one
    # A chosen token tree (per-depth top-k; () for a chain). When set, ``gamma``/``confidence_threshold``/
    # ``gamma_schedule`` hold the best measured chain (what stacks without trees export), ``tree_gamma`` the depth.
    # ``tree_nodes`` > 0: the tree is dynamic (EAGLE-2: top-k expansion, the draft's best tree_nodes verified).
    tree_topk: tuple[int, ...] = ()
    # The profile's drafter when exporters substitute another: "hybrid" (exported as the draft model, "model").
    chosen_drafter: str | None = None
    tree_gamma: int = 0
    best_chain_measured: bool = (
        True  # False: no chain of the draft model was measured; gamma is the tree's depth
    )
    tree_nodes: int = 0

    @property
    def schedule_max(self) -> int:
        """Largest gamma in the batch-size schedule (0 when speculation is off everywhere)."""
        return 0 if self.drafter == "none" else max(gamma for _, gamma in self.schedule)


def export_inputs(
    profile: Mapping[str, Any], target_model: str | None = None, draft_model: str | None = None
) -> ExportInputs:
    """Validate what exporters read and return it typed; overrides replace the pair's paths.

    Example:
        >>> p = {"tool_version": "0.1.0", "created_at": "2026-11-30T01:30:00+00:00",
        ...      "device": {"key": "ab12", "label": "NVIDIA H200"},
        ...      "pair": {"target": "/m/t", "draft": "/m/d"},
        ...      "chosen": {"drafter": "model", "gamma": 4},
        ...      "schedule": [{"batch_size": 1, "gamma": 4}]}
        >>> export_inputs(p, target_model="/gguf/t.gguf").target
        '/gguf/t.gguf'
    """
    from profiles.schema import MISSING, Chosen  # schema builds on this module

    check_schema_version(profile)
    chosen = Chosen.from_json(profile.get("chosen", {}))
    drafter, gamma, threshold, gamma_schedule = (
        chosen.drafter,
        chosen.gamma,
        chosen.threshold,
        chosen.gamma_policy,
    )
    tree, chain_measured = chosen.tree_shape, True
    if tree:  # chain-only stacks get the best measured chain; the tree travels in tree_topk
        best = chosen.best_chain if chosen.best_chain is not MISSING else None
        chain_measured = best is not None
        if best is not None:
            gamma = int(best["gamma"])
            threshold = float(best.get("confidence_threshold", 0.0) or 0.0)
            gamma_schedule = best.get("gamma_schedule", "constant")
    chosen_drafter = None
    if drafter == "hybrid":  # per-row n-gram / draft model: stacks get the draft model (notes say so)
        drafter, chosen_drafter = "model", "hybrid"
    lookup_min = lookup_max = None
    if drafter == "ngram":
        lookup_min, lookup_max = chosen.prompt_lookup_min, chosen.prompt_lookup_max
    max_batch = None if chosen.max_batch_size is MISSING else chosen.max_batch_size
    target = target_model or get(profile, "pair.target", str)
    draft = draft_model or get(profile, "pair.draft", str, default=None, nullable=True)
    if drafter == "model" and draft is None:
        raise ProfileError(
            f"profile: missing key 'pair.draft' (the chosen drafter is {chosen.drafter!r}; "
            "pass --draft-model to name it)"
        )
    return ExportInputs(
        tool_version=get(profile, "tool_version", str),
        created_at=get(profile, "created_at", str),
        device_label=get(profile, "device.label", str),
        device_key=get(profile, "device.key", str),
        target=target,
        draft=draft if drafter == "model" else None,
        drafter=drafter,
        gamma=gamma,
        confidence_threshold=threshold,
        gamma_schedule=gamma_schedule,
        prompt_lookup_min=lookup_min,
        prompt_lookup_max=lookup_max,
        schedule=parse_schedule(profile),
        max_batch_size=max_batch,
        tree_topk=tree,
        chosen_drafter=chosen_drafter,
        tree_gamma=len(tree),
        best_chain_measured=chain_measured,
        tree_nodes=chosen.tree_nodes,
    )
