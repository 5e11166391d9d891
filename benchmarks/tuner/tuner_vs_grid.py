"""The Optuna study against an exhaustive grid over the same space, and against popular defaults.

For the workload and search space of a tune.yaml (default: the bundled one on the demo pair):

1. grid: every (gamma, confidence_threshold, gamma_schedule) of the space, gamma over the full
   configured range, thresholds at {low, middle, high}, each evaluated exactly like a trial
   (autotune.backends.engine.EngineBackend.run: every load level of the workload);
2. study: ``autotune tune``'s study (profiler-shaped space, warm starts, TPE) with a budget of
   at most 20% of the grid's evaluations;
3. popular defaults at the same load: transformers' assisted generation (20 tokens, confidence
   0.4), vLLM-style gamma 5, llama.cpp (--spec-draft-n-max 3, p-min 0).

Reported: the best feasible tokens/s found by the study / the grid's best, evaluations used,
and tokens/s of the study's choice against each default. Every number is a measurement taken
in this run. Usage::

    python -m benchmarks.tuner.tuner_vs_grid [--config tune.yaml] [--fraction 0.2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from autotune import context
from autotune.backends.engine import EngineBackend
from autotune.cli.text import columns
from autotune.config import TuneConfig, load_config
from autotune.jobs.tune import run_tune
from autotune.knobs import Knobs
from autotune.search import study as study_mod
from benchmarks._common import claim_dir, stamp

ROOT = Path(__file__).resolve().parents[2]

DEFAULTS = {
    "transformers (20 tokens, confidence 0.4)": {"gamma": 20, "confidence_threshold": 0.4},
    "vLLM-style gamma=5": {"gamma": 5, "confidence_threshold": 0.0},
    "llama.cpp (n-max 3, p-min 0)": {"gamma": 3, "confidence_threshold": 0.0},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=ROOT / "tune.yaml")
    ap.add_argument("--fraction", type=float, default=0.2, help="study budget as a fraction of the grid")
    ap.add_argument("--out", type=Path, default=claim_dir("tuner_vs_grid") / "tuner_vs_grid.json")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="tuner_vs_grid_"))
    cfg = load_config(args.config)
    cfg = cfg.with_overrides(
        {"storage.url": f"sqlite:///{tmp / 'bench.db'}", "export.formats": [], "storage.study_name": None}
    )
    ctx = context.build(cfg)
    measurement, _ = context.ensure_profile(ctx)
    drafter, grid = exhaustive_grid(cfg)
    print(f"grid: {len(grid)} configurations x {len(cfg.workload.load_levels)} load levels", file=sys.stderr)
    engine = EngineBackend(ctx)
    t0 = time.perf_counter()
    grid_results = measure_grid(engine, grid, cfg)
    grid_s = time.perf_counter() - t0
    grid_best = max((r for r in grid_results if r["feasible"]), key=lambda r: r["tokens_per_second"])

    budget = max(1, int(args.fraction * len(grid)))
    t0 = time.perf_counter()
    prof = run_tune(
        cfg.with_overrides({"budget.n_trials": budget, "budget.timeout_s": None}),
        say=lambda s: print(s, file=sys.stderr),
    )
    study_s = time.perf_counter() - t0
    trials = prof["trials"]
    study_best = max((t for t in trials if t["feasible"]), key=lambda t: t["tokens_per_second"])

    chosen = prof["chosen"]
    chosen_res, rows_defaults = measure_defaults(engine, chosen, drafter, cfg.budget.seed + 2)

    result = {
        "command": " ".join(sys.argv),
        **stamp(ctx.fingerprint["label"]),
        "device": ctx.fingerprint["label"],
        "config": str(args.config),
        "grid_evaluations": len(grid),
        "study_trials": budget,
        "study_evaluations_fraction": budget / len(grid),
        "grid_best": grid_best,
        "study_best": study_best,
        "study_best_over_grid_best": study_best["tokens_per_second"] / grid_best["tokens_per_second"],
        "grid_wall_s": grid_s,
        "study_wall_s": study_s,
        "chosen": chosen,
        "chosen_tokens_per_second": chosen_res["tokens_per_second"],
        "defaults": rows_defaults,
        "grid": grid_results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print_report(result, chosen_res)
    print(f"\nwrote {args.out}")


def exhaustive_grid(cfg: TuneConfig) -> tuple[str, list[Knobs]]:
    """The config's drafter and every (gamma, threshold, schedule) of its search space: three
    thresholds (low, middle, high), gamma 0 once."""
    lo, hi = cfg.search.confidence_threshold.low, cfg.search.confidence_threshold.high
    thresholds = sorted({lo, (lo + hi) / 2, hi})
    drafter = next((d for d in cfg.search.drafter if d != "none"), "none")
    mbs = max(cfg.search.max_batch_size)
    grid = [
        Knobs(drafter, g, t, s, mbs)
        for g in range(int(cfg.search.gamma.low), int(cfg.search.gamma.high) + 1)
        for t in (thresholds if g else [lo])
        for s in (cfg.search.gamma_schedule if g else cfg.search.gamma_schedule[:1])
    ]
    return drafter, grid


def measure_grid(engine: EngineBackend, grid: list[Knobs], cfg: TuneConfig) -> list[dict]:
    """Every grid configuration run once at the config's load levels, with its SLO feasibility."""
    grid_results = []
    for i, knobs in enumerate(grid):
        res = engine.run(knobs, cfg.budget.seed)
        viol = sum(max(v, 0.0) for v in study_mod.slo_violations(cfg, res).values())
        grid_results.append(
            {
                "params": knobs.to_params(with_tree=False),
                "tokens_per_second": res.tokens_per_second,
                "latency_ms": res.latency_ms,
                "feasible": viol <= 0,
            }
        )
        print(
            f"  grid {i + 1}/{len(grid)}: {knobs.label}: {res.tokens_per_second:.1f} tok/s", file=sys.stderr
        )
    return grid_results


def measure_defaults(engine: EngineBackend, chosen: dict, drafter: str, seed: int) -> tuple[dict, list[dict]]:
    """The tuned configuration and each stack's default (:data:`DEFAULTS`) at the same load and seed."""
    chosen_res = engine.run(Knobs.from_params(chosen), seed).to_json()
    rows_defaults = []
    for name, knobs in DEFAULTS.items():
        params = {**chosen, "drafter": drafter, "gamma_schedule": "constant", **knobs}
        res = engine.run(Knobs.from_params(params), seed).to_json()
        rows_defaults.append(
            {
                "config": name,
                "params": params,
                "tokens_per_second": res["tokens_per_second"],
                "latency_ms": res["latency_ms"],
                "tuned_over_default": chosen_res["tokens_per_second"] / res["tokens_per_second"],
            }
        )
    return chosen_res, rows_defaults


def print_report(result: dict, chosen_res: dict) -> None:
    """The grid's best against the study's, and the tuned configuration against the defaults."""
    grid_best, study_best, budget = result["grid_best"], result["study_best"], result["study_trials"]
    evaluations, rows_defaults = result["grid_evaluations"], result["defaults"]
    print(
        columns(
            ["", "evaluations", "best tok/s", "gamma", "threshold", "schedule"],
            [
                (
                    "grid",
                    evaluations,
                    grid_best["tokens_per_second"],
                    grid_best["params"]["gamma"],
                    grid_best["params"]["confidence_threshold"],
                    grid_best["params"]["gamma_schedule"],
                ),
                (
                    "study",
                    budget,
                    study_best["tokens_per_second"],
                    study_best["params"].get("gamma"),
                    study_best["params"].get("confidence_threshold"),
                    study_best["params"].get("gamma_schedule"),
                ),
            ],
        )
    )
    print(
        f"\nstudy best / grid best = {result['study_best_over_grid_best']:.3f} with "
        f"{budget}/{evaluations} = {budget / evaluations:.0%} of the evaluations\n"
    )
    print(
        columns(
            ["config at the same load", "tok/s", "latency ms", "tuned / this"],
            [("tuned (chosen)", chosen_res["tokens_per_second"], chosen_res["latency_ms"], 1.0)]
            + [
                (r["config"], r["tokens_per_second"], r["latency_ms"], r["tuned_over_default"])
                for r in rows_defaults
            ],
        )
    )


if __name__ == "__main__":
    main()
