"""Shared body of the schedule benchmarks: K per load level, measured inside one serving stack.

``schedule_vllm.py`` and ``schedule_llamacpp.py`` run configurations through a :class:`Plan`:
each configuration gets its own server (the backend's launcher, the same host flags) and runs
every load level of the workload ``repeats`` times, round r with seed ``budget.seed + r`` for
every configuration, so rounds are paired across configurations as in
``_transfer.measure_plan``. Configurations given together (:meth:`Plan.together`) are
interleaved: their servers are up at once (at most ``--interleave``, by default as many as the
backend keeps alive: for vLLM what the host's memory holds, all started before the first round so
every run has the same servers beside it) and round r of each runs before round r + 1 of any,
round r starting at the r-th configuration (no configuration always first or last), so host drift
hits them alike; a configuration given alone runs its rounds back to back in a fresh server.
Every group after the first measures no speculation again (a ``bridge`` row, ``--no-bridge`` to
spare the slot), so a ratio between rows of different groups is
(A / bridge in A's group) x (bridge / B in B's group): drift between the groups cancels instead of
passing for a difference (``autotune.stats.bridged_ratio``; each ratio's ``across`` says so).
With ``rounds_per_server`` R (``--rounds-per-server``), every configuration's server is started
afresh every R rounds (a server set: the group's servers stopped together; with R = 1 nothing is
kept, each run has the host to itself): each set is then one observation in the ratios
(:func:`server_sets`: the geometric mean of its rounds), so an interval counts the offsets
between two servers of the same command, which rounds in one server share and cannot show. Every
round's per-level metrics are kept (``per_level_rounds``), and the arrival trace's
(``trace_rounds``) when the workload has one. A command already measured is
not run twice (the row says ``same_as``), except no speculation, measured first and again last
(the drift check).

:func:`analyse` then adds, per row and load level, the median tokens/s with min-max over rounds,
the median TPOT p95, and the paired per-level ratios (geometric mean over rounds, 95% interval)
over no speculation and over the best constant at that level (the fastest median among no
speculation and the grid there); per row, the traffic-weighted tokens/s of the sweep (generated
tokens over wall time of all levels: ``TrialResult.tokens_per_second``), the trace's tokens/s and
the goodput under the TPOT SLO. Goodput definition (one of the two the issue allows): per round,
the generated tokens of the levels whose TPOT p95 meets ``--slo-tpot-ms`` over the wall time of
*all* levels, so a level that misses the SLO contributes its time but not its tokens (SLO-meeting
tokens per second of the whole sweep); the levels whose median TPOT p95 meets the SLO are listed
next to it. :func:`report` writes the JSON atomically (machine paths made portable) and prints a
table per level, one aggregate table and the summary.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.backends.server import ServerError
from autotune.cli.text import columns, fmt
from autotune.config import WorkloadConfig
from autotune.decide.decision import round_order
from autotune.decide.selection import LevelChoice, TablePlan, choose_with_margin, plan_table
from autotune.knobs import Knobs
from autotune.records import LEVEL_KEYS, PER_POSITION, Point
from autotune.stats import (
    Estimate,
    bridged_ratio,
    pairable,
    paired_half_width,
    paired_ratio,
    significantly_below,
)
from benchmarks._common import claim_dir, portable
from profiles.schema import Profile

ROOT = Path(__file__).resolve().parents[1]
CONSTANT_KINDS = ("off", "constant")  # the rows the best constant (overall and per level) is taken from


def parse_table(text: str) -> tuple[tuple[int, int], ...]:
    """``--table`` text, vLLM's ranges written as :func:`autotune.knobs.table_text` prints them
    ("1-8:3,9-16:2", commas or spaces), as ``Knobs.for_table`` points (upper batch size, K).

    Example:
        >>> parse_table("1-8:3,9-16:2"), parse_table("1:5 2-16:1")
        (((8, 3), (16, 2)), ((1, 5), (16, 1)))
        >>> parse_table("2-16:1")
        Traceback (most recent call last):
        ...
        ValueError: table '2-16:1': its ranges must start at 1 and follow each other (got 2-16 after 0)
    """
    points, last = [], 0
    for entry in text.replace(",", " ").split():
        span, _, k = entry.partition(":")
        lo, _, hi = span.partition("-")
        try:
            lo_i, hi_i, k_i = int(lo), int(hi or lo), int(k)
        except ValueError:
            raise ValueError(f"table {text!r}: {entry!r} is not LO-HI:K") from None
        if lo_i != last + 1 or hi_i < lo_i or k_i < 0:
            raise ValueError(
                f"table {text!r}: its ranges must start at 1 and follow each other (got {span} after {last})"
            )
        points.append((hi_i, k_i))
        last = hi_i
    if not points:
        raise ValueError(f"table {text!r}: no range")
    return tuple(points)


def arguments(doc: str, stack: str, grid_help: str, tables: bool = False) -> argparse.Namespace:
    """The flags both schedule benchmarks take (``tables``: ``--table``, a stack that serves tables),
    checked; with ``--resume``, the earlier run's rounds and grid."""
    p = parser(doc, stack, grid_help, tables)
    args = p.parse_args()
    for text in getattr(args, "tables", []):
        try:
            parse_table(text)
        except ValueError as e:
            p.error(f"--table: {e}")
    if args.measured_only and args.resume is None:
        p.error("--measured-only needs --resume JSON")
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    if args.interleave is not None and args.interleave < 1:
        p.error("--interleave must be >= 1")
    if args.rounds_per_server is not None and args.rounds_per_server < 1:
        p.error("--rounds-per-server must be >= 1")
    if args.resume is not None:  # the earlier run's rounds and grid: new rows pair with its rounds
        try:
            earlier = json.loads(args.resume.read_text())
        except (OSError, ValueError) as e:
            p.error(f"--resume {args.resume}: {e}")
        args.repeats = earlier.get("repeats", args.repeats)
        args.rounds_per_server = earlier.get("rounds_per_server", args.rounds_per_server)
        if earlier.get("grid"):
            args.grid = ",".join(str(k) for k in earlier["grid"])
    return args


def parser(doc: str, stack: str, grid_help: str, tables: bool) -> argparse.ArgumentParser:
    """The parser of :func:`arguments`."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=ROOT / "tune.yaml")
    p.add_argument("--repeats", type=int, default=3, help="rounds per configuration")
    p.add_argument(
        "--interleave",
        type=int,
        default=None,
        metavar="N",
        help="configurations whose servers are alive at once, their rounds interleaved (default: the "
        "backend's keep_servers, sized from the host's memory for vLLM; 1: back to back)",
    )
    p.add_argument(
        "--no-bridge",
        dest="bridge",
        action="store_false",
        help="do not measure no speculation again in every later group (ratios across groups are then "
        "unpaired in time)",
    )
    add_rounds_per_server(p)
    p.add_argument("--grid", default="1,2,3,5", help=grid_help)
    p.add_argument(
        "--slo-tpot-ms",
        type=float,
        default=50.0,
        help="TPOT p95 SLO of the goodput column (ms)",
    )
    p.add_argument(
        "--engine-profile",
        metavar="ID",
        type=int,
        default=None,
        help="profile id (default: newest engine-backend one)",
    )
    p.add_argument(
        f"--{stack}-profile",
        dest="stack_profile",
        metavar="ID",
        type=int,
        default=None,
        help=f"profile id (default: newest {stack}-backend one)",
    )
    p.add_argument("--out", type=Path, default=claim_dir(f"schedule_{stack}") / f"schedule_{stack}.json")
    add_resume_and_table_flags(p, tables)
    return p


def add_rounds_per_server(p: argparse.ArgumentParser) -> None:
    """``--rounds-per-server R``: the :class:`Plan`'s server sets."""
    p.add_argument(
        "--rounds-per-server",
        type=int,
        default=None,
        metavar="R",
        help="start every configuration's server afresh every R rounds (a server set), each set one "
        "observation in the ratios, so their intervals count the offsets between servers of the same "
        "command (default: all rounds in one server)",
    )


def add_resume_and_table_flags(p: argparse.ArgumentParser, tables: bool) -> None:
    """``--resume``, ``--measured-only`` and, where the stack serves tables, ``--table``."""
    p.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="JSON",
        help="reuse the configurations an earlier (interrupted) run of this benchmark measured, by label "
        "(its --repeats and --grid too: new rows pair with its rounds)",
    )
    p.add_argument(
        "--measured-only",
        action="store_true",
        help="with --resume: measure nothing new, report what the JSON holds (a partial run)",
    )
    if tables:
        p.add_argument(
            "--table",
            dest="tables",
            action="append",
            default=[],
            metavar="RANGES",
            help="also serve this table beside the grid, in the first group (repeatable), e.g. "
            "1-16:2 (one K everywhere: what the table mechanism costs over the constant) or 1-8:3,9-16:1",
        )


def grid_values(text: str) -> list[int]:
    """``"1,2,3,5"`` -> ``[1, 2, 3, 5]`` (K >= 1 each)."""
    values = [int(x) for x in text.split(",") if x.strip()]
    if not values or any(k < 1 for k in values):
        sys.exit(f"error: --grid {text!r}: give K values >= 1, e.g. 1,2,3,5")
    return values


def k_at(schedule: Sequence[tuple[int, int]], batch: int) -> int:
    """A by-batch-size schedule's K with ``batch`` running requests (the next tuned batch size up,
    the last one's above it).

    Example:
        >>> [k_at(((1, 5), (4, 3), (16, 0)), b) for b in (1, 2, 8, 32)]
        [5, 3, 0, 0]
    """
    points = sorted(schedule)
    return next((g for b, g in points if b >= batch), points[-1][1])


def _median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


class Plan:
    """Configurations measured one after the other; ``rows`` in the order run (see the module docstring)."""

    def __init__(
        self,
        backend,
        batch: int,
        levels: Sequence[int],
        repeats: int,
        seed: int,
        greedy: bool,
        checkpoint=None,
        host_flag: str = "--host",
        interleave: int = 1,
        bridge: bool = True,
        rounds_per_server: int | None = None,
    ) -> None:
        self.backend, self.batch, self.levels = backend, batch, list(levels)
        self.repeats, self.seed, self.greedy, self.host_flag = repeats, seed, greedy, host_flag
        self.checkpoint = checkpoint  # called with the rows after each configuration (partial JSON)
        self.rows: list[dict] = []
        self.knobs: dict[str, Knobs] = {}  # label -> knobs, where the row is a Knobs (not a profile)
        self._by_command: dict[str, dict] = {}
        self._base_outputs: dict | None = None
        self.previous: dict[str, dict] = {}  # label -> row of an earlier run (resume), see :meth:`resume`
        self.measure_new = True
        self.skipped: list[str] = []  # labels --measured-only did not measure
        self.interleave = interleave  # configurations measured together at most (see :meth:`together`)
        if backend is not None and getattr(backend, "keep_servers", 1) < interleave:
            backend.keep_servers = interleave  # a group's servers stay up across its rounds
        self.bridge = bridge  # measure the first no speculation again in every later group (see together)
        # servers started afresh every this many rounds (a server set, see server_sets); None: never
        self.rounds_per_server = rounds_per_server if (rounds_per_server or repeats) < repeats else None
        self.keep_outputs = False  # a row also keeps its first level's output tokens (``outputs``)
        self._bridge: tuple[dict, list[str]] | None = None  # (row, command) of that configuration
        self._groups = 0  # groups measured so far: a row's ``group``
        self._queue: list[tuple[dict, list[str]]] | None = None  # inside together(): to measure
        self._aliases: list[tuple[dict, dict]] = []  # (alias row, the row it names) not yet filled

    def resume(self, path: Path, measure_new: bool = True) -> None:
        """Take the measured rows of an earlier run's JSON (``path``) instead of measuring them again;
        with ``measure_new`` False, configurations it lacks are skipped (a report of a partial run)."""
        data = json.loads(path.read_text())
        for row in data.get("rows", []):
            if "error" in row or "per_level_rounds" not in row:
                continue
            row["per_level_rounds"] = {int(b): v for b, v in row["per_level_rounds"].items()}
            row["k_per_level"] = {int(b): k for b, k in (row.get("k_per_level") or {}).items()}
            self.previous[row["config"]] = row
        self._groups = 1 + max((r.get("group", -1) for r in self.previous.values()), default=-1)
        self.measure_new = measure_new

    def resumed_label(self, prefix: str) -> str | None:
        """The label of the earlier run's row that starts with ``prefix`` (a profile's row when the
        store no longer holds that profile), appended to ``rows``; None when it has none."""
        for label, row in self.previous.items():
            if label.startswith(prefix):
                self.rows.append(row)
                print(f"{label}: measured in the resumed run, its profile not in this store", file=sys.stderr)
                return label
        return None

    def profiles(
        self, wanted: Sequence[tuple[str, dict | None, str]], labels: list[str]
    ) -> Iterator[tuple[str, dict]]:
        """Of ``wanted`` (row label, stored profile or None, the command that makes one): the row
        label and profile of each stored one, its label appended to ``labels``; a profile the store
        lacks is the resumed run's row where it has one (its label appended), else a note."""
        for label, prof, how in wanted:
            if prof is None and (earlier := self.resumed_label(f"{label} (profile #")):
                labels.append(earlier)
                continue
            if prof is None:
                print(
                    f"note: no {label.split()[0]} profile for this host and pair (run `{how}`)",
                    file=sys.stderr,
                )
                continue
            labels.append(f"{label} (profile #{prof['id']})")
            yield labels[-1], prof

    @contextlib.contextmanager
    def together(self) -> Iterator[None]:
        """Configurations given to :meth:`run` inside the block are measured on leaving it, their
        rounds interleaved (A B C B C A ...), so drift hits them alike: in groups of at most
        ``interleave`` (the servers kept alive at once; the backend's ``keep_servers``), each group's
        servers started once. The rows :meth:`run` returned are filled in place then.

        With ``bridge`` (and ``interleave`` > 1), every group after the one that measured no
        speculation first measures it again (a ``bridge`` row, unless the group already holds that
        command, as the drift check does), so :func:`analyse` pairs rows of different groups
        through it (:func:`autotune.stats.bridged_ratio`) instead of comparing minutes apart."""
        if self._queue is not None:
            raise RuntimeError("Plan.together() does not nest")
        self._queue = []
        try:
            yield
            queue, self._queue = self._queue, None
            size = max(1, self.interleave)
            while queue:
                bridge = self._bridge_for(queue[:size])
                if bridge is None or any(entry is bridge for entry in queue[:size]):
                    group, queue = queue[:size], queue[size:]
                else:  # room for the bridge
                    group, queue = [*queue[: size - 1], bridge], queue[size - 1 :]
                self.backend.close()  # fresh servers for every group
                self._measure(group)
        finally:
            self._queue = None
            self.backend.close()

    def _bridge_for(self, group: list[tuple[dict, list[str]]]) -> tuple[dict, list[str]] | None:
        """The bridge entry to measure in ``group`` (its own no speculation where it holds that
        command among its first ``interleave - 1``), or None: no bridging, no bridge measured yet,
        or the bridge's own group."""
        if not self.bridge or self.interleave < 2 or self._bridge is None:
            return None
        first, command = self._bridge
        if "group" not in first or "error" in first or any(row is first for row, _ in group):
            return None
        for entry in group[: self.interleave - 1]:
            if entry[1] == command:
                entry[0]["bridge"] = True
                return entry
        label = f"{first['config']} (bridge, group {self._groups + 1})"
        row = {k: first[k] for k in ("knobs", "k_per_level", "args") if k in first}
        row.update(config=label, kind="bridge", bridge=True)
        if first["config"] in self.knobs:
            self.knobs[label] = self.knobs[first["config"]]
        self.rows.insert(self.rows.index(group[0][0]), row)
        return row, command

    def run(
        self,
        label: str,
        command: list[str],
        kind: str,
        knobs: Knobs | None = None,
        k_per_level: dict[int, int] | None = None,
    ) -> dict:
        """Measure ``command`` in a fresh server (unless already measured); the row, appended to ``rows``.
        Inside :meth:`together` it is measured on leaving the block, and the row filled then.

        ``kind``: ``off`` (no speculation, first), ``constant`` (the grid), ``table``, ``table-zero``,
        ``table-fastest``, ``table-asked`` (``--table``),
        ``profile``, ``alias`` (a row pointing at a measured one) or ``off-again`` (the drift check).
        """
        if knobs is not None:
            self.knobs[label] = knobs
            k_per_level = k_per_level or {
                b: knobs.gamma_at(b) if knobs.speculates else 0 for b in self.levels
            }
        key = json.dumps(command)
        if label in self.previous:
            return self._resumed_row(label, key, command)
        if not self.measure_new:
            print(f"{label}: not in the resumed run, skipped (--measured-only)", file=sys.stderr)
            self.skipped.append(label)
            return {"config": label, "kind": kind, "error": "not measured (--measured-only)"}
        if key in self._by_command and kind != "off-again":
            prior = self._by_command[key]
            row = {"config": label, "kind": kind, "same_as": prior["config"]}
            self.rows.append(row)
            print(f"{label}: same command as {prior['config']}, not run again", file=sys.stderr)
            self._aliases.append((row, prior))
            if self._queue is None:
                self._fill_aliases()
            return row
        end = command.index(self.host_flag) if self.host_flag in command else len(command)
        row: dict[str, Any] = {
            "config": label,
            "kind": kind,
            "knobs": knobs.label if knobs is not None else None,
            "k_per_level": k_per_level,
            "args": shlex.join(command[1:end]),
        }
        self._by_command.setdefault(key, row)
        self.rows.append(row)
        self._take_bridge(row, command)
        if self._queue is not None:
            self._queue.append((row, command))
        else:
            self.backend.close()  # a fresh server for every configuration
            self._measure([(row, command)])
            self.backend.close()
        return row

    def _resumed_row(self, label: str, key: str, command: list[str]) -> dict:
        """The resumed run's row of ``label`` (command ``key``) in place of a measurement, appended
        to ``rows`` after its group's bridge."""
        row = self.previous[label]
        self.rows.extend(  # its group's bridge, which no run() names, goes back in the report with it
            prev
            for prev in self.previous.values()
            if prev["kind"] == "bridge"
            and prev.get("group") == row.get("group")
            and all(prev is not r for r in self.rows)
        )
        self.rows.append(row)
        self._by_command.setdefault(key, row)
        self._take_bridge(row, command)
        print(f"{label}: measured in the resumed run, not run again", file=sys.stderr)
        self._checkpoint()
        return row

    def _take_bridge(self, row: dict, command: list[str]) -> None:
        """The first no speculation given is the bridge every later group measures again."""
        if self._bridge is None and row["kind"] == "off":
            self._bridge = (row, command)
            row["bridge"] = True

    def _measure(self, group: Sequence[tuple[dict, list[str]]]) -> None:
        """Every round of every configuration of ``group``, interleaved (round r of each, then r + 1;
        round r starts at configuration r mod n, so none is always first or last), each in its own
        server kept alive across the rounds (across ``rounds_per_server`` of them, then the group's
        servers are started afresh); the rows filled in place.

        Every run sees the same servers alive beside its own: with servers kept, a set's servers
        are all started before its first round (else the first configuration of a round would run
        alone and the last beside every other one, idle but awake); with one round per server
        (``rounds_per_server`` 1) nothing is kept, and each run has the host to itself."""
        records: dict[str, dict] = {row["config"]: {} for row, _ in group}
        runs: dict[str, list] = {row["config"]: [] for row, _ in group}
        startup: dict[str, float | None] = {}
        if len(group) > 1:
            print(f"interleaved: {', '.join(row['config'] for row, _ in group)}", file=sys.stderr)
        for row, _ in group:
            row["group"] = self._groups
        self._groups += 1
        alone = self.rounds_per_server == 1  # a server serves one round: none is kept beside another
        per_set = self.rounds_per_server or self.repeats
        for n, (i, r) in enumerate(round_order(len(group), self.repeats, interleaved=True, rotate=True)):
            row, command = group[i]
            label = row["config"]
            first_of_set = n % len(group) == 0 and r % per_set == 0  # the set's first run
            if alone or (first_of_set and r):
                self.backend.close()  # the next server set (or the next run's own host)
            if first_of_set and not alone and len(group) > 1:
                self._start_all(group)
            if "error" in row:
                continue
            keep_records = records[label] if r == 0 else None
            try:
                res = self.backend.run_command(
                    command, self.batch, self.seed + r, keep_records, with_trace=True
                )
            except ServerError as exc:
                print(f"{label}: failed: {exc}", file=sys.stderr)
                row["error"] = str(exc)[:2000]
                continue
            runs[label].append(res)
            startup.setdefault(label, self.backend.server.startup_s if self.backend.server else None)
        for row, _ in group:
            if "error" not in row:
                self._fill(row, runs[row["config"]], records[row["config"]], startup.get(row["config"]))
        self._fill_aliases()
        self._checkpoint()

    def _start_all(self, group: Sequence[tuple[dict, list[str]]]) -> None:
        """Start the server of every configuration of ``group`` (kept alive: the backend keeps as
        many as the group holds); a server that fails to start marks its row."""
        for row, command in group:
            if "error" in row:
                continue
            try:
                self.backend.server_for(command)
            except ServerError as exc:
                print(f"{row['config']}: failed to start: {exc}", file=sys.stderr)
                row["error"] = str(exc)[:2000]

    def _fill(self, row: dict, runs: list, records: dict, startup_s: float | None) -> None:
        label, kind = row["config"], row["kind"]
        tps = [res.tokens_per_second for res in runs]
        if self.rounds_per_server:
            row["rounds_per_server"] = self.rounds_per_server
        row.update(
            startup_s=startup_s,
            tokens_per_second_runs=tps,
            latency_ms_runs=[res.latency_ms for res in runs],
            per_level_rounds={
                b: {k: [getattr(res.per_level[b], k) for res in runs] for k in (*LEVEL_KEYS, PER_POSITION)}
                for b in runs[0].per_level
            },
        )
        traces = [getattr(res, "trace", None) for res in runs]  # workload.trace: run after the levels
        if all(t is not None for t in traces):
            row["trace_rounds"] = [t.to_json() for t in traces]
        outputs = {b: [rec.output_tokens for rec in recs] for b, recs in records.items()}
        has_ids = all(-1 not in out for recs in outputs.values() for out in recs)  # llama-server: no ids
        if self._base_outputs is None and kind == "off":
            self._base_outputs = outputs
        elif self._base_outputs is not None and self.greedy and has_ids:
            row["greedy_identical"] = outputs == self._base_outputs
        if self.keep_outputs:
            row["outputs"] = outputs[min(outputs)] if outputs else []
        trace = row.get("trace_rounds")
        print(
            f"{label}: {_median(tps):.1f} tok/s over the sweep ({min(tps):.1f}-{max(tps):.1f})"
            + (f", trace {_median([t['tokens_per_second'] for t in trace]):.1f} tok/s" if trace else "")
            + (f", start-up {startup_s:.1f} s" if startup_s is not None else ""),
            file=sys.stderr,
        )

    def _fill_aliases(self) -> None:
        """Rows that name a measured one (the same command) take its measurements once it has them."""
        waiting = []
        for row, prior in self._aliases:
            if "tokens_per_second_runs" in prior or "error" in prior:
                row.update(
                    {**prior, "config": row["config"], "kind": row["kind"], "same_as": prior["config"]}
                )
            else:
                waiting.append((row, prior))
        self._aliases = waiting

    def _checkpoint(self) -> None:
        if self.checkpoint is not None:
            self.checkpoint(self.rows)

    def ok(self, kinds: Sequence[str] | None = None) -> list[dict]:
        """The measured rows (of ``kinds``)."""
        return [r for r in self.rows if "error" not in r and (kinds is None or r["kind"] in kinds)]

    def point(self, row: dict) -> Point:
        """A measured row as a :class:`Point` with paired rounds per level (for the selection rules)."""
        knobs = self.knobs.get(row["config"]) or Knobs("none", 0, max_batch_size=self.batch)
        tps, lat = row["tokens_per_second_runs"], row["latency_ms_runs"]
        levels = row["per_level_rounds"]
        return Point(
            knobs,
            _median(tps),
            _median(lat),
            per_batch={b: _median(v["tokens_per_second"]) for b, v in levels.items()},
            rounds=tuple(zip(tps, lat, strict=True)),
            per_batch_rounds={b: tuple(v["tokens_per_second"]) for b, v in levels.items()},
        )

    def table_plan(self, drafter: str) -> TablePlan | None:
        """The tool's per-level rule and the table it serves (:func:`autotune.decide.selection.plan_table`)
        over no speculation and the grid measured so far, anchored on the constant the tool chooses
        over the sweep (:meth:`constant_choice`), the fastest constant K where that is none; None
        before anything is measured."""
        rows = self.ok(CONSTANT_KINDS)
        label, _ = self.constant_choice()
        if label is None:
            return None
        points = [self.point(r) for r in rows]
        constant = next(p for r, p in zip(rows, points, strict=True) if r["config"] == label)
        ks = [p for p in points if p.knobs.gamma > 0]
        best_static = max(ks, key=lambda p: p.tokens_per_second) if ks else None
        return plan_table(points, self.levels, constant, best_static, drafter)

    def fastest_table(self) -> tuple[tuple[int, int], ...]:
        """Per level, the K of the grid's fastest constant there this run (median tokens/s, no margin,
        K >= 1: a table's K=0 range still runs the drafter): the table the point estimates name,
        whatever the noise says; () before a constant K is measured."""
        rows = [r for r in self.ok(("constant",)) if (r.get("k_per_level") or {}).get(self.levels[0])]
        if not rows:
            return ()

        def tps(r: dict, b: int) -> float:
            return _median(r["per_level_rounds"][b]["tokens_per_second"])

        return tuple((b, max(rows, key=lambda r, b=b: tps(r, b))["k_per_level"][b]) for b in self.levels)

    def level_choices(self, drafter: str) -> list[LevelChoice]:
        """The per-level choices of :meth:`table_plan` (speculation off included)."""
        plan = self.table_plan(drafter)
        return [] if plan is None else plan.levels

    def constant_choice(self) -> tuple[str | None, str]:
        """The tool's margin rule (:func:`autotune.decide.selection.choose_with_margin`, on the sweep's
        traffic-weighted tokens/s) over no speculation and the grid: ``(row label, reason)``."""
        rows = self.ok(CONSTANT_KINDS)
        if not rows:
            return None, "nothing measured"
        points = [self.point(r) for r in rows]
        choice = choose_with_margin(points, has_slo=False)  # max tokens/s, by a margin
        label = rows[next(i for i, p in enumerate(points) if p is choice.point)]["config"]
        return label, choice.reason.removeprefix("highest throughput meeting every SLO").lstrip("; ")


# analysis ------------------------------------------------------------------------------------------


def server_sets(xs: Sequence[float | None], rounds_per_server: int | None) -> list[float | None]:
    """A row's per-round values as one observation per server set: the geometric mean of each run of
    ``rounds_per_server`` consecutive rounds (one server's), the rounds themselves when None. Paired
    over sets, a ratio's interval counts what differs between two servers of the same command.

    Example:
        >>> [round(x, 9) for x in server_sets([1.0, 4.0, 2.0, 8.0, 3.0], 2)], server_sets([1.0, 2.0], None)
        ([2.0, 4.0, 3.0], [1.0, 2.0])
    """
    if not rounds_per_server:
        return list(xs)
    chunks = [xs[i : i + rounds_per_server] for i in range(0, len(xs), rounds_per_server)]
    return [
        math.exp(statistics.fmean(math.log(x) for x in c))
        if all(x is not None and x > 0 for x in c)
        else None
        for c in chunks
    ]


def rounds_text(repeats: int, rounds_per_server: int | None) -> str:
    """The report header's rounds: ``8 rounds per server``, or in server sets.

    Example:
        >>> rounds_text(8, None), rounds_text(8, 2)
        ('8 rounds per server', '8 rounds, every server started afresh every 2 (4 server sets)')
    """
    if not rounds_per_server or rounds_per_server >= repeats:
        return f"{repeats} rounds per server"
    sets = -(-repeats // rounds_per_server)
    return f"{repeats} rounds, every server started afresh every {rounds_per_server} ({sets} server sets)"


def _ratio(a: Sequence[float], b: Sequence[float], per_server: int | None = None) -> Estimate | None:
    """:func:`autotune.stats.paired_ratio` (over server sets, see :func:`server_sets`), None where the
    rounds cannot be paired."""
    a, b = server_sets(a, per_server), server_sets(b, per_server)
    return paired_ratio(a, b) if pairable(a, b) else None


class Pairing:
    """Ratios of one row's rounds over another's: paired round by round where both were measured in
    one group (interleaved), through the group's bridge rows where they were not
    (:func:`autotune.stats.bridged_ratio`); rows of different groups with no bridge in either are
    paired round by round as before (unpaired in time: the dict says ``"across": "groups"``). Two
    bridge rows (no speculation in two groups) are compared directly: that ratio is the drift
    between the groups (``"across": "drift"``), which a bridged ratio would cancel to 1.

    Example:
        >>> def row(name, group, tps, bridge=False):
        ...     return {"config": name, "group": group, "bridge": bridge, "tokens_per_second_runs": tps}
        >>> rows = [row("off", 0, [100, 110], True), row("K=3", 1, [150, 165]),
        ...         row("off (bridge)", 1, [120, 132], True)]
        >>> est = Pairing(rows).ratio(rows[1], rows[0], lambda r: r["tokens_per_second_runs"])
        >>> round(est["value"], 3), est["across"]
        (1.25, 'bridge')
    """

    def __init__(self, rows: list[dict]) -> None:
        self.bridges = {r["group"]: r for r in rows if r.get("bridge") and "group" in r and "error" not in r}

    def ratio(self, a: dict, b: dict, series) -> dict | None:
        """``series(a)`` over ``series(b)``: :meth:`Estimate.as_dict` plus ``across`` when a and b
        were measured in different groups (``bridge`` or ``groups``); None where rounds are missing.
        Rows measured in server sets (``rounds_per_server``) are paired set by set (:func:`server_sets`)."""

        def per_set(row: dict) -> list[float | None]:  # its rounds, one value per server set
            return server_sets(series(row), row.get("rounds_per_server"))

        x, y = per_set(a), per_set(b)
        ga, gb = a.get("group"), b.get("group")
        if ga is None or gb is None or ga == gb:
            est = _ratio(x, y)
            return est and est.as_dict()
        ba, bb = self.bridges.get(ga), self.bridges.get(gb)
        if a is ba and b is bb:
            est = _ratio(x, y)
            return est and {**est.as_dict(), "across": "drift"}
        if ba is not None and bb is not None and pairable(x, per_set(ba)) and pairable(y, per_set(bb)):
            return {**bridged_ratio(x, per_set(ba), per_set(bb), y).as_dict(), "across": "bridge"}
        est = _ratio(x, y)
        return est and {**est.as_dict(), "across": "groups"}


def ratio_text(r: dict | None) -> str | None:
    """``1.23 (1.10-1.35)`` from an :meth:`Estimate.as_dict` (:meth:`Estimate.cell`); one round: ``1.23``."""
    return None if r is None else Estimate.from_dict(r).cell()


def _goodput(levels: dict, slo: float) -> list[float]:
    """Per round: tokens of the levels meeting the TPOT p95 SLO over the wall time of all levels."""
    n = len(next(iter(levels.values()))["wall_s"])
    out = []
    for i in range(n):
        tokens = sum(
            lv["generated_tokens"][i]
            for lv in levels.values()
            if lv["tpot_ms_p95"][i] is not None and lv["tpot_ms_p95"][i] <= slo
        )
        out.append(tokens / sum(lv["wall_s"][i] for lv in levels.values()))
    return out


def _spread(xs: Sequence[float]) -> dict:
    return {"median": _median(xs), "min": min(xs), "max": max(xs), "runs": list(xs)}


def analyse(rows: list[dict], levels: Sequence[int], slo: float) -> dict:
    """Per-level and aggregate figures of every measured row (in place, ``row["levels"]`` and
    ``row["aggregate"]``); returns the references they were taken against."""
    ok = [r for r in rows if "error" not in r]
    base = next((r for r in ok if r["kind"] == "off"), None)
    constants = [r for r in ok if r["kind"] in CONSTANT_KINDS]
    if base is None or not constants:
        return {"no_speculation": None, "best_constant": None, "best_constant_at": {}}

    pairing = Pairing(ok)

    def level_tps(b: int):
        return lambda r: r["per_level_rounds"][b]["tokens_per_second"]

    def sweep(r: dict) -> list[float]:
        return r["tokens_per_second_runs"]

    def over_base(series):  # ranks the constants on their ratio over no speculation: bridged across groups
        return lambda r: 1.0 if r is base else ((pairing.ratio(r, base, series) or {}).get("value") or 0.0)

    best_at = {b: max(constants, key=over_base(level_tps(b))) for b in levels}
    best = max(constants, key=over_base(sweep))
    for r in ok:
        r["levels"] = {}
        for b in levels:
            lv = r["per_level_rounds"][b]
            tpot = [x for x in lv["tpot_ms_p95"] if x is not None]
            r["levels"][b] = {
                "k": (r.get("k_per_level") or {}).get(b),
                "tokens_per_second": _spread(lv["tokens_per_second"]),
                "tpot_ms_p95": _median(tpot) if tpot else None,
                "meets_slo": bool(tpot) and _median(tpot) <= slo,
                "over_no_speculation": pairing.ratio(r, base, level_tps(b)),
                "over_best_constant_here": pairing.ratio(r, best_at[b], level_tps(b)),
                "best_constant_here": best_at[b]["config"],
            }
        r["aggregate"] = _aggregate(r, base, best, pairing, slo)
    return {
        "no_speculation": base["config"],
        "best_constant": best["config"],
        "best_constant_at": {b: best_at[b]["config"] for b in levels},
    }


def _trace_tps(r: dict) -> list[float]:
    """The arrival trace's tokens/s per round (``workload.trace``), empty without a trace."""
    return [t["tokens_per_second"] for t in r.get("trace_rounds") or []]


def _aggregate(r: dict, base: dict, best: dict, pairing: Pairing, slo: float) -> dict:
    """One row's sweep figures, its trace's, and its worst levels (from ``r["levels"]``), paired
    with no speculation (``base``) and the best constant over the sweep (``best``)."""
    trace = r.get("trace_rounds")
    worst_best = [lv["over_best_constant_here"] for lv in r["levels"].values()]
    worst_off = [lv["over_no_speculation"] for lv in r["levels"].values()]

    def over_trace(ref: dict) -> dict | None:
        return pairing.ratio(r, ref, _trace_tps) if trace and ref.get("trace_rounds") else None

    return {
        "tokens_per_second": _spread(r["tokens_per_second_runs"]),
        "trace_tokens_per_second": _spread(_trace_tps(r)) if trace else None,
        "trace_over_no_speculation": over_trace(base),
        "trace_over_best_constant": over_trace(best),
        "goodput_tokens_per_second": _spread(_goodput(r["per_level_rounds"], slo)),
        "levels_meeting_slo": [b for b, lv in r["levels"].items() if lv["meets_slo"]],
        "over_no_speculation": pairing.ratio(r, base, lambda x: x["tokens_per_second_runs"]),
        "over_best_constant": pairing.ratio(r, best, lambda x: x["tokens_per_second_runs"]),
        "worst_level_over_best_constant_here": min(
            (x for x in worst_best if x), key=lambda x: x["value"], default=None
        ),
        "worst_level_over_no_speculation": min(
            (x for x in worst_off if x), key=lambda x: x["value"], default=None
        ),
    }


def goals(row: dict | None) -> dict | None:
    """The issue's per-level goals for one row: >= 0.97x the best constant at every level and >= 0.98x
    no speculation. ``met``: on the point ratio of each level's paired rounds (the worst level);
    ``not_refuted``: no level's 95% interval lies wholly below the bar
    (:func:`autotune.stats.significantly_below`: what the noise can show)."""
    if row is None or "aggregate" not in row:
        return None
    agg = row["aggregate"]
    wb, wo = agg["worst_level_over_best_constant_here"], agg["worst_level_over_no_speculation"]
    levels = row.get("levels", {}).values()

    def below(key: str, bar: float) -> bool:
        return any(
            lv[key] is not None and significantly_below(Estimate.from_dict(lv[key]), bar) for lv in levels
        )

    return {
        "config": row["config"],
        "worst_level_over_best_constant_here": wb and wb["value"],
        "worst_level_over_no_speculation": wo and wo["value"],
        "met": bool(wb and wo and wb["value"] >= 0.97 and wo["value"] >= 0.98),
        "not_refuted": bool(wb and wo)
        and not below("over_best_constant_here", 0.97)
        and not below("over_no_speculation", 0.98),
    }


def table_cost(rows: list[dict], label: str, levels: Sequence[int]) -> dict[int, dict] | None:
    """What serving row ``label`` as a table costs beyond its K, per level: its paired rounds over
    those of the grid's constant with the K the table holds there (None when either is missing)."""
    by_name = {r["config"]: r for r in rows if "error" not in r}
    table = by_name.get(label)
    pairing = Pairing(list(by_name.values()))
    constants = {
        (r.get("k_per_level") or {}).get(levels[0]): r
        for r in rows
        if r.get("kind") == "constant" and "error" not in r
    }
    if table is None:
        return None
    out: dict[int, dict] = {}
    for b in levels:
        k = (table.get("k_per_level") or {}).get(b)
        same = constants.get(k)
        est = same and pairing.ratio(
            table, same, lambda r, b=b: r["per_level_rounds"][b]["tokens_per_second"]
        )
        if est:
            out[b] = {"k": k, "over_constant_same_k": est}
    return out


def drift(rows: list[dict]) -> dict | None:
    """No speculation measured last over first (aggregate paired ratio)."""
    first = next((r for r in rows if r["kind"] == "off" and "error" not in r), None)
    last = next((r for r in rows if r["kind"] == "off-again" and "error" not in r), None)
    if first is None or last is None:
        return None
    per_server = first.get("rounds_per_server")
    est = _ratio(last["tokens_per_second_runs"], first["tokens_per_second_runs"], per_server)
    return est and est.as_dict()


def table_ceiling(rows: list[dict], refs: dict) -> dict | None:
    """The most any K-per-level table could gain over the sweep from these constants: per round, the
    generated tokens over the wall time of each level's best constant there (the point estimates of
    ``refs["best_constant_at"]``, as if a table served each at its level for free), paired with the
    best single constant's rounds. Where this ceiling misses the issue's 1.05x, no table built from
    these constants can meet it on this host; None when the rows lack per-level tokens and times.

    Example:
        >>> def row(name, kind, tps):  # two levels, 100 tokens each, two rounds
        ...     lv = {b: {"tokens_per_second": t, "generated_tokens": [100, 100],
        ...               "wall_s": [100 / x for x in t]} for b, t in tps.items()}
        ...     agg = [200 / sum(100 / lv[b]["tokens_per_second"][i] for b in lv) for i in (0, 1)]
        ...     return {"config": name, "kind": kind, "per_level_rounds": lv, "tokens_per_second_runs": agg}
        >>> rows = [row("K=1", "constant", {1: [50, 52], 8: [200, 210]}),
        ...         row("K=3", "constant", {1: [80, 82], 8: [150, 160]})]
        >>> c = table_ceiling(rows, {"best_constant": "K=3", "best_constant_at": {1: "K=3", 8: "K=1"}})
        >>> c["per_level"], round(c["over_best_constant"]["value"], 3)
        ({1: 'K=3', 8: 'K=1'}, 1.091)
    """
    by_name = {r["config"]: r for r in rows if "error" not in r}
    best = by_name.get(refs.get("best_constant"))
    at = refs.get("best_constant_at") or {}
    if best is None or not at or any(name not in by_name for name in at.values()):
        return None
    n = len(best["tokens_per_second_runs"])
    tokens, wall = [0.0] * n, [0.0] * n
    for b, name in at.items():
        lv = by_name[name]["per_level_rounds"][b]
        toks, secs = lv.get("generated_tokens"), lv.get("wall_s")
        if not toks or not secs or len(toks) != n or len(secs) != n:
            return None
        for i in range(n):
            tokens[i] += toks[i]
            wall[i] += secs[i]
    ceiling = [t / w for t, w in zip(tokens, wall, strict=True)]
    est = _ratio(ceiling, best["tokens_per_second_runs"], best.get("rounds_per_server"))
    return {"per_level": dict(at), "over_best_constant": est and est.as_dict()}


# output --------------------------------------------------------------------------------------------


def identity(ctx, config: Path) -> dict:
    """What every stack benchmark's JSON opens with: the command line, the host, the config, the workload."""
    return {
        "command": shlex.join([sys.executable, *sys.argv]),
        "device": ctx.fingerprint["label"],
        "config": str(config),
        "workload": ctx.workload,
    }


def write_json(out: Path, result: dict) -> None:
    """Write ``result`` atomically, machine paths made portable (``<repo>``, ``~``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(portable(json.dumps(result, indent=2)) + "\n")
    tmp.replace(out)


def level_tables(rows: list[dict], levels: Sequence[int], concurrency: bool) -> str:
    """One table per load level: rows = configurations."""
    out = []
    for b in levels:
        ok = [r for r in rows if "levels" in r]
        best = ok[0]["levels"][b]["best_constant_here"] if ok else "-"
        what = f"concurrency {b}" if concurrency else f"open-loop rate, batch key {b}"
        out.append(f"{what} (best constant here: {best})")
        out.append(
            columns(
                [
                    "configuration",
                    "K here",
                    "tok/s (median)",
                    "min-max",
                    "TPOT p95 ms",
                    "x no-spec (95% CI)",
                    "x best constant here",
                ],
                [
                    (
                        r["config"],
                        "error: " + r.get("error", "no reference row")[:60],
                        None,
                        None,
                        None,
                        None,
                        None,
                    )
                    if "levels" not in r
                    else (
                        r["config"],
                        r["levels"][b]["k"],
                        r["levels"][b]["tokens_per_second"]["median"],
                        f"{fmt(r['levels'][b]['tokens_per_second']['min'])}-"
                        f"{fmt(r['levels'][b]['tokens_per_second']['max'])}",
                        r["levels"][b]["tpot_ms_p95"],
                        ratio_text(r["levels"][b]["over_no_speculation"]),
                        ratio_text(r["levels"][b]["over_best_constant_here"]),
                    )
                    for r in rows
                ],
            )
        )
        out.append("")
    return "\n".join(out)


def aggregate_table(rows: list[dict], slo: float, best: str | None) -> str:
    """One row per configuration: the sweep's traffic-weighted tokens/s, the trace's, the goodput."""
    has_trace = any((r.get("aggregate") or {}).get("trace_tokens_per_second") for r in rows)
    headers = [
        "configuration",
        "tok/s sweep",
        "min-max",
        *(["trace tok/s", "trace x no-spec", f"trace x {best}"] if has_trace else []),
        f"goodput (TPOT p95 <= {slo:g} ms)",
        "levels meeting SLO",
        "x no-spec (95% CI)",
        f"x best constant ({best})",
        "worst level x best const there",
        "worst level x no-spec",
        "greedy = no-spec",
        "start-up s",
    ]
    body = []
    for r in rows:
        if "aggregate" not in r:
            body.append((r["config"], "error", *([None] * (len(headers) - 2))))
            continue
        a = r["aggregate"]
        body.append(
            (
                r["config"],
                a["tokens_per_second"]["median"],
                f"{fmt(a['tokens_per_second']['min'])}-{fmt(a['tokens_per_second']['max'])}",
                *(
                    [
                        a["trace_tokens_per_second"] and a["trace_tokens_per_second"]["median"],
                        ratio_text(a.get("trace_over_no_speculation")),
                        ratio_text(a.get("trace_over_best_constant")),
                    ]
                    if has_trace
                    else []
                ),
                a["goodput_tokens_per_second"]["median"],
                ",".join(map(str, a["levels_meeting_slo"])) or "none",
                ratio_text(a["over_no_speculation"]),
                ratio_text(a["over_best_constant"]),
                ratio_text(a["worst_level_over_best_constant_here"]),
                ratio_text(a["worst_level_over_no_speculation"]),
                r.get("greedy_identical"),
                r.get("startup_s"),
            )
        )
    return columns(headers, body)


def summary_text(key: str, value: Any) -> str:
    """One summary line: ratios as ``1.23 (1.10-1.35)``, floats to 3 decimals, the rest as JSON."""
    if isinstance(value, dict) and "ci95" in value:
        return f"{key}: {ratio_text(value)}"
    if isinstance(value, float):
        return f"{key}: {value:.3f}"
    return f"{key}: {json.dumps(value) if isinstance(value, (dict, list)) else value}"


def level_choice_text(choices: Sequence[LevelChoice]) -> str:
    """``1: K=3, 4: K=0`` (each level's K by the tool's rule)."""
    return ", ".join(f"{c.batch_size}: K={c.gamma}" for c in choices)


def choices_json(choices: Sequence[LevelChoice]) -> list[dict]:
    """The per-level choices for the JSON: level, K, median tokens/s there, the rule's reason."""
    return [
        {
            "batch_size": c.batch_size,
            "k": c.gamma,
            "tokens_per_second": c.point.tokens_per_second,
            "reason": c.reason,
        }
        for c in choices
    ]


def choice_lines(choices: Sequence[LevelChoice]) -> list[str]:
    """One line per level: the K the tool's per-level rule takes there and why."""
    return [f"  {c.batch_size}: K={c.gamma}: {c.reason}" for c in choices]


def level_requests(workload: WorkloadConfig, max_batch_size: int) -> dict[int, int]:
    """Requests per load level, by batch size (``workload.min_batches`` raises the high levels')."""
    return {lv.batch_key(max_batch_size): workload.requests_at(lv.concurrency) for lv in workload.load_levels}


def requests_text(requests: Mapping[int, int]) -> str:
    """``"16 requests"`` where every level runs as many, else ``"16-48 requests (1: 16, ..., 16: 48)"``.

    Example:
        >>> requests_text({1: 16, 4: 16}), requests_text({1: 16, 8: 24, 16: 48})
        ('16 requests', '16-48 requests (1: 16, 8: 24, 16: 48)')
    """
    counts = sorted(set(requests.values()))
    if len(counts) == 1:
        return f"{counts[0]} requests"
    return f"{counts[0]}-{counts[-1]} requests (" + ", ".join(f"{b}: {n}" for b, n in requests.items()) + ")"


def noise_by_level(
    rows: list[dict], levels: Sequence[int], requests: int | Mapping[int, int], target: float = 0.05
) -> dict:
    """How many requests per level the measured noise asks for.

    Per level: the round-to-round coefficient of variation of tokens/s (median over the measured
    configurations), the 95% half-width of a paired ratio it gives with this run's rounds
    (:func:`autotune.stats.paired_half_width`), and the requests per
    level that would bring that half-width to ``target`` with as many rounds (the CV taken to fall
    as 1/sqrt(requests): a level's tokens/s is a mean over its requests), or the rounds that would
    with as many requests (None past 60).

    Example:
        >>> rows = [{"per_level_rounds": {1: {"tokens_per_second": [100.0, 110.0, 90.0]}}}]
        >>> n = noise_by_level(rows, [1], 32)[1]
        >>> round(n["cv"], 3), n["requests_for_target"] > 32
        (0.1, True)
    """
    out = {}
    for b in levels:
        cvs = []
        for r in rows:
            x = r.get("per_level_rounds", {}).get(b, {}).get("tokens_per_second") or []
            if len(x) >= 2 and statistics.mean(x) > 0:
                cvs.append(statistics.stdev(x) / statistics.mean(x))
        if not cvs:
            continue
        n = min(
            len(r["per_level_rounds"][b]["tokens_per_second"])
            for r in rows
            if b in r.get("per_level_rounds", {})
        )
        cv = statistics.median(cvs)
        half = paired_half_width(cv, n)
        out[b] = {
            "cv": cv,
            "rounds": n,
            "ratio_half_width_95": half,
            "requests": (n_req := requests[b] if isinstance(requests, Mapping) else requests),
            "requests_for_target": math.ceil(n_req * (half / target) ** 2),
            "rounds_for_target": next((m for m in range(2, 61) if paired_half_width(cv, m) <= target), None),
            "target_half_width": target,
        }
    return out


def noise_lines(noise: dict) -> list[str]:
    """The report's lines for :func:`noise_by_level`."""
    lines = ["noise per level (round-to-round CV of tokens/s, median of configs):"]
    for b, n in noise.items():
        lines.append(
            f"  {b} ({n['requests']} requests): CV {n['cv']:.1%}, paired-ratio 95% half-width "
            f"~{n['ratio_half_width_95']:.1%} over {n['rounds']} rounds; +-{n['target_half_width']:.0%} "
            f"needs ~{n['requests_for_target']} requests per level, or {n['rounds_for_target'] or '> 60'} "
            f"rounds of {n['requests']}"
        )
    return lines


def common_summary(plan: Plan, refs: dict, choices: Sequence[LevelChoice]) -> dict:
    """What both benchmarks report: the references, the per-level best K and why, the drift check."""
    return {
        "best_constant": refs["best_constant"],
        "best_constant_at": refs["best_constant_at"],
        "per_level_best_k": {c.batch_size: c.gamma for c in choices},
        "table_ceiling": table_ceiling(plan.rows, refs),
        "drift_no_speculation_last_over_first": drift(plan.rows),
    }


def goal_lines(rows: list[dict], labels: Sequence[str | None]) -> tuple[list[dict], list[str]]:
    """The per-level goals of the rows named ``labels`` (None and unmeasured ones skipped)."""
    found, lines = [], []
    for label in labels:
        row = next((r for r in rows if r["config"] == label), None)
        g = goals(row)
        if g is None:
            continue
        found.append(g)
        wb, wo, met = g["worst_level_over_best_constant_here"], g["worst_level_over_no_speculation"], g["met"]
        lines.append(
            f"  {label}: worst level {fmt(wb)}x the best constant there, {fmt(wo)}x no speculation "
            f"-> {'met' if met else 'NOT met'} on the point ratios; "
            + ("no level's interval lies below a bar" if g["not_refuted"] else "a level's interval is below")
        )
    if lines:
        lines.insert(0, "goal: at every level >= 0.97x the best constant there and >= 0.98x no speculation")
    return found, lines


def pairing_note(rows: list[dict]) -> str:
    """How the ratios between configurations of different groups were paired ("" when every ratio
    is within one group)."""
    across = {
        est.get("across")
        for r in rows
        for est in (
            *(
                lv.get(k)
                for lv in r.get("levels", {}).values()
                for k in ("over_no_speculation", "over_best_constant_here")
            ),
            *(r.get("aggregate", {}).get(k) for k in ("over_no_speculation", "over_best_constant")),
        )
        if est
    }
    notes = []
    if "bridge" in across:
        notes.append(
            "ratios between configurations of different groups go through the bridge (no speculation "
            "measured in both groups: autotune.stats.bridged_ratio)"
        )
    if "drift" in across:
        notes.append(
            "no speculation in a later group over the first (x no-spec of a bridge row) is the drift "
            "between the groups, unpaired"
        )
    if "groups" in across:
        notes.append("some ratios compare groups measured minutes apart with no bridge: unpaired in time")
    return "; ".join(notes)


def print_report(
    header: str, result: dict, levels: Sequence[int], concurrency: bool, extra: list[str]
) -> None:
    """The per-level tables, the aggregate table, ``extra`` lines and the summary."""
    rows = result["rows"]
    print(f"\n{header}\n")
    print(level_tables(rows, levels, concurrency))
    print("aggregate over the sweep (traffic-weighted: generated tokens / wall time of all levels)")
    print(aggregate_table(rows, result["slo_tpot_ms"], result["summary"].get("best_constant")))
    print(
        "goodput: per round, the tokens of the levels whose TPOT p95 meets the SLO over the wall time of "
        "all levels (median of rounds)"
    )
    if note := pairing_note(rows):
        print(note)
    if extra:
        print("\n" + "\n".join(extra))
    print("\n" + "\n".join(summary_text(k, v) for k, v in result["summary"].items()))


# the steps both benchmarks take --------------------------------------------------------------------


@dataclass
class Bench:
    """One run of a schedule benchmark: its flags, the stack it opened (``_transfer.open_stack``) and
    its clock, what every step below reads."""

    stack: str  # the backend's name: "vllm", "llamacpp"
    args: argparse.Namespace
    grid: list[int]
    cfg: Any
    ctx: Any
    backend: Any
    engine_profile: dict | None  # the newest engine-backend profile (None: the store has none)
    stack_profile: dict | None  # the newest profile this stack's own tune stored
    t0: float = field(default_factory=time.perf_counter)

    @property
    def batch(self) -> int:
        """The server's batch limit: ``--max-num-seqs`` / ``-np``."""
        return max(self.cfg.search.max_batch_size)

    @property
    def levels(self) -> list[int]:
        """The load levels, by batch size."""
        return list(self.cfg.batch_sizes)

    @property
    def workload(self) -> WorkloadConfig:
        return self.cfg.workload

    def elapsed(self) -> float:
        """Seconds since the run began (the JSON's ``wall_s``)."""
        return time.perf_counter() - self.t0


def profile_brief(prof: dict | None) -> dict | None:
    """A stored profile as the JSON names it: its id, choice and schedule (None stays None)."""
    return prof and {k: prof[k] for k in ("id", "chosen", "schedule")}


def checkpointer(bench: Bench, result: dict, version_key: str | None = None) -> Callable[[list[dict]], None]:
    """What :class:`Plan` calls after each configuration: the rows and the clock into ``result``
    (and the stack's version under ``version_key``, known once a server ran), the JSON rewritten."""

    def checkpoint(rows: list[dict]) -> None:
        result.update(rows=rows, wall_s=bench.elapsed())
        if version_key is not None:
            result[version_key] = bench.backend.version or result[version_key]
        write_json(bench.args.out, result)

    return checkpoint


def new_plan(bench: Bench, checkpoint: Callable[[list[dict]], None]) -> Plan:
    """The :class:`Plan` of this run: its levels, rounds, seed, interleaving and bridge from the flags
    and the config (``--interleave`` by default the backend's ``keep_servers``)."""
    return Plan(
        bench.backend,
        bench.batch,
        bench.levels,
        bench.args.repeats,
        bench.cfg.budget.seed,
        bench.workload.temperature == 0,
        checkpoint,
        interleave=bench.args.interleave or bench.backend.keep_servers,
        bridge=bench.args.bridge,
        rounds_per_server=bench.args.rounds_per_server,
    )


def resume_rows(bench: Bench, plan: Plan, result: dict, version_key: str) -> None:
    """With ``--resume``: the rows of the earlier run into ``plan``, and its host and stack version
    (under ``version_key``) into ``result``; a note when that host is not this one."""
    args = bench.args
    if args.resume is None:
        return
    plan.resume(args.resume, measure_new=not args.measured_only)
    earlier = json.loads(args.resume.read_text())
    result.update(
        {"device": earlier.get("device", result["device"])},
        **{version_key: earlier.get(version_key, result[version_key])},
        resumed_from=str(args.resume),
    )
    if earlier.get("device") != bench.ctx.fingerprint["label"]:
        print(f"note: the resumed rows were measured on {earlier.get('device')}", file=sys.stderr)


def run_profiles(
    bench: Bench, plan: Plan, serve: Callable[[Profile], tuple[list[str], dict[int, int]]]
) -> list[str]:
    """The rows of the stored profiles (the engine backend's export, this stack's own choice), each
    served by ``serve`` (its server command and its K per level); their labels, in order."""
    labels: list[str] = []
    wanted = (
        ("engine-backend export", bench.engine_profile, "autotune tune"),
        (f"{bench.stack}-backend choice", bench.stack_profile, f"autotune tune --backend {bench.stack}"),
    )
    for label, prof in plan.profiles(wanted, labels):
        command, k_per_level = serve(Profile.from_json(prof))
        plan.run(label, command, "profile", k_per_level=k_per_level)
    return labels


def finish(
    bench: Bench,
    plan: Plan,
    result: dict,
    version: tuple[str, str | None],
    choices: Sequence[LevelChoice],
    summary: dict,
    extra: list[str],
    goal_labels: Sequence[str | None],
) -> None:
    """The goals of the rows named ``goal_labels`` and the noise per level into ``summary`` and
    ``extra``; then the complete JSON written (``version``: the stack's version key and value)."""
    rows, levels = plan.rows, bench.levels
    found, lines = goal_lines(rows, goal_labels)
    summary["goals"] = found
    extra += lines
    summary["noise"] = noise_by_level(rows, levels, level_requests(bench.workload, bench.batch))
    extra += noise_lines(summary["noise"])
    key, value = version
    result.update(
        {key: value or result[key]},
        wall_s=bench.elapsed(),
        complete=not plan.skipped,
        skipped=plan.skipped,
        per_level_choices=choices_json(choices),
        summary=summary,
        rows=rows,
    )
    write_json(bench.args.out, result)


def report(bench: Bench, stack_text: str, batch_flag: str, result: dict, extra: list[str]) -> None:
    """The printed report, headed by ``stack_text`` (the server, its version and host), the workload
    and the server's batch limit (``batch_flag``: the stack's name for it)."""
    w = bench.workload
    print_report(
        f"{stack_text}; workload {w.prompts.name}, concurrency {list(w.concurrency)}, "
        f"{requests_text(level_requests(w, bench.batch))} x {w.max_new_tokens} tokens per level"
        + (f", trace {w.trace}" if w.trace is not None else "")
        + f"; {rounds_text(bench.args.repeats, bench.args.rounds_per_server)}; {batch_flag} {bench.batch}",
        result,
        bench.levels,
        w.rate is None,
        extra,
    )
    print(f"\nwrote {bench.args.out}")
