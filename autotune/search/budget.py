"""``budget.minutes``: one clock for the whole run, asked by every phase before it spends time.

Profiling, the study, the re-measurement, the second look and the table contest share one deadline.
Each phase estimates what its next step costs from what the run has measured so far (a trial's
seconds, a round's seconds) and either takes it or records what it cut, so the report can say what
was left out and what that costs in confidence. Without ``budget.minutes`` nothing is cut.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def minutes_text(seconds: float) -> str:
    """``95`` -> ``"1.6 min"``; under a minute in seconds."""
    return f"{seconds:.0f} s" if seconds < 60 else f"{seconds / 60:.1f} min"


@dataclass
class RunBudget:
    """The run's deadline (``seconds`` None: unbounded) and the cuts made to keep it.

    Example:
        >>> t = [0.0]
        >>> b = RunBudget(600.0, clock=lambda: t[0])
        >>> t[0] = 500.0
        >>> b.left(), b.allows(60.0), b.allows(120.0)
        (100.0, True, False)
    """

    seconds: float | None
    clock: Callable[[], float] = time.monotonic
    started: float = field(default=-1.0)
    cuts: list[str] = field(default_factory=list)
    run_s: float | None = None  # one configuration's run over every load level, as the study measured it

    def __post_init__(self) -> None:
        if self.started < 0:
            self.started = self.clock()

    @classmethod
    def of_minutes(cls, minutes: float | None) -> RunBudget:
        return cls(None if minutes is None else minutes * 60.0)

    def spent(self) -> float:
        return self.clock() - self.started

    def left(self) -> float | None:
        return None if self.seconds is None else self.seconds - self.spent()

    def allows(self, seconds: float) -> bool:
        """Whether ``seconds`` more fit before the deadline."""
        left = self.left()
        return left is None or seconds <= left

    def fit(self, wanted: int, each_s: float, at_least: int = 0) -> int:
        """How many of ``wanted`` steps of ``each_s`` seconds fit in what is left (``at_least`` always)."""
        left = self.left()
        if left is None or each_s <= 0:
            return wanted
        return max(at_least, min(wanted, int(left // each_s)))

    def rounds(self, wanted: int, configs: int, at_least: int) -> int:
        """Rounds of ``configs`` runs that fit (of ``wanted``; ``at_least`` always), from :attr:`run_s`."""
        if self.run_s is None:
            return wanted
        return self.fit(wanted, self.run_s * configs, at_least)

    def cut(self, what: str) -> str:
        """Record a cut; returns the line to print."""
        self.cuts.append(what)
        return f"budget: {what}"

    def eta(self, remaining_s: float) -> str:
        """``"ETA 3.0 min, 12.5 min left of 45 min"`` (without a deadline, the ETA alone)."""
        text = f"ETA {minutes_text(max(remaining_s, 0.0))}"
        left = self.left()
        if left is None or self.seconds is None:
            return text
        return f"{text}, {minutes_text(max(left, 0.0))} left of {minutes_text(self.seconds)}"

    def to_json(self) -> dict[str, Any]:
        """The profile's ``study.run_budget``: the limit, the time spent and the cuts."""
        return {
            "minutes": None if self.seconds is None else round(self.seconds / 60.0, 2),
            "spent_min": round(self.spent() / 60.0, 2),
            "cuts": list(self.cuts),
        }
