"""Inside vLLM: the stack cost fit predicts every (load level, K) from a few servers; the planner vs a grid.

One run: a fresh vLLM server for no speculation and for each constant K of ``--grid`` (default
1..8, the draft model), every load level of ``--config``'s workload ``--repeats`` times (the
schedule benchmarks' :class:`_schedule.Plan`; every round's per-level metrics are kept, the
per-position acceptance from vLLM's counters among them). Or ``--from JSON``: the rows of an
earlier run of this script or of ``schedule_vllm.py``.

Then, with :mod:`autotune.cost.stackcost`:

1. **Predicted vs measured.** The fit from the calibration servers (``--calibrate``, default no
   speculation, the smallest and the largest K of the grid) predicts every other K at every level,
   printed as the ratio predicted / measured (median tokens/s over rounds), with the measurement's
   own round-to-round spread beside it, so a miss inside the noise reads as such.
2. **The planner against the exhaustive grid.** The in-stack study's planner
   (:func:`autotune.cost.stackcost.next_k`, as ``autotune tune --backend vllm`` runs it) is replayed on
   the grid's medians: start from ``--start``, fit, serve what :func:`~autotune.cost.stackcost.next_k`
   names, refit, until it names none. Reported: the server starts it took against the grid's, and
   per level the best measured tokens/s among the K it served against the grid's per-level best
   (goal: within 3% with at most a third of the starts).
3. **The planner on one round per server** (a grid of two rounds or more): as a study meets the
   host, each server measured once (``--draws`` seeded draws of a round per K), from no
   speculation and :func:`~autotune.cost.stackcost.first_ks`; with the study's second no-speculation
   round (the host's noise, :func:`~autotune.cost.stackcost.replicate_noise`) and without it (the rule
   before it). Reported: mean starts, the share within a third of the grid's, and the landing on
   the grid's per-level medians.

JSON: ``benchmarks/results/stack_cost_vllm/stack_cost_vllm.json`` (rows rewritten after each server). Usage::

    python -m benchmarks.stacks.stack_cost [--config tune.yaml] [--grid 1,2,3,4,5,6,7,8] [--repeats 1] \
[--calibrate 1,8] [--start 3,6] [--draws 300] [--from JSON] [--out JSON]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from autotune.cli.text import columns, fmt
from autotune.cost import stackcost
from autotune.records import LevelMetrics
from benchmarks._common import claim_dir, stamp
from benchmarks._schedule import Plan, grid_values, identity, write_json

ROOT = Path(__file__).resolve().parents[2]


def arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=ROOT / "tune.yaml")
    p.add_argument("--grid", default="1,2,3,4,5,6,7,8", help="constant K of the grid (draft model)")
    p.add_argument("--repeats", type=int, default=1, help="rounds per server, back to back")
    p.add_argument(
        "--calibrate",
        default=None,
        help="K of the calibration servers beside no speculation (default min, max of the grid)",
    )
    p.add_argument(
        "--start",
        default=None,
        help="K the planner starts from beside no speculation (default the grid's max)",
    )
    p.add_argument(
        "--from", dest="source", type=Path, default=None, help="analyse this run's rows, start nothing"
    )
    p.add_argument("--draws", type=int, default=300, help="seeded one-round replays (grids of 2+ rounds)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=claim_dir("stack_cost_vllm") / "stack_cost_vllm.json")
    return p.parse_args()


def row_k(row: dict) -> int | None:
    """The constant K of a Plan row (0 for no speculation), None for any other row."""
    if row.get("kind") == "off":
        return 0
    if row.get("kind") == "constant" and str(row.get("config", "")).startswith("grid K="):
        return int(row["config"].removeprefix("grid K="))
    return None


def observation(row: dict, k: int) -> stackcost.Observation:
    """A row's per-level medians over rounds (per-position acceptance: the first round's)."""
    per_level = {}
    for b, lv in row["per_level_rounds"].items():
        metrics = {}
        for key, values in lv.items():
            nums = [v for v in values if isinstance(v, (int, float))]
            metrics[key] = statistics.median(nums) if nums and len(nums) == len(values) else values[0]
        per_level[int(b)] = LevelMetrics.from_metrics(metrics)
    return stackcost.Observation(k, per_level)


def spread(row: dict, level: int) -> float:
    """Half the min-max range of a level's tokens/s over rounds, relative to the median (0 with one round)."""
    xs = row["per_level_rounds"][level]["tokens_per_second"]
    return (max(xs) - min(xs)) / 2 / statistics.median(xs) if len(xs) > 1 else 0.0


def round_observation(row: dict, k: int, i: int) -> stackcost.Observation:
    """A row's ``i``-th round alone, as one study trial measures it."""
    per_level = {
        int(b): LevelMetrics.from_metrics({key: values[i] for key, values in lv.items()})
        for b, lv in row["per_level_rounds"].items()
    }
    return stackcost.Observation(k, per_level)


def replay(
    obs: dict[int, stackcost.Observation],
    start: Sequence[int],
    ks: Sequence[int],
    extra: Sequence[stackcost.Observation] = (),
) -> dict:
    """The study's planner on measured observations: starts, fits, and per level the K it would pick.
    ``extra``: more runs for the fit (the study's second no-speculation round: its noise)."""
    served, steps = list(start), []
    while True:
        cost = stackcost.calibrate([obs[k] for k in served] + list(extra), "model")
        if cost is None:
            return {"served": served, "steps": steps, "error": "no fit from the start set"}
        k, best = stackcost.next_k(cost, ks, served)
        steps.append(
            {"fit": cost.fit, "measured_k": list(cost.measured_k), "predicted_best": best, "next": k}
        )
        if k is None or k not in obs:
            return {"served": served, "steps": steps, "cost": cost.to_json(), "unmeasured": k}
        served.append(k)


def resampled(rows: dict[int, dict], ks: Sequence[int], draws: int, seed: int, noise: bool) -> dict:
    """The planner as a study meets this grid: every server measured once (a round drawn at random
    per K, seeded), from no speculation and :func:`autotune.cost.stackcost.first_ks`; with ``noise``, no
    speculation's second round in its server (another of its rounds) gives the fit its noise, as
    ``autotune tune --backend vllm`` does; without, the rule before it. Landing is judged on the
    grid's per-level medians over all rounds."""
    rng = random.Random(seed)
    levels = sorted(int(b) for b in rows[0]["per_level_rounds"])
    n = {k: len(r["per_level_rounds"][levels[0]]["tokens_per_second"]) for k, r in rows.items()}
    median = {
        b: {k: statistics.median(r["per_level_rounds"][b]["tokens_per_second"]) for k, r in rows.items()}
        for b in levels
    }
    start = [0, *stackcost.first_ks(min(ks), max(ks))]
    starts, within, worst = [], [], []
    for _ in range(draws):
        pick = {k: rng.randrange(n[k]) for k in rows}
        obs = {k: round_observation(r, k, pick[k]) for k, r in rows.items()}
        again = [round_observation(rows[0], 0, rng.choice([i for i in range(n[0]) if i != pick[0]]))]
        served = replay(obs, start, ks, again if noise else ())["served"]
        ratios = [max(median[b][k] for k in served) / max(median[b].values()) for b in levels]
        starts.append(len(served))
        within.append(sum(x >= 0.97 for x in ratios) / len(ratios))
        worst.append(min(ratios))
    return {
        "rule": "margin + fit error (noise from the second no-speculation round)" if noise else "margin only",
        "start": start,
        "draws": draws,
        "mean_starts": statistics.mean(starts),
        "share_within_a_third": sum(x <= len(ks) / 3 for x in starts) / draws,
        "starts_histogram": {str(x): starts.count(x) for x in sorted(set(starts))},
        "levels_within_3pct": statistics.mean(within),
        "worst_level_mean": statistics.mean(worst),
    }


def load_result(args: argparse.Namespace, t0: float) -> dict:
    """The grid run to analyse: ``--from`` a stored JSON (its level keys made ints again) or measured now."""
    if args.source is None:
        return measure(args, t0)
    result = json.loads(args.source.read_text())
    result["analysed_from"] = str(args.source)
    for row in result["rows"]:
        if "per_level_rounds" in row:
            row["per_level_rounds"] = {int(b): v for b, v in row["per_level_rounds"].items()}
    return result


def print_costs(result: dict, cal: list[int], cost: stackcost.StackCost) -> None:
    """The calibration servers and the fitted per-level costs."""
    print(f"device: {result['device']}; vLLM {result.get('vllm_version')}; workload {result['config']}")
    print(
        f"calibration servers K={cal} ({cost.fit} fit); acceptance (counters of K={max(cal)}): "
        + " ".join(f"{p:.2f}" for p in cost.acceptance)
    )
    print()
    print("level costs (ms per row-step: decode + [K>0] fixed + K per_token; requests in flight):")
    print(
        columns(
            ["level", "decode", "fixed", "per token", "in flight"],
            [
                [
                    b,
                    fmt(1e3 * c.decode_s, 2),
                    fmt(1e3 * c.fixed_s, 2),
                    fmt(1e3 * c.per_token_s, 2),
                    fmt(c.in_flight, 1),
                ]
                for b, c in sorted(cost.levels.items())
            ],
        )
    )
    print()


def main() -> None:
    args = arguments()
    result = load_result(args, time.perf_counter())
    rows = {k: r for r in result["rows"] if "per_level_rounds" in r and (k := row_k(r)) is not None}
    obs = {k: observation(r, k) for k, r in rows.items()}
    spec = sorted(k for k in obs if k > 0)
    if 0 not in obs or len(spec) < 2:
        sys.exit("stack_cost: needs no speculation and two constant K measured")
    cal = grid_values(args.calibrate) if args.calibrate else [0, spec[0], spec[-1]]
    if 0 not in cal:
        cal = [0, *cal]
    missing = [k for k in cal if k not in obs]
    if missing:
        sys.exit(f"--calibrate: K {missing} not measured in this run")
    levels = sorted(obs[0].per_level)
    cost = stackcost.calibrate([obs[k] for k in cal], "model")
    assert cost is not None
    print_costs(result, cal, cost)
    pvm = predicted_vs_measured(obs, rows, cost, cal, levels)
    ks = sorted(obs)
    start = sorted({0, *grid_values(args.start)}) if args.start else [0, spec[-1]]
    if any(k not in obs for k in start):
        sys.exit(f"--start: K {[k for k in start if k not in obs]} not measured in this run")
    planner = plan_against_grid(obs, rows, start, levels)
    resamples = resample_report(args, rows, ks, levels)
    result["analysis"] = {
        "resampled": resamples,
        "calibration": cal,
        "start": start,
        "cost": cost.to_json(),
        "predicted_vs_measured": pvm,
        "planner": planner,
    }
    write_json(args.out, result)
    print(f"\nJSON: {args.out}")


def predicted_vs_measured(
    obs: dict[int, stackcost.Observation],
    rows: dict[int, dict],
    cost: stackcost.StackCost,
    cal: list[int],
    levels: list[int],
) -> list[dict]:
    """The fit's tokens/s against every measured (K, level), printed, with the held-out error."""
    pvm = []
    body = []
    for k in sorted(obs):
        cells = [f"K={k}" + (" (cal)" if k in cal else "")]
        for b in levels:
            measured = obs[k].per_level[b].tokens_per_second or 0.0
            pred = cost.tokens_per_second(b, k)
            pvm.append(
                {
                    "k": k,
                    "level": b,
                    "predicted": pred,
                    "measured": measured,
                    "ratio": pred / measured if measured else None,
                    "round_spread": spread(rows[k], b),
                    "calibration": k in cal,
                }
            )
            cells.append(f"{pred:.0f}/{measured:.0f} ({pred / measured:.2f})" if measured else "-")
        body.append(cells)
    print("predicted / measured tokens/s (ratio) per load level:")
    print(columns(["K", *[f"c={b}" for b in levels]], body))
    held = [r for r in pvm if not r["calibration"] and r["ratio"]]
    if held:
        errs = sorted(abs(r["ratio"] - 1) for r in held)
        print(
            f"held-out (level, K): {len(held)}; |predicted/measured - 1| "
            f"median {statistics.median(errs):.1%}, "
            f"max {errs[-1]:.1%}; measured round spread median "
            f"{statistics.median(r['round_spread'] for r in held):.1%}"
        )
    print()
    return pvm


def plan_against_grid(
    obs: dict[int, stackcost.Observation], rows: dict[int, dict], start: list[int], levels: list[int]
) -> dict:
    """The planner replayed from ``start`` on the measured grid: its K per level against the grid's
    best, its server starts, and the two goals (printed; the JSON's ``analysis.planner``)."""
    ks = sorted(obs)
    plan = replay(obs, start, ks)
    grid_best = {b: max(ks, key=lambda k: obs[k].per_level[b].tokens_per_second or 0.0) for b in levels}
    served = plan["served"]
    picks, worst = [], 1.0
    for b in levels:
        pick = max(served, key=lambda k: obs[k].per_level[b].tokens_per_second or 0.0)
        best_tps = obs[grid_best[b]].per_level[b].tokens_per_second or 0.0
        got = obs[pick].per_level[b].tokens_per_second or 0.0
        ratio = got / best_tps if best_tps else 0.0
        worst = min(worst, ratio)
        picks.append(
            {
                "level": b,
                "grid_best_k": grid_best[b],
                "planner_k": pick,
                "ratio": ratio,
                "grid_round_spread": spread(rows[grid_best[b]], b),
            }
        )
    starts_ok = len(served) <= len(ks) / 3
    print_plan(plan, picks, len(ks), worst, starts_ok)
    return {
        **plan,
        "picks": picks,
        "starts": len(served),
        "grid_starts": len(ks),
        "worst_ratio": worst,
        "within_3pct": worst >= 0.97,
        "third_of_starts": starts_ok,
    }


def print_plan(plan: dict, picks: list[dict], grid_starts: int, worst: float, starts_ok: bool) -> None:
    """The planner's steps, its K per level against the grid's best, and the two goals."""
    served = plan["served"]
    print(f"planner: served K={served} ({len(served)} server starts; the grid: {grid_starts})")
    for s in plan["steps"]:
        print(
            f"  fit on K={s['measured_k']} ({s['fit']}): predicted best "
            + " ".join(f"{b}:{g}" for b, g in s["predicted_best"].items())
            + (
                f" -> serve K={s['next']}"
                if s["next"] is not None
                else " -> nothing predicted >3% faster beyond the fit's error: stop"
            )
        )
    print(
        columns(
            ["level", "grid best K", "planner's K", "x grid best", "grid round spread"],
            [
                [
                    p["level"],
                    p["grid_best_k"],
                    p["planner_k"],
                    fmt(p["ratio"], 3),
                    f"{p['grid_round_spread']:.1%}",
                ]
                for p in picks
            ],
        )
    )
    print(
        "goal: within 3% of the grid's per-level best at every level: "
        f"{'met' if worst >= 0.97 else 'NOT met'} "
        f"(worst {worst:.3f}); at most a third of the grid's starts: "
        f"{'met' if starts_ok else 'NOT met'} ({len(served)} of {grid_starts})"
    )


def resample_report(
    args: argparse.Namespace, rows: dict[int, dict], ks: list[int], levels: list[int]
) -> list:
    """The planner on one round per server, without and with the noise term (where rounds allow)."""
    resamples = []
    if min(len(r["per_level_rounds"][levels[0]]["tokens_per_second"]) for r in rows.values()) >= 2:
        resamples = [resampled(rows, ks, args.draws, args.seed, noise) for noise in (False, True)]
        print(f"\nthe planner on one round per server ({args.draws} seeded draws of the grid's rounds):")
        print(
            columns(
                ["rule", "starts (mean)", "<= a third", "levels within 3%", "worst level (mean)"],
                [
                    [
                        r["rule"],
                        fmt(r["mean_starts"], 2),
                        f"{r['share_within_a_third']:.0%}",
                        f"{r['levels_within_3pct']:.0%}",
                        fmt(r["worst_level_mean"], 3),
                    ]
                    for r in resamples
                ],
            )
        )
    return resamples


def measure(args: argparse.Namespace, t0: float) -> dict:
    """Run no speculation and every K of the grid in fresh vLLM servers (the rows of the JSON)."""
    from autotune.backends.vllm import VllmBackend
    from autotune.knobs import Knobs
    from benchmarks._transfer import open_stack

    ns = argparse.Namespace(config=args.config, engine_profile=None, stack_profile=None)
    cfg, ctx, backend, _, _ = open_stack(ns, "vllm", VllmBackend)
    batch = max(cfg.search.max_batch_size)
    levels = list(cfg.batch_sizes)
    result: dict = {
        **identity(ctx, args.config),
        **stamp(ctx.fingerprint["label"]),
        "vllm_version": None,
        "levels": levels,
        "max_num_seqs": batch,
        "repeats": args.repeats,
        "grid": grid_values(args.grid),
        "complete": False,
        "rows": [],
    }

    def checkpoint(rows: list[dict]) -> None:
        result.update(rows=rows, wall_s=time.perf_counter() - t0, vllm_version=backend.version)
        write_json(args.out, result)

    def command(k: int) -> list[str]:
        knobs = Knobs("model" if k else "none", k, max_batch_size=batch)
        return backend.command(knobs)

    plan = Plan(
        backend, batch, levels, args.repeats, cfg.budget.seed, cfg.workload.temperature == 0, checkpoint
    )
    try:
        plan.run("no speculation", command(0), "off")
        for k in grid_values(args.grid):
            plan.run(f"grid K={k}", command(k), "constant")
    finally:
        backend.close()
    result["complete"] = True
    checkpoint(plan.rows)
    return result


if __name__ == "__main__":
    main()
