"""benchmarks/_transfer.measure_plan: back to back per fresh server, or interleaved rounds across kept servers."""

from __future__ import annotations

from types import SimpleNamespace

from autotune.backends.http_backend import HttpBackend
from autotune.backends.server import ServerError
from autotune.records import LevelMetrics
from benchmarks._transfer import measure_plan


class StackStub:
    """run_command records (command, round); tokens/s = 100 x the command's number + the round."""

    def __init__(self, keep_servers: int, broken: str | None = None) -> None:
        self.keep_servers, self.broken = keep_servers, broken
        self.calls: list[tuple[str, int]] = []
        self.closes = 0
        self.server = SimpleNamespace(startup_s=1.5)

    remeasure_order = HttpBackend.remeasure_order  # interleaved while keep_servers holds them all

    def close(self) -> None:
        self.closes += 1

    def server_for(self, command):  # a server started ahead of its group's first round
        if command[1] == self.broken:
            raise ServerError(f"{command[1]} died")

    def run_command(self, command, batch, seed, records=None, with_trace=False):  # noqa: ARG002
        name = command[1]
        if name == self.broken:
            raise ServerError(f"{name} died")
        self.calls.append((name, seed))
        tps = 100.0 * int(name[1:]) + seed
        if records is not None:
            records[1] = [SimpleNamespace(output_tokens=[1, 2, int(name[1:])])]
        level = LevelMetrics(tokens_per_second=tps, acceptance_rate=0.5)
        return SimpleNamespace(tokens_per_second=tps, latency_ms=1.0, per_level={1: level}, trace=None)


def plan() -> list[tuple[str, list[str]]]:
    cmd = lambda n: ["python", f"c{n}", "--host", "127.0.0.1"]  # noqa: E731
    return [
        ("no speculation", cmd(1)),
        ("a", cmd(2)),
        ("b", cmd(3)),
        ("b again", cmd(3)),
        ("no speculation (last)", cmd(1)),
    ]


def test_interleaved_rounds_run_every_configuration_before_the_next_round() -> None:
    stub = StackStub(keep_servers=5)
    rows = measure_plan(stub, plan(), batch=4, repeats=2, seed=10, interleaved=True)
    first, second = stub.calls[:4], stub.calls[4:]
    assert [s for _, s in first] == [10] * 4 and [s for _, s in second] == [11] * 4
    assert [n for n, _ in first] == ["c1", "c2", "c3", "c1"]  # "b again" is "b"'s row, not a run
    by = {r["config"]: r for r in rows}
    assert by["a"]["per_level_runs"] == {"1": [210.0, 211.0]} and by["a"]["order"] == "interleaved"
    assert (
        by["b again"]["same_as"] == "b" and by["b again"]["tokens_per_second"] == by["b"]["tokens_per_second"]
    )
    assert by["no speculation (last)"]["tokens_per_second_runs"] == [110.0, 111.0]
    a = by["a"]  # the row the transfer summaries and the drafters benchmark read
    assert (a["tokens_per_second"], a["min"], a["max"], a["acceptance_rate"]) == (210.5, 210.0, 211.0, 0.5)
    assert a["per_level"][1]["tokens_per_second"] == 211.0 and a["outputs"] == [[1, 2, 2]]
    assert stub.closes == 2  # fresh servers once, then closed at the end


def test_back_to_back_where_the_host_keeps_too_few_servers_and_a_failed_server_is_a_row() -> None:
    stub = StackStub(keep_servers=2, broken="c2")
    rows = measure_plan(stub, plan(), batch=4, repeats=2, seed=0, interleaved=True)
    assert stub.calls == [("c1", 0), ("c1", 1), ("c3", 0), ("c3", 1), ("c1", 0), ("c1", 1)]
    assert stub.closes == 5  # a fresh server for each of the four measured entries, closed at the end
    by = {r["config"]: r for r in rows}
    assert "c2 died" in by["a"]["error"] and by["b"]["order"] == "back to back"
    assert [r["config"] for r in rows] == [name for name, _ in plan()]
    broken_b = measure_plan(StackStub(keep_servers=5, broken="c3"), plan(), batch=4, repeats=1, seed=0)
    assert [r["config"] for r in broken_b if "error" in r] == ["b", "b again"]  # its alias failed with it
