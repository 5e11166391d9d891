"""The per-device profile store (SQLAlchemy) and the serving-stack exporters.

Never imports torch, ``engine`` or ``autotune``: a profile is stored as JSON; :mod:`profiles.schema`
holds its typed form (:class:`Profile`, :class:`Chosen`, :class:`BatchSchedule`).

Example:
    >>> from profiles import FORMATS, Store
    >>> "vllm" in FORMATS and Store("sqlite://").list_profiles() == []
    True
"""

from __future__ import annotations

from profiles.errors import ProfileError, ProfileNotFound
from profiles.exporters import FORMATS, Exported, export, write_export
from profiles.hashing import hash_folder, hash_json
from profiles.reading import SCHEMA_VERSION, TOOL_VERSION
from profiles.schema import BatchSchedule, Chosen, Profile, ScheduleEntry
from profiles.store import Store

__all__ = [
    "FORMATS",
    "SCHEMA_VERSION",
    "TOOL_VERSION",
    "BatchSchedule",
    "Chosen",
    "Exported",
    "Profile",
    "ProfileError",
    "ProfileNotFound",
    "ScheduleEntry",
    "Store",
    "export",
    "hash_folder",
    "hash_json",
    "write_export",
]
