"""Content hashes that identify model folders and workloads in the profile store.

``hash_folder`` fingerprints a Hugging Face style model folder by the bytes of its
``config.json`` and ``*.safetensors`` files, so a copied or moved folder keeps its hash and a
re-trained one gets a new hash. ``hash_json`` hashes canonical JSON (sorted keys, no
whitespace), the workload key of stored measurements and profiles.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from profiles.errors import ProfileError

_CHUNK = 1 << 20
# (folder, ((file name, mtime_ns, size), ...)) -> hex digest; valid while no file changes.
_FOLDER_CACHE: dict[tuple[str, tuple[tuple[str, int, int], ...]], str] = {}


def _hashed_files(folder: Path) -> list[Path]:
    config = folder / "config.json"
    if not config.is_file():
        raise ProfileError(f"{folder}: no config.json (not a model folder)")
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        raise ProfileError(f"{folder}: no *.safetensors weights")
    return [config, *weights]


def hash_folder(path: str | os.PathLike[str]) -> str:
    """sha256 over a model folder's ``config.json`` and ``*.safetensors`` contents.

    Files are read in 1 MiB chunks in sorted order; each file's name is hashed before its
    bytes, so renaming a shard changes the hash. Results are cached for the life of the
    process, keyed by each file's (name, mtime, size).

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (d / "config.json").write_text("{}"); _ = (d / "model.safetensors").write_bytes(b"w")
        >>> len(hash_folder(d))
        64
    """
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise ProfileError(f"{folder}: not a folder")
    files = _hashed_files(folder)
    stats = []
    for file in files:
        st = file.stat()
        stats.append((file.name, st.st_mtime_ns, st.st_size))
    key = (str(folder), tuple(stats))
    cached = _FOLDER_CACHE.get(key)
    if cached is not None:
        return cached
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode() + b"\0")
        with file.open("rb") as fh:
            while chunk := fh.read(_CHUNK):
                digest.update(chunk)
    _FOLDER_CACHE[key] = digest.hexdigest()
    return _FOLDER_CACHE[key]


def canonical_json(obj: Any) -> str:
    """Canonical JSON text: sorted keys, no whitespace, UTF-8 kept, NaN refused.

    Example:
        >>> canonical_json({"b": 1, "a": [1.0, "x"]})
        '{"a":[1.0,"x"],"b":1}'
    """
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ProfileError(f"not JSON-serializable: {exc}") from None


def hash_json(obj: Any) -> str:
    """sha256 hex digest of :func:`canonical_json` of ``obj`` (key order never matters).

    ``1`` and ``1.0`` serialize differently and so hash differently: build workload dicts
    from validated, typed values.

    Example:
        >>> hash_json({"a": 1, "b": 2}) == hash_json({"b": 2, "a": 1})
        True
    """
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()
