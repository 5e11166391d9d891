"""User-facing errors of the profile store and the exporters.

Anything the user can fix (a profile without a key, an unknown profile id, a schedule a
serving stack would reject) raises :class:`ProfileError` with a one-line message that names
the key or value. The CLI turns it into ``error: <message>`` and exit code 2.
"""

from __future__ import annotations


class ProfileError(ValueError):
    """A bad or incomplete profile, or an export a serving stack would reject (one-line message)."""


class ProfileNotFound(ProfileError):
    """No stored profile has the requested id."""
