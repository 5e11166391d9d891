"""The engine-only mode of benchmarks/stacks/vllm_plugin.py (``--offline``): what each engine is
asked to run, and the paired ratios and greedy check of its report (no vLLM needed)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from benchmarks.stacks import vllm_plugin as bench


def _args(**kw: object) -> argparse.Namespace:
    base = {"levels": "1,4", "batches": [1, 4], "max_new_tokens": 8, "inner": 3, "dtype": "float32"}
    return argparse.Namespace(**{**base, **kw})


def test_the_k0_table_covers_every_batch_and_no_speculation_has_no_config() -> None:
    table = bench.offline_request(_args(), table=True)
    assert table["spec"][bench.TABLE_KEY] == [[1, 4, 0]] and table["spec"]["method"] == "draft_model"
    assert len(table["prompts"]) == 4 and table["batches"] == [1, 4] and table["repeats"] == 3
    assert bench.offline_request(_args(), table=False)["spec"] is None


def _run(seconds: float, tokens: list[int]) -> dict:
    return {
        b: {"seconds": [seconds * b, seconds * b * 1.01, seconds * b * 0.99], "tokens": [tokens]}
        for b in (1, 4)
    }


def test_the_report_pairs_rounds_and_flags_output_that_differs(tmp_path: Path) -> None:
    rounds = {
        "no speculation": [_run(1.0, [1, 2]), _run(1.1, [1, 2])],
        "K=0 table, vLLM as shipped": [_run(1.25, [1, 2]), _run(1.375, [1, 2])],  # 0.8x in both rounds
        "K=0 table, plugin": [_run(1.0, [1, 2]), _run(1.1, [1, 3])],  # as fast, one token differs
    }
    result = {"host": "test", "dtype": "float32", "batches": [1, 4], "max_new_tokens": 8}
    result.update(inner=3, repeats=2, mode="offline", rounds=rounds)
    out = tmp_path / "offline.json"
    bench.offline_report(result, out)
    summary = json.loads(out.read_text())["summary"]
    assert math.isclose(summary["table-zero"]["4"]["value"], 0.8, rel_tol=1e-9)
    assert math.isclose(summary["table-zero-plugin"]["1"]["value"], 1.0, rel_tol=1e-9)
    same = summary["greedy_identical_to_no_speculation"]
    assert same == {"no speculation": True, "K=0 table, vLLM as shipped": True, "K=0 table, plugin": False}
    again = tmp_path / "again.json"
    bench.offline_report(json.loads(out.read_text()), again)  # --report on the stored JSON
    assert json.loads(again.read_text())["summary"] == summary
