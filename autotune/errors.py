"""User-facing errors of the tuner, and the set the CLI maps to exit code 2."""

from __future__ import annotations

from engine.errors import EngineInputError


class ConfigError(ValueError):
    """A bad tune.yaml (or flag): the message names the key path and the problem."""


class BusyHostError(RuntimeError):
    """``autotune tune --strict`` on a host too noisy to measure on: nothing is stored."""


def _user_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [EngineInputError, ConfigError, BusyHostError]
    try:
        from profiles.errors import ProfileError
    except ImportError:  # the store is optional for engine-only commands
        return tuple(errors)
    return (*errors, ProfileError)


USER_ERRORS = _user_errors()
