"""benchmarks/stacks/stack_cost.py --from: predicted vs measured and the planner's replay on a synthetic grid run."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.autotune.test_stackcost import ACCEPT, COSTS, true_tps


def grid_row(k: int) -> dict:
    """One server's row as benchmarks/_schedule.Plan writes it: one round per level."""
    levels = {}
    for b in COSTS:
        levels[str(b)] = {
            "tokens_per_second": [true_tps(b, k)],
            "mean_acceptance_length": [1 + sum(ACCEPT[:k]) if k else None],
            "per_position_acceptance": [list(ACCEPT[:k]) if k else None],
            "mean_batch_size": [float(b)],
        }
    label = "no speculation" if k == 0 else f"grid K={k}"
    return {"config": label, "kind": "off" if k == 0 else "constant", "per_level_rounds": levels}


def test_the_replay_lands_on_each_levels_best_with_few_starts(tmp_path) -> None:
    run = {"device": "synthetic", "config": "x.yaml", "rows": [grid_row(k) for k in range(9)]}
    src, out = tmp_path / "grid.json", tmp_path / "out.json"
    src.write_text(json.dumps(run))
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.stacks.stack_cost", "--from", str(src), "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    analysis = json.loads(out.read_text())["analysis"]
    held = [r for r in analysis["predicted_vs_measured"] if not r["calibration"]]
    assert held and all(abs(r["ratio"] - 1) < 1e-9 for r in held)  # the synthetic stack is the model
    planner = analysis["planner"]
    assert planner["worst_ratio"] > 1 - 1e-9 and planner["within_3pct"]
    assert planner["starts"] < planner["grid_starts"]
    assert [p["planner_k"] for p in planner["picks"]] == [p["grid_best_k"] for p in planner["picks"]]
    assert "goal: within 3% of the grid's per-level best at every level: met" in proc.stdout
