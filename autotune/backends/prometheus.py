"""Prometheus text exposition: read counters, take differences, turn spec-decode counts into metrics.

Serving stacks count speculative decoding in monotonically increasing counters; a run's
numbers are the difference of two scrapes (before and after the load). The mapping from a
stack's counter names to the four counts below lives with the stack's backend.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse_text(text: str) -> Samples:
    """``{(name, frozenset(labels)): value}`` for every sample line; comments and bad lines skipped.

    Example:
        >>> s = parse_text('# TYPE x counter\\nx_total{model="m",position="0"} 3.0\\nup 1')
        >>> s[("x_total", frozenset({("model", "m"), ("position", "0")}))]
        3.0
    """
    out: Samples = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = frozenset(_LABEL.findall(m.group(2) or ""))
        out[(m.group(1), labels)] = value
    return out


def total(samples: Samples, name: str, **match: str) -> float:
    """Sum of ``name`` over every label set that contains ``match`` (0 when absent)."""
    want = set(match.items())
    return sum(v for (n, labels), v in samples.items() if n == name and want <= labels and math.isfinite(v))


def by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    """``name`` summed per value of ``label`` (e.g. per draft position)."""
    out: dict[str, float] = {}
    for (n, labels), v in samples.items():
        if n != name:
            continue
        for key, val in labels:
            if key == label:
                out[val] = out.get(val, 0.0) + v
    return out


@dataclass(frozen=True)
class SpecCounts:
    """Speculative-decoding counts of one run (differences of two scrapes)."""

    drafts: float  # verify steps per row that carried draft tokens
    draft_tokens: float  # draft tokens proposed
    accepted: float  # draft tokens accepted
    accepted_per_pos: tuple[float, ...]  # accepted tokens at draft position i

    def __sub__(self, before: SpecCounts) -> SpecCounts:
        n = max(len(self.accepted_per_pos), len(before.accepted_per_pos))
        pad = lambda xs: tuple(xs) + (0.0,) * (n - len(xs))  # noqa: E731
        return SpecCounts(
            self.drafts - before.drafts,
            self.draft_tokens - before.draft_tokens,
            self.accepted - before.accepted,
            tuple(
                a - b for a, b in zip(pad(self.accepted_per_pos), pad(before.accepted_per_pos), strict=True)
            ),
        )

    def metrics(self) -> dict[str, float | list[float] | None]:
        """The engine's speculative metrics, from counts (docs/metrics.md; None when undefined).

        ``rollback_frequency`` is exact only when every draft proposed the same number of
        tokens (then a draft rolled back iff its last position was rejected); otherwise None.

        Example:
            >>> SpecCounts(10, 40, 20, (9, 6, 3, 2)).metrics()["mean_acceptance_length"]
            3.0
        """
        if self.drafts <= 0 or self.draft_tokens <= 0:
            return {
                "acceptance_rate": None,
                "mean_acceptance_length": None,
                "per_position_acceptance": [],
                "rollback_frequency": None,
                "batch_utilization": None,
            }
        k = self.draft_tokens / self.drafts
        uniform = abs(k - round(k)) < 1e-9 and len(self.accepted_per_pos) >= round(k)
        return {
            "acceptance_rate": self.accepted / self.draft_tokens,
            "mean_acceptance_length": 1 + self.accepted / self.drafts,
            "per_position_acceptance": [a / self.drafts for a in self.accepted_per_pos],
            "rollback_frequency": 1 - self.accepted_per_pos[round(k) - 1] / self.drafts if uniform else None,
            "batch_utilization": (self.drafts + self.accepted) / (self.drafts + self.draft_tokens),
        }
