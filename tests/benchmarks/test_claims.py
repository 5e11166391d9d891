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
