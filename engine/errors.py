"""User-facing errors of the engine.

Anything the user can fix (a missing folder, a bad checkpoint, a workload line) raises
:class:`EngineInputError` with a one-line message that names the file, key or value. The
CLI turns it into ``error: <message>`` and exit code 2; library users can catch it.
"""

from __future__ import annotations


class EngineInputError(ValueError):
    """Bad input to the engine: the message is one line and names the culprit."""
