"""The acceptance tail past the measured positions: which rule predicts the expected tokens of a larger K.

A serving stack counts accepted tokens per draft position only up to the K it serves; the stack
cost fit (the counters of the largest K a study served) and ``autotune watch`` (the live counters
of the served K) both predict larger K from them. Two rules continue the per-position acceptance
p[0..m-1] past position m:

- **mean rate** (:func:`autotune.cost.acceptance.extend`): the geometric mean of the measured
  conditional rates, p[m-1] ** (1 / m);
- **last rate**: the last measured conditional rate, p[m-1] / p[m-2].

No run: a replay of the grids already measured (``schedule_*.json`` and ``stack_cost_vllm.json``
under ``--results``, or under ``benchmarks/results`` as committed at ``--at COMMIT``: each constant
K served in its own server, the per-position acceptance of every round at every load level from
the stack's own counters). For every round and level,
every measured K=m >= 2 (at m = 1 the rules agree) predicts every larger measured K=n: the
predicted E(n) = 1 + p[0] + ... + p[n-1] against the E(n) the K=n server counted in the same
round at the same level. Reported per stack and per gap n - m: the mean absolute and the mean
signed relative error of each rule, and how often the mean rate is the closer. Also counted: the
per-position vectors of those rounds (the tuner's counters, before any clamp) whose acceptance
rises from one position to the next (:func:`autotune.cost.acceptance.from_counts` holds them
non-increasing).

JSON: ``benchmarks/results/acceptance_tail/acceptance_tail.json``. Usage::

    python -m benchmarks.tuner.acceptance_tail [--results benchmarks/results | --at COMMIT] \
[--out JSON]
"""

from __future__ import annotations

import argparse
import io
import json
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from autotune.cli.text import columns
from autotune.cost.acceptance import expected_tokens, extend
from benchmarks._common import claim_dir, fail, portable, stamp
from benchmarks._schedule import write_json

ROOT = Path(__file__).resolve().parents[2]

GRID_K = re.compile(r"grid (?:K=|n-max )(\d+)$")


def last_rate(acceptance: Sequence[float], n: int) -> tuple[float, ...]:
    """The rule compared against: a geometric tail at the last measured conditional rate."""
    out = [min(max(float(p), 0.0), 1.0) for p in acceptance[:n]]
    rate = out[-1] / out[-2] if len(out) >= 2 and out[-2] > 0 else out[0]
    rate = min(max(rate, 0.0), 1.0)
    while len(out) < n:
        out.append(out[-1] * rate)
    return tuple(out)


def grid_rounds(result: dict) -> Iterator[tuple[int, dict[int, list[float]]]]:
    """Per (level, round): the per-position acceptance each constant K of the grid counted there."""
    grid: dict[int, dict] = {}
    for row in result.get("rows", []):
        if row.get("kind") == "constant" and (m := GRID_K.match(str(row.get("config", "")))):
            grid.setdefault(int(m.group(1)), row)
    for level in result.get("levels", []):
        rounds: dict[int, dict[int, list[float]]] = {}
        for k, row in grid.items():
            at_level = row.get("per_level_rounds", {}).get(str(level), {})
            per_round = at_level.get("per_position_acceptance") or []
            for r, acc in enumerate(per_round):
                if acc and len(acc) >= k and all(isinstance(p, int | float) for p in acc):
                    rounds.setdefault(r, {})[k] = [float(p) for p in acc[:k]]
        for _, by_k in sorted(rounds.items()):
            yield level, by_k


def grid_files(results: Path) -> list[Path]:
    """The stored grids under ``results`` (its claim folders searched too): schedule and stack-cost runs."""
    return sorted(results.rglob("schedule_*.json")) + sorted(results.rglob("stack_cost_vllm.json"))


def stored_at(commit: str, into: Path) -> Path:
    """``benchmarks/results`` as committed at ``commit``, unpacked under ``into`` (``git archive``)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit, "benchmarks/results"],
        capture_output=True,
    )
    if archive.returncode != 0:
        fail(f"--at {commit}: {archive.stderr.decode().strip()}")
    tarfile.open(fileobj=io.BytesIO(archive.stdout)).extractall(into, filter="data")
    return into / "benchmarks" / "results"


def cases(results: Path) -> list[dict]:
    """Every (file, level, round, measured m >= 2, predicted n > m) with both rules' relative errors."""
    out = []
    for path in grid_files(results):
        if path.stem.endswith("_reanalysed") or not path.is_file():
            continue  # a re-analysis holds the same rows as its run
        stack = "llamacpp" if "llamacpp" in path.stem else "vllm"
        for level, by_k in grid_rounds(json.loads(path.read_text())):
            for m in sorted(k for k in by_k if k >= 2):
                for n in sorted(k for k in by_k if k > m):
                    measured = expected_tokens(by_k[n], n)
                    out.append(
                        {
                            "file": path.name,
                            "stack": stack,
                            "level": level,
                            "m": m,
                            "n": n,
                            "measured": measured,
                            "mean_rate": expected_tokens(extend(by_k[m], n), n) / measured - 1,
                            "last_rate": expected_tokens(last_rate(by_k[m], n), n) / measured - 1,
                        }
                    )
    return out


def out_of_order(results: Path) -> dict:
    """The grids' per-position vectors (every round, level and K) and those that rise somewhere."""
    vectors = [
        acc
        for path in grid_files(results)
        if not path.stem.endswith("_reanalysed")
        for _, by_k in grid_rounds(json.loads(path.read_text()))
        for acc in by_k.values()
    ]
    rising = [acc for acc in vectors if any(b > a for a, b in zip(acc, acc[1:], strict=False))]
    return {"vectors": len(vectors), "rising": len(rising)}


def summary(rows: Sequence[dict]) -> dict:
    return {
        "cases": len(rows),
        "mean_rate_abs": statistics.fmean(abs(r["mean_rate"]) for r in rows),
        "last_rate_abs": statistics.fmean(abs(r["last_rate"]) for r in rows),
        "mean_rate_bias": statistics.fmean(r["mean_rate"] for r in rows),
        "last_rate_bias": statistics.fmean(r["last_rate"] for r in rows),
        "mean_rate_closer": sum(abs(r["mean_rate"]) < abs(r["last_rate"]) for r in rows) / len(rows),
    }


def report(groups: dict[str, dict]) -> str:
    headers = ["group", "cases", "mean rate |err|", "last rate |err|"]
    headers += ["mean rate bias", "last rate bias", "mean closer"]
    rows = [
        [
            name,
            s["cases"],
            f"{100 * s['mean_rate_abs']:.1f}%",
            f"{100 * s['last_rate_abs']:.1f}%",
            f"{100 * s['mean_rate_bias']:+.1f}%",
            f"{100 * s['last_rate_bias']:+.1f}%",
            f"{100 * s['mean_rate_closer']:.0f}%",
        ]
        for name, s in groups.items()
    ]
    return columns(headers, rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument(
        "--at",
        metavar="COMMIT",
        help="replay the grids stored under benchmarks/results at this git commit (read with git archive)",
    )
    p.add_argument("--out", type=Path, default=claim_dir("acceptance_tail") / "acceptance_tail.json")
    args = p.parse_args()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        if args.at:
            args.results = stored_at(args.at, Path(tmp))
        rows = cases(args.results)
        order = out_of_order(args.results)
    if not rows:
        fail(f"no grid of two K >= 2 in {args.at or args.results}: schedule_*.json, stack_cost_vllm.json")
    groups = {"all": summary(rows)}
    for stack in sorted({r["stack"] for r in rows}):
        groups[stack] = summary([r for r in rows if r["stack"] == stack])
    for gap in sorted({r["n"] - r["m"] for r in rows}):
        groups[f"n - m = {gap}"] = summary([r for r in rows if r["n"] - r["m"] == gap])
    print("E(n) predicted from the counters of K=m, relative to the E(n) the K=n server counted")
    print(report(groups))
    print(f"\nper-position vectors counted: {order['vectors']}, rising somewhere: {order['rising']}")
    names = sorted({r["file"] for r in rows})
    files = {name: summary([r for r in rows if r["file"] == name]) for name in names}
    result = {"command": " ".join(sys.argv), **stamp(), "groups": groups, "files": files, "order": order}
    result["wall_s"] = round(time.perf_counter() - t0, 2)
    write_json(args.out, result)
    print(f"\nwrote {portable(str(args.out))}")


if __name__ == "__main__":
    main()
