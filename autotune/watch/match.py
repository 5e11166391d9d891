"""Which stored profile a live server is held against: the newest of the model it serves, tuned on its stack.

The server names its model on ``GET /v1/models``: vLLM's entries carry ``id`` (the served name,
``--served-model-name``) and ``root`` (the path or Hub id it loaded); llama-server's ``id`` is
its ``--alias`` or the GGUF path it loaded. A profile names its target by the folder it tuned
(``pair.target``) and that folder's hash (``pair.target_hash``). They are the same model when a
name of one equals a name of the other (:func:`model_names`: the basename, a Hub id's repository,
a Hugging Face cache snapshot's repository, a GGUF file without ``.gguf`` and without the
``-<hash>`` of autotune's GGUF cache), or, where the server loaded a folder this host can read,
when that folder's hash is the profile's. The server's device is not on any endpoint the stacks
serve, so the stack and the model are what a profile is matched on.
"""

from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from autotune.errors import ConfigError
from profiles.errors import ProfileError
from profiles.schema import MISSING, Profile

# autotune's GGUF cache names a converted folder "<folder name>-<12 hex digits>.gguf"
_GGUF_CACHE_SUFFIX = re.compile(r"-[0-9a-f]{12}$")
# a Hugging Face cache snapshot: .../models--<org>--<name>/snapshots/<commit>
_HF_SNAPSHOT = re.compile(r"models--(?:[^/]+--)?([^/]+)/snapshots/[^/]+/?$")


@dataclass(frozen=True)
class ServedModel:
    """One entry of a server's ``/v1/models``: ``id`` and, on vLLM, ``root`` (None where absent)."""

    id: str
    root: str | None = None

    def label(self) -> str:
        """``id``, with ``root`` beside it where it says more."""
        return self.id if self.root in (None, self.id) else f"{self.id} ({self.root})"


def models_url(metrics_url: str) -> str:
    """The ``/v1/models`` URL of the server whose ``/metrics`` URL is given.

    Example:
        >>> models_url("http://127.0.0.1:8000/metrics")
        'http://127.0.0.1:8000/v1/models'
    """
    parts = urllib.parse.urlsplit(metrics_url)
    path = parts.path.rstrip("/").removesuffix("/metrics")
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, f"{path}/v1/models", "", ""))


def parse_models(body: str) -> list[ServedModel]:
    """The models of a ``/v1/models`` answer (OpenAI's ``{"data": [{"id", ...}]}``).

    Raises:
        ValueError: When the body is not that shape.

    Example:
        >>> parse_models('{"data": [{"id": "qwen", "root": "/m/Qwen3-8B"}]}')
        [ServedModel(id='qwen', root='/m/Qwen3-8B')]
    """
    data = json.loads(body).get("data")
    if not isinstance(data, list) or not data:
        raise ValueError("no model list under 'data'")
    models = []
    for entry in data:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("id"), str):
            raise ValueError(f"a model entry without an id: {entry!r}")
        root = entry.get("root")
        models.append(ServedModel(entry["id"], root if isinstance(root, str) and root else None))
    return models


def fetch_models(url: str, timeout: float) -> list[ServedModel]:
    """One ``GET`` of a ``/v1/models`` URL; OSError (refused, timeouts, HTTP errors) or ValueError."""
    request = urllib.request.Request(url, headers={"Accept": "application/json"}, method="GET")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return parse_models(response.read(16 * 1024 * 1024).decode("utf-8"))


def model_names(name: str | None) -> set[str]:
    """The names a model path, Hub id or GGUF file is known by, lower-cased.

    Example:
        >>> sorted(model_names("/cache/gguf/Qwen3-8B-0123456789ab.gguf"))
        ['qwen3-8b', 'qwen3-8b-0123456789ab', 'qwen3-8b-0123456789ab.gguf']
        >>> model_names("Qwen/Qwen3-8B"), sorted(model_names("/hf/models--Qwen--Qwen3-8B/snapshots/9f1e/"))
        ({'qwen3-8b'}, ['9f1e', 'qwen3-8b'])
    """
    if not name or not name.strip():
        return set()
    text = name.strip().lower()
    base = PurePosixPath(text.rstrip("/")).name or text
    names = {base}
    snapshot = _HF_SNAPSHOT.search(text)
    if snapshot is not None:
        names.add(snapshot.group(1))
    if base.endswith(".gguf"):
        stem = base.removesuffix(".gguf")
        names |= {stem, _GGUF_CACHE_SUFFIX.sub("", stem)}
    return names


def served_names(served: Sequence[ServedModel]) -> set[str]:
    """Every name the server's models go by."""
    return {n for model in served for text in (model.id, model.root) for n in model_names(text)}


def served_hashes(served: Sequence[ServedModel], hash_folder: Callable[[str], str]) -> set[str]:
    """The hashes of the folders the server loaded that this host can read (none when it runs elsewhere)."""
    hashes = set()
    for model in served:
        for text in (model.id, model.root):
            if text and Path(text).expanduser().is_dir():
                try:
                    hashes.add(hash_folder(text))
                except (OSError, ProfileError):
                    continue
    return hashes


def serves_target(pair: Mapping[str, Any], names: set[str], hashes: set[str]) -> bool:
    """Whether a profile's ``pair`` names the served model (by a shared name, or its folder's hash)."""
    if model_names(pair.get("target")) & names:
        return True
    return bool(hashes) and pair.get("target_hash") in hashes


@dataclass(frozen=True)
class Pick:
    """The profile a watch holds the server against, and a note on why it was picked."""

    profile: Profile
    why: str


def pick_profile(
    rows: Sequence[Mapping[str, Any]],
    load: Callable[[int], Profile],
    stack: str,
    served: Sequence[ServedModel] | None,
    hash_folder: Callable[[str], str],
) -> Pick:
    """The newest profile of the served model tuned on ``stack``, else of that model on another stack.

    Args:
        rows: The store's summary rows, newest first (``id``, ``backend``, ``pair``).
        load: Reads one stored profile by id.
        stack: The watched stack.
        served: The server's ``/v1/models``; None where it could not be read, and then the newest
            profile tuned on ``stack`` (else the newest of any) is taken, as a server that does not
            say what it serves cannot be matched.
        hash_folder: Hashes a model folder as the store does (folders this host can read only).

    Raises:
        ProfileError: For an empty store.
        ConfigError: When no stored profile is of the served model (one line naming the model and
            the stored profiles).
    """
    if not rows:
        raise ProfileError("no profile in the store (run `autotune tune`, or pass --storage URL)")
    if served is None:
        return _by_stack(rows, load, stack)
    names = served_names(served)
    label = ", ".join(model.label() for model in served)
    hashes: set[str] | None = None
    other: Pick | None = None
    for row in rows:
        profile = load(int(row["id"]))
        pair = profile.pair if profile.pair is not MISSING else {}
        if not serves_target(pair, names, set()):
            hashes = served_hashes(served, hash_folder) if hashes is None else hashes
            if not serves_target(pair, names, hashes):
                continue
        backend = row.get("backend")
        if backend == stack:
            return Pick(profile, f"the newest of {label} tuned on {stack}")
        if other is None:
            other = Pick(profile, f"the newest of {label} (none was tuned on {stack}; this one on {backend})")
    if other is not None:
        return other
    stored = "; ".join(f"#{row['id']} {row.get('pair')} on {row.get('backend')}" for row in rows[:5])
    more = f" and {len(rows) - 5} more" if len(rows) > 5 else ""
    raise ConfigError(
        f"the server serves {label}, and no stored profile is of that model (stored: {stored}{more}); "
        "tune it, or pass --profile ID"
    )


def _by_stack(rows: Sequence[Mapping[str, Any]], load: Callable[[int], Profile], stack: str) -> Pick:
    """The newest profile tuned on ``stack``, else the newest of any."""
    same = [row for row in rows if row.get("backend") == stack]
    if same:
        return Pick(load(int(same[0]["id"])), f"the newest tuned on {stack}")
    row = rows[0]
    return Pick(load(int(row["id"])), f"the newest (none was tuned on {stack}; this one on {row['backend']})")


def check_profile(
    profile: Profile, served: Sequence[ServedModel] | None, hash_folder: Callable[[str], str]
) -> str | None:
    """A warning line when a profile the user named is not of the served model; None when it is,
    or when the server does not say what it serves."""
    if served is None:
        return None
    pair = profile.pair if profile.pair is not MISSING else {}
    names = served_names(served)
    if serves_target(pair, names, set()) or serves_target(pair, names, served_hashes(served, hash_folder)):
        return None
    label = ", ".join(model.label() for model in served)
    return f"warning: profile #{profile.id} was tuned on {pair.get('target')}, the server serves {label}"
