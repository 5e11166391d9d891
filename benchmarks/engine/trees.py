"""Token trees vs chains vs autoregressive decoding on the demo pair (held-out prompts).

For each batch size B (closed loop: concurrency = max_batch_size = B) and mode (greedy,
temperature 1), every configuration runs the same requests through ``autotune.workload.runner.run_load``:
AR (gamma 0), chains (draft model, gamma in ``--gammas``) and trees (``--trees``: top-k per
depth, depth = gamma; greedy rows take the draft's top-k children, sampled rows k i.i.d. draft
samples, and at T=1 each tree also runs with top-k children, labelled "topk"), dynamic
(EAGLE-2) trees (``--dynamic``: "KxD/N", each row's own tree: the best N of the draft's
top-K expansion to depth D, by path score; top-k children at every temperature) and the hybrid
drafter (n-gram when the prompt lookup matches, else the draft model; ``--hybrid-gammas``). All
configurations are interleaved in one invocation: ``--repeats`` rounds, each round running every
(B, mode, configuration) once in a rotated order, so slow phases of a shared host hit every
configuration alike. Reported per configuration (medians over rounds):

    mean accepted length   tokens per row per verify step (1 + accepted drafts)
    verify ms              one target pass over B x (nodes + 1) tokens
    draft ms / step        draft forwards per step x one draft forward
    tokens/s               generated tokens / wall time of the run
    x AR                   median over rounds of tokens/s / the same round's AR tokens/s

then, per (B, mode), the best chain, tree and hybrid by median x AR, and the tree / chain ratio
(median over rounds of the same round's tokens/s ratio). Last, the least-disturbed cost of each
configuration's forwards (min over ``--cost-repeats`` timings of one verify forward and of one
step's draft forwards, on a random context) and the throughput they imply with the measured
mean accepted length, B x E / (draft + verify): a noise-robust view that leaves out the engine's
own per-step work. Last, per batch size, where trees pay against the profiler's label: the
label from this run's least-disturbed T_verify(B, 9) / T_verify(B, 1) by the profiler's rule
(``autotune.device.classify.label``), whether the best tree or dynamic tree beat the best chain
(greedy, paired: in every round, in none, or within noise), and whether the label said so
(memory-bound: trees pay; otherwise not).
Ratios come from runs of one invocation on one (noisy, shared) host; read them as such.
``--engine compiled`` (the default, what ``autotune tune`` runs) puts chains and trees alike
through the compiled forward, warmed before any timing.

``--drafter eagle3`` drafts the chains and trees with the EAGLE-3 head (``--eagle3``, default the
demo head) instead of the draft model (the least-disturbed cost table then is not measured).

Example:
    python -m benchmarks.engine.trees                                  # ~10 min on 2 cores
    python -m benchmarks.engine.trees --num-prompts 4 --max-new-tokens 32 --repeats 1 --trees "2,2,1;3,1,1"
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

import torch

from autotune.device import classify
from autotune.workload.runner import LoadSpec, run_load
from benchmarks import _common
from engine.demo import DEMO_EAGLE3
from engine.errors import EngineInputError
from engine.speculative import SpecConfig
from engine.tree import DynamicTree, TreeShape

NAME = "trees"
TEMPERATURE = {"greedy": 0.0, "t1": 1.0}
DEFAULT_TREES = "2,1,1,1;2,2,1,1;2,1,1,1,1;2,2,1,1,1;3,2,1,1,1"
DEFAULT_DYNAMIC = "2x5/7;2x6/8;2x7/10;3x6/10"
LABEL_GAMMA = 8  # the profiler's default profile.gamma_max: its label compares verifying 9 tokens with 1
Cell = tuple[int, str, str]  # (batch size, mode, configuration label)
Configs = dict[str, list[tuple[str, str, SpecConfig, str]]]  # mode -> what configs() gives
HEADERS = [
    "B",
    "mode",
    "config",
    "nodes",
    "mean accepted length",
    "verify ms",
    "draft ms/step",
    "tokens/s",
    "x AR",
    "greedy_match",
]
SUMMARY_HEADERS = [
    "B",
    "mode",
    "AR tok/s",
    "best chain",
    "chain tok/s",
    "best tree",
    "tree tok/s",
    "tree / chain (paired)",
    "best dynamic",
    "dynamic / chain (paired)",
    "chain x AR",
    "tree x AR",
    "dynamic x AR",
    "hybrid x AR",
]


def tree_list(text: str) -> list[tuple[int, ...]]:
    """``"2,2,1;3,1"`` -> ``[(2, 2, 1), (3, 1)]`` (an argparse type)."""
    return [tuple(_common.int_list(part)) for part in text.split(";") if part.strip()]


def dynamic_list(text: str) -> list[DynamicTree]:
    """``"2x6/8;3x5/10"`` -> the dynamic tree specs (an argparse type)."""
    try:
        return [DynamicTree.parse(part) for part in text.split(";") if part.strip()]
    except EngineInputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def configs(
    gammas: list[int],
    trees: list[tuple[int, ...]],
    hybrid_gammas: list[int],
    mode: str,
    dynamic: list[DynamicTree] = (),
    drafter: str = "model",
) -> list[tuple[str, str, SpecConfig, str]]:
    """(label, kind, config, drafter) for AR, every chain, every tree and every dynamic tree of
    ``drafter`` (the draft model or the EAGLE-3 head) and the hybrid drafter; at T=1 each static
    tree twice: i.i.d. sampled children (the default) and top-k children ("topk")."""
    out = [("AR", "ar", SpecConfig(gamma=0), "none")]
    out += [(f"chain g={g}", "chain", SpecConfig(gamma=g), drafter) for g in gammas]
    for shape in trees:
        name = f"tree {'-'.join(map(str, shape))}"
        out.append((name, "tree", SpecConfig(gamma=len(shape), tree_topk=shape), drafter))
        if mode != "greedy":
            out.append(
                (
                    f"{name} topk",
                    "tree",
                    SpecConfig(gamma=len(shape), tree_topk=shape, tree_sampling="topk"),
                    drafter,
                )
            )
    out += [(f"dynamic {t.name}", "dynamic", SpecConfig.for_tree(t), drafter) for t in dynamic]
    out += [(f"hybrid g={g}", "hybrid", SpecConfig(gamma=g), "hybrid") for g in hybrid_gammas]
    return out


def _min_ms(fn, repeats: int) -> float:
    """Least of ``repeats`` wall times of ``fn`` in ms (on a GPU: waiting for its kernels each time)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    best = float("inf")
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return 1e3 * best


def min_costs(pair, spec: SpecConfig, batch: int, context: int, repeats: int) -> tuple[int, float, float]:
    """(verify width, min-of-k ms of one target verify forward, min-of-k ms of one step's draft forwards).

    The forwards the engine runs for ``spec`` at batch ``batch`` after a ``context``-token prefix:
    a chain verifies 1 + gamma tokens causally and drafts one token per forward; a tree verifies
    1 + nodes tokens under the tree mask and drafts each depth's nodes in one forward (a dynamic
    tree: one token, then top-k tokens per later depth; the cost of a width does not depend on the
    mask's pattern, so a one-level tree of that width stands in for it). The minimum
    over ``repeats`` is the least disturbed timing a shared host gives.
    """
    target, draft = pair.target, pair.draft
    dev = target.lm_head.weight.device
    gen = torch.Generator().manual_seed(0)
    vocab = target.config.vocab_size
    zero = torch.zeros(batch, dtype=torch.long, device=dev)
    base = torch.full((batch,), context, dtype=torch.long, device=dev)
    shape = spec.tree
    width = 1 + (shape.n_nodes if shape is not None else spec.gamma)
    kv = context + width + 2
    caches = []
    with torch.inference_mode():
        for model in (target, draft):
            cache = model.new_cache(batch, kv)
            model(
                torch.randint(1, vocab, (batch, context), generator=gen).to(dev),
                cache=cache,
                start=zero,
                kv_len=context,
            )
            caches.append(cache)
        x = torch.randint(1, vocab, (batch, width), generator=gen).to(dev)
        if shape is None:
            verify = _min_ms(lambda: target.decode(x, caches[0], base, kv), repeats)
            one = _min_ms(lambda: draft.decode(x[:, :1], caches[1], base, kv), repeats) if spec.gamma else 0.0
            return width, verify, one * spec.gamma
        if isinstance(shape, DynamicTree):
            return width, *_dynamic_tree_costs(pair, shape, x, caches, base, kv, repeats)
        return width, *_tree_costs(pair, shape, x, caches, base, kv, repeats)


def _dynamic_tree_costs(
    pair, shape: DynamicTree, x, caches, base, kv: int, repeats: int
) -> tuple[float, float]:
    """:func:`min_costs` of a dynamic tree: its verify as a one-level tree of its width, its draft
    as one token, then ``topk`` tokens per later depth."""
    target, draft, dev = pair.target, pair.draft, x.device
    width = x.shape[1]
    flat = TreeShape((width - 1,)).tensors(dev)
    verify = _min_ms(
        lambda: target.decode(x, caches[0], base, kv, flat.attention(base, 0, width, kv)), repeats
    )
    level = TreeShape((shape.topk,)).tensors(dev)
    drafting = _min_ms(lambda: draft.decode(x[:, :1], caches[1], base, kv), repeats)
    drafting += (shape.depth - 1) * _min_ms(
        lambda: draft.decode(
            x[:, 1 : 1 + shape.topk],
            caches[1],
            base + 1,
            kv,
            level.attention(base, 1, shape.topk, kv),
        ),
        repeats,
    )
    return verify, drafting


def _tree_costs(pair, shape: TreeShape, x, caches, base, kv: int, repeats: int) -> tuple[float, float]:
    """:func:`min_costs` of a static tree: its verify under the tree mask, its draft one forward
    per depth over that depth's parents."""
    target, draft, width = pair.target, pair.draft, x.shape[1]
    tree = shape.tensors(x.device)
    verify = _min_ms(
        lambda: target.decode(x, caches[0], base, kv, tree.attention(base, 0, width, kv)), repeats
    )
    drafting = 0.0
    for d in range(shape.depth):
        first, n = shape.level_offsets[d], (1 if d == 0 else shape.level_sizes[d - 1])
        drafting += _min_ms(
            lambda first=first, n=n: draft.decode(
                x[:, first : first + n], caches[1], base + first, kv, tree.attention(base, first, n, kv)
            ),
            repeats,
        )
    return verify, drafting


def main() -> None:
    args, modes = arguments()
    cfgs = configurations(args, modes)
    bench = _common.start(NAME, args)
    pair, requests = load_pair(bench, args)
    runs, outputs = measure(pair, requests, args, modes, cfgs)
    cells = tabulate_cells(args, modes, cfgs, runs, outputs, bench.device, len(requests))
    summary = summarize(args, modes, cells)
    # Least-disturbed step costs (min of --cost-repeats) and the throughput they imply with each
    # configuration's measured mean accepted length: B x E / (draft + verify), no engine overhead.
    context = max(len(r.prompt_ids) for r in requests) + args.max_new_tokens // 2
    costs = modelled_costs(pair, args, modes, cfgs, cells, context)
    pays = where_trees_pay(pair, args.batch_sizes, summary, context, args.cost_repeats)
    print_where_trees_pay(pays, args.cost_repeats)
    _common.write_json(
        bench, {"cells": cells, "summary": summary, "min_costs": costs, "where_trees_pay": pays}
    )


def arguments() -> tuple[argparse.Namespace, list[str]]:
    """The flags, and the modes asked for (``--modes``); bad values are one line and exit 2."""
    p = _common.parser(__doc__.split("\n\n")[0], num_prompts=8, max_new_tokens=48)
    p.add_argument("--batch-sizes", type=_common.int_list, default=[1, 4], help="default 1,4")
    p.add_argument(
        "--gammas", type=_common.int_list, default=[2, 3, 4, 5, 6], help="chain gammas (default 2..6)"
    )
    p.add_argument(
        "--trees",
        type=tree_list,
        default=tree_list(DEFAULT_TREES),
        help=f'tree shapes, top-k per depth, ";"-separated (default "{DEFAULT_TREES}")',
    )
    p.add_argument(
        "--dynamic",
        type=dynamic_list,
        default=dynamic_list(DEFAULT_DYNAMIC),
        help=f'dynamic (EAGLE-2) trees "KxD/N", ";"-separated, "" for none (default "{DEFAULT_DYNAMIC}")',
    )
    p.add_argument(
        "--hybrid-gammas", type=_common.int_list, default=[4], help="hybrid drafter gammas (default 4)"
    )
    p.add_argument(
        "--drafter",
        choices=("model", "eagle3"),
        default="model",
        help="who drafts the chains and trees: the draft model or the --eagle3 head (default model)",
    )
    p.add_argument("--eagle3", type=Path, default=DEMO_EAGLE3, help="EAGLE-3 head folder (default: demo)")
    p.add_argument("--modes", default="greedy,t1", help="greedy and/or t1 (default both)")
    p.add_argument("--repeats", type=int, default=2, help="interleaved rounds (default 2)")
    p.add_argument(
        "--cost-repeats", type=int, default=15, help="timings per forward for the min-of-k costs (default 15)"
    )
    p.add_argument(
        "--engine",
        choices=("compiled", "eager"),
        default="compiled",
        help="decode, draft and verify (chains and trees alike) through torch.compile, as autotune tune "
        "runs them by default, or eager (default compiled)",
    )
    args = p.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in TEMPERATURE for m in modes) or args.repeats < 1 or 0 in args.batch_sizes:
        _common.fail("--modes takes greedy and/or t1; --repeats and --batch-sizes must be >= 1")
    return args, modes


def configurations(args: argparse.Namespace, modes: list[str]) -> Configs:
    """Every mode's configurations (:func:`configs`); a bad tree is one line and exit 2."""
    try:
        return {
            mode: configs(args.gammas, args.trees, args.hybrid_gammas, mode, args.dynamic, args.drafter)
            for mode in modes
        }
    except EngineInputError as exc:
        _common.fail(str(exc))


def load_pair(bench: _common.Bench, args: argparse.Namespace) -> tuple:
    """The pair (with the ``--eagle3`` head where it drafts) and the held-out requests; with
    ``--engine compiled`` the pair's compiled twin, its compile time printed (and left out of
    every timing)."""
    pair, requests = _common.load(bench, eagle3=args.eagle3 if args.drafter == "eagle3" else None)
    if args.engine == "compiled":
        pair = _common.compiled_twin(pair, trees=args.trees + [(t.topk,) * t.depth for t in args.dynamic])
        print(
            f"compiled decode/verify (chains and trees) of target and draft in {pair.compile_s:.1f} s "
            "(excluded from every timing)",
            flush=True,
        )
    return pair, requests


def measure(
    pair, requests: list, args: argparse.Namespace, modes: list[str], cfgs: Configs
) -> tuple[dict[Cell, list[dict]], dict[Cell, list[list[int]]]]:
    """Every (B, mode, configuration) once per round, ``--repeats`` rounds, the configurations'
    order rotated each round; per cell its rounds' metrics and its last round's output tokens."""
    runs: dict[Cell, list[dict]] = {}
    outputs: dict[Cell, list[list[int]]] = {}
    for rep in range(args.repeats):
        for b in args.batch_sizes:
            load = LoadSpec(max_batch_size=b, concurrency=b, num_requests=len(requests))
            for mode in modes:
                reqs = [dataclasses.replace(r, temperature=TEMPERATURE[mode]) for r in requests]
                shift = rep % len(cfgs[mode])
                for label, _kind, spec, drafter in (
                    cfgs[mode][shift:] + cfgs[mode][:shift]
                ):  # rotated each round
                    run = run_load(pair, reqs, spec, drafter, load, args.seed)
                    m = run.metrics
                    runs.setdefault((b, mode, label), []).append(round_record(rep, m))
                    outputs[(b, mode, label)] = _common.outputs(run)
                    print(
                        f"  round {rep} B={b} {mode} {label}: {m['tokens_per_second']:.1f} tok/s, "
                        f"accepted length {m['mean_acceptance_length'] or 1:.2f}",
                        flush=True,
                    )
    return runs, outputs


def round_record(rep: int, m: dict) -> dict:
    """What the JSON keeps of one round of one cell (``m``: the run's metrics)."""
    draft_step = (m["draft_forward_ms"] or 0.0) * (m["draft_forwards_per_step"] or 0.0)
    return {
        "round": rep,
        "tokens_per_second": m["tokens_per_second"],
        "wall_s": m["wall_s"],
        "mean_acceptance_length": m["mean_acceptance_length"],
        "verify_step_ms": m["verify_step_ms"],
        "draft_ms_per_step": draft_step,
        "acceptance_rate": m["acceptance_rate"],
        "verify_tokens_per_row": m["verify_tokens_per_row"],
        "generated_tokens": m["generated_tokens"],
    }


def _med(rs: list[dict], key: str) -> float | None:
    values = [r[key] for r in rs if r[key] is not None]
    return statistics.median(values) if values else None


def tabulate_cells(
    args: argparse.Namespace,
    modes: list[str],
    cfgs: Configs,
    runs: dict[Cell, list[dict]],
    outputs: dict[Cell, list[list[int]]],
    device: str,
    n_requests: int,
) -> list[dict]:
    """One cell per (B, mode, configuration): medians over rounds, x AR (median of same-round
    ratios) and, greedy, whether its tokens equal AR's; printed as the first table."""
    cells, rows = [], []
    for b in args.batch_sizes:
        for mode in modes:
            ar = runs[(b, mode, "AR")]
            for label, kind, spec, _ in cfgs[mode]:
                rs = runs[(b, mode, label)]
                x_ar = statistics.median(
                    r["tokens_per_second"] / a["tokens_per_second"] for r, a in zip(rs, ar, strict=True)
                )
                match = outputs[(b, mode, label)] == outputs[(b, mode, "AR")] if mode == "greedy" else None
                cell = {
                    "batch_size": b,
                    "mode": mode,
                    "config": label,
                    "kind": kind,
                    "gamma": spec.gamma,
                    "tree_topk": list(spec.tree_topk),
                    "tree_nodes": spec.tree_nodes,
                    "nodes": spec.tree.n_nodes if spec.tree is not None else spec.gamma,
                    "mean_acceptance_length": _med(rs, "mean_acceptance_length") or 1.0,
                    "verify_step_ms": _med(rs, "verify_step_ms"),
                    "draft_ms_per_step": _med(rs, "draft_ms_per_step"),
                    "tokens_per_second": _med(rs, "tokens_per_second"),
                    "x_ar": x_ar,
                    "greedy_match": match,
                    "runs": rs,
                }
                cells.append(cell)
                rows.append(
                    (
                        b,
                        mode,
                        label,
                        cell["nodes"],
                        cell["mean_acceptance_length"],
                        cell["verify_step_ms"],
                        cell["draft_ms_per_step"],
                        cell["tokens_per_second"],
                        x_ar,
                        "-" if match is None else match,
                    )
                )
    _common.print_table(
        f"trees vs chains vs AR on {device} ({n_requests} held-out prompts, "
        f"{args.max_new_tokens} new tokens, medians of {args.repeats} interleaved rounds)",
        HEADERS,
        rows,
    )
    return cells


def summarize(args: argparse.Namespace, modes: list[str], cells: list[dict]) -> list[dict]:
    """Per (B, mode) with a chain and a tree: the best chain, tree, dynamic tree and hybrid by
    median x AR, and the trees' paired ratios over the best chain; printed as the second table."""
    summary, srows = [], []
    for b in args.batch_sizes:
        for mode in modes:
            s = best_of(b, mode, [c for c in cells if c["batch_size"] == b and c["mode"] == mode])
            if s is None:
                continue
            summary.append(s)
            srows.append(
                tuple(
                    "-" if v is None else v
                    for v in (
                        b,
                        mode,
                        s["ar_tokens_per_second"],
                        s["best_chain"],
                        s["chain_tokens_per_second"],
                        s["best_tree"],
                        s["tree_tokens_per_second"],
                        s["tree_over_chain_paired"],
                        s["best_dynamic"],
                        s["dynamic_over_chain_paired"],
                        s["chain_x_ar"],
                        s["tree_x_ar"],
                        s["dynamic_x_ar"],
                        s["hybrid_x_ar"],
                    )
                )
            )
    _common.print_table(
        "best tree vs best chain (by median x AR; ratios are medians over rounds of same-round "
        "ratios, one invocation on a shared host)",
        SUMMARY_HEADERS,
        srows,
    )
    return summary


def _over_chain_rounds(cell: dict | None, ch: dict) -> list[float] | None:
    """Same-round tokens/s ratios of ``cell`` to the best chain ``ch`` (None without a cell)."""
    return (
        [
            t["tokens_per_second"] / c["tokens_per_second"]
            for t, c in zip(cell["runs"], ch["runs"], strict=True)
        ]
        if cell
        else None
    )


def best_of(b: int, mode: str, mine: list[dict]) -> dict | None:
    """The summary of one (B, mode)'s cells ``mine``; None without a chain or without any tree."""
    ar = next(c for c in mine if c["kind"] == "ar")
    best = {
        k: max((c for c in mine if c["kind"] == k), key=lambda c: c["x_ar"], default=None)
        for k in ("chain", "tree", "dynamic", "hybrid")
    }
    ch, tr, dy, hy = best["chain"], best["tree"], best["dynamic"], best["hybrid"]
    if ch is None or (tr is None and dy is None):
        return None

    def rounds(cell: dict | None) -> list[float] | None:
        return _over_chain_rounds(cell, ch)

    def paired(cell: dict | None) -> float | None:
        return statistics.median(rounds(cell)) if cell else None

    return {
        "batch_size": b,
        "mode": mode,
        "ar_tokens_per_second": ar["tokens_per_second"],
        "best_chain": ch["config"],
        "chain_tokens_per_second": ch["tokens_per_second"],
        "best_tree": tr["config"] if tr else None,
        "tree_tokens_per_second": tr["tokens_per_second"] if tr else None,
        "chain_x_ar": ch["x_ar"],
        "tree_x_ar": tr["x_ar"] if tr else None,
        "tree_over_chain_paired": paired(tr),
        "tree_over_chain_rounds": rounds(tr),
        "best_dynamic": dy["config"] if dy else None,
        "dynamic_tokens_per_second": dy["tokens_per_second"] if dy else None,
        "dynamic_x_ar": dy["x_ar"] if dy else None,
        "dynamic_over_chain_paired": paired(dy),
        "dynamic_over_chain_rounds": rounds(dy),
        "best_hybrid": hy["config"] if hy else None,
        "hybrid_x_ar": hy["x_ar"] if hy else None,
    }


def modelled_costs(
    pair, args: argparse.Namespace, modes: list[str], cfgs: Configs, cells: list[dict], context: int
) -> list[dict]:
    """Per B and configuration (hybrid aside; the draft model's only), the least-disturbed verify and
    draft costs (:func:`min_costs`) and the tokens/s they imply with each mode's measured mean
    accepted length, over the best chain's; printed as the third table."""
    costs = []
    for b in args.batch_sizes if args.drafter == "model" else ():  # min_costs times the draft model
        for label, kind, spec, _ in cfgs[modes[0]]:
            if kind == "hybrid":
                continue
            width, verify, drafting = min_costs(pair, spec, b, context, args.cost_repeats)
            row = {
                "batch_size": b,
                "config": label,
                "verify_width": width,
                "verify_ms_min": verify,
                "draft_ms_per_step_min": drafting,
            }
            for mode in modes:
                cell = next(
                    c for c in cells if c["batch_size"] == b and c["mode"] == mode and c["config"] == label
                )
                row[f"modelled_tokens_per_second_{mode}"] = (
                    1e3 * b * cell["mean_acceptance_length"] / (verify + drafting)
                )
            costs.append(row)
    for b in args.batch_sizes:
        mine = [c for c in costs if c["batch_size"] == b]
        for mode in modes:
            key = f"modelled_tokens_per_second_{mode}"
            chains = [c[key] for c in mine if c["config"].startswith("chain")]
            for c in mine:
                c[f"modelled_x_best_chain_{mode}"] = c[key] / max(chains) if chains else None
    print_costs(costs, args, modes, context)
    return costs


def print_costs(costs: list[dict], args: argparse.Namespace, modes: list[str], context: int) -> None:
    """The third table: :func:`modelled_costs`' rows, by B (a note where the head drafts)."""
    crows = []
    for b in args.batch_sizes:
        for c in [c for c in costs if c["batch_size"] == b]:
            crows.append(
                (
                    b,
                    c["config"],
                    c["verify_width"],
                    c["verify_ms_min"],
                    c["draft_ms_per_step_min"],
                    *(
                        x
                        for m in modes
                        for x in (c[f"modelled_tokens_per_second_{m}"], c[f"modelled_x_best_chain_{m}"])
                    ),
                )
            )
    if args.drafter != "model":
        print(
            "least-disturbed step costs: not measured with the EAGLE-3 head (min_costs times the draft model)"
        )
    _common.print_table(
        f"least-disturbed step costs (min of {args.cost_repeats}, context {context} tokens) and the "
        "throughput they imply with the measured mean accepted length",
        [
            "B",
            "config",
            "verify width",
            "verify ms (min)",
            "draft ms/step (min)",
            *(h for m in modes for h in (f"modelled tok/s {m}", f"x best chain {m}")),
        ],
        crows,
    )


def print_where_trees_pay(pays: list[dict], cost_repeats: int) -> None:
    """The last table: per B, the label, whether trees paid, whether the label said so."""
    _common.print_table(
        f"where trees pay vs the profiler's label (verify cost = T_verify(B, {LABEL_GAMMA}+1) / "
        f"T_verify(B, 1), min of {cost_repeats}; autotune.device.classify.label)",
        [
            "B",
            "verify cost",
            "label",
            "best tree or dynamic / best chain (greedy, paired median)",
            "trees pay",
            "label agrees",
        ],
        [
            (
                r["batch_size"],
                r["verify_cost"],
                r["label"],
                r["best_tree_over_chain"],
                r["trees_pay"],
                r["label_agrees"],
            )
            for r in pays
        ],
    )


def where_trees_pay(
    pair, batch_sizes: list[int], summary: list[dict], context: int, repeats: int
) -> list[dict]:
    """Per batch size: the profiler's label from this run's least-disturbed verify costs (the
    profiler's rule: ``autotune.device.classify.label`` at gamma :data:`LABEL_GAMMA`), whether the best tree
    (static or dynamic) beat the best chain (greedy: "yes" when the paired ratio is above 1 in every
    round, "no" when below in every round, else "within noise"), and whether the label predicted
    it: trees pay where verifying more tokens is nearly free (memory-bound), not elsewhere."""
    out = []
    for b in batch_sizes:
        one = min_costs(pair, SpecConfig(gamma=0), b, context, repeats)[1]
        wide = min_costs(pair, SpecConfig(gamma=LABEL_GAMMA), b, context, repeats)[1]
        cost = wide / one
        label = classify.label(cost, LABEL_GAMMA)
        s = next((x for x in summary if x["batch_size"] == b and x["mode"] == "greedy"), None)
        both = (
            []
            if s is None
            else [s[f"{k}_over_chain_rounds"] for k in ("tree", "dynamic") if s[f"{k}_over_chain_rounds"]]
        )
        best = max(both, key=statistics.median, default=None)  # the better of the best tree and best dynamic
        if best is None:
            pay = None
        else:  # every round beyond 1, every round below, or the rounds straddle 1: noise decides nothing
            pay = "yes" if min(best) > 1.0 else "no" if max(best) < 1.0 else "within noise"
        agrees = None if pay in (None, "within noise") else (pay == "yes") == (label == "memory-bound")
        out.append(
            {
                "batch_size": b,
                "verify_cost": cost,
                "label": label,
                "best_tree_over_chain": statistics.median(best) if best else None,
                "best_tree_over_chain_rounds": best,
                "trees_pay": pay,
                "label_agrees": agrees,
            }
        )
    return out


if __name__ == "__main__":
    main()
