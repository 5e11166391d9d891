"""Memory- vs compute-bound classification from measured verify curves (DESIGN.md).

- Knee ``n*``: over the curve T(n) of verify passes carrying n tokens (n = B*k in powers of
  two), the first n with T(n) > 1.1 * T(1). Below it extra tokens ride along almost free.
- Per batch size B: ``verify_cost = T_verify(B, gamma+1) / T_verify(B, 1)``, the price of
  checking gamma+1 tokens relative to decoding one.

  * memory-bound: verify_cost < 1.2 (verification nearly free: a large gamma pays);
  * compute-bound: verify_cost >= (gamma+1) / 2 (every extra token costs: gamma -> 0);
  * transitional: in between.
"""

from __future__ import annotations

from collections.abc import Mapping

from autotune.costmodel import Curves, StepSample, best_gamma

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


def classify(
    curves: Curves,
    knee_curve: Mapping[int, float],
    samples: list[StepSample],
    gamma_max: int,
    thresholds: tuple[float, ...] = (0.0,),
) -> dict:
    """The classification table: per measured batch size, cost, label and predicted best gamma."""
    n_star = knee(knee_curve)
    rows = []
    for batch in sorted(curves.t_verify):
        cost = curves.verify(batch, gamma_max + 1) / curves.verify(batch, 1)
        best = best_gamma(curves, samples, batch, gamma_max, thresholds)
        rows.append({
            "batch_size": batch,
            "tokens_in_verify": batch * (gamma_max + 1),
            "verify_cost": cost,
            "label": label(cost, gamma_max),
            "best_gamma": best.gamma,
            "best_threshold": best.confidence_threshold,
            "predicted_speedup": best.speedup,
            "predicted_tokens_per_second": best.tokens_per_second,
        })
    memory_bound = [r["batch_size"] for r in rows if r["label"] == "memory-bound"]
    return {"knee_tokens": n_star, "gamma_max": gamma_max, "batch_sizes": rows,
            "memory_bound_batch_sizes": memory_bound}
