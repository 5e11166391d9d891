"""Our engine against transformers' assisted generation: same pair, prompts, gamma, B=1, greedy.

Six ways to generate exactly ``--max-new-tokens`` tokens for each prompt, one prompt at a time
(end-of-sequence disabled on both sides, so every output has the same length):

- ours spec:    ``engine.generate.generate`` with the draft model, constant gamma, threshold 0,
                decode/verify compiled (``Transformer.compile_decode``, what ``autotune tune`` runs);
- ours AR:      the same engine with gamma 0;
- ours spec eager / ours AR eager: the same two without compiling (fused projections, eager torch);
                with ``--engine eager`` (the quick run) ours spec and ours AR are these, and nothing
                is compiled;
- HF assisted:  ``model.generate(input_ids, assistant_model=draft, do_sample=False, ...)`` with
                ``num_assistant_tokens=gamma``, ``num_assistant_tokens_schedule="constant"`` and
                ``assistant_confidence_threshold=0.0`` set on the *draft's* generation_config (transformers
                reads them there; passed to ``generate`` they would land on the target's and be ignored);
- HF plain:     ``model.generate(input_ids, do_sample=False, ...)``.

Models load with ``AutoModelForCausalLM.from_pretrained(folder, dtype=...)`` (LlamaForCausalLM for
the demo pair; the engine's folders are Hugging Face checkpoints). Each call is timed end to end
(prefill included, host clock, device synchronised); the order of the four rotates from prompt to
prompt so drift hits them alike, and each method first generates one untimed prompt (compile time
is reported apart). tokens/s = all generated tokens / summed wall time; the ratios' 95% intervals
bootstrap the prompts (per-prompt times of both methods resampled together). Identical-output
counts compare the token lists per prompt.

Example:
    python -m benchmarks.engine.vs_transformers                      # the demo pair, ~1-2 min on 2 cores
    python -m benchmarks.engine.vs_transformers --gamma 2 --num-prompts 2 --max-new-tokens 16
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable

import torch

from autotune.stats import bootstrap_interval
from benchmarks import _common
from engine.generate import generate
from engine.loader import ModelPair
from engine.speculative import Request, SpecConfig

NAME = "vs_transformers"
METHODS = ("ours_spec", "ours_ar", "ours_spec_eager", "ours_ar_eager", "hf_assisted", "hf_plain")
PAIRS = (
    ("ours_spec", "hf_assisted"),
    ("ours_spec", "ours_ar"),
    ("hf_assisted", "hf_plain"),
    ("ours_ar", "hf_plain"),
    ("ours_spec", "ours_spec_eager"),
    ("ours_ar", "ours_ar_eager"),
)


def load_hf(folder, dtype: str, device):
    """A transformers causal LM from a model folder, in eval mode (progress bars and warnings off)."""
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).to(device).eval()
    model.generation_config.eos_token_id = None  # generate exactly max_new_tokens, like our engine below
    return model


def ratio_interval(rows: list[dict], a: str, b: str, seed: int) -> tuple[float, float, float]:
    """tokens/s of ``a`` over ``b`` and its bootstrap 95% interval (prompts resampled, both methods
    together)."""

    def ratio(sample: list[dict]) -> float:
        ta = sum(r[f"{a}_tokens"] for r in sample) / sum(r[f"{a}_s"] for r in sample)
        return ta / (sum(r[f"{b}_tokens"] for r in sample) / sum(r[f"{b}_s"] for r in sample))

    lo, hi = bootstrap_interval([range(len(rows))], lambda idx: ratio([rows[i] for i in idx]), seed=seed)
    return ratio(rows), lo, hi


def as_assistant(draft, gamma: int) -> None:
    """transformers' assisted generation set to our engine's chain: ``gamma`` tokens a step, always."""
    draft.generation_config.num_assistant_tokens = gamma
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0


def ours(models: ModelPair, gamma: int, n_new: int, seed: int) -> Callable[[list[int]], list[int]]:
    """Our engine on one prompt at B=1: speculative at ``gamma``, autoregressive at 0."""
    cfg = SpecConfig(gamma=gamma, confidence_threshold=0.0)
    drafter = "model" if gamma else "none"
    return lambda ids: generate(
        models, [Request(ids, n_new)], cfg, drafter, max_batch_size=1, seed=seed, eos_ids=()
    ).tokens[0]


def hf(target, assistant, n_new: int) -> Callable[[list[int]], list[int]]:
    """transformers' greedy generate on one prompt, assisted by ``assistant`` when it is given."""
    device = target.device

    def run(ids: list[int]) -> list[int]:
        x = torch.tensor([ids], device=device)
        kw = {"assistant_model": assistant} if assistant is not None else {}
        out = target.generate(
            x,
            attention_mask=torch.ones_like(x),
            do_sample=False,
            max_new_tokens=n_new,
            eos_token_id=None,
            **kw,
        )
        return out[0, len(ids) :].tolist()

    return run


def methods_of(engine: str) -> tuple[str, ...]:
    """The methods ``--engine`` runs: all six with ``both``; with ``eager`` the eager engine under the
    names ``ours_spec``/``ours_ar`` (nothing compiled, no compiled-over-eager pairs)."""
    return METHODS if engine == "both" else tuple(m for m in METHODS if not m.endswith("_eager"))


def measure_prompts(
    fns: dict[str, Callable[[list[int]], list[int]]],
    requests: list[Request],
    timed: Callable[[Callable[[list[int]], list[int]], list[int]], tuple[list[int], float]],
) -> list[dict]:
    """Every method on every prompt (after one untimed warm-up each), the order rotated per prompt:
    each row holds every method's seconds and tokens and, per pair, whether the outputs agree."""
    methods = tuple(fns)
    for name in methods:  # untimed warm-up: allocator, kernels, lazy init
        timed(fns[name], requests[0].prompt_ids)
    per_prompt = []
    for i, req in enumerate(requests):
        k = i % len(methods)
        order = methods[k:] + methods[:k]
        row: dict = {"prompt_tokens": len(req.prompt_ids)}
        toks = {}
        for name in order:
            toks[name], row[f"{name}_s"] = timed(fns[name], req.prompt_ids)
            row[f"{name}_tokens"] = len(toks[name])
        for a, b in pairs_of(methods):
            row[f"{a}=={b}"] = toks[a] == toks[b]
            row[f"{a}~{b}_common_prefix"] = common_prefix(toks[a], toks[b])
        per_prompt.append(row)
        print(
            f"  prompt {i + 1}/{len(requests)}: " + ", ".join(f"{m} {row[f'{m}_s']:.2f}s" for m in methods),
            flush=True,
        )
    return per_prompt


def pairs_of(methods: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    return tuple((a, b) for a, b in PAIRS if a in methods and b in methods)


def summarize(per_prompt: list[dict], seed: int, title: str, methods: tuple[str, ...] = METHODS) -> dict:
    """Tokens/s per method, the pairs' ratios with bootstrap intervals and per-prompt medians, and
    how many outputs agree (printed; the JSON's summary keys)."""
    pairs = pairs_of(methods)
    tps = {
        m: sum(r[f"{m}_tokens"] for r in per_prompt) / sum(r[f"{m}_s"] for r in per_prompt) for m in methods
    }
    identical = {f"{a}=={b}": sum(r[f"{a}=={b}"] for r in per_prompt) for a, b in pairs}
    ratio = tps["ours_spec"] / tps["hf_assisted"]
    _common.print_table(title, ["", *methods], [("tokens/s", *(tps[m] for m in methods))])
    intervals = {f"{a}/{b}": ratio_interval(per_prompt, a, b, seed) for a, b in pairs}
    medians = {f"{a}/{b}": statistics.median(r[f"{b}_s"] / r[f"{a}_s"] for r in per_prompt) for a, b in pairs}
    _common.print_table(
        "ratios of tokens/s (95% interval: bootstrap over prompts; the median of per-prompt "
        "ratios resists one disturbed prompt)",
        ["ratio", "value", "95% CI", "per-prompt median"],
        [(k, v[0], f"{v[1]:.2f}-{v[2]:.2f}", medians[k]) for k, v in intervals.items()],
    )
    compiled = (
        f"; compiled / eager: spec {tps['ours_spec'] / tps['ours_spec_eager']:.2f}x, "
        f"AR {tps['ours_ar'] / tps['ours_ar_eager']:.2f}x"
        if "ours_spec_eager" in tps
        else " (eager engine)"
    )
    print(
        f"ours spec / HF assisted: {ratio:.2f}x, per-prompt median {medians['ours_spec/hf_assisted']:.2f}x "
        f"(goal >= 2x){compiled}"
    )
    print(
        "identical greedy outputs: " + ", ".join(f"{k} {v}/{len(per_prompt)}" for k, v in identical.items())
    )
    return {
        "tokens_per_second": tps,
        "ours_spec_over_hf_assisted": ratio,
        "ratio_intervals": {
            k: {"ratio": v[0], "ci95": [v[1], v[2]], "per_prompt_median": medians[k]}
            for k, v in intervals.items()
        },
        "identical_outputs": identical,
    }


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def generators(args, eager: ModelPair, pair: ModelPair, target, draft) -> dict[str, Callable]:
    """The methods ``--engine`` runs, each a function from prompt ids to generated ids."""
    n_new = args.max_new_tokens
    every = {
        "ours_spec": ours(pair, args.gamma, n_new, args.seed),
        "ours_ar": ours(pair, 0, n_new, args.seed),
        "ours_spec_eager": ours(eager, args.gamma, n_new, args.seed),
        "ours_ar_eager": ours(eager, 0, n_new, args.seed),
        "hf_assisted": hf(target, draft, n_new),
        "hf_plain": hf(target, None, n_new),
    }
    return {m: every[m] for m in methods_of(args.engine)}


def timer(device) -> Callable[[Callable[[list[int]], list[int]], list[int]], tuple[list[int], float]]:
    """Times one generation end to end (the device synchronised on both sides)."""

    def timed(fn: Callable[[list[int]], list[int]], ids: list[int]) -> tuple[list[int], float]:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            toks = fn(ids)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return toks, time.perf_counter() - t0

    return timed


def main() -> None:
    p = _common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--gamma", type=int, default=4, help="draft tokens per step on both sides (default 4)")
    p.add_argument(
        "--engine",
        choices=("both", "eager"),
        default="both",
        help="our engine compiled and eager (default), or eager only (nothing compiled: the quick run)",
    )
    args = p.parse_args()
    if args.gamma < 1:
        _common.fail("--gamma must be >= 1")
    bench = _common.start(NAME, args)
    eager, requests = _common.load(bench)
    pair = _common.compiled_twin(eager) if args.engine == "both" else eager
    if args.engine == "both":
        print(f"compiled decode/verify of target and draft in {pair.compile_s:.1f} s (excluded from timings)")
    device = pair.target.lm_head.weight.device
    target, draft = load_hf(args.target, args.dtype, device), load_hf(args.draft, args.dtype, device)
    as_assistant(draft, args.gamma)
    fns = generators(args, eager, pair, target, draft)
    per_prompt = measure_prompts(fns, requests, timer(device))
    summary = summarize(
        per_prompt,
        args.seed,
        f"B=1, gamma {args.gamma}, {len(requests)} prompts x {args.max_new_tokens} new tokens, greedy, "
        f"{args.dtype} on {bench.device}, {torch.get_num_threads()} torch threads"
        + ("" if args.engine == "both" else ", our engine eager"),
        tuple(fns),
    )
    tps = summary["tokens_per_second"]
    import transformers

    _common.write_json(
        bench,
        {
            "gamma": args.gamma,
            **summary,
            "engine": args.engine,
            "compile_s": pair.compile_s if args.engine == "both" else None,
            "ours_ar_over_hf_plain": tps["ours_ar"] / tps["hf_plain"],
            "num_prompts": len(requests),
            "transformers": transformers.__version__,
            "hf_class": type(target).__name__,
            "hf_attn_implementation": target.config._attn_implementation,
            "per_prompt": per_prompt,
        },
    )


if __name__ == "__main__":
    main()
