"""``budget.minutes`` kept: ``autotune tune --budget M`` on the bundled tune.yaml, timed from outside.

For each ``BACKEND:MINUTES`` of ``--runs`` (run one after another, each from an empty store in a
temporary folder holding a copy of ``--config``, default the bundled tune.yaml, so its exports land
there too; the quick run gives benchmarks/configs/quick.yaml, whose relative paths, if any, must be
absolute or ``demo``): the
wall time of the whole command against M (the goal: at most 1.1 x M), its exit code, every
``budget: ...`` line it printed (what was cut) and the choice it stored. Prints a table and writes
``<out-dir>/budget.json`` (the console of each run beside it as ``budget_<backend>_<M>.txt``).
Usage::

    python -m benchmarks.tuner.budget [--config tune.yaml] --runs engine:20,vllm:15
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._common import Bench, claim_dir, portable, print_table, write_json

ROOT = Path(__file__).resolve().parents[2]

BACKENDS = ("engine", "vllm", "llamacpp")


def runs_arg(text: str) -> list[tuple[str, float]]:
    """``"engine:20,vllm:15"`` -> ``[("engine", 20.0), ("vllm", 15.0)]`` (an argparse type)."""
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        backend, _, minutes = item.partition(":")
        try:
            value = float(minutes)
        except ValueError:
            value = -1.0
        if backend not in BACKENDS or value <= 0:
            raise argparse.ArgumentTypeError(f"expected BACKEND:MINUTES, BACKEND one of {BACKENDS}: {item!r}")
        out.append((backend, value))
    if not out:
        raise argparse.ArgumentTypeError("expected at least one BACKEND:MINUTES")
    return out


def run_one(backend: str, minutes: float, out_dir: Path, source: Path = ROOT / "tune.yaml") -> dict:
    """One ``autotune tune --budget`` on a copy of ``source`` from an empty store; its console kept
    next to the JSON."""
    with tempfile.TemporaryDirectory(prefix="budget-") as tmp:
        config = Path(tmp) / "tune.yaml"
        shutil.copy(source, config)
        autotune = Path(sys.executable).with_name("autotune")
        cmd = [
            str(autotune if autotune.exists() else "autotune"),
            "tune",
            "--config",
            str(config),
            "--backend",
            backend,
            "--budget",
            f"{minutes:g}m",
            "--storage",
            f"sqlite:///{tmp}/autotune.db",
        ]
        start = time.monotonic()
        done = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
        wall = time.monotonic() - start
    console = done.stdout + done.stderr
    name = f"budget_{backend}_{minutes:g}"
    (out_dir / f"{name}.txt").write_text(portable(console))
    budget_lines = [line for line in console.splitlines() if line.startswith("budget:")]
    summary = next((line for line in reversed(budget_lines) if " of " in line and "; cut:" in line), "")
    chosen = next((line.split(None, 1)[1] for line in console.splitlines() if line.startswith("chosen ")), "")
    cut = summary.split("; cut: ", 1)[1] if summary else ""
    return {
        "backend": backend,
        "budget_min": minutes,
        "wall_min": wall / 60,
        "wall_over_budget": wall / 60 / minutes,
        "exit_code": done.returncode,
        "cut": cut,
        "budget_lines": budget_lines,
        "chosen": re.sub(r"\s+", " ", chosen),
        "console": f"{name}.txt",
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=runs_arg, default=runs_arg("engine:20,vllm:15"), help="BACKEND:MINUTES,...")
    p.add_argument("--config", type=Path, default=ROOT / "tune.yaml", help="the config each run tunes")
    p.add_argument("--out-dir", type=Path, default=claim_dir("budget"))
    args = p.parse_args()
    bench = Bench("budget", args)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    results = [run_one(backend, minutes, args.out_dir, args.config) for backend, minutes in args.runs]
    rows = [
        (
            r["backend"],
            f"{r['budget_min']:g}",
            f"{r['wall_min']:.1f}",
            f"{r['wall_over_budget']:.2f}",
            r["exit_code"],
            r["cut"] or "-",
        )
        for r in results
    ]
    print_table(
        f"autotune tune --budget M on {portable(str(args.config))} (goal: wall <= 1.1 x M)",
        ["backend", "M (min)", "wall (min)", "wall / M", "exit", "cut"],
        rows,
    )
    for r in results:
        print(f"{r['backend']} {r['budget_min']:g} min: chosen {r['chosen'] or '-'}")
    config = portable(str(args.config))
    write_json(bench, {"config": config, "runs": results, "goal_wall_over_budget": 1.1}, dtype=None)
    print(json.dumps({"max_wall_over_budget": max(r["wall_over_budget"] for r in results)}))


if __name__ == "__main__":
    main()
