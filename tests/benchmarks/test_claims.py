"""The claims registry behind ``python -m benchmarks``: every step names a script that exists, a
results page that exists, and only flags its script (or the shared parser it uses) defines."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from benchmarks.claims import CLAIMS, GROUPS

ROOT = Path(__file__).resolve().parents[2]
SHARED = ("_common.py", "_transfer.py", "_schedule.py")


def _flags(script: Path) -> set[str]:
    texts = [script.read_text()]
    texts += [(ROOT / "benchmarks" / s).read_text() for s in SHARED]
    return set(re.findall(r'"(--[a-z][a-z0-9-]*)"', "\n".join(texts)))


def test_every_step_has_its_script_page_and_known_flags() -> None:
    names = [s.name for s in CLAIMS]
    assert len(names) == len(set(names)), "step names are console file names: unique"
    assert {s.group for s in CLAIMS} == set(GROUPS)
    for step in CLAIMS:
        script = ROOT / step.path
        assert script.is_file(), step
        assert step.script == f"benchmarks.{step.group}.{script.stem}", (
            f"{step.name}: the script sits in its group"
        )
        assert (ROOT / "docs" / "results" / step.page).is_file(), step
        known = _flags(script)
        for arg in (*step.full, *step.quick):
            if arg.startswith("--"):
                assert arg in known, f"{step.name}: {arg} is not a flag of {step.script}"


def test_the_entry_point_lists_every_claim_and_refuses_an_unknown_step() -> None:
    listed = subprocess.run(
        [sys.executable, "-m", "benchmarks", "list"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert len(listed) == len(CLAIMS)
    bad = subprocess.run(
        [sys.executable, "-m", "benchmarks", "run", "engine", "--only", "nope"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and "no step nope in engine" in bad.stderr


RESULTS = ROOT / "benchmarks" / "results"
PAGES = ROOT / "docs" / "results"
RESULT_LINK = re.compile(r"\]\(((?:\.\./)+benchmarks/results/[^)\s#]+)\)")
MAX_RESULT_FILES = 40


def committed_results() -> set[str]:
    """The files under benchmarks/results/ that git tracks, relative to that folder."""
    out = subprocess.run(
        ["git", "ls-files", "--", "benchmarks/results"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return {str(Path(p).relative_to("benchmarks/results")) for p in out}


def cited_results() -> dict[str, list[str]]:
    """Every results file a docs/results page links, relative to benchmarks/results/, with its pages."""
    cited: dict[str, list[str]] = {}
    for page in sorted(PAGES.glob("*.md")):
        for target in RESULT_LINK.findall(page.read_text(encoding="utf-8")):
            path = (page.parent / target).resolve()
            cited.setdefault(str(path.relative_to(RESULTS)), []).append(page.name)
    return cited


def test_every_committed_result_is_cited_by_a_results_page_and_every_citation_exists() -> None:
    committed, cited = committed_results(), cited_results()
    assert committed, "git ls-files found no results"
    uncited = sorted(committed - set(cited))
    assert not uncited, f"results no docs/results page links (cite them or git rm them): {uncited}"
    missing = sorted(
        f"{path} (in {', '.join(pages)})" for path, pages in cited.items() if path not in committed
    )
    assert not missing, f"docs/results pages link results that are not committed: {missing}"
    assert len(committed) <= MAX_RESULT_FILES, f"{len(committed)} result files: keep the latest run per claim"


def test_every_claim_has_its_result_in_its_folder() -> None:
    committed = committed_results()
    for step in CLAIMS:
        assert f"{step.name}/{step.name}.json" in committed, (
            f"{step.name}: no results/{step.name}/{step.name}.json"
        )


def test_the_benchmarks_readme_is_what_its_generator_writes() -> None:
    """benchmarks/README.md is ``python -m benchmarks readme``'s output: a claim, a result or the
    quick run's record changed without regenerating it fails here."""
    from benchmarks.__main__ import readme

    assert (ROOT / "benchmarks" / "README.md").read_text() == readme(), "run: python -m benchmarks readme"


def test_only_a_whole_passing_quick_run_is_recorded_for_the_readme(tmp_path, monkeypatch) -> None:
    import argparse
    import json

    from benchmarks import __main__ as entry

    record = tmp_path / "quick_run_times.json"
    monkeypatch.setattr(entry, "QUICK_TIMES", record)
    times = {"trees": (0, 7.4), "budget": (0, 127.2)}
    for group, only, quick, failed in (
        ("all", "trees", True, False),
        ("engine", None, True, False),
        ("all", None, False, False),
        ("all", None, True, True),
    ):
        args = argparse.Namespace(group=group, only=only, quick=quick)
        entry.record_times({**times, **({"vllm": (1, 3.0)} if failed else {})}, args, tmp_path, False)
        assert not record.exists(), (group, only, quick, failed)
        assert json.loads((tmp_path / "run_times.log").read_text())["group"] == group
    whole = argparse.Namespace(group="all", only=None, quick=True)
    entry.record_times(times, whole, tmp_path, True)
    (written,) = json.loads(record.read_text())["runs"]
    assert written["steps"] == {"trees": {"exit": 0, "seconds": 7}, "budget": {"exit": 0, "seconds": 127}}
    assert written["rerun"] is True and written["host"] and written["date_utc"]
    line = entry.quick_run_line([written])
    assert "2.2 minutes for its 2 steps" in line and "a rerun" in line
    assert entry.quick_run_line([]).startswith("No whole")
    other = {**written, "host": "another host", "rerun": False}
    record.write_text(json.dumps({"runs": [other, written]}))
    entry.record_times({"trees": (0, 9.0)}, whole, tmp_path, False)  # this host again: replaces its own
    runs = json.loads(record.read_text())["runs"]
    assert [r["host"] for r in runs] == ["another host", written["host"]]
    assert runs[1]["steps"] == {"trees": {"exit": 0, "seconds": 9}} and runs[1]["rerun"] is False
    line = entry.quick_run_line(runs)
    assert "on another host" in line and "a first run" in line and "one figure per host" in line


def test_a_quick_run_is_a_rerun_unless_a_watch_step_tuned_its_profile_first(tmp_path) -> None:
    import json

    from benchmarks import __main__ as entry
    from benchmarks.claims import CLAIMS

    watch = [s for s in CLAIMS if s.group == "watch"]
    assert not entry.tuned_first(watch, tmp_path)  # nothing written: nothing tuned
    for i, s in enumerate(watch):
        (tmp_path / s.name).mkdir()
        (tmp_path / s.name / f"{s.name}.json").write_text(json.dumps({"tuned_first": i == 1}))
    assert entry.tuned_first(watch, tmp_path) and not entry.tuned_first(watch[:1], tmp_path)
