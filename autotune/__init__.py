"""spec-autotune: profile this host, tune speculative decoding with Optuna, store per-device profiles,
export serving configs (see docs/architecture.md).

Importing the package points inductor's cache at :data:`INDUCTOR_CACHE` (unless
``$TORCHINDUCTOR_CACHE_DIR`` is set): inductor's compile workers start when torch is first
imported and read the folder then, so setting it just before compiling left the graphs in /tmp.
"""

from __future__ import annotations

import os
from pathlib import Path

INDUCTOR_CACHE = Path("~/.cache/spec-autotune/inductor").expanduser()
"""Where compiled engine graphs are cached between runs ($TORCHINDUCTOR_CACHE_DIR wins when set)."""
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(INDUCTOR_CACHE))
