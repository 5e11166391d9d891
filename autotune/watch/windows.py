"""Two scrapes of one server -> one :class:`Window`: the counter differences and the load between them.

A counter that went down, or a changed process start time, raises :class:`CounterReset` (the
server restarted): the loop skips that window and takes the later scrape as its new baseline.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from autotune.backends.prometheus import PER_POSITION, SPEC_COUNTERS, SpecCounts
from autotune.cost.acceptance import from_counts
from autotune.watch.scrape import COUNTERS, Scrape


class CounterReset(ValueError):
    """A counter went down between two scrapes, or the process start time changed: the server restarted."""


@dataclass(frozen=True)
class Window:
    """Counter differences between two scrapes, and the load over them (None: a series was missing)."""

    seconds: float
    drafts: float | None = None
    draft_tokens: float | None = None
    accepted: float | None = None
    accepted_per_pos: tuple[float, ...] = ()
    generated: float | None = None
    # time-averaged requests running per engine: vLLM's finished requests' running seconds per
    # window second (else the mean of the two scrapes' gauge) over its data-parallel engines,
    # llama-server's busy slots per decode
    running: float | None = None
    waiting: float | None = None  # per engine, as running
    engines: int = 1  # data-parallel engines the counts were summed over

    @property
    def idle(self) -> bool:
        """No token generated in the window (or no way to tell and nothing running)."""
        if self.generated is not None:
            return self.generated <= 0
        return not (self.drafts or self.running)

    @property
    def per_position_acceptance(self) -> list[float]:
        """Accepted tokens at draft position i per draft (unconditional, docs/metrics.md); [] if no drafts.

        :func:`autotune.cost.acceptance.from_counts`, the rule the tuner reads its counters with.
        """
        return from_counts(self.accepted_per_pos, self.drafts or 0.0)

    @property
    def acceptance_rate(self) -> float | None:
        if not self.draft_tokens or self.accepted is None:
            return None
        return self.accepted / self.draft_tokens

    @property
    def mean_accepted_length(self) -> float | None:
        """1 + accepted tokens per draft (the bonus token included)."""
        if not self.drafts or self.accepted is None:
            return None
        return 1 + self.accepted / self.drafts

    @property
    def mean_draft_length(self) -> float | None:
        return self.draft_tokens / self.drafts if self.drafts and self.draft_tokens is not None else None

    @property
    def drafts_per_second(self) -> float | None:
        return self.drafts / self.seconds if self.drafts is not None and self.seconds > 0 else None

    @property
    def tokens_per_second(self) -> float | None:
        return self.generated / self.seconds if self.generated is not None and self.seconds > 0 else None


def window(before: Scrape, after: Scrape) -> Window:
    """The window between two scrapes of one server.

    Raises CounterReset when a counter went down or the process start time changed (a restart);
    also when the number of data-parallel engines changed. The caller skips the window and takes
    ``after`` as the new baseline. Running and waiting are per engine (the summed counts over
    :attr:`Scrape.engines`): each engine's scheduler looks up its own batch in the table.

    Example:
        >>> from autotune.watch.scrape import read_scrape
        >>> a = read_scrape("vllm:generation_tokens_total 100\\nvllm:num_requests_running 2", at=0)
        >>> b = read_scrape("vllm:generation_tokens_total 400\\nvllm:num_requests_running 4", at=15)
        >>> w = window(a, b)
        >>> w.tokens_per_second, w.running
        (20.0, 3.0)
    """
    s0, s1 = before.gauges.get("started"), after.gauges.get("started")
    if s0 is not None and s1 is not None and s0 != s1:
        raise CounterReset("process_start_time_seconds changed")
    if before.engines != after.engines:
        raise CounterReset(f"the server's engines changed ({before.engines} -> {after.engines})")
    spec = _spec_difference(before, after)
    diff = _counter_differences(before, after)
    seconds = after.at - before.at
    n = after.engines
    running, waiting = _running(before, after, diff, seconds), _mean_gauge(before, after, "waiting")
    return Window(
        seconds=seconds,
        drafts=spec.drafts if spec is not None else None,
        draft_tokens=spec.draft_tokens if spec is not None else None,
        accepted=spec.accepted if spec is not None else None,
        accepted_per_pos=spec.accepted_per_pos if spec is not None else (),
        generated=diff.get("generated"),
        running=running / n if running is not None else None,
        waiting=waiting / n if waiting is not None else None,
        engines=n,
    )


def _spec_difference(before: Scrape, after: Scrape) -> SpecCounts | None:
    """The spec-decode counts between the scrapes (None unless both have them); CounterReset naming
    the first counter that went down, in a fixed order so the warning names the same one every time."""
    if before.spec is None or after.spec is None:
        return None
    for key, name in SPEC_COUNTERS.items():
        old, new = getattr(before.spec, key), getattr(after.spec, key)
        if new < old:
            raise CounterReset(f"{after.stack}:{name} went down ({old:g} -> {new:g})")
    n = min(len(before.spec.accepted_per_pos), len(after.spec.accepted_per_pos))  # positions both count
    pairs = list(zip(before.spec.accepted_per_pos[:n], after.spec.accepted_per_pos[:n], strict=True))
    for pos, (old, new) in enumerate(pairs):
        if new < old:
            raise CounterReset(f"{after.stack}:{PER_POSITION}{{position={pos}}} went down")
    return SpecCounts(
        after.spec.drafts - before.spec.drafts,
        after.spec.draft_tokens - before.spec.draft_tokens,
        after.spec.accepted - before.spec.accepted,
        tuple(new - old for old, new in pairs),
    )


def _counter_differences(before: Scrape, after: Scrape) -> dict[str, float]:
    """The stack's other counters between the scrapes (those both have); CounterReset as above."""
    diff: dict[str, float] = {}
    names = COUNTERS[after.stack]
    for key in names:
        if key not in before.counters or key not in after.counters:
            continue
        d = after.counters[key] - before.counters[key]
        if d < 0:
            raise CounterReset(
                f"{names[key]} went down ({before.counters[key]:g} -> {after.counters[key]:g})"
            )
        diff[key] = d
    return diff


def _running(before: Scrape, after: Scrape, diff: Mapping[str, float], seconds: float) -> float | None:
    """The window's time-averaged requests running.

    vLLM: by Little's law, the seconds finished requests spent running over the window's seconds,
    where requests are short next to the window (each is counted whole in the window it ends
    in); else the mean of the two scrapes' gauge. The gauge is a point sample, and two of them
    read a closed loop's wave of starts and ends at its phase, not its mean
    (docs/decisions.md#watch-load-littles-law). llama-server: its since-start busy slots per
    decode gauge, differenced through the decode counter.
    """
    running = _mean_gauge(before, after, "running")
    busy_s, finished = diff.get("running_seconds"), diff.get("finished")
    if busy_s is not None and finished and seconds > 0 and busy_s / finished <= seconds / 2:
        running = busy_s / seconds
    b0, b1 = before.gauges.get("busy_per_decode"), after.gauges.get("busy_per_decode")
    decodes = diff.get("decodes")
    if b0 is not None and b1 is not None and decodes:
        busy = b1 * after.counters["decodes"] - b0 * before.counters["decodes"]
        running = max(busy / decodes, 0.0)
    return running


def _mean_gauge(before: Scrape, after: Scrape, key: str) -> float | None:
    values = [s.gauges[key] for s in (before, after) if key in s.gauges]
    return statistics.fmean(values) if values else None
