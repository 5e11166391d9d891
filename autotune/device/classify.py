"""Memory- vs compute-bound classification from measured verify curves (docs/metrics.md).

- Knee ``n*``: over the curve T(n) of verify passes carrying n tokens (n = B*k in powers of
  two), the first n with T(n) > 1.1 * T(1). Below it extra tokens ride along almost free.
- Per batch size B: ``verify_cost = T_verify(B, gamma+1) / T_verify(B, 1)``, the price of
  checking gamma+1 tokens relative to decoding one.

  * memory-bound: verify_cost < 1.2 (verification nearly free: a large gamma pays);
  * compute-bound: verify_cost >= (gamma+1) / 2 (every extra token costs: gamma -> 0);
  * transitional: in between.

With repeated timings (``cost_samples``: per batch size the samples of T_verify(B, 1) and
T_verify(B, gamma_max+1); ``knee_samples``: per n the samples of T(n)), each label comes with
its evidence: the verify cost's seeded bootstrap 95% interval (ratio of medians, resampled) and
the knee's. A batch size whose interval straddles a class boundary cannot be separated at this
noise: it is labelled ``transitional`` (the class between the two) with ``separable: False`` and
the labels at both ends of the interval, never the point label of one noisy draw.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence

from autotune.cost.costmodel import best_gamma
from autotune.records import Curves, StepSample
from autotune.stats import bootstrap_interval

MEMORY_BOUND_MAX_COST = 1.2
KNEE_FACTOR = 1.1


def knee(curve: Mapping[int, float], factor: float = KNEE_FACTOR) -> int | None:
    """First n (ascending) with T(n) > factor * T(smallest n); None if the curve never bends.

    Example:
        >>> knee({1: 1.0, 2: 1.0, 4: 1.05, 8: 1.3, 16: 2.5})
        8
    """
    ns = sorted(curve)
    base = curve[ns[0]]
    return next((n for n in ns if curve[n] > factor * base), None)


def label(verify_cost: float, gamma: int) -> str:
    """'memory-bound', 'transitional' or 'compute-bound' for a cost ratio at gamma."""
    if verify_cost < MEMORY_BOUND_MAX_COST:
        return "memory-bound"
    if verify_cost >= (gamma + 1) / 2:
        return "compute-bound"
    return "transitional"


def label_with_evidence(cost: float, low: float, high: float, gamma: int) -> dict:
    """The label of a verify cost with a 95% interval; straddling a boundary is not separable.

    Example:
        >>> label_with_evidence(1.15, 1.10, 1.19, 8)["label"]
        'memory-bound'
        >>> e = label_with_evidence(1.15, 1.05, 1.40, 8)
        >>> e["label"], e["separable"], e["label_range"]
        ('transitional', False, ['memory-bound', 'transitional'])
    """
    ends = [label(low, gamma), label(high, gamma)]
    separable = ends[0] == ends[1]
    return {
        "label": ends[0] if separable else "transitional",
        "separable": separable,
        "label_range": ends,
        "point_label": label(cost, gamma),
        "verify_cost_ci95": [low, high],
    }


def knee_interval(
    knee_samples: Mapping[int, Sequence[float]], n_boot: int = 400, seed: int = 0, factor: float = KNEE_FACTOR
) -> list[int | None]:
    """Seeded bootstrap 95% interval of the knee n* (None at an end: the curve did not bend there).

    Example:
        >>> knee_interval({1: [1.0, 1.01, 0.99], 2: [1.0, 1.02, 0.98], 4: [1.5, 1.6, 1.4]})
        [4, 4]
    """
    ns = sorted(knee_samples, key=int)
    rng = random.Random(seed)
    never = 2 * int(ns[-1])
    values = []
    for _ in range(n_boot):
        curve = {
            int(n): statistics.median([rng.choice(knee_samples[n]) for _ in knee_samples[n]]) for n in ns
        }
        values.append(knee(curve, factor) or never)
    values.sort()
    lo, hi = values[int(0.025 * (n_boot - 1))], values[math.ceil(0.975 * (n_boot - 1))]
    return [None if lo == never else lo, None if hi == never else hi]


def classify(
    curves: Curves,
    knee_curve: Mapping[int, float],
    samples: list[StepSample],
    gamma_max: int,
    thresholds: tuple[float, ...] = (0.0,),
    cost_samples: Mapping[int, tuple[Sequence[float], Sequence[float]]] | None = None,
    knee_samples: Mapping[int, Sequence[float]] | None = None,
    seed: int = 0,
) -> dict:
    """The classification table: per measured batch size, cost, label and predicted best gamma.

    ``cost_samples[B] = (samples of T_verify(B, 1), samples of T_verify(B, gamma_max+1))`` and
    ``knee_samples`` add the evidence (intervals, separability) described in the module docstring.
    """
    n_star = knee(knee_curve)
    rows = []
    cost_samples = {int(b): v for b, v in (cost_samples or {}).items()}
    for batch in sorted(curves.t_verify):
        cost = curves.verify(batch, gamma_max + 1) / curves.verify(batch, 1)
        best = best_gamma(curves, samples, batch, gamma_max, thresholds)
        row = {
            "batch_size": batch,
            "tokens_in_verify": batch * (gamma_max + 1),
            "verify_cost": cost,
            "label": label(cost, gamma_max),
            "best_gamma": best.gamma,
            "best_threshold": best.confidence_threshold,
            "predicted_speedup": best.speedup,
            "predicted_tokens_per_second": best.tokens_per_second,
        }
        one, full = cost_samples.get(batch, ((), ()))
        if len(one) >= 2 and len(full) >= 2:
            low, high = bootstrap_interval(
                [one, full], lambda a, b: statistics.median(b) / statistics.median(a), seed=seed + batch
            )
            row.update(label_with_evidence(cost, low, high, gamma_max))
        rows.append(row)
    memory_bound = [r["batch_size"] for r in rows if r["label"] == "memory-bound"]
    out: dict[str, object] = {
        "knee_tokens": n_star,
        "gamma_max": gamma_max,
        "batch_sizes": rows,
        "memory_bound_batch_sizes": memory_bound,
    }
    if knee_samples and all(len(v) >= 2 for v in knee_samples.values()):
        out["knee_tokens_ci95"] = knee_interval(knee_samples, seed=seed)
    return out
