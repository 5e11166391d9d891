"""benchmarks/_schedule.py: the table the point estimates name and what serving it costs, on
synthetic rows shaped as Plan writes them."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import _schedule  # noqa: E402

LEVELS = (1, 4, 16)


def row(label: str, kind: str, k_per_level: dict[int, int], tps: dict[int, list[float]]) -> dict:
    return {
        "config": label,
        "kind": kind,
        "k_per_level": k_per_level,
        "per_level_rounds": {b: {"tokens_per_second": t} for b, t in tps.items()},
    }


def grid() -> list[dict]:
    return [
        row("no speculation", "off", dict.fromkeys(LEVELS, 0), {1: [70, 72], 4: [200, 210], 16: [360, 350]}),
        row("grid K=1", "constant", dict.fromkeys(LEVELS, 1), {1: [85, 86], 4: [215, 210], 16: [352, 351]}),
        row("grid K=3", "constant", dict.fromkeys(LEVELS, 3), {1: [120, 118], 4: [230, 236], 16: [320, 330]}),
    ]


def test_the_fastest_table_takes_each_levels_fastest_k_and_never_k0() -> None:
    plan = _schedule.Plan(None, 16, LEVELS, 2, 0, True)
    assert plan.fastest_table() == ()
    plan.rows = grid()
    # at 16 no speculation is fastest, but a table's K=0 range still drafts: the fastest K >= 1 (K=1)
    assert plan.fastest_table() == ((1, 3), (4, 3), (16, 1))


def test_the_tables_cost_is_its_rounds_over_the_constant_of_the_same_k_at_each_level() -> None:
    rows = grid()
    rows.append(
        row("table", "table-fastest", {1: 3, 4: 3, 16: 1}, {1: [108, 106.2], 4: [230, 236], 16: [351, 351]})
    )
    cost = _schedule.table_cost(rows, "table", LEVELS)
    assert cost is not None and {b: c["k"] for b, c in cost.items()} == {1: 3, 4: 3, 16: 1}
    assert round(cost[1]["over_constant_same_k"]["value"], 3) == 0.9  # 108/120 and 106.2/118
    assert round(cost[4]["over_constant_same_k"]["value"], 3) == 1.0
    assert _schedule.table_cost(rows, "missing", LEVELS) is None
