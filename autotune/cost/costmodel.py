"""Cost model: predict tokens per step, step time, throughput and TPOT from measurements.

Pure functions over plain Python data (no torch), so they are cheap to call thousands of times
inside the study and easy to test on synthetic curves with known answers.

Leviathan et al. 2023, Thm 3.8, generalised to measured costs and per-position acceptance:

    E(gamma)   = 1 + sum_{i=1..gamma} P(draft token i accepted)
    T(B, gamma) = draft_forwards * T_draft(B) + T_verify(B, gamma + 1)
    tokens/s   = B * E / T        tpot = T / E

``per_position_acceptance[i]`` is the unconditional fraction of docs/metrics.md (token i accepted, so all
before it too), measured and extended by :mod:`autotune.cost.acceptance`; with a constant conditional
rate alpha it is alpha^i and E reduces to (1 - alpha^(gamma+1)) / (1 - alpha). The steady state of a
constant chain at any batch (:func:`chain_stats`, :func:`steady_tokens_per_second`) is what
``autotune watch`` predicts with too.

A confidence threshold is predicted from the profiler's per-step *samples*: for each verify
step at gamma_max and threshold 0, the number of accepted tokens and the draft's top
probability at every position. Under threshold tau a row stops drafting at the first position
whose confidence is below tau, so that step would have accepted min(n_accepted, first_low)
tokens and run min(first_low + 1, gamma) draft forwards.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.cost.acceptance import expected_tokens
from autotune.records import Curves, StepSample, interpolate


@dataclass(frozen=True)
class StepStats:
    """Expected per-row behaviour of one step for a (gamma, threshold)."""

    tokens: float  # emitted tokens per row per step, bonus included
    draft_forwards: float  # batched draft forwards per step
    verify_width: float  # tokens per row in the verify pass (1 + max proposals in the batch)


def row_outcomes(samples: Sequence[StepSample], gamma: int, threshold: float) -> list[tuple[int, int, int]]:
    """Per profiled row step under (gamma, threshold): (tokens emitted, draft forwards, proposals)."""
    if gamma == 0 or not samples:
        return [(1, 0, 0)]
    rows = []
    for s in samples:
        low = next((i for i, c in enumerate(s.confidence[:gamma]) if c < threshold), None)
        proposed = gamma if low is None else low
        forwards = gamma if low is None else min(low + 1, gamma)
        rows.append((1 + min(s.n_accepted, proposed), forwards, proposed))
    return rows


def step_stats(
    samples: Sequence[StepSample], gamma: int, threshold: float, batch: int = 1, seed: int = 0
) -> StepStats:
    """Expected tokens, draft forwards and verify width per step from profiled samples.

    With batch > 1, rows draft in lock step: the batch runs as many draft forwards as its
    longest row needs, and the verify pass is as wide as its longest proposal. Those maxima
    are estimated by resampling batches of profiled rows (seeded, deterministic).
    """
    if gamma == 0 or not samples:
        return StepStats(1.0, 0.0, 1.0)
    rows = row_outcomes(samples, gamma, threshold)
    tokens = sum(r[0] for r in rows) / len(rows)
    if batch <= 1:
        return StepStats(tokens, sum(r[1] for r in rows) / len(rows), 1 + sum(r[2] for r in rows) / len(rows))
    rng = random.Random(seed)
    draws = [[rng.choice(rows) for _ in range(batch)] for _ in range(256)]
    forwards = sum(max(r[1] for r in d) for d in draws) / len(draws)
    width = sum(1 + max(r[2] for r in d) for d in draws) / len(draws)
    return StepStats(tokens, forwards, width)


def chain_stats(acceptance: Sequence[float], gamma: int) -> StepStats:
    """One row's step of a constant chain of ``gamma`` draft tokens, from per-position acceptance:
    E(gamma) tokens, gamma draft forwards, a verify pass gamma + 1 wide (gamma 0: plain decoding).

    Example:
        >>> s = chain_stats([0.8, 0.6], 2)
        >>> round(s.tokens, 3), s.draft_forwards, s.verify_width, chain_stats([0.8, 0.6], 0).tokens
        (2.4, 2, 3, 1.0)
    """
    return StepStats(expected_tokens(acceptance, gamma), gamma, gamma + 1)


def step_time(curves: Curves, batch: float, stats: StepStats) -> float:
    """Seconds of one step at ``batch`` rows: draft_forwards x T_draft(B) + T_verify(B, width) + overhead(B)."""
    t_verify = curves.verify(batch, max(1.0, stats.verify_width))
    return stats.draft_forwards * curves.draft(batch) + t_verify + curves.step_overhead(batch)


def steady_tokens_per_second(curves: Curves, batch: float, stats: StepStats) -> float:
    """The steady state's tokens/s at ``batch`` rows: B x tokens per row-step / step time.

    Example:
        >>> c = Curves({1: {1: 0.010, 2: 0.011, 3: 0.012}}, {1: 0.001})
        >>> [round(steady_tokens_per_second(c, 1, chain_stats([0.8, 0.6], k)), 1) for k in (0, 2)]
        [100.0, 171.4]
    """
    return batch * stats.tokens / step_time(curves, batch, stats)


@dataclass(frozen=True)
class Prediction:
    gamma: int
    confidence_threshold: float
    batch_size: int
    tokens_per_step: float
    step_time_s: float
    tokens_per_second: float
    tpot_ms: float
    speedup: float  # over plain decoding at the same batch size


def predict(
    curves: Curves,
    samples: Sequence[StepSample],
    gamma: int,
    threshold: float,
    batch: int,
    new_tokens: int | None = None,
    num_requests: int | None = None,
    prompt_lens: Sequence[int] | None = None,
) -> Prediction:
    """Predicted throughput and time per output token of (gamma, threshold) at batch size B.

    Without ``new_tokens``: the steady state, B * E / T_step. With ``new_tokens`` (N tokens per
    request) and ``num_requests``: a closed-loop run of that many requests through B slots,
    replayed by :func:`simulate_closed_loop` (prefills of arriving requests, rows finishing at
    different steps, the batch draining at the end). ``tpot_ms`` is always the steady state's.

    Example:
        >>> curves = Curves({1: {1: 0.010, 2: 0.0105, 3: 0.011}}, {1: 0.001})
        >>> samples = [StepSample(2, (0.9, 0.9)), StepSample(0, (0.2, 0.9))]
        >>> p = predict(curves, samples, gamma=2, threshold=0.0, batch=1)
        >>> round(p.tokens_per_step, 2), round(p.step_time_s, 4)
        (2.0, 0.013)
    """
    st = step_stats(samples, gamma, threshold, batch)
    step = step_time(curves, batch, st)
    if new_tokens:
        n = num_requests or batch
        tps = simulate_closed_loop(
            curves, row_outcomes(samples, gamma, threshold), batch, new_tokens, n, prompt_lens
        )
        base = simulate_closed_loop(curves, row_outcomes(samples, 0, 0.0), batch, new_tokens, n, prompt_lens)
    else:
        tps = steady_tokens_per_second(curves, batch, st)
        base = steady_tokens_per_second(curves, batch, StepStats(1.0, 0.0, 1.0))
    return Prediction(gamma, threshold, batch, st.tokens, step, tps, 1e3 * step / st.tokens, tps / base)


REPLAY_ROW_STEPS = 40_000  # work cap of one closed-loop replay (row draws over all repeats)


def simulate_closed_loop(
    curves: Curves,
    rows: Sequence[tuple[int, int, int]],
    batch: int,
    new_tokens: int,
    num_requests: int,
    prompt_lens: Sequence[int] | None = None,
    repeats: int = 8,
    seed: int = 0,
) -> float:
    """Tokens/s of ``num_requests`` requests of ``new_tokens`` tokens each through ``batch`` slots,
    closed loop (a finished request is replaced at once), as the engine's scheduler runs them.

    Each loop: requests waiting for a free slot are prefilled together (T_prefill(m) at the
    longest of their prompts, drawn from ``prompt_lens``, since the engine pads to it; a model
    drafter prefills too, at its draft/target cost ratio; the prefill emits each request's first
    token), then one step of the b running rows: every row draws a profiled outcome (tokens,
    draft forwards, proposals) from ``rows``; the step costs
    max(forwards) * T_draft(b) + T_verify(b, 1 + max(proposals)) + overhead(b). A row retires
    once it has its tokens. Averaged over ``repeats`` seeded replays.

    The replay is capped at ``REPLAY_ROW_STEPS`` row-steps (fewer repeats first, then fewer
    requests, never under two batches' worth), so long workloads stay cheap to predict.
    """
    rng = random.Random(seed)
    per_request = new_tokens / (sum(r[0] for r in rows) / len(rows))  # expected row-steps of a request
    repeats = max(1, min(repeats, int(REPLAY_ROW_STEPS // (num_requests * per_request))))
    num_requests = min(num_requests, max(2 * batch, int(REPLAY_ROW_STEPS // per_request)))
    draft_share = 0.0  # the draft model's prefill, relative to the target's
    if any(r[1] for r in rows) and curves.t_draft and curves.t_verify:
        draft_share = interpolate(curves.t_draft, 1) / curves.verify(1, 1)
    tokens = wall = 0.0
    for _ in range(repeats):
        queue, t = num_requests, 0.0
        running: list[int] = []  # tokens each running row has still to generate
        while queue or running:
            admit = min(batch - len(running), queue)
            if admit:
                width = max(rng.choice(prompt_lens) for _ in range(admit)) if prompt_lens else None
                t += curves.prefill(admit, width) * (1 + draft_share)
                running += [new_tokens - 1] * admit
                queue -= admit
                running = [r for r in running if r > 0]
                if not running:
                    continue
            b = len(running)
            draws = [rng.choice(rows) for _ in running]
            t += (
                max(d[1] for d in draws) * curves.draft(b)
                + curves.verify(b, 1 + max(d[2] for d in draws))
                + curves.step_overhead(b)
            )
            running = [r - d[0] for r, d in zip(running, draws, strict=True) if r - d[0] > 0]
        tokens += num_requests * new_tokens
        wall += t
    return tokens / wall


def best_gamma(
    curves: Curves,
    samples: Sequence[StepSample],
    batch: int,
    gamma_max: int,
    thresholds: Sequence[float] = (0.0,),
    new_tokens: int | None = None,
    num_requests: int | None = None,
    prompt_lens: Sequence[int] | None = None,
) -> Prediction:
    """The highest-throughput (gamma, threshold) at batch size B; gamma 0 when nothing pays.
    With ``new_tokens``/``num_requests`` the candidates are compared on the closed-loop replay
    of such a run (see :func:`predict`), otherwise on the steady state."""
    cands = [
        predict(curves, samples, g, t, batch, new_tokens, num_requests, prompt_lens)
        for g in range(gamma_max + 1)
        for t in (thresholds if g else (0.0,))
    ]
    return max(cands, key=lambda p: (p.tokens_per_second, -p.gamma))


# --- token trees -----------------------------------------------------------------------------------

TREE_RANK_CAP = 16  # ranks are stored up to this (a rank >= the cap is never inside a searched top-k)


def tree_rank_samples(acceptance: Mapping[str, Any]) -> list[list[int]] | None:
    """The profiler's per-position draft ranks (``acceptance.tree_ranks``), or None when not measured."""
    ranks = acceptance.get("tree_ranks") if isinstance(acceptance, Mapping) else None
    return [list(map(int, r)) for r in ranks] if ranks else None


def tree_expected_tokens(ranks: Sequence[Sequence[int]], topk: Sequence[int]) -> float:
    """Expected tokens per row-step of a static tree (per-depth ``topk``), bonus included.

    ``ranks`` (per profiled request) holds, for each output position t, the rank of the target's
    token among the draft's predictions at that position (0 = the draft's top-1), both models
    teacher-forced on the target's own output. A step starting at t with a top-k tree reaches depth
    d when ``rank[t + j] < topk[j]`` for every j < d: the node of the target's token exists at every
    depth (a node's children are the draft's top-k given its path, which is the target's path).
    The step's tokens are 1 + that depth; the estimate averages over every start t of every
    request (starts near the end are cut by the output's end, as the request itself would be).

    Approximations (docs/metrics.md, cost model): exact in expectation for greedy rows when step
    starts are uniform over positions; for sampled rows the target token is a sample, and the
    tree's recursive rejection accepts more than "the sampled token is a child" for top-k children
    (the residual is renormalised after each rejected sibling) and differently for i.i.d.
    children, so there it is an approximation. A chain (top-k 1) gives the greedy chain's E.

    Example:
        >>> tree_expected_tokens([[0, 1, 0, 3]], (1, 1))  # starts 0..3 reach depths 1, 0, 1, 0
        1.5
        >>> tree_expected_tokens([[0, 1, 0, 3]], (2, 2))  # depths 2, 2, 1, 0
        2.25
    """
    total = count = 0
    for seq in ranks:
        n = len(seq)
        for t in range(n):
            d = 0
            while d < len(topk) and t + d < n and seq[t + d] < topk[d]:
                d += 1
            total += 1 + d
            count += 1
    return total / count if count else 1.0


def tree_level_sizes(topk: Sequence[int]) -> list[int]:
    """Nodes per depth 1..depth of a static tree (engine.tree.TreeShape.level_sizes, without torch)."""
    sizes, n = [], 1
    for k in topk:
        n *= k
        sizes.append(n)
    return sizes


@dataclass(frozen=True)
class TreePrediction:
    topk: tuple[int, ...]
    batch_size: int
    tokens_per_step: float
    step_time_s: float
    tokens_per_second: float
    tpot_ms: float
    speedup: float  # over plain decoding at the same batch size


def predict_tree(
    curves: Curves, ranks: Sequence[Sequence[int]], topk: Sequence[int], batch: int
) -> TreePrediction:
    """Steady-state throughput of a static tree at batch size B.

    Step time = sum over depths of one draft forward over the previous depth's nodes
    (T_draft(B) x T_verify(B, w) / T_verify(B, 1) for w nodes per row: the draft's width cost is
    assumed to scale like the target's) + T_verify(B, 1 + nodes) + overhead(B). Every row drafts
    the whole tree (no confidence cut), so there is no lock-step maximum. Tokens per step:
    :func:`tree_expected_tokens`.

    Example:
        >>> curves = Curves({1: {1: 0.010, 2: 0.010, 3: 0.011, 4: 0.012}}, {1: 0.001})
        >>> p = predict_tree(curves, [[0, 1, 0, 3]], (2, 1), 1)
        >>> round(p.tokens_per_step, 2), round(p.step_time_s, 4)
        (2.0, 0.014)
    """
    topk = tuple(topk)
    sizes = tree_level_sizes(topk)
    t1 = curves.verify(batch, 1)
    widths = [1, *sizes[:-1]]
    draft = sum(curves.draft(batch) * (curves.verify(batch, w) / t1 if t1 else 1.0) for w in widths)
    overhead = curves.step_overhead(batch)
    step = draft + curves.verify(batch, 1 + sum(sizes)) + overhead
    tokens = tree_expected_tokens(ranks, topk)
    tps = batch * tokens / step
    return TreePrediction(
        topk, batch, tokens, step, tps, 1e3 * step / tokens, tps / (batch / (t1 + overhead))
    )


def best_tree(
    curves: Curves, ranks: Sequence[Sequence[int]], shapes: Sequence[Sequence[int]], batch: int
) -> tuple[tuple[int, ...], TreePrediction]:
    """The highest predicted throughput among ``shapes`` at batch size B (ties to fewer nodes)."""
    preds = [predict_tree(curves, ranks, s, batch) for s in shapes]
    best = max(preds, key=lambda p: (p.tokens_per_second, -sum(tree_level_sizes(p.topk))))
    return best.topk, best
