"""Reading a stored profile's JSON: its versions, the enumerations its knobs take, typed key access.

Every reader of a stored profile (:mod:`profiles.schema`, :mod:`profiles.profile`,
:mod:`profiles.store`) builds on this module, which builds on none of them. :func:`get` reads a
dotted key with a type check and raises :class:`~profiles.errors.ProfileError` naming the
missing or bad key; :func:`check_schema_version` refuses a profile from a newer schema.
"""

from __future__ import annotations

from collections.abc import Mapping
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
]

SCHEMA_VERSION = 1
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
