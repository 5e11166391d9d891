"""Reading a stored profile's JSON: its versions, the enumerations its knobs take, typed key access.

Every reader of a stored profile (:mod:`profiles.schema`, :mod:`profiles.profile`,
:mod:`profiles.store`) builds on this module, which builds on none of them. :func:`get` reads a
dotted key with a type check and raises :class:`~profiles.errors.ProfileError` naming the
missing or bad key; :func:`check_schema_version` refuses a profile from a newer schema and
:func:`migrate` brings one of an older schema to this one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from profiles.errors import ProfileError

__all__ = [
    "DRAFTERS",
    "GAMMA_POLICIES",
    "SCHEMA_VERSION",
    "TOOL_VERSION",
    "check_kind",
    "check_schema_version",
    "get",
    "migrate",
]

SCHEMA_VERSION = 2  # :func:`migrate` reads every earlier one
# Copies of the engine's enumerations (engine.generate.DRAFTERS, engine.speculative.GAMMA_POLICIES):
# profiles never imports engine; tests/test_enumerations.py checks that the copies match.
DRAFTERS = ("model", "ngram", "hybrid", "eagle3", "none")
GAMMA_POLICIES = ("constant", "heuristic")  # the per-row gamma policies


def _tool_version() -> str:
    try:
        return version("spec-autotune")
    except PackageNotFoundError:
        return "0.0.0+local"


TOOL_VERSION = _tool_version()

_MISSING = object()
_KIND_NAMES = {int: "an integer", float: "a number", str: "a string", list: "a list", dict: "a mapping"}


def check_kind(value: Any, kind: type, where: str) -> Any:
    """``value`` if it is of ``kind`` (a float for ``float``), else ProfileError naming ``where``.

    ``int`` refuses booleans, ``float`` accepts ints (returned as float), ``str`` refuses "",
    ``dict`` accepts any mapping.

    Example:
        >>> check_kind(3, float, "chosen.confidence_threshold")
        3.0
    """
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
    return check_kind(node, kind, dotted)


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


def migrate(profile: Mapping[str, Any]) -> Mapping[str, Any]:
    """``profile`` in this schema's layout: each version's step to the next applied in turn (an
    absent ``schema_version`` is this one; :func:`check_schema_version` refuses a newer one first).

    Version 2 stores ``table_decision.levels[].over_chosen`` as ``{value, ci95: [low, high], n}``,
    the shape of every other paired ratio in a profile (``schedule[].ratio``), where version 1 wrote
    ``{value, low, high, n}``; it also adds the optional ``deployment`` section, which a version-1
    profile lacks. The input is not changed.

    Example:
        >>> v1 = {"schema_version": 1, "table_decision": {"levels": [{"batch_size": 8, "gamma": 2,
        ...       "over_chosen": {"value": 1.06, "low": 1.02, "high": 1.11, "n": 6}}]}}
        >>> v2 = migrate(v1)
        >>> v2["schema_version"], v2["table_decision"]["levels"][0]["over_chosen"]
        (2, {'value': 1.06, 'ci95': [1.02, 1.11], 'n': 6})
    """
    version = get(profile, "schema_version", int, default=SCHEMA_VERSION)
    while version < SCHEMA_VERSION:
        step = _STEPS.get(version)
        if step is None:
            raise ProfileError(
                f"profile: schema_version {version} is older than any this spec-autotune reads "
                f"({min(_STEPS)}-{SCHEMA_VERSION})"
            )
        profile = step(profile)
        version += 1
    return profile


def _version_2(profile: Mapping[str, Any]) -> dict[str, Any]:
    """From version 1 to version 2: each level's ``over_chosen`` as ``{value, ci95, n}`` (:func:`migrate`)."""
    data = {**profile, "schema_version": 2}
    decision = profile.get("table_decision")
    if isinstance(decision, Mapping) and isinstance(levels := decision.get("levels"), list):
        data["table_decision"] = {**decision, "levels": [_level_version_2(lv) for lv in levels]}
    return data


def _level_version_2(level: Any) -> Any:
    over = level.get("over_chosen") if isinstance(level, Mapping) else None
    if not isinstance(over, Mapping) or "ci95" in over:
        return level
    ratio = {"value": over.get("value"), "ci95": [over.get("low"), over.get("high")], "n": over.get("n")}
    return {**level, "over_chosen": ratio}


_STEPS: dict[int, Callable[[Mapping[str, Any]], dict[str, Any]]] = {1: _version_2}
