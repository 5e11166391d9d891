"""The generated "Latest runs" blocks of docs/results (benchmarks/pages.py, benchmarks/renderers.py):
each page's blocks are what the renderers make of the committed JSONs, every step has a renderer
and a block, a JSON of another shape gives a one-line note instead of an error, and a run outside
the committed root writes page copies under that root, never into docs/."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import benchmarks.__main__ as entry
from benchmarks import pages
from benchmarks.claims import CLAIMS
from benchmarks.renderers import RENDERERS

PAGES = sorted({s.page for s in CLAIMS})
STEP = next(s for s in CLAIMS if s.name == "draft_after_verify")


def _docs() -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(pages.DOCS.glob("*.md"))}


def _copy_result(root: Path, name: str, **changes: object) -> Path:
    """The committed JSON of step ``name`` under ``root``, top-level keys changed as given."""
    data = json.loads((pages.COMMITTED / name / f"{name}.json").read_text())
    data.update(changes)
    path = root / name / f"{name}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("page", PAGES)
def test_each_page_is_what_the_renderers_make_of_the_committed_jsons(page: str) -> None:
    text = (pages.DOCS / page).read_text(encoding="utf-8")
    assert text == pages.page_text(page, pages.COMMITTED, pages.DOCS), (
        f"docs/results/{page} differs from its JSONs: run `python -m benchmarks pages` "
        "(edit the renderers in benchmarks/renderers.py, not the generated blocks)"
    )
    assert "Figures not shown" not in text, f"{page}: a renderer did not find its figures"


def test_every_step_has_a_renderer_and_one_block_on_its_page() -> None:
    assert set(RENDERERS) == {s.name for s in CLAIMS}
    for step in CLAIMS:
        text = (pages.DOCS / step.page).read_text(encoding="utf-8")
        begin, end = pages.begin_marker(step.name), pages.end_marker(step.name)
        assert text.count(begin) == 1 and text.count(end) == 1, step.name
        assert text.index(pages.SECTION) < text.index(begin) < text.index(end), step.name
        inner = text[text.index(begin) : text.index(end)]
        assert f"({step.name}/{step.name}.json)" in inner or f"/{step.name}/{step.name}.json)" in inner


def test_a_changed_json_changes_its_block() -> None:
    page = (pages.DOCS / STEP.page).read_text(encoding="utf-8")
    data = json.loads((pages.COMMITTED / STEP.name / f"{STEP.name}.json").read_text())
    assert pages.figures(STEP.name, data) in page
    data["cells"][0]["mean_ratio"] = 9.876
    changed = pages.figures(STEP.name, data)
    assert "9.88" in changed and changed not in page


def test_pages_out_writes_copies_and_leaves_docs_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _docs()
    _copy_result(tmp_path / "results", STEP.name, command="python -m a.changed.command")
    out = tmp_path / "pages"
    argv = ["python -m benchmarks", "pages", "--results", str(tmp_path / "results"), "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    entry.main()
    assert _docs() == before
    assert sorted(p.name for p in out.glob("*.md")) == PAGES
    copy = (out / STEP.page).read_text(encoding="utf-8")
    assert "`python -m a.changed.command`" in copy
    assert "](../results/draft_after_verify/draft_after_verify.json)" in copy
    assert "No result in ../results/trees/ yet" in copy  # a step with no JSON in that root


def test_a_json_without_the_renderers_keys_gives_one_line_each() -> None:
    for step in CLAIMS:
        text = pages.figures(step.name, {})
        assert text.startswith("Figures not shown: the JSON has no key "), (step.name, text)
        assert "\n" not in text
    shaped = pages.figures("demo_pair_quality", {"greedy": [], "t1": []})
    assert shaped.startswith("Figures not shown: the JSON is not of the shape") and "\n" not in shaped


def test_an_old_json_without_host_or_date_says_not_recorded(tmp_path: Path) -> None:
    (tmp_path / STEP.name).mkdir()
    (tmp_path / STEP.name / f"{STEP.name}.json").write_text(json.dumps({"cells": []}))
    text = pages.block(STEP, tmp_path, tmp_path)
    assert "**Host:** not recorded; **date:** not recorded; **wall time:** not recorded" in text
    assert "**Command:** `not recorded`" in text
    assert text.splitlines()[0] == pages.begin_marker(STEP.name)
    assert text.splitlines()[-1] == pages.end_marker(STEP.name)


def test_a_png_the_step_wrote_is_embedded(tmp_path: Path) -> None:
    _copy_result(tmp_path, STEP.name)
    (tmp_path / STEP.name / "speedup.png").write_bytes(b"\x89PNG")
    text = pages.block(STEP, tmp_path, tmp_path / "pages")
    assert "![speedup](../draft_after_verify/speedup.png)" in text


def test_the_run_hook_writes_page_copies_under_another_root_and_skips_failed_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _docs()
    failing = next(s for s in CLAIMS if s.name == "budget")
    assert failing.page != STEP.page

    def fake_run_step(step, quick: bool, results: Path) -> tuple[int, float]:
        _copy_result(results, step.name, command=f"fake {step.name}")
        return (1 if step is failing else 0), 1.0

    monkeypatch.setattr(entry, "run_step", fake_run_step)
    argv = ["python -m benchmarks", "run", "all", "--only", f"{STEP.name},budget", "--results", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as done:
        entry.main()
    assert done.value.code == 1  # budget "failed"
    assert _docs() == before
    assert sorted(p.name for p in (tmp_path / "pages").iterdir()) == [STEP.page]
    copy = (tmp_path / "pages" / STEP.page).read_text(encoding="utf-8")
    assert "`fake draft_after_verify`" in copy
    assert "](../draft_after_verify/draft_after_verify.json)" in copy
    assert "No result in ../trees/ yet" in copy  # the page's other steps: not in this root


def test_after_step_rewrites_docs_only_for_the_committed_root(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(pages, "write_pages", lambda results, out, names: calls.append((results, out, names)))
    pages.after_step(STEP, pages.COMMITTED)
    pages.after_step(STEP, Path("/elsewhere"))
    assert calls == [
        (pages.COMMITTED, None, [STEP.page]),
        (Path("/elsewhere"), Path("/elsewhere/pages"), [STEP.page]),
    ]
