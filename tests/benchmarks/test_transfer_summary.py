"""benchmarks/_transfer.summarize and report: ratios paired round by round (the tuner's
autotune.stats), not ratios of medians, on rows shaped as measure_plan writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.stats import paired_ratio
from benchmarks._transfer import report, summarize


def row(name: str, *tps: float, outputs: list[int] | None = None) -> dict:
    return {
        "config": name,
        "tokens_per_second_runs": list(tps),
        "tokens_per_second": sorted(tps)[len(tps) // 2],
        "min": min(tps),
        "max": max(tps),
        "outputs": [outputs or [1, 2, 3]],
    }


def rows() -> list[dict]:
    # the host slows round by round; K=3 is 1.3x no speculation in every round, K=5 1.2x
    return [
        row("no speculation", 100, 90, 80),
        row("engine-backend export", 120, 108, 96),
        row("vllm-backend choice", 130, 117, 104),
        row("grid K=3", 130, 117, 104),
        row("grid K=5", 120, 108, 96, outputs=[1, 2, 4]),
        row("grid K=7", 125, 112, 110),
        row("no speculation (again, last)", 95, 86, 76),
    ]


def test_ratios_pair_the_rounds_and_carry_an_interval() -> None:
    rs = rows()
    s = summarize(rs, True, "vllm-backend choice")
    by = {r["config"]: r for r in rs}
    k5 = by["grid K=5"]["over_no_speculation"]
    assert k5["value"] == pytest.approx(1.2) and k5["ci95"] == pytest.approx([1.2, 1.2]) and k5["n"] == 3
    assert s["grid_best"] == "grid K=3"
    assert s["engine_export_over_grid_best"]["value"] == pytest.approx(1.2 / 1.3)
    assert s["engine_export_vs_grid_best"].startswith("significantly worse (ratio 0.92")
    assert s["choice_vs_grid_best"] == "the grid's best (grid K=3)"
    # K=7's median (112) over K=3's (117) is 0.957; paired, its rounds' ratios are 0.96, 0.96, 1.06
    k7 = by["grid K=7"]["over_grid_best"]
    assert k7 == paired_ratio([125, 112, 110], [130, 117, 104]).as_dict()
    assert k7["ci95"][0] < 1 < k7["ci95"][1] and s["grid_within_noise_of_best"] == ["grid K=7"]
    assert s["drift_no_speculation_last_over_first"]["value"] == pytest.approx(
        (0.95 * 86 / 90 * 0.95) ** (1 / 3)
    )
    assert by["grid K=5"]["greedy_identical"] is False and by["grid K=3"]["greedy_identical"] is True


def test_rows_that_cannot_be_paired_get_no_ratio() -> None:
    rs = [row("no speculation", 100, 90), row("grid K=3", 130, 117, 104)]
    s = summarize(rs, True, "choice")
    assert rs[1]["over_no_speculation"] is None and rs[1]["over_grid_best"]["value"] == pytest.approx(1.0)
    assert s["choice_over_grid_best"] is None and s["drift_no_speculation_last_over_first"] is None


def test_the_report_prints_the_intervals_and_writes_the_json(tmp_path: Path, capsys) -> None:
    rs = rows()
    result = {"summary": summarize(rs, True, "vllm-backend choice"), "rows": rs}
    report(tmp_path / "t.json", "header", result)
    text = capsys.readouterr().out
    assert "x no-spec (95% CI)" in text and "min-max" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("grid K=7"))
    k7 = paired_ratio([125, 112, 110], [130, 117, 104])
    assert "110-125" in line and k7.cell() in line
    assert "engine_export_over_grid_best: 0.92 (0.92-0.92)" in text
    assert json.loads((tmp_path / "t.json").read_text())["summary"]["grid_best"] == "grid K=3"
