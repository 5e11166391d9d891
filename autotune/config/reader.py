"""Reading tune.yaml: one mapping at a time, with the key path for error messages.

:class:`Section` tracks which keys were read (an unknown key is an error: a typo must not be
ignored) and has one typed getter per kind of value; every problem is a
:class:`~autotune.errors.ConfigError` worded ``<key.path>: <problem> (got <value>)``. The typed
configs that use it are in :mod:`autotune.config`.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import ConfigError

DEMO = "demo"  # models.target / models.draft / workload.prompts: the bundled demo pair and prompts


@dataclass(frozen=True)
class Range:
    """A searched range [low, high], or a fixed value when low == high."""

    low: float
    high: float

    @property
    def fixed(self) -> bool:
        return self.low == self.high


class Section:
    """Reads one mapping, tracking the key path and refusing unknown keys."""

    def __init__(self, raw: Any, path: str, required: bool = False) -> None:
        if raw is None and not required:
            raw = {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{path or 'tune.yaml'}: must be a mapping (got {type(raw).__name__})")
        self.raw, self.path = raw, path
        self.seen: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def get(self, name: str, default: Any = None) -> Any:
        self.seen.add(name)
        return self.raw.get(name, default)

    def sub(self, name: str) -> Section:
        return Section(self.get(name), self.key(name))

    def done(self) -> None:
        extra = sorted(set(map(str, self.raw)) - self.seen)
        if extra:
            raise ConfigError(f"{self.key(extra[0])}: unknown key")

    # typed getters ------------------------------------------------------------------
    def int(
        self, name: str, default: int | None, lo: int | None = None, allow_none: bool = False
    ) -> int | None:
        v = self.get(name, default)
        if v is None and allow_none:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"{self.key(name)}: must be an integer (got {v!r})")
        if lo is not None and v < lo:
            raise ConfigError(f"{self.key(name)}: must be >= {lo} (got {v})")
        return v

    def num(
        self,
        name: str,
        default: float | None,
        lo: float | None = None,
        hi: float | None = None,
        allow_none: bool = False,
        open_lo: bool = False,
    ) -> float | None:
        v = self.get(name, default)
        if v is None and allow_none:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(f"{self.key(name)}: must be a number (got {v!r})")
        if lo is not None and (v < lo or (open_lo and v == lo)):
            raise ConfigError(f"{self.key(name)}: must be {'>' if open_lo else '>='} {lo} (got {v})")
        if hi is not None and v > hi:
            raise ConfigError(f"{self.key(name)}: must be <= {hi} (got {v})")
        return float(v)

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        v = self.get(name, default)
        if v not in choices:
            raise ConfigError(f"{self.key(name)}: must be one of {', '.join(choices)} (got {v!r})")
        return v

    def choices(self, name: str, default: tuple[str, ...], choices: tuple[str, ...]) -> tuple[str, ...]:
        v = self.get(name, list(default))
        vals = [v] if isinstance(v, str) else v
        if not isinstance(vals, list) or not vals:
            raise ConfigError(
                f"{self.key(name)}: must be one of {', '.join(choices)} or a non-empty list (got {v!r})"
            )
        for x in vals:
            if x not in choices:
                raise ConfigError(f"{self.key(name)}: {x!r} is not one of {', '.join(choices)}")
        return tuple(dict.fromkeys(vals))

    # builtins.int: in the class body below, a bare ``int`` names the getter above
    def ints(
        self, name: str, default: tuple[builtins.int, ...], lo: builtins.int = 1
    ) -> tuple[builtins.int, ...]:
        v = self.get(name, list(default))
        vals = [v] if isinstance(v, int) and not isinstance(v, bool) else v
        if not isinstance(vals, list) or not vals:
            raise ConfigError(
                f"{self.key(name)}: must be an integer or a non-empty list of integers (got {v!r})"
            )
        for x in vals:
            if isinstance(x, bool) or not isinstance(x, int) or x < lo:
                raise ConfigError(f"{self.key(name)}: every value must be an integer >= {lo} (got {x!r})")
        return tuple(sorted(set(vals)))

    def range(self, name: str, default: Range, lo: float, hi: float | None, integer: bool) -> Range:
        v = self.get(name, {"low": default.low, "high": default.high})
        kind = "an integer" if integer else "a number"
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            sub = Section({"low": v, "high": v}, self.key(name))
        else:
            sub = Section(v, self.key(name))
        get = (
            (lambda k: sub.int(k, None, lo=int(lo)))
            if integer
            else (lambda k: sub.num(k, None, lo=lo, hi=hi))
        )
        if sub.raw.get("low") is None or sub.raw.get("high") is None:
            raise ConfigError(f"{self.key(name)}: must be {kind} or a mapping with low and high")
        low, high = get("low"), get("high")
        assert low is not None and high is not None  # the getters refuse None (allow_none is off)
        sub.done()
        if hi is not None and high > hi:
            raise ConfigError(f"{self.key(name)}.high: must be <= {hi} (got {high})")
        if high < low:
            raise ConfigError(f"{self.key(name)}.high: must be >= {self.key(name)}.low (got {high} < {low})")
        return Range(low, high)

    def path_(
        self,
        name: str,
        base: Path,
        default: Any = None,
        must_exist: bool = True,
        allow_none: bool = False,
        demo: Path | None = None,
    ) -> Path | None:
        v = self.get(name, default)
        if v is None and allow_none:
            return None
        if demo is not None and v == DEMO:
            return demo
        if not isinstance(v, str) or not v:
            raise ConfigError(f"{self.key(name)}: must be a path (got {v!r})")
        p = Path(v).expanduser()
        p = p if p.is_absolute() else (base / p)
        if must_exist and not p.exists():
            hint = f"; `{DEMO}` names the bundled demo {name}" if demo is not None else ""
            raise ConfigError(f"{self.key(name)}: {v} does not exist (resolved to {p}){hint}")
        return p
