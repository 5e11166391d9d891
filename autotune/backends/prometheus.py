"""Prometheus text exposition: read counters, take differences, turn spec-decode counts into metrics.

Serving stacks count speculative decoding in monotonically increasing counters; a run's
numbers are the difference of two scrapes (before and after the load). vLLM and llama-server
share the counter names under their own prefix (``vllm:``, ``llamacpp:``; docs/backends.md), and
:func:`read_spec_counts` is the one reader of them: the tuner's serving backends
(:func:`spec_counts`, around each load level) and ``autotune watch`` (every window) both call it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from autotune.cost.acceptance import from_counts

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

SPEC_COUNTERS = {
    "drafts": "spec_decode_num_drafts_total",
    "draft_tokens": "spec_decode_num_draft_tokens_total",
    "accepted": "spec_decode_num_accepted_tokens_total",
}
"""The spec-decode counters of :class:`SpecCounts`, by field, without the stack's prefix."""
PER_POSITION = "spec_decode_num_accepted_tokens_per_pos_total"
"""Accepted tokens per draft position (label ``position``, 0-based), without the stack's prefix."""


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
            "per_position_acceptance": from_counts(self.accepted_per_pos, self.drafts),
            "rollback_frequency": 1 - self.accepted_per_pos[round(k) - 1] / self.drafts if uniform else None,
            "batch_utilization": (self.drafts + self.accepted) / (self.drafts + self.draft_tokens),
        }


def read_spec_counts(samples: Samples, prefix: str) -> SpecCounts | None:
    """The ``<prefix>:spec_decode_*`` counters of one scrape, summed over label sets (engines, models);
    None when the scrape has none of them (the server does not speculate).

    NaN and infinite samples are skipped (a series with no finite sample is absent); the
    per-position counts run from position 0 up to the first position the scrape lacks.

    Example:
        >>> text = 'p:spec_decode_num_drafts_total 10\\np:spec_decode_num_accepted_tokens_total 9\\n'
        >>> text += 'p:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 3\\n'
        >>> text += 'p:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 6'
        >>> read_spec_counts(parse_text(text), "p")
        SpecCounts(drafts=10.0, draft_tokens=0.0, accepted=9.0, accepted_per_pos=(6.0, 3.0))
        >>> read_spec_counts(parse_text("up 1"), "p") is None
        True
    """
    names = {key: f"{prefix}:{name}" for key, name in SPEC_COUNTERS.items()}
    if not any(n in names.values() and math.isfinite(v) for (n, _), v in samples.items()):
        return None
    per_pos: dict[int, float] = {}
    for (name, labels), v in samples.items():
        pos = dict(labels).get("position")
        if name == f"{prefix}:{PER_POSITION}" and pos is not None and pos.isdigit() and math.isfinite(v):
            per_pos[int(pos)] = per_pos.get(int(pos), 0.0) + v
    contiguous: list[float] = []
    while len(contiguous) in per_pos:
        contiguous.append(per_pos[len(contiguous)])
    return SpecCounts(
        float(total(samples, names["drafts"])),
        float(total(samples, names["draft_tokens"])),
        float(total(samples, names["accepted"])),
        tuple(contiguous),
    )


def spec_counts(metrics_text: str, prefix: str) -> SpecCounts:
    """:func:`read_spec_counts` of one ``/metrics`` text, zero counts where the server does not speculate."""
    return read_spec_counts(parse_text(metrics_text), prefix) or SpecCounts(0.0, 0.0, 0.0, ())
