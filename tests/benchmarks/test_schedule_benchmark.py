"""benchmarks/_schedule.py: the table the point estimates name and what serving it costs, on
synthetic rows shaped as Plan writes them."""

from __future__ import annotations

from benchmarks import _schedule

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


class FakeStack:
    """A backend whose every run is one call logged in order; tokens/s = 100 x the call's number."""

    def __init__(self, keep_servers: int = 1) -> None:
        self.keep_servers, self.calls, self.kept, self.closes, self.server = keep_servers, [], [], 0, None
        self.started: list[tuple[str, int]] = []  # (command, calls so far) per server started ahead

    def server_for(self, command):
        self.started.append((command[0], len(self.calls)))

    def run_command(self, command, batch, seed, records=None, with_trace=False):  # noqa: ARG002
        from types import SimpleNamespace

        from autotune.records import LevelMetrics

        self.calls.append((command[0], seed))
        self.kept.append(self.keep_servers)
        if command[0] == "broken":
            raise _schedule.ServerError("server died")
        tps = 100.0 * len(self.calls)
        level = LevelMetrics(tokens_per_second=tps)
        if records is not None:
            records[1] = [SimpleNamespace(output_tokens=[1, 2])]
        return SimpleNamespace(tokens_per_second=tps, latency_ms=1.0, per_level={1: level}, trace=None)

    def close(self) -> None:
        self.closes += 1


def test_together_interleaves_the_rounds_in_groups_the_kept_servers_hold_and_fills_the_rows() -> None:
    stack = FakeStack()
    plan = _schedule.Plan(stack, 16, (1,), 2, 10, True, interleave=2, bridge=False)
    with plan.together():
        a = plan.run("A", ["a", "--host"], "off")
        b = plan.run("B", ["b", "--host"], "constant")
        same = plan.run("A again", ["a", "--host"], "alias")  # the same command: A's measurements
        bad = plan.run("broken", ["broken", "--host"], "constant")
        c = plan.run("C", ["c", "--host"], "constant")
        assert "tokens_per_second_runs" not in a  # measured on leaving the block
    # groups of 2: A and B interleaved round by round (round 1 starts at B), then broken and C;
    # seeds pair the rounds
    assert stack.calls == [
        ("a", 10), ("b", 10), ("b", 11), ("a", 11), ("broken", 10), ("c", 10), ("c", 11)
    ]  # fmt: skip
    assert set(stack.kept) == {2} and stack.keep_servers == 2  # both servers alive while interleaved
    # every server of a group started before its first run: no run has fewer servers beside it
    assert stack.started == [("a", 0), ("b", 0), ("broken", 4), ("c", 4)]
    assert a["tokens_per_second_runs"] == [100.0, 400.0] and b["tokens_per_second_runs"] == [200.0, 300.0]
    assert c["tokens_per_second_runs"] == [600.0, 700.0]
    assert same["tokens_per_second_runs"] == a["tokens_per_second_runs"] and same["same_as"] == "A"
    assert same["config"] == "A again" and same["kind"] == "alias"
    assert "server died" in bad["error"] and "per_level_rounds" not in bad
    assert [r["config"] for r in plan.rows] == ["A", "B", "A again", "broken", "C"]  # the order given
    assert b["greedy_identical"] is True  # the same outputs as no speculation's


def test_run_outside_together_measures_at_once_in_a_fresh_server() -> None:
    stack = FakeStack(keep_servers=3)
    plan = _schedule.Plan(stack, 16, (1,), 2, 0, True)
    row = plan.run("A", ["a", "--host"], "off")
    assert stack.calls == [("a", 0), ("a", 1)] and row["tokens_per_second_runs"] == [100.0, 200.0]
    assert stack.closes == 2  # before (fresh) and after


def test_server_sets_restart_the_groups_servers_and_pair_the_ratios_set_by_set() -> None:
    stack = FakeStack(keep_servers=2)
    plan = _schedule.Plan(stack, 16, (1,), 4, 0, True, interleave=2, bridge=False, rounds_per_server=2)
    with plan.together():
        a = plan.run("A", ["a", "--host"], "off")
        b = plan.run("B", ["b", "--host"], "constant")
    # rounds rotated (A B, B A, A B, B A); every server stopped before round 2 (the second set),
    # and each set's servers started before its first run
    assert [c for c, _ in stack.calls] == list("abbaabba")
    assert stack.closes == 3  # before the group, before the second set, after the group
    assert stack.started == [("a", 0), ("b", 0), ("a", 4), ("b", 4)]
    assert a["rounds_per_server"] == b["rounds_per_server"] == 2
    assert b["tokens_per_second_runs"] == [200.0, 300.0, 600.0, 700.0]
    # one observation per set: geometric means (200x300)^.5/(100x400)^.5, (600x700)^.5/(500x800)^.5
    est = _schedule.Pairing(plan.rows).ratio(b, a, lambda r: r["tokens_per_second_runs"])
    sets = [(200 * 300 / (100 * 400)) ** 0.5, (600 * 700 / (500 * 800)) ** 0.5]
    assert est["n"] == 2 and abs(est["value"] - (sets[0] * sets[1]) ** 0.5) < 1e-9
    a4, b4 = ({**r, "rounds_per_server": None} for r in (a, b))  # the same rounds, paired one by one
    assert _schedule.Pairing([a4, b4]).ratio(b4, a4, lambda r: r["tokens_per_second_runs"])["n"] == 4
    plain = _schedule.Plan(FakeStack(), 16, (1,), 2, 0, True, rounds_per_server=2)  # one set: no sets
    assert "rounds_per_server" not in plain.run("A", ["a", "--host"], "off")


def test_one_round_per_server_runs_every_server_alone_each_configuration_in_every_place() -> None:
    stack = FakeStack(keep_servers=3)
    plan = _schedule.Plan(stack, 16, (1,), 3, 0, True, interleave=3, bridge=False, rounds_per_server=1)
    with plan.together():
        for name in "abc":
            plan.run(name.upper(), [name, "--host"], "off" if name == "a" else "constant")
    assert [c for c, _ in stack.calls] == list("abcbcacab")  # each configuration first once, last once
    assert [s for _, s in stack.calls] == [0, 0, 0, 1, 1, 1, 2, 2, 2]  # round r: seed r for all
    assert stack.started == []  # nothing started ahead: no server is kept beside another
    assert stack.closes == 1 + 9 + 1  # before the group, before every run, after the group
    assert [r["rounds_per_server"] for r in plan.rows] == [1, 1, 1]


def test_every_later_group_measures_the_bridge_again_and_its_ratios_go_through_it() -> None:
    stack = FakeStack()
    plan = _schedule.Plan(stack, 16, (1,), 2, 10, True, interleave=3)
    with plan.together():
        off = plan.run("off", ["off", "--host"], "off")
        for k in "bcde":
            plan.run(k, [k, "--host"], "constant")
    with plan.together():
        again = plan.run("off again", ["off", "--host"], "off-again")  # the drift check bridges its group
        plan.run("f", ["f", "--host"], "constant")
    # groups of 3: [off b c], then [d e] + the bridge, then [off-again f] (no extra bridge); each
    # group's second round starts at its second configuration
    assert [c for c, _ in stack.calls] == [
        *"off b c b c off".split(),
        *"d e off e off d".split(),
        *"off f f off".split(),
    ]
    labels = [r["config"] for r in plan.rows]
    assert labels == ["off", "b", "c", "off (bridge, group 2)", "d", "e", "off again", "f"]
    assert [r["group"] for r in plan.rows] == [0, 0, 0, 1, 1, 1, 2, 2]
    assert [r["config"] for r in plan.rows if r.get("bridge")] == [
        "off",
        "off (bridge, group 2)",
        "off again",
    ]
    assert off["bridge"] and again["bridge"] and plan.knobs == {}


def test_ratios_across_groups_cancel_the_drift_the_bridge_saw() -> None:
    def measured(label, kind, group, tps, bridge=False):
        return {
            **row(label, kind, {1: 0 if kind in ("off", "bridge") else 3}, {1: tps}),
            "group": group,
            "bridge": bridge,
            "tokens_per_second_runs": tps,
            "latency_ms_runs": [1.0] * len(tps),
        }

    def fill(r):
        lv = r["per_level_rounds"][1]
        lv.update(
            tpot_ms_p95=[10.0] * 3,
            generated_tokens=[100] * 3,
            wall_s=[100 / x for x in lv["tokens_per_second"]],
        )
        return r

    # the host ran 1.5x faster for group 1: K=3 looks 1.8x no speculation unpaired, 1.2x through the bridge
    rows = [
        fill(measured("no speculation", "off", 0, [100, 104, 96], bridge=True)),
        fill(measured("K=3", "constant", 1, [180, 187, 173])),
        fill(measured("no speculation (bridge)", "bridge", 1, [150, 156, 144], bridge=True)),
    ]
    _schedule.analyse(rows, (1,), slo=50.0)
    k3 = rows[1]["aggregate"]["over_no_speculation"]
    assert k3["across"] == "bridge" and round(k3["value"], 3) == 1.2
    assert rows[1]["levels"][1]["over_no_speculation"]["across"] == "bridge"
    drift = rows[2]["aggregate"]["over_no_speculation"]  # the bridge over the first: the drift, unpaired
    assert drift["across"] == "drift" and round(drift["value"], 2) == 1.5
    unbridged = [dict(r, bridge=False) for r in rows]
    _schedule.analyse(unbridged, (1,), slo=50.0)
    assert unbridged[1]["aggregate"]["over_no_speculation"]["across"] == "groups"
    assert round(unbridged[1]["aggregate"]["over_no_speculation"]["value"], 2) == 1.8
