"""benchmarks/stacks/vllm_plugin.py: the engine-only mode (``--offline``): what each engine is
asked to run, the paired ratios and greedy check of its report; and the commands the HTTP mode records
(no vLLM needed)."""

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
    table = bench.offline_request(_args(), 0)
    assert table["spec"][bench.TABLE_KEY] == [[1, 4, 0]] and table["spec"]["method"] == "draft_model"
    assert len(table["prompts"]) == 4 and table["batches"] == [1, 4] and table["repeats"] == 3
    assert bench.offline_request(_args(), None)["spec"] is None
    constant = bench.offline_request(_args(), 4)["spec"]
    assert constant["num_speculative_tokens"] == 4 and bench.TABLE_KEY not in constant


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


def test_alternated_calls_put_each_configuration_in_each_place_after_each_other() -> None:
    orders = bench.call_orders(["a", "b", "c"])
    assert len(orders) == 6 and all(sorted(o) == ["a", "b", "c"] for o in orders)
    for label in "abc":  # each place equally often
        assert [o.index(label) for o in orders].count(0) == 2
    followed = [(o[i - 1], o[i]) for o in orders for i in range(1, 3)]  # each after each, twice
    assert sorted(followed) == sorted(2 * [(x, y) for x in "abc" for y in "abc" if x != y])
    request = bench.alternate_request(_args(pause=0.3, constants=[]))
    assert [c["plugin"] for c in request["configs"]] == [False, False, True]
    assert request["configs"][0]["spec"] is None and request["configs"][2]["spec"][bench.TABLE_KEY]
    assert request["switch"] == "SPEC_AUTOTUNE_K0_SKIP" and request["pause"] == 0.3


def test_the_plugin_line_is_attributed_to_the_engine_started_before_it() -> None:
    log = "\n".join(
        [
            "ENGINE no speculation",
            "INFO loading",
            "ENGINE K=0 table, vLLM as shipped",
            "ENGINE K=0 table, plugin",
            f"(EngineCore pid=3) INFO {bench.PLUGIN_LOG} (a table's K=0 skips the drafter)",
            f"(EngineCore pid=3) INFO {bench.PLUGIN_LOG} again",
            "ENGINES READY",
            f"{bench.PLUGIN_LOG} after the start: not an engine's",
        ]
    )
    assert bench.plugin_engines(log) == ["K=0 table, plugin"]
    assert bench.plugin_engines("ENGINE no speculation\nready") == []


def test_alternated_calls_are_paired_call_by_call_and_by_round(tmp_path: Path) -> None:
    def run(seconds: list[float]) -> dict:
        return {1: {"seconds": seconds, "tokens": [[1]]}}

    rounds = {  # round 2 is 10% slower for every engine: per call the plugin is 0.95x, 1.0x
        "no speculation": [run([1.0, 1.0]), run([1.1, 1.1])],
        "K=0 table, vLLM as shipped": [run([1.25, 1.25]), run([1.375, 1.375])],
        "K=0 table, plugin": [run([1.0, 1.0 / 0.95]), run([1.1, 1.1 / 0.95])],
    }
    result = {"host": "test", "dtype": "float32", "batches": [1], "max_new_tokens": 8}
    result.update(inner=2, repeats=2, mode="offline", rounds=rounds, alternate=True, pause=0.3)
    out = tmp_path / "alternate.json"
    bench.offline_report(result, out)
    summary = json.loads(out.read_text())["summary"]
    calls = summary["per_call"]["table-zero-plugin"]["1"]
    assert math.isclose(calls["value"], math.sqrt(0.95), rel_tol=1e-9) and calls["n"] == 4
    assert math.isclose(summary["per_call"]["table-zero"]["1"]["value"], 0.8, rel_tol=1e-9)
    assert math.isclose(bench.call_ratio([[1.0, 2.0], [0.5]], [[1.1, 2.2], [0.55]]).value, 1.1)


def test_a_constant_k_is_served_without_and_with_the_plugin_and_compared(tmp_path: Path) -> None:
    args = _args(pause=0.3, constants=[4])
    configs = bench.offline_configs(args)
    assert [c[1] for c in configs][-2:] == ["constant-4", "constant-4-plugin"]
    request = bench.alternate_request(args)
    assert [c["plugin"] for c in request["configs"]] == [False, False, True, False, True]
    assert request["configs"][3]["spec"] == request["configs"][4]["spec"]

    def run(seconds: float) -> dict:
        return {1: {"seconds": [seconds, seconds], "tokens": [[1]]}}

    rounds = {label: [run(1.0), run(1.1)] for label, *_ in configs}
    rounds["constant K=4, plugin"] = [run(1.0 / 0.9), run(1.1 / 0.9)]  # 0.9x the constant without it
    result = {"host": "test", "dtype": "float32", "batches": [1], "max_new_tokens": 8, "configs": configs}
    result.update(inner=2, repeats=2, mode="offline", rounds=rounds, alternate=True, pause=0.3)
    out = tmp_path / "constant.json"
    bench.offline_report(result, out)
    ratio = json.loads(out.read_text())["summary"]["plugin_over_without"]["K=4"]["1"]
    assert math.isclose(ratio["rounds"]["value"], 0.9, rel_tol=1e-9)
    assert math.isclose(ratio["calls"]["value"], 0.9, rel_tol=1e-9) and ratio["calls"]["n"] == 4


def test_the_recorded_commands_name_the_catch_up_record_without_the_runs_temporary_folder() -> None:
    tmp = "/tmp/vllm_plugin_abc123"
    rows = [
        {"config": "no speculation", "args": "python serve target"},
        {"config": "table", "args": f"SPEC_AUTOTUNE_K0_STATS={tmp}/catchups_0.jsonl python serve target"},
        {"config": "K=4", "same_as": "no speculation"},
    ]
    bench.without_tmp(rows, tmp)
    assert rows[1]["args"] == "SPEC_AUTOTUNE_K0_STATS=catchups_0.jsonl python serve target"
    assert rows[0]["args"] == "python serve target" and "args" not in rows[2]


def test_each_configuration_served_both_ways_is_paired_with_its_own_without_the_plugin() -> None:
    def row(label: str, kind: str, tps: list[float]) -> dict:
        return {
            "config": label,
            "kind": kind,
            "group": 0,
            "per_level_rounds": {4: {"tokens_per_second": tps}},
        }

    rows = [
        row("no speculation", "off", [100.0, 120.0]),
        row("K=0 table, vLLM as shipped", "table-zero", [80.0, 90.0]),
        row("K=0 table, plugin", "table-zero-plugin", [96.0, 108.0]),
        row("constant K=4", "constant", [110.0, 100.0]),
        row("constant K=4, plugin", "constant-plugin", [99.0, 90.0]),
        row("table 1-16:4, plugin", "table-plugin", [50.0, 60.0]),  # served with the plugin only
    ]
    summary: dict = {}
    lines = bench.plugin_pairs(rows, [4], summary)
    pairs = summary["plugin_over_without"]
    assert set(pairs) == {"K=0 table, plugin", "constant K=4, plugin"}
    assert math.isclose(pairs["K=0 table, plugin"]["4"]["value"], 1.2, rel_tol=1e-9)
    assert math.isclose(pairs["constant K=4, plugin"]["4"]["value"], 0.9, rel_tol=1e-9)
    assert len(lines) == 3 and lines[2].startswith("  constant K=4, plugin: 4: 0.90")


def test_a_drain_queues_twice_the_batch_with_spread_lengths_and_a_table_is_served_with_the_plugin() -> None:
    args = _args(levels="4", batches=[4], max_new_tokens=48, drain=True, tables=["1-2:4,3-4:0"], constants=[])
    request = bench.offline_request(args, "1-2:4,3-4:0")
    assert request["max_num_seqs"] == 4 and request["per_call"] == {"4": 8} and len(request["prompts"]) == 8
    assert sorted(request["lengths"]) == sorted(bench.drain_lengths(8, 48))
    assert min(request["lengths"]) == 24 and max(request["lengths"]) == 72
    assert request["lengths"][:4] != sorted(request["lengths"][:4])  # long and short mixed in the batch
    spec = request["spec"]
    assert spec[bench.TABLE_KEY] == [[1, 2, 4], [3, 4, 0]] and spec["num_speculative_tokens"] == 4
    configs = bench.offline_configs(args)
    assert configs[-1] == ("table 1-2:4 3-4:0, plugin", "table-plugin 1-2:4,3-4:0", "1-2:4,3-4:0", True)
    alt = bench.alternate_request(_args(**{**vars(args), "pause": 0.3}), {configs[-1][0]: "/x/c.jsonl"})
    assert [c.get("stats") for c in alt["configs"]] == [None, None, None, "/x/c.jsonl"]
    assert alt["stats_switch"] == "SPEC_AUTOTUNE_K0_STATS"
    plain = bench.offline_request(_args(drain=False), None)
    assert plain["per_call"] == {"1": 1, "4": 4} and plain["lengths"] == [8, 8, 8, 8]


def test_a_drain_report_counts_the_calls_tokens_and_pools_every_engines_catch_ups(tmp_path: Path) -> None:
    def run(seconds: float) -> dict:
        return {4: {"seconds": [seconds, seconds], "tokens": [[1]]}}

    label = "table 1-2:4 3-4:0, plugin"
    configs = [*bench.OFFLINE_CONFIGS, (label, "table-plugin 1-2:4,3-4:0", "1-2:4,3-4:0", True)]
    rounds = {c[0]: [run(2.0), run(2.2)] for c in configs}
    rounds[label] = [run(2.0 / 0.96), run(2.2 / 0.96)]
    caught = [{"rows": 2, "tokens": 100, "seconds": 0.01, "passes": 1}]
    result = {"host": "test", "dtype": "float32", "batches": [4], "max_new_tokens": 48, "configs": configs}
    result.update(inner=2, repeats=2, mode="offline", rounds=rounds, alternate=True, pause=0.3)
    result.update(
        tokens_per_call={"4": 380}, drain=True, lengths=[24, 72], catch_ups={label: [caught, 2 * caught]}
    )
    out = tmp_path / "drain.json"
    bench.offline_report(result, out)
    summary = json.loads(out.read_text())["summary"]
    assert math.isclose(summary["table-plugin 1-2:4,3-4:0"]["4"]["value"], 0.96, rel_tol=1e-9)
    assert summary["catch_ups"][label]["count"] == 3 and "plugin_over_without" not in summary
    stored = json.loads(out.read_text())
    assert stored["tokens_per_call"] == {"4": 380}
