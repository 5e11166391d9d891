"""The whole profile as YAML (everything measured), with a provenance header.

``yaml.safe_dump`` keeps the profile's key order; ``--target-model``/``--draft-model``
overrides replace ``pair.target``/``pair.draft`` in the dumped copy.
"""

from __future__ import annotations

import copy

import yaml

from profiles.errors import ProfileError
from profiles.exporters._common import Exported, StackTarget, comment_header
from profiles.profile import ExportInputs
from profiles.reading import SCHEMA_VERSION
from profiles.schema import Profile

FILENAME = "profile.yaml"


def export(
    profile: Profile,
    inputs: ExportInputs,
    target_model: str | None = None,
    draft_model: str | None = None,
) -> Exported:
    """Render the whole profile (its stored JSON, with path overrides applied) as YAML.

    Example:
        >>> from profiles.profile import export_inputs
        >>> p = Profile.from_json({"tool_version": "0.1.0", "created_at": "2026-11-30T01:30:00+00:00",
        ...      "device": {"key": "k", "label": "H200"}, "pair": {"target": "/m/t", "draft": None},
        ...      "chosen": {"drafter": "none", "gamma": 0}, "schedule": [{"batch_size": 1, "gamma": 0}]})
        >>> "drafter: none" in export(p, export_inputs(p)).text
        True
    """
    data = copy.deepcopy(profile.to_json())
    pair = data.get("pair")
    if isinstance(pair, dict):
        if target_model:
            pair["target"] = target_model
        if draft_model:
            pair["draft"] = draft_model
    stack = StackTarget(
        "spec-autotune", "profile YAML", f"schema_version {data.get('schema_version', SCHEMA_VERSION)}"
    )
    header = comment_header(FILENAME, "the whole spec-autotune profile (everything measured)", inputs, stack)
    try:
        body = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False)
    except yaml.YAMLError as exc:
        raise ProfileError(f"yaml export: profile holds a value YAML cannot represent ({exc})") from None
    return Exported("yaml", FILENAME, header + body, speculation=inputs.schedule_max > 0)
