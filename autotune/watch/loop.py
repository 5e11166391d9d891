"""The scrape loop: one GET /metrics per interval, a window against the last scrape, a verdict per window.

Read-only: the watch sends ``GET /metrics`` to a server the user runs (vLLM or llama-server), one
request per interval, and never restarts or reconfigures it. A failed scrape or a restarted server
is a warning and the watch goes on.
"""

from __future__ import annotations

import http.client
import time
from collections.abc import Callable
from dataclasses import dataclass

from autotune.errors import ConfigError
from autotune.watch.endpoint import MetricsServer, metrics_text
from autotune.watch.predict import assess
from autotune.watch.profile_model import ProfileModel
from autotune.watch.scrape import Scrape, read_scrape
from autotune.watch.staleness import Staleness, Verdict
from autotune.watch.windows import CounterReset, Window, window


@dataclass
class Watch:
    """The scrape loop's state: the baseline scrape, the hysteresis and the counts the endpoint shows."""

    fetch: Callable[[], str]  # one GET /metrics (raises OSError or MetricsError)
    stack: str | None  # None: detect from the first scrape
    warn: Callable[[str], None]
    clock: Callable[[], float] = time.monotonic
    baseline: Scrape | None = None
    windows: int = 0
    errors: int = 0
    resets: int = 0
    last: Verdict | None = None
    failing: str | None = None  # the reason of the failures in a row so far (None: the last scrape worked)
    failed: int = 0  # failed scrapes in a row

    def scrape(self) -> Scrape | None:
        """One scrape; a failure is one warning and None (the watch goes on).

        A failure for the same reason as the one before is counted, not warned again; the first
        scrape that works after failures says so in one line.
        """
        try:
            text = self.fetch()
            got = read_scrape(text, self.stack, self.clock())
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self.errors += 1
            self.failed += 1
            reason = getattr(exc, "reason", None) or exc
            text = " ".join(str(reason).split()) or type(exc).__name__
            if text != self.failing:
                self.warn(f"warning: scrape failed ({text}); still watching")
            self.failing = text
            return None
        if self.failed:
            self.warn(f"note: scraping again after {self.failed} failed scrape{'s' * (self.failed > 1)}")
        self.failing, self.failed = None, 0
        self.stack = got.stack
        return got

    def next_window(self) -> Window | None:
        """Scrape and difference against the baseline; None when there is no window this time."""
        got = self.scrape()
        if got is None:
            return None
        before, self.baseline = self.baseline, got
        if before is None:
            return None
        try:
            win = window(before, got)
        except CounterReset as exc:
            self.resets += 1
            self.warn(f"warning: counter reset, server restarted? ({exc}): window skipped, baseline reset")
            return None
        self.windows += 1
        return win


def run(
    watch: Watch,
    model: ProfileModel,
    staleness: Staleness,
    emit: Callable[[Verdict], None],
    interval: float,
    once: bool = False,
    sleep: Callable[[float], None] = time.sleep,
    exporter: MetricsServer | None = None,
    max_windows: int | None = None,
) -> int:
    """Scrape every ``interval`` seconds and emit a verdict per window (``watch.baseline`` must be set).

    ``once``: one window, then the exit code (0 fresh, 1 stale); otherwise until interrupted (or
    ``max_windows`` windows, for tests), returning 0.
    """
    emitted = 0
    next_at = watch.clock() + interval
    while True:
        sleep(max(next_at - watch.clock(), 0.0))
        next_at += interval
        if next_at < watch.clock():  # fell behind (a slow scrape): keep the cadence, skip missed ticks
            next_at = watch.clock() + interval
        win = watch.next_window()
        if win is not None and watch.stack is not None:
            verdict = staleness.update(assess(model, win, watch.stack))
            watch.last = verdict
            emit(verdict)
            emitted += 1
        if exporter is not None:
            exporter.update(
                metrics_text(
                    watch.last, watch.stack, watch.windows, watch.errors, watch.resets, model.profile_id
                )
            )
        if once:
            if win is None:
                raise ConfigError("--once: no window (the second scrape failed or the counters reset)")
            return 1 if staleness.stale else 0
        if max_windows is not None and emitted >= max_windows:
            return 0
