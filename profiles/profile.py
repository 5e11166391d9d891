"""What exporters read of a profile: :class:`ExportInputs`, built from the typed Profile.

A profile is read once, by :meth:`profiles.schema.Profile.from_json` (the schema version, the
chosen knobs and the batch schedule validated there). Exporters read only ``tool_version``,
``created_at``, ``device``, ``pair``, ``chosen`` and ``schedule``; :func:`export_inputs` takes
those from a :class:`~profiles.schema.Profile` and returns them typed, raising
:class:`ProfileError` that names the missing or bad key.

The versions, the enumerations and :func:`get` live in :mod:`profiles.reading` and are
importable from here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from profiles.deployment import Deployment
from profiles.errors import ProfileError
from profiles.reading import (
    DRAFTERS,
    GAMMA_POLICIES,
    SCHEMA_VERSION,
    TOOL_VERSION,
    check_schema_version,
    get,
)
from profiles.schema import MISSING, PluginNeed, Profile

__all__ = [
    "DRAFTERS",
    "GAMMA_POLICIES",
    "SCHEMA_VERSION",
    "TOOL_VERSION",
    "ExportInputs",
    "check_schema_version",
    "export_inputs",
    "get",
]


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
    # A chosen token tree (per-depth top-k; () for a chain). When set, ``gamma``,
    # ``confidence_threshold`` and ``gamma_schedule`` hold the best measured chain (what stacks
    # without trees export), ``tree_gamma`` the depth. ``tree_nodes`` > 0: the tree is dynamic
    # (EAGLE-2: top-k expansion, the draft's best tree_nodes verified).
    tree_topk: tuple[int, ...] = ()
    # The profile's drafter when exporters substitute another: "hybrid" (exported as the draft
    # model, "model").
    chosen_drafter: str | None = None
    tree_gamma: int = 0
    best_chain_measured: bool = (
        True  # False: no chain of the draft model was measured; gamma is the tree's depth
    )
    tree_nodes: int = 0
    # why the schedule is a by-batch-size table or one K: the profile's table_decision, in a sentence
    schedule_note: str = ""
    # the server flags the trials ran with (None: a profile without them, or measured on the engine)
    deployment: Deployment | None = None
    # the schedule's K=0 range is speculation off only with the spec-autotune vLLM plugin, and what a
    # server without it serves (table_decision.needs_plugin; None: the schedule needs no plugin)
    needs_plugin: PluginNeed | None = None

    @property
    def schedule_max(self) -> int:
        """Largest gamma in the batch-size schedule (0 when speculation is off everywhere)."""
        return 0 if self.drafter == "none" else max(gamma for _, gamma in self.schedule)


_HEADER = ("tool_version", "created_at", "device", "pair")  # the untyped sections exporters read


def export_inputs(
    profile: Profile, target_model: str | None = None, draft_model: str | None = None
) -> ExportInputs:
    """What exporters read of ``profile``, typed; overrides replace the pair's paths.

    ``profile.chosen`` and ``profile.schedule`` were validated when the profile was read; here
    only their absence and the header sections (``tool_version``, ``created_at``, ``device``,
    ``pair``) are checked.

    Example:
        >>> p = Profile.from_json({"tool_version": "0.1.0", "created_at": "2026-11-30T01:30:00+00:00",
        ...      "device": {"key": "ab12", "label": "NVIDIA H200"},
        ...      "pair": {"target": "/m/t", "draft": "/m/d"},
        ...      "chosen": {"drafter": "model", "gamma": 4},
        ...      "schedule": [{"batch_size": 1, "gamma": 4}]})
        >>> export_inputs(p, target_model="/gguf/t.gguf").target
        '/gguf/t.gguf'

    Long because: every field exporters read is taken and checked here, once, in ExportInputs' order.
    """
    if profile.chosen is MISSING:
        raise ProfileError("profile: missing key 'chosen.drafter'")
    chosen = profile.chosen
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
    header: dict[str, Any] = {k: getattr(profile, k) for k in _HEADER if getattr(profile, k) is not MISSING}
    target = target_model or get(header, "pair.target", str)
    draft = draft_model or get(header, "pair.draft", str, default=None, nullable=True)
    if drafter == "eagle3" and draft_model is None:  # a head searched beside the draft model: pair.eagle3
        draft = get(header, "pair.eagle3", str, default=None, nullable=True) or draft
    if drafter in ("model", "eagle3") and draft is None:
        what = "the EAGLE-3 head folder" if drafter == "eagle3" else "the draft model"
        raise ProfileError(
            f"profile: missing key 'pair.draft' (the chosen drafter is {chosen.drafter!r}; "
            f"pass --draft-model to name {what})"
        )
    tool_version = get(header, "tool_version", str)
    created_at = get(header, "created_at", str)
    device_label = get(header, "device.label", str)
    device_key = get(header, "device.key", str)
    if profile.schedule is MISSING:
        raise ProfileError("profile: missing key 'schedule'")
    return ExportInputs(
        tool_version=tool_version,
        created_at=created_at,
        device_label=device_label,
        device_key=device_key,
        target=target,
        draft=draft if drafter in ("model", "eagle3") else None,  # eagle3: the head folder
        drafter=drafter,
        gamma=gamma,
        confidence_threshold=threshold,
        gamma_schedule=gamma_schedule,
        prompt_lookup_min=lookup_min,
        prompt_lookup_max=lookup_max,
        schedule=profile.schedule.pairs(),
        max_batch_size=max_batch,
        tree_topk=tree,
        chosen_drafter=chosen_drafter,
        tree_gamma=len(tree),
        best_chain_measured=chain_measured,
        tree_nodes=chosen.tree_nodes,
        schedule_note=_schedule_note(profile),
        deployment=None if profile.deployment is MISSING else profile.deployment,
        needs_plugin=_needs_plugin(profile),
    )


def _needs_plugin(profile: Profile) -> PluginNeed | None:
    """``table_decision.needs_plugin`` where the profile has it, else None."""
    decision = profile.table_decision
    if decision is MISSING or decision.needs_plugin is MISSING:
        return None
    need: PluginNeed = decision.needs_plugin
    return need


def _schedule_note(profile: Profile) -> str:
    """The profile's ``table_decision`` as one sentence for the exports' notes ("" when absent)."""
    decision = profile.table_decision
    if decision is MISSING:
        return ""
    per_level = ", ".join(f"{lv.batch_size}: {lv.gamma}" for lv in decision.levels or ())
    head = f"the per-level choice of K was (batch size: K) {per_level}; " if per_level else ""
    served = "served live, chosen: " if decision.won else ""
    return head + served + (decision.reason or "")
