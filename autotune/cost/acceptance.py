"""Per-position acceptance: the one acceptance model the cost model, the stack cost fit and the watch read.

``p[i]`` is the unconditional probability that draft token i + 1 is accepted (so every token
before it is too; docs/metrics.md). It is measured two ways, and continued one way:

- :func:`from_samples`: the engine profiler's verify steps (accepted tokens per step, threshold 0);
- :func:`from_counts`: a serving stack's Prometheus counters (accepted tokens at each draft
  position over drafts), read by :func:`autotune.backends.prometheus.read_spec_counts`;
- :func:`extend`: past the measured positions (a stack counts up to the K it serves), a
  geometric tail at the mean conditional rate of the measured ones.

:func:`expected_tokens` is E(K) = 1 + p[0] + ... + p[K-1], the tokens one row-step emits.

Pure Python, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from autotune.records import StepSample


def from_samples(samples: Sequence[StepSample], gamma_max: int) -> list[float]:
    """Unconditional per-position acceptance from profiled verify steps (threshold 0).

    Example:
        >>> from_samples([StepSample(2, (0.9, 0.9)), StepSample(0, (0.2, 0.9))], 2)
        [0.5, 0.5]
    """
    if not samples:
        return [0.0] * gamma_max
    return [sum(s.n_accepted > i for s in samples) / len(samples) for i in range(gamma_max)]


def from_counts(accepted_per_pos: Sequence[float], drafts: float) -> list[float]:
    """Accepted tokens at each draft position per draft, held non-increasing and in [0, 1]; [] without drafts.

    A token accepted at position i means every token before it was, so the true counts never
    rise with the position; the stacks update the counters one by one, not atomically, so a
    scrape between two of one step's increments can leave a difference of two scrapes out of
    order by that step's count, and each position is held at most at the one before it
    (docs/decisions.md#per-position-acceptance-clamped).

    Example:
        >>> from_counts([60.0, 38.0, 39.0, -1.0], 100.0)
        [0.6, 0.38, 0.38, 0.0]
    """
    if drafts <= 0:
        return []
    out, last = [], 1.0
    for accepted in accepted_per_pos:
        last = min(last, max(accepted / drafts, 0.0))
        out.append(last)
    return out


def extend(acceptance: Sequence[float], n: int) -> tuple[float, ...]:
    """The first ``n`` per-position acceptances; past the measured ones a geometric tail at the
    mean conditional rate of the measured positions, p[m-1] ** (1 / m) for m measured.

    The mean rate rests on every measured position; the last conditional rate alone
    (p[m-1] / p[m-2]) rests on the two deepest, the fewest-counted, and missed the measured
    expected tokens about twice as far (docs/decisions.md#acceptance-tail-geometric-mean).
    Nothing measured: zeros.

    Example:
        >>> extend([0.5, 0.25], 4)
        (0.5, 0.25, 0.125, 0.0625)
        >>> extend([0.8, 0.6, 0.5], 2), extend([], 2)
        ((0.8, 0.6), (0.0, 0.0))
    """
    out = [min(max(float(p), 0.0), 1.0) for p in acceptance[:n]]
    if not out:
        return (0.0,) * n
    rate = out[-1] ** (1 / len(out))
    while len(out) < n:
        out.append(out[-1] * rate)
    return tuple(out)


def expected_tokens(acceptance: Sequence[float], k: int) -> float:
    """E(K) = 1 + the sum of the first K per-position acceptances (the bonus token included).

    With a constant conditional rate alpha, p[i] = alpha ** (i + 1) and E(K) is Leviathan et
    al.'s (1 - alpha ** (K + 1)) / (1 - alpha). ValueError past the given positions
    (:func:`extend` continues them).

    Example:
        >>> round(expected_tokens([0.8, 0.64, 0.512], 3), 3)  # alpha = 0.8
        2.952
    """
    if k > len(acceptance):
        raise ValueError(f"gamma {k} beyond the {len(acceptance)} profiled positions")
    return 1.0 + sum(acceptance[:k])
