"""Run metrics, one definition each (docs/metrics.md).

The engine accumulates raw counters on the device during a run (no host syncs in the hot
loop); :meth:`SpecStats.summary` turns them into the named metrics. Latency percentiles over
requests live here too, so every number the tool prints has one function that computes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TypeAlias

import torch

SourceSummary: TypeAlias = dict[str, dict[str, float | None]]
# One value of SpecStats.summary: a rate or time, per-position rates, or the per-source split.
Metric: TypeAlias = float | list[float | None] | SourceSummary | None


@dataclass
class SpecStats:
    """Raw counters of one engine run."""

    gamma_max: int
    device: torch.device | str = "cpu"
    row_steps: torch.Tensor = field(init=False)  # verify steps x rows
    proposed: torch.Tensor = field(init=False)  # draft tokens proposed
    accepted: torch.Tensor = field(init=False)  # draft tokens accepted
    rollbacks: torch.Tensor = field(init=False)  # row-steps with >= 1 rejected draft token
    pos_proposed: torch.Tensor = field(init=False)  # (gamma_max,) steps proposing position i
    pos_accepted: torch.Tensor = field(init=False)  # (gamma_max,) steps accepting position i
    tokens_kept: torch.Tensor = field(init=False)  # tokens emitted by verify passes
    verify_slots: int = 0  # token slots computed in verify passes (padding included)
    verify_steps: int = 0  # target verify forwards
    draft_forwards: int = 0  # draft model forwards (one per proposed position, batched)
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    batch_rows: int = 0  # sum over verify steps of running rows
    sources: tuple[str, ...] = ("none", "ngram", "model")  # draft sources (engine.drafters.SOURCES)
    by_source: torch.Tensor | None = (
        None  # (sources, 3): row-steps, proposed, accepted; None = never recorded
    )

    def __post_init__(self) -> None:
        def z(shape: int | tuple[int, ...]) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.long, device=self.device)

        self.row_steps, self.proposed, self.accepted, self.rollbacks, self.tokens_kept = (
            z(()) for _ in range(5)
        )
        self.pos_proposed, self.pos_accepted = z(max(self.gamma_max, 1)), z(max(self.gamma_max, 1))

    def record(self, n_proposed: torch.Tensor, n_accepted: torch.Tensor, n_emitted: torch.Tensor) -> None:
        """Add one verify step over B rows (all tensors (B,))."""
        g = self.pos_proposed.shape[0]
        pos = torch.arange(g, device=n_proposed.device)[None, :]
        self.row_steps += n_proposed.shape[0]
        self.proposed += n_proposed.sum()
        self.accepted += n_accepted.sum()
        self.rollbacks += (n_accepted < n_proposed).sum()
        self.pos_proposed += (pos < n_proposed[:, None]).sum(0)
        self.pos_accepted += (pos < n_accepted[:, None]).sum(0)
        self.tokens_kept += n_emitted.sum()

    def record_sources(
        self, source: torch.Tensor, n_proposed: torch.Tensor, n_accepted: torch.Tensor
    ) -> None:
        """Split one verify step by draft source (``source`` (B,) indices into ``sources``)."""
        if self.by_source is None:
            self.by_source = torch.zeros(len(self.sources), 3, dtype=torch.long, device=source.device)
        one_hot = torch.nn.functional.one_hot(source, len(self.sources))  # (B, S)
        self.by_source += one_hot.T @ torch.stack([torch.ones_like(n_proposed), n_proposed, n_accepted], 1)

    def source_summary(self) -> SourceSummary | None:
        """Per draft source: share of row-steps it served, tokens proposed, its acceptance rate."""
        if self.by_source is None:
            return None
        counts = self.by_source.tolist()
        total = sum(c[0] for c in counts)
        return {
            name: {
                "share": c[0] / total if total else None,
                "row_steps": c[0],
                "proposed": c[1],
                "accepted": c[2],
                "acceptance_rate": c[2] / c[1] if c[1] else None,
            }
            for name, c in zip(self.sources, counts, strict=True)
        }

    def summary(self) -> dict[str, Metric]:
        """The speculative metrics of docs/metrics.md as plain numbers."""
        steps = int(self.row_steps)
        proposed, accepted = int(self.proposed), int(self.accepted)
        pos_p, pos_a = self.pos_proposed.tolist(), self.pos_accepted.tolist()
        return {
            "acceptance_rate": accepted / proposed if proposed else None,
            "mean_acceptance_length": 1 + accepted / steps if steps else None,
            "per_position_acceptance": [a / p if p else None for a, p in zip(pos_a, pos_p, strict=True)],
            "rollback_frequency": int(self.rollbacks) / steps if steps else None,
            "batch_utilization": int(self.tokens_kept) / self.verify_slots if self.verify_slots else None,
            "mean_batch_size": self.batch_rows / self.verify_steps if self.verify_steps else None,
            "verify_tokens_per_row": self.verify_slots / self.batch_rows if self.batch_rows else None,
            "verify_step_ms": 1e3 * self.verify_time_s / self.verify_steps if self.verify_steps else None,
            "draft_forward_ms": 1e3 * self.draft_time_s / self.draft_forwards
            if self.draft_forwards
            else None,
            "draft_forwards_per_step": self.draft_forwards / self.verify_steps if self.verify_steps else None,
            "draft_sources": self.source_summary(),
        }


def verification_efficiency(t_verify_k: float, k: float, t_decode: float) -> float:
    """T_verify(B, k) / (k * T_decode(B, 1)): below 1, verifying k tokens beats decoding them."""
    return t_verify_k / (k * t_decode)


def draft_cost_ratio(t_draft_step: float, t_decode: float) -> float:
    """c = T_draft_step(B) / T_decode(B, 1)."""
    return t_draft_step / t_decode


def speedup(t_autoregressive: float, t_speculative: float) -> float:
    """T_autoregressive / T_speculative on the same workload and engine."""
    return t_autoregressive / t_speculative


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
