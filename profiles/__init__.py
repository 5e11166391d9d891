"""The per-device profile store (SQLAlchemy) and the serving-stack exporters.

Never imports torch, ``engine`` or ``autotune``: profiles are plain JSON-able dicts.

Example:
    >>> from profiles import FORMATS, Store
    >>> "vllm" in FORMATS and Store("sqlite://").list_profiles() == []
    True
"""

from __future__ import annotations

from profiles.errors import ProfileError, ProfileNotFound
from profiles.exporters import FORMATS, Exported, export, write_export
from profiles.hashing import hash_folder, hash_json
from profiles.profile import SCHEMA_VERSION, TOOL_VERSION
from profiles.store import Store

__all__ = [
    "FORMATS", "SCHEMA_VERSION", "TOOL_VERSION", "Exported", "ProfileError", "ProfileNotFound", "Store",
    "export", "hash_folder", "hash_json", "write_export",
]
