"""The profiler: what this device does with this model pair, measured.

``measure`` produces one JSON-serialisable dict (stored whole in the profile database):

- ``fingerprint`` and ``ceilings``: device identity, theoretical and measured roofline;
- ``curves``: ``t_verify[B][k]`` (a target forward of B rows x k tokens over a cache filled
  to the workload's typical context) and ``t_draft[B]`` (one batched draft forward: the draft
  model's, or an EAGLE-3 head's one-token step), for B in
  powers of two up to the largest batch size, k = 1 .. gamma_max + 1 (and, when token trees are
  searched, up to the largest tree's nodes + 1: ``extend_for_trees``);
- ``knee_curve``: T(n) for verify passes of n = B*k tokens in powers of two, and ``knee_tokens``;
- ``acceptance``: per-position acceptance at gamma_max and threshold 0, and the per-step
  samples (tokens accepted, draft confidence per position) the cost model uses to predict any
  confidence threshold without rerunning; when token trees are searched (``extend_for_trees``),
  also ``tree_ranks``: per request and output position, the rank of the target's token among the
  draft's predictions, from which the cost model predicts any tree shape's accepted length;
- ``verification_efficiency[B][k]`` and ``draft_cost_ratio[B]`` (docs/metrics.md);
- ``classification``: the per-batch-size table (autotune.device.classify), each label with its evidence
  (verify cost with a bootstrap 95% interval from the repeated timings in ``t_verify_samples``;
  the knee with its interval from ``knee_curve_samples``).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable

import torch

from autotune.cost.acceptance import from_samples
from autotune.cost.costmodel import TREE_RANK_CAP
from autotune.device.ceilings import measure_ceilings
from autotune.device.classify import classify
from autotune.device.hardware import fingerprint
from autotune.device.timing import forward_timer, measure_stable, time_fn
from autotune.records import Curves, StepSample
from autotune.workload.runner import LoadSpec, run_load
from engine.eagle3 import Eagle3Head
from engine.loader import ModelPair
from engine.metrics import draft_cost_ratio, verification_efficiency
from engine.model import Transformer
from engine.speculative import Request, SpecConfig

Progress = Callable[[str], None]
"""Called between the profiler's steps with the step just done, never after the last one: a callback
that raises (a run over its budget share) stops before more work and never discards a finished
measurement."""


ACCEPTANCE_PROMPTS = 24  # prompts of the acceptance pass, spread evenly over the workload file


def spread(items: list, n: int) -> list:
    """``n`` items evenly spaced over ``items`` (all of them when there are fewer)."""
    if len(items) <= n:
        return list(items)
    return [items[i * len(items) // n] for i in range(n)]


def powers_of_two(limit: int) -> list[int]:
    """1, 2, 4, ... up to and including ``limit`` (``limit`` itself added if not a power)."""
    out, b = [], 1
    while b < limit:
        out.append(b)
        b *= 2
    return [*out, limit]


def _head_timer(head: Eagle3Head, batch: int, context: int, device: torch.device) -> Callable[[], object]:
    """One EAGLE-3 head forward of (batch, 1) new tokens after ``context`` (a draft step's cost: the
    head runs once per drafted token, fed its own previous hidden state)."""
    cache = head.new_cache(batch, context + 2)
    c = head.config.layer
    gen = torch.Generator().manual_seed(0)
    dtype = head.fc.weight.dtype
    with torch.inference_mode():
        prefix = torch.randint(0, c.vocab_size, (batch, context), generator=gen).to(device)
        hidden = torch.randn(batch, context, c.hidden_size, generator=gen).to(device, dtype)
        head(prefix, hidden, cache, torch.zeros(batch, dtype=torch.long, device=device), context)
    tokens = torch.randint(0, c.vocab_size, (batch, 1), generator=gen).to(device)
    step_hidden = torch.randn(batch, 1, c.hidden_size, generator=gen).to(device, dtype)
    start = torch.full((batch,), context, dtype=torch.long, device=device)

    def run() -> object:
        with torch.inference_mode():
            return head(tokens, step_hidden, cache, start, context + 1)

    return run


def compiled_over_eager(
    model: Transformer, widths: tuple[int, ...] = (1, 5), rounds: int = 7, context: int = 64
) -> float:
    """Time of ``model``'s compiled decode over its eager one at B=1 (< 1: compiling pays).

    Per width (a decode step and a gamma-4 verify by default) the same forward runs compiled and
    eager (``model.compiled`` toggled) in ``rounds`` interleaved rounds of 5 calls, so a slow
    phase of a shared host hits both; returns the sum over widths of the compiled medians over the
    sum of the eager ones. ``model`` must be compiled (and stays so).
    """
    device = model.lm_head.weight.device
    medians = {True: 0.0, False: 0.0}
    try:
        for k in widths:
            run = forward_timer(model, 1, k, context, device)
            samples: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(rounds):
                for compiled in (True, False):
                    model.compiled = compiled  # decode() reads the flag on every call
                    samples[compiled].append(statistics.median(time_fn(run, device, warmup=1, repeats=5)))
            for compiled, times in samples.items():
                medians[compiled] += statistics.median(times)
    finally:
        model.compiled = True
    return medians[True] / medians[False]


def measure_curves(
    pair: ModelPair,
    batch_sizes: list[int],
    gamma_max: int,
    context: int,
    repeats: int = 7,
    progress: Progress | None = None,
    prompt_tokens: int | None = None,
    verify_k_max: int | None = None,
) -> dict:
    """T_verify(B, k), T_draft(B), T_prefill(B) and the knee curve T(n), medians over ``repeats``.

    k runs 1 .. gamma_max + 1, or 1 .. ``verify_k_max`` when that is larger (a token tree's nodes + 1)."""
    prompt_tokens = prompt_tokens or context
    device = pair.target.lm_head.weight.device
    k_max = max(gamma_max + 1, verify_k_max or 0)
    t_verify: dict[int, dict[int, float]] = {}
    t_draft: dict[int, float] = {}
    cost_samples: dict[int, dict[int, list[float]]] = {}  # the classifier's evidence: k = 1 and gamma_max + 1
    noisy: list[str] = []
    for b in batch_sizes:
        t_verify[b], cost_samples[b], noisy_ks = _verify_row(
            pair.target, b, k_max, gamma_max, context, repeats
        )
        noisy += [f"verify B={b} k={k}" for k in noisy_ks]
        draft_step = _draft_timer(pair, b, context, device)
        if draft_step is not None:
            t_draft[b] = measure_stable(draft_step, device, warmup=2, repeats=repeats)["median"]
        if progress:
            progress(f"verify/draft curves B={b}")
    t_prefill = {
        b: measure_stable(
            forward_timer(pair.target, b, prompt_tokens, 1, device),
            device,
            warmup=1,
            repeats=max(3, repeats // 2),
        )["median"]
        for b in batch_sizes
    }
    knee_curve, knee_samples = _knee_curve(pair.target, max(batch_sizes), gamma_max, context, repeats)
    if progress:
        progress("knee curve")
    return {
        "t_verify": t_verify,
        "t_draft": t_draft,
        "t_prefill": t_prefill,
        "knee_curve": knee_curve,
        "t_verify_samples": cost_samples,
        "knee_curve_samples": knee_samples,
        "context_tokens": context,
        "prompt_tokens": prompt_tokens,
        "repeats": repeats,
        "noisy": noisy,
    }


def _verify_row(
    target: Transformer, b: int, k_max: int, gamma_max: int, context: int, repeats: int
) -> tuple[dict[int, float], dict[int, list[float]], list[int]]:
    """T_verify(b, k) for k = 1 .. ``k_max``: the medians, the samples at k = 1 and gamma_max + 1 (the
    classifier's evidence), and the k whose samples stayed noisy."""
    device = target.lm_head.weight.device
    times: dict[int, float] = {}
    samples: dict[int, list[float]] = {}
    noisy = []
    for k in range(1, k_max + 1):
        m = measure_stable(
            forward_timer(target, b, k, context, device), device, warmup=2, repeats=repeats, keep_samples=True
        )
        times[k] = m["median"]
        if k in (1, gamma_max + 1):
            samples[k] = m["samples"]
        if m["noisy"]:
            noisy.append(k)
    return times, samples, noisy


def _draft_timer(pair: ModelPair, b: int, context: int, device: torch.device) -> Callable[[], object] | None:
    """One draft step at batch ``b``: the draft model's forward, or the EAGLE-3 head's; None without either."""
    if pair.draft is not None:
        return forward_timer(pair.draft, b, 1, context, device)
    if pair.eagle3 is not None:
        return _head_timer(pair.eagle3, b, context, device)
    return None


def _knee_curve(
    target: Transformer, b_max: int, gamma_max: int, context: int, repeats: int
) -> tuple[dict[int, float], dict[int, list[float]]]:
    """T(n) for verify passes of n = B * k tokens in powers of two (B up to ``b_max``): medians and samples."""
    device = target.lm_head.weight.device
    curve: dict[int, float] = {}
    samples: dict[int, list[float]] = {}
    for n in powers_of_two(max(64, b_max * (gamma_max + 1))):
        b = min(n, b_max)
        k = max(1, n // b)
        m = measure_stable(
            forward_timer(target, b, k, context, device), device, warmup=2, repeats=repeats, keep_samples=True
        )
        curve[b * k] = m["median"]
        samples[b * k] = m["samples"]
    return curve, samples


def measure_overhead(pair: ModelPair, requests: list[Request], curves: dict, seed: int = 0) -> None:
    """Engine work beyond the bare forwards, per batch size, added to ``curves`` in place.

    ``overhead[B]``: a real decode step minus the bare target forward (sampling, acceptance,
    bookkeeping, the step's host sync). ``draft_overhead[B]``: a real draft forward inside the
    engine (gathering pending tokens, picking proposals) minus the bare draft forward. Every step
    pays both; without them the cost model over-predicts throughput.
    """
    t_verify, t_draft = curves["t_verify"], curves["t_draft"]
    curves["overhead"], curves["draft_overhead"] = {}, {}
    for b in t_verify:
        short = [Request(r.prompt_ids, 16, r.temperature, r.top_k, r.top_p, r.id) for r in requests[:b]]
        short = short * max(1, b // len(short) + 1)
        load = LoadSpec(max_batch_size=b, num_requests=2 * b)
        run = run_load(pair, short, SpecConfig(gamma=0), "none", load, seed)
        curves["overhead"][b] = max(run.metrics["verify_step_ms"] / 1e3 - t_verify[b][1], 0.0)
        if b in t_draft and (pair.draft is not None or pair.eagle3 is not None):
            kind = "model" if pair.draft is not None else "eagle3"
            run = run_load(pair, short, SpecConfig(gamma=2), kind, load, seed)
            curves["draft_overhead"][b] = max(run.metrics["draft_forward_ms"] / 1e3 - t_draft[b], 0.0)


def measure_acceptance(
    pair: ModelPair, requests: list[Request], drafter: str, gamma_max: int, seed: int = 0
) -> dict:
    """Per-position acceptance at gamma_max, threshold 0, B=1, with per-step samples."""
    run = run_load(
        pair,
        requests,
        SpecConfig(gamma=gamma_max),
        drafter,
        LoadSpec(max_batch_size=1, num_requests=len(requests)),
        seed,
        warmup=False,
        trace=True,
    )
    samples = run.trace
    return {
        "gamma_max": gamma_max,
        "drafter": drafter,
        "acceptance_rate": run.metrics["acceptance_rate"],
        "per_position_acceptance": from_samples(samples, gamma_max),
        "samples": [[s.n_accepted, list(s.confidence)] for s in samples],
    }


def measure_tree_ranks(
    pair: ModelPair, requests: list[Request], seed: int = 0, cap: int = TREE_RANK_CAP
) -> list[list[int]]:
    """Per request, the rank of each output token among the draft's predictions (capped at ``cap``).

    The target generates each request's output (plain decoding, the workload's sampling); then
    one uncached forward of the draft over prompt + output gives, at every output position, the
    draft's logits given the target's own prefix, and the output token's rank among them (0 =
    the draft's argmax). :func:`autotune.cost.costmodel.tree_expected_tokens` reads these.
    """
    if pair.draft is None:
        return []
    device = pair.target.lm_head.weight.device
    run = run_load(
        pair,
        requests,
        SpecConfig(gamma=0),
        "none",
        LoadSpec(max_batch_size=1, num_requests=len(requests)),
        seed,
        warmup=False,
    )
    out = []
    for rec in run.records:
        req = requests[
            rec.id % len(requests)
        ]  # the load generator issues the list in order, as ids 0, 1, ...
        if not rec.output_tokens:
            continue
        ids = torch.tensor([list(req.prompt_ids) + list(rec.output_tokens)], device=device)
        p = len(req.prompt_ids)
        with torch.inference_mode():
            logits = pair.draft(ids[:, :-1])[0, p - 1 :]  # predictions of output positions 0..n-1
        tokens = ids[0, p:]
        chosen = logits.gather(1, tokens[:, None])
        ranks = (logits > chosen).sum(-1).clamp(max=cap)
        out.append([int(r) for r in ranks.tolist()])
    return out


def tree_nodes(shapes) -> int:
    """The most verified nodes among trees (per-depth top-k tuples, dynamic trees); 0 for chains only."""
    trees = [SpecConfig.for_tree(s).tree for s in shapes if s]
    return max((t.n_nodes for t in trees if t is not None), default=0)


def extend_for_trees(
    pair: ModelPair,
    requests: list[Request],
    measurement: dict,
    shapes,
    seed: int = 0,
    progress: Progress | None = None,
) -> dict | None:
    """What the profiler adds when token trees are searched, or None when the measurement has it already.

    T_verify(B, k) for k up to the largest tree's nodes + 1 at every measured batch size (same
    context, repeats and timer as :func:`measure_curves`), and ``acceptance.tree_ranks``
    (:func:`measure_tree_ranks`). Returns a new measurement (stored form: string keys); nothing
    already measured changes.
    """
    need = tree_nodes(shapes) + 1
    curves = measurement["curves"]
    t_verify = curves["t_verify"]
    missing = {
        b: [k for k in range(1, need + 1) if str(k) not in row and k not in row]
        for b, row in t_verify.items()
    }
    has_ranks = bool(measurement.get("acceptance", {}).get("tree_ranks"))
    if need <= 1 or (has_ranks and not any(missing.values())):
        return None
    device = pair.target.lm_head.weight.device
    context = int(curves.get("context_tokens") or max(len(r.prompt_ids) for r in requests))
    repeats = int(curves.get("repeats") or 7)
    new = json.loads(json.dumps(measurement))
    for b, ks in missing.items():
        for k in ks:
            m = measure_stable(
                forward_timer(pair.target, int(b), k, context, device), device, warmup=2, repeats=repeats
            )
            new["curves"]["t_verify"][str(b)][str(k)] = m["median"]
            t1 = new["curves"]["t_verify"][str(b)].get("1")
            if t1:
                new["verification_efficiency"].setdefault(str(b), {})[str(k)] = verification_efficiency(
                    m["median"], k, t1
                )
        if ks and progress:
            progress(f"tree verify widths B={b} k<={need}")
    if not has_ranks:
        new["acceptance"]["tree_ranks"] = measure_tree_ranks(pair, spread(requests, ACCEPTANCE_PROMPTS), seed)
        if progress:
            progress("tree acceptance (draft ranks of the target's tokens)")
    return new


def curves_from_json(curves: dict) -> Curves:
    """Rebuild :class:`Curves` from stored JSON (whose mapping keys became strings)."""
    return Curves.from_json(curves)


def samples_from_json(acceptance: dict) -> list[StepSample]:
    """The profiler's stored ``acceptance.samples`` as :class:`StepSample` records."""
    return [StepSample.from_json(s) for s in acceptance["samples"]]


def measure(
    pair: ModelPair,
    requests: list[Request],
    drafter: str,
    max_batch_size: int,
    gamma_max: int,
    device_name: str = "auto",
    dtype: str = "float32",
    thresholds: tuple[float, ...] = (0.0,),
    seed: int = 0,
    progress: Progress | None = None,
) -> dict:
    """Everything the tuner knows about this device and pair before its first trial."""
    device = pair.target.lm_head.weight.device
    fp = fingerprint(str(device), dtype)
    if progress:
        progress("fingerprint")
    ceilings = measure_ceilings(device)
    if progress:
        progress("ceilings")
    prompt = int(statistics.median(len(r.prompt_ids) for r in requests))
    context = prompt + requests[0].max_new_tokens // 2
    batches = powers_of_two(max_batch_size)
    curves = measure_curves(pair, batches, gamma_max, context, progress=progress, prompt_tokens=prompt)
    measure_overhead(pair, requests, curves, seed)
    if progress:  # the last call: a caller that stops here stops before the acceptance pass, never after it
        progress("engine step overhead; next: the acceptance pass")
    acceptance = measure_acceptance(pair, spread(requests, ACCEPTANCE_PROMPTS), drafter, gamma_max, seed)
    cv = curves_from_json(curves)
    samples = samples_from_json(acceptance)
    table = classify(
        cv,
        curves["knee_curve"],
        samples,
        gamma_max,
        thresholds,
        cost_samples={b: (row[1], row[gamma_max + 1]) for b, row in curves["t_verify_samples"].items()},
        knee_samples=curves["knee_curve_samples"],
        seed=seed,
    )
    ve = {
        b: {k: verification_efficiency(t, k, row[1]) for k, t in row.items()}
        for b, row in cv.t_verify.items()
    }
    dcr = {b: draft_cost_ratio(cv.draft(b), cv.verify(b, 1)) for b in cv.t_verify} if cv.t_draft else {}
    return {
        "fingerprint": fp,
        "ceilings": ceilings,
        "curves": curves,
        "knee_tokens": table["knee_tokens"],
        "acceptance": acceptance,
        "verification_efficiency": ve,
        "draft_cost_ratio": dcr,
        "classification": table,
    }
