"""``autotune watch``: follow a live server's /metrics and say when its stored profile no longer holds.

Read-only: the watch sends ``GET /metrics`` to a server the user runs (vLLM or llama-server), one
request per interval, and never restarts or reconfigures it. Everything below the scraper is a
pure function of two scrapes and a stored profile, so the rule is tested on synthetic windows
(docs/watch.md has the rule in prose and the exact metric names):

1. :func:`read_scrape`: one /metrics text -> the counters and gauges the watch reads (NaN and
   missing series are absent, not zero).
2. :func:`window`: two scrapes -> one :class:`Window` of counter differences (a counter that went
   down, or a changed process start time, raises :class:`CounterReset`: the server restarted).
3. :func:`assess`: a window against a :class:`ProfileModel` (the profile's cost curves, or for
   the stack that measured the profile its fitted stack cost, ``profile["stack_cost"]``; its
   per-position acceptance, what it serves at each batch size) -> the predicted tokens/s of every
   K at the live load and acceptance, the served K and the best alternative.
4. :class:`Staleness`: the hysteresis over windows -> a :class:`Verdict` (fresh or stale).
"""

from __future__ import annotations

import http.client
import http.server
import json
import math
import statistics
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.backends.prometheus import Samples, parse_text
from autotune.cost.costmodel import expected_tokens
from autotune.cost.stackcost import StackCost
from autotune.errors import ConfigError
from autotune.records import Curves
from autotune.stats import Estimate, paired_ratio
from profiles.errors import ProfileError
from profiles.profile import export_inputs
from profiles.schema import MISSING, BatchSchedule, Profile

STACKS = ("vllm", "llamacpp")
MIN_DRAFTS = 10  # fewer drafts in a window: its acceptance is too thin, the profile's is used

# counters (differenced per window) and gauges of each stack; spec-decode counters share names
COUNTERS: Mapping[str, Mapping[str, str]] = {
    "vllm": {
        "drafts": "vllm:spec_decode_num_drafts_total",
        "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
        "accepted": "vllm:spec_decode_num_accepted_tokens_total",
        "generated": "vllm:generation_tokens_total",
        # the time finished requests spent scheduled (prefill + decode) and their count: the
        # window's time-averaged requests running by Little's law (window())
        "running_seconds": "vllm:request_inference_time_seconds_sum",
        "finished": "vllm:request_inference_time_seconds_count",
    },
    "llamacpp": {
        "drafts": "llamacpp:spec_decode_num_drafts_total",
        "draft_tokens": "llamacpp:spec_decode_num_draft_tokens_total",
        "accepted": "llamacpp:spec_decode_num_accepted_tokens_total",
        "generated": "llamacpp:tokens_predicted_total",
        "decodes": "llamacpp:n_decode_total",
    },
}
GAUGES: Mapping[str, Mapping[str, str]] = {
    "vllm": {
        "running": "vllm:num_requests_running",
        "waiting": "vllm:num_requests_waiting",
        "started": "process_start_time_seconds",
    },
    "llamacpp": {
        "running": "llamacpp:requests_processing",
        "waiting": "llamacpp:requests_deferred",
        "busy_per_decode": "llamacpp:n_busy_slots_per_decode",
    },
}
PER_POS = {s: f"{s}:spec_decode_num_accepted_tokens_per_pos_total" for s in STACKS}


class MetricsError(ValueError):
    """A /metrics text the watch cannot read (no samples, or not the stack's)."""


class CounterReset(ValueError):
    """A counter went down between two scrapes, or the process start time changed: the server restarted."""


# --- scraping ----------------------------------------------------------------------------------------


def metrics_url(url: str) -> str:
    """``http://HOST:PORT`` -> ``http://HOST:PORT/metrics`` (a URL already ending in /metrics is kept).

    Example:
        >>> metrics_url("http://127.0.0.1:8000/"), metrics_url("http://h:1/metrics")
        ('http://127.0.0.1:8000/metrics', 'http://h:1/metrics')
    """
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"--url: need http://HOST:PORT of a running server (got {url!r})")
    try:
        _ = parts.port  # raises on a bad port
    except ValueError:
        raise ConfigError(f"--url: bad port in {url!r}") from None
    path = parts.path.rstrip("/")
    if not path.endswith("/metrics"):
        path += "/metrics"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def fetch_metrics(url: str, timeout: float) -> str:
    """One ``GET url`` (no retry); OSError (URLError, timeouts, refused) or MetricsError on failure."""
    request = urllib.request.Request(url, headers={"Accept": "text/plain"}, method="GET")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body = response.read(64 * 1024 * 1024)
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MetricsError(f"not UTF-8 text (byte {exc.start})") from None


def _value(samples: Samples, name: str) -> float | None:
    """Sum of ``name`` over its label sets, NaN and infinities ignored; None when no finite sample."""
    values = [v for (n, _), v in samples.items() if n == name and math.isfinite(v)]
    return sum(values) if values else None


def detect_stack(samples: Samples) -> str | None:
    """``vllm`` or ``llamacpp`` from the metric names' prefix (None when neither is there).

    Example:
        >>> detect_stack(parse_text("llamacpp:n_decode_total 3")), detect_stack(parse_text("up 1"))
        ('llamacpp', None)
    """
    for stack in STACKS:
        if any(n.startswith(f"{stack}:") for n, _ in samples):
            return stack
    return None


@dataclass(frozen=True)
class Scrape:
    """What the watch reads of one /metrics text: counters, per-position counts, gauges (absent: unknown)."""

    stack: str
    at: float  # seconds on the watch's monotonic clock
    counters: Mapping[str, float]
    per_pos: Mapping[int, float]  # draft position (0-based, as the stacks label it) -> accepted tokens
    gauges: Mapping[str, float]


def read_scrape(text: str, stack: str | None = None, at: float = 0.0) -> Scrape:
    """One /metrics text -> :class:`Scrape`; MetricsError when it has no samples or not the stack's.

    Example:
        >>> s = read_scrape("vllm:num_requests_running{engine=\\"0\\"} 2.0\\nvllm:generation_tokens_total 9")
        >>> s.stack, s.counters["generated"], s.gauges["running"]
        ('vllm', 9.0, 2.0)
    """
    samples = parse_text(text)
    if not samples:
        raise MetricsError("no Prometheus samples in the response")
    found = detect_stack(samples)
    if stack is None:
        if found is None:
            raise MetricsError(
                "neither vllm: nor llamacpp: metrics in the response (is this a vLLM or llama-server?)"
            )
        stack = found
    elif not any(n.startswith(f"{stack}:") for n, _ in samples):
        raise MetricsError(f"no {stack}: metrics in the response (is this a {stack} server?)")
    counters = {k: v for k, name in COUNTERS[stack].items() if (v := _value(samples, name)) is not None}
    gauges = {k: v for k, name in GAUGES[stack].items() if (v := _value(samples, name)) is not None}
    per_pos: dict[int, float] = {}
    for (name, labels), v in samples.items():
        pos = dict(labels).get("position")
        if name == PER_POS[stack] and pos is not None and pos.isdigit() and math.isfinite(v):
            per_pos[int(pos)] = per_pos.get(int(pos), 0.0) + v
    return Scrape(stack, at, counters, per_pos, gauges)


# --- windows -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """Counter differences between two scrapes, and the load over them (None: a series was missing)."""

    seconds: float
    drafts: float | None = None
    draft_tokens: float | None = None
    accepted: float | None = None
    accepted_per_pos: tuple[float, ...] = ()
    generated: float | None = None
    # time-averaged requests running: vLLM's finished requests' running seconds per window second
    # (else the mean of the two scrapes' gauge), llama-server's busy slots per decode
    running: float | None = None
    waiting: float | None = None

    @property
    def idle(self) -> bool:
        """No token generated in the window (or no way to tell and nothing running)."""
        if self.generated is not None:
            return self.generated <= 0
        return not (self.drafts or self.running)

    @property
    def per_position_acceptance(self) -> list[float]:
        """Accepted tokens at draft position i per draft (unconditional, docs/metrics.md); [] if no drafts."""
        if not self.drafts or self.drafts <= 0:
            return []
        out, last = [], 1.0
        for a in self.accepted_per_pos:
            last = min(last, max(a / self.drafts, 0.0))  # token i accepted implies every one before it
            out.append(last)
        return out

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

    Raises CounterReset when a counter went down or the process start time changed (a restart):
    the caller skips the window and takes ``after`` as the new baseline.

    Example:
        >>> a = read_scrape("vllm:generation_tokens_total 100\\nvllm:num_requests_running 2", at=0)
        >>> b = read_scrape("vllm:generation_tokens_total 400\\nvllm:num_requests_running 4", at=15)
        >>> w = window(a, b)
        >>> w.tokens_per_second, w.running
        (20.0, 3.0)
    """
    s0, s1 = before.gauges.get("started"), after.gauges.get("started")
    if s0 is not None and s1 is not None and s0 != s1:
        raise CounterReset("process_start_time_seconds changed")
    diff: dict[str, float] = {}
    names = COUNTERS[after.stack]
    for key in names:  # in a fixed order, so the warning names the same counter every time
        if key not in before.counters or key not in after.counters:
            continue
        d = after.counters[key] - before.counters[key]
        if d < 0:
            raise CounterReset(
                f"{names[key]} went down ({before.counters[key]:g} -> {after.counters[key]:g})"
            )
        diff[key] = d
    per_pos: list[float] = []
    for pos in range(len(after.per_pos)):
        if pos not in before.per_pos or pos not in after.per_pos:
            break
        d = after.per_pos[pos] - before.per_pos[pos]
        if d < 0:
            raise CounterReset(f"{PER_POS[after.stack]}{{position={pos}}} went down")
        per_pos.append(d)
    seconds = after.at - before.at
    running = _mean_gauge(before, after, "running")
    busy_s, finished = diff.get("running_seconds"), diff.get("finished")
    if busy_s is not None and finished and seconds > 0 and busy_s / finished <= seconds / 2:
        # Little's law over the window: the seconds finished requests spent running / the window's
        # seconds is the time-averaged number running, where requests are short next to the window
        # (each is counted whole in the window it ends in). The gauge is a point sample per scrape;
        # at saturation a closed loop's requests start and end in waves, and two samples read 8 or
        # 14 of 16 by the wave's phase (benchmarks/results/watch_drift_vllm_intel.txt).
        running = busy_s / seconds
    b0, b1 = before.gauges.get("busy_per_decode"), after.gauges.get("busy_per_decode")
    decodes = diff.get("decodes")
    if b0 is not None and b1 is not None and decodes:
        # llama-server's gauge is busy slots / decode calls since start: difference the products
        busy = b1 * after.counters["decodes"] - b0 * before.counters["decodes"]
        running = max(busy / decodes, 0.0)
    return Window(
        seconds=seconds,
        drafts=diff.get("drafts"),
        draft_tokens=diff.get("draft_tokens"),
        accepted=diff.get("accepted"),
        accepted_per_pos=tuple(per_pos),
        generated=diff.get("generated"),
        running=running,
        waiting=_mean_gauge(before, after, "waiting"),
    )


def _mean_gauge(before: Scrape, after: Scrape, key: str) -> float | None:
    values = [s.gauges[key] for s in (before, after) if key in s.gauges]
    return statistics.fmean(values) if values else None


# --- the profile and the cost model ------------------------------------------------------------------


@dataclass(frozen=True)
class ProfileModel:
    """What the watch holds a window against: a stored profile's cost curves, acceptance and served K."""

    profile_id: int | None
    curves: Curves
    acceptance: tuple[float, ...]  # the profile's unconditional per-position acceptance (B=1, threshold 0)
    schedule: tuple[tuple[int, int], ...]  # (batch_size, K), sorted: vLLM's by-batch-size table
    gamma: int  # the single K a one-K stack (llama-server) is exported with
    speculates: bool
    levels: tuple[int, ...] = ()  # the workload's tuned load levels (concurrency)
    level_choices: Mapping[int, int] = field(default_factory=dict)  # table_decision: batch size -> K
    backend: str = "engine"  # what measured the profile
    # the stack's own step costs (profile["stack_cost"], autotune.cost.stackcost): used for that stack
    stack_cost: StackCost | None = None
    # table_decision.levels[].over_chosen: batch size -> the tune's paired ratio of that level's
    # choice over the chosen configuration there (absent in profiles from before it)
    level_ratios: Mapping[int, Estimate] = field(default_factory=dict)
    # schedule[].ratio: batch size -> the tune's measured tokens/s of the schedule's K there over no
    # speculation (re-measured rounds; where that K speculates)
    off_ratios: Mapping[int, float] = field(default_factory=dict)

    @classmethod
    def from_profile(cls, profile: Profile) -> ProfileModel:
        """ProfileError (one line) when the profile lacks the cost curves or the acceptance."""
        pid = None if profile.id is MISSING else profile.id
        where = f"profile #{pid}" if pid is not None else "profile"
        if profile.curves is MISSING or not isinstance(profile.curves, Mapping):
            raise ProfileError(f"{where}: no 'curves' (cost model); re-run `autotune tune`")
        acceptance = profile.acceptance if isinstance(profile.acceptance, Mapping) else {}
        ppa = acceptance.get("per_position_acceptance")
        if not isinstance(ppa, list) or not ppa:
            raise ProfileError(f"{where}: no 'acceptance.per_position_acceptance'; re-run `autotune tune`")
        try:
            curves = Curves.from_json(profile.curves)
        except (KeyError, TypeError, ValueError) as exc:
            raise ProfileError(f"{where}: unreadable 'curves' ({type(exc).__name__}: {exc})") from None
        inputs = export_inputs(profile)
        workload = profile.workload if isinstance(profile.workload, Mapping) else {}
        decision = profile.table_decision if isinstance(profile.table_decision, Mapping) else {}
        entries = [
            c
            for c in decision.get("levels", [])
            if isinstance(c, Mapping) and "batch_size" in c and "gamma" in c
        ]
        choices = {int(c["batch_size"]): int(c["gamma"]) for c in entries}
        ratios: dict[int, Estimate] = {}
        for c in entries:
            if (over := c.get("over_chosen")) is None:
                continue
            try:
                est = Estimate(float(over["value"]), float(over["low"]), float(over["high"]), int(over["n"]))
            except (KeyError, TypeError, ValueError) as exc:
                raise ProfileError(
                    f"{where}: unreadable 'table_decision.levels[].over_chosen' ({type(exc).__name__}: {exc})"
                ) from None
            if not est.value > 0:
                raise ProfileError(f"{where}: 'table_decision.levels[].over_chosen.value' must be > 0")
            ratios[int(c["batch_size"])] = est
        off_ratios: dict[int, float] = {}
        for e in profile.schedule.entries if isinstance(profile.schedule, BatchSchedule) else ():
            value = e.ratio.get("value") if isinstance(e.ratio, Mapping) else None
            if e.gamma > 0 and isinstance(value, int | float) and value > 0:
                off_ratios[e.batch_size] = float(value)
        backend = profile.backend if isinstance(profile.backend, Mapping) else {}
        stack_cost = None
        if isinstance(profile.stack_cost, Mapping):
            try:
                stack_cost = StackCost.from_json(profile.stack_cost)
            except (KeyError, TypeError, ValueError) as exc:
                raise ProfileError(
                    f"{where}: unreadable 'stack_cost' ({type(exc).__name__}: {exc})"
                ) from None
        return cls(
            profile_id=pid,
            curves=curves,
            acceptance=tuple(float(a) for a in ppa),
            schedule=tuple(sorted(inputs.schedule)),
            gamma=inputs.gamma,
            speculates=inputs.drafter != "none",
            levels=tuple(int(c) for c in workload.get("concurrency", []) or []),
            level_choices=choices,
            backend=str(backend.get("name", "engine")),
            stack_cost=stack_cost,
            level_ratios=ratios,
            off_ratios=off_ratios,
        )

    @property
    def gamma_max(self) -> int:
        """The largest K the watch predicts: the profile's measured acceptance positions."""
        return len(self.acceptance)

    def served_k(self, stack: str, batch: float) -> int:
        """The K the exported configuration drafts with ``batch`` requests running.

        llama-server takes one K (``--spec-draft-n-max``); vLLM the schedule as its per-batch-size
        table (the K of the smallest tuned batch size >= the batch, the last one's above).

        Example:
            >>> m = ProfileModel(None, Curves({1: {1: 1.0}}, {}), (0.5,), ((1, 5), (4, 3), (8, 0)), 5, True)
            >>> [m.served_k("vllm", b) for b in (1, 2, 4.4, 6, 64)], m.served_k("llamacpp", 64)
            ([5, 3, 3, 0, 0], 5)
        """
        if not self.speculates:
            return 0
        if stack == "llamacpp" or not self.schedule:
            return self.gamma
        b = max(1, round(batch))
        return next((k for size, k in self.schedule if b <= size), self.schedule[-1][1])

    def chosen_k_at(self, level: int) -> int:
        """The K the profile's chosen configuration runs at tuned level ``level`` (its schedule there):
        what the level's ``over_chosen`` ratio was measured over."""
        if not self.speculates:
            return 0
        return dict(self.schedule).get(level, self.gamma)

    def nearest_level(self, batch: float) -> int | None:
        return min(self.levels, key=lambda lv: (abs(lv - batch), lv)) if self.levels else None


def predicted_tps(curves: Curves, acceptance: Sequence[float], k: int, batch: float) -> float:
    """Steady-state tokens/s of a constant K at ``batch`` rows (costmodel.predict's arithmetic).

    B x E(K) / (K x T_draft(B) + T_verify(B, K + 1) + overhead(B)); K = 0 is plain decoding.

    Example:
        >>> c = Curves({1: {1: 0.010, 2: 0.011, 3: 0.012}}, {1: 0.001})
        >>> round(predicted_tps(c, [0.8, 0.6], 2, 1), 1), round(predicted_tps(c, [0.8, 0.6], 0, 1), 1)
        (171.4, 100.0)
    """
    b = max(float(batch), 1.0)
    overhead = curves.step_overhead(b)
    if k == 0:
        return b / (curves.verify(b, 1) + overhead)
    step = k * curves.draft(b) + curves.verify(b, k + 1) + overhead
    return b * expected_tokens(acceptance, k) / step


def extend_acceptance(observed: Sequence[float], n: int) -> tuple[float, ...]:
    """``observed`` per-position acceptance continued to ``n`` positions at its mean conditional rate.

    The stacks count positions up to the served K only; beyond it the watch assumes the
    geometric mean of the observed conditional rates, (a_K)^(1/K).

    Example:
        >>> extend_acceptance([0.5, 0.25], 4)
        (0.5, 0.25, 0.125, 0.0625)
    """
    out = list(observed[:n])
    if not out:
        return (0.0,) * n
    rate = out[-1] ** (1 / len(out)) if out[-1] > 0 else 0.0
    while len(out) < n:
        out.append(out[-1] * rate)
    return tuple(out)


@dataclass(frozen=True)
class Assessment:
    """One window held against the profile: the predicted tokens/s of every K at the live state."""

    window: Window
    batch: float  # requests running the prediction used (>= 1)
    served_k: int
    acceptance: tuple[float, ...]  # per position, what the prediction used
    acceptance_source: str  # "live" (this window's counters) or "profile"
    observed_positions: int  # positions measured live; beyond them extrapolated
    tps: tuple[float, ...]  # predicted tokens/s for K = 0..len-1
    alternative: int  # the best K other than the served one
    gain: float  # tps[alternative] / tps[served_k]
    served_from: str = "profile"  # "server": the server's counted positions overrode the profile's K
    costs: str = "engine"  # "stack": the profile's stack cost fit for this stack; "engine": its curves
    calibrated_at: int | None = None  # the tuned level whose measured choice calibrated tps (see assess)
    calibration: tuple[float, ...] = ()  # per K: what tps[k] was divided by there (1: unchanged)
    # the tune's paired ratio of the alternative over the served K at calibrated_at, where the gain
    # rests on the profile alone (see assess and tune_measured); None: the windows are the repeats
    measured: Estimate | None = None

    @property
    def idle(self) -> bool:
        return self.window.idle


def assess(model: ProfileModel, win: Window, stack: str) -> Assessment:
    """Predicted tokens/s of every K (speculation off included) under the window's acceptance and load.

    The live per-position acceptance is used when the window has at least :data:`MIN_DRAFTS`
    drafts and per-position counts; otherwise (speculation off, a quiet window) the profile's.
    The served K is the profile's at the live load, except where the server shows it runs
    another one: fewer counted positions than that K (it cannot draft more), or drafts on a
    one-K stack whose profile turns speculation off; then the server's positions are its K.

    ``measured``: where the window used the profile's acceptance at a tuned level
    (:func:`measured_level`), the alternative is that level's measured choice and the served K is
    the profile's chosen K there, the tune's ratio of the one over the other there
    (``table_decision.levels[].over_chosen``), when the profile has it.
    """
    batch = max(win.running or 0.0, 1.0)
    served = model.served_k(stack, batch)
    live = win.per_position_acceptance
    live_ok = bool(live) and (win.drafts or 0) >= MIN_DRAFTS
    served_from = "profile"
    if live_ok and (served > len(live) or (served == 0 and stack == "llamacpp")):
        served, served_from = len(live), "server"
    elif live_ok and stack == "vllm" and win.mean_draft_length is not None:
        # vLLM drafts the K it serves for every running request: the window's draft tokens per
        # draft are that K (a table's, at the window's loads), whatever the profile exported
        k = round(win.mean_draft_length)
        if 1 <= k <= len(live) and k != served:
            served, served_from = k, "server"
    top = max(model.gamma_max, served, len(live))
    if live_ok:
        acceptance, source, observed = extend_acceptance(live, top), "live", len(live)
    else:
        acceptance, source, observed = extend_acceptance(model.acceptance, top), "profile", 0
    stack_cost = model.stack_cost if model.stack_cost is not None and model.backend == stack else None

    def predict(acc: Sequence[float]) -> tuple[float, ...]:
        if stack_cost is not None:  # the stack's own step costs at the live load (autotune.cost.stackcost)
            return tuple(stack_cost.predict_at_load(batch, k, acc) for k in range(top + 1))
        return tuple(predicted_tps(model.curves, acc, k, batch) for k in range(top + 1))

    tps = predict(acceptance)
    level = measured_level(model, batch)
    calibration: Sequence[float] = ()
    if level is not None:  # the tune measured which K is best here: what the model claims beyond it, at
        # the profile's own acceptance, is the model's error, not a change of the traffic
        best = min(model.level_choices[level], top)
        base = predict(extend_acceptance(model.acceptance, top))
        # every K the model claims at least as good as the measured choice is brought to its level,
        # and a hair below it (1e-9), so the measured K wins the tie here and over a streak
        calibration = [
            base[k] / base[best] * (1 + 1e-9) if k != best and base[k] >= base[best] else 1.0
            for k in range(top + 1)
        ]
        # speculation off, where the tune measured the level's K faster than it (ratio r > 1): held at
        # 1/r of that K at the profile's acceptance, not at a hair below it, so only the live change
        # of acceptance moves it (the model had K=0 level with K=5 at 16 requests, where the tune
        # measured K=5 1.17x and a live acceptance 10% under the profile's then read as stale)
        r = model.off_ratios.get(level, 0.0)
        if best > 0 and r > 1.0 and model.chosen_k_at(level) == best and base[0] * r > base[best]:
            calibration[0] = base[0] * r / base[best]
        tps = tuple(t / c for t, c in zip(tps, calibration, strict=True))
    others = [k for k in range(top + 1) if k != served]
    alternative = max(others, key=lambda k: (tps[k], -k))
    gain = tps[alternative] / tps[served]
    costs = "stack" if stack_cost is not None else "engine"
    measured = None
    if (
        source == "profile"
        and level is not None
        and alternative == model.level_choices[level]
        and served == model.chosen_k_at(level)
    ):
        measured = model.level_ratios.get(level)
    return Assessment(
        win,
        batch,
        served,
        acceptance,
        source,
        observed,
        tps,
        alternative,
        gain,
        served_from,
        costs,
        level,
        tuple(calibration),
        measured,
    )


def measured_level(model: ProfileModel, batch: float) -> int | None:
    """The tuned load level the live load sits at (nearest, inside the tuned range) where the
    profile holds a measured per-level choice; else None.

    There the tune measured the K it served against each other under the profile's acceptance and
    chose one (``table_decision.levels``); a cost model that predicts another K better at that
    acceptance is wrong by that much, so :func:`assess` divides each K's predicted gain by what the
    model claims over the measured choice at the profile's own acceptance (when it claims a gain).
    Where the served K is the measured choice, only a change of acceptance alarms; where it is not
    (one K for a whole sweep, e.g. a llama-server profile that is off while the live load sits at a
    level where the tune measured K=2 faster), the measured choice is what the watch names.

    Example:
        >>> m = ProfileModel(None, Curves({1: {1: 1.0}}, {}), (0.5,), ((16, 3),), 3, True, (1, 4, 16),
        ...                  {1: 3, 4: 3, 16: 3})
        >>> measured_level(m, 13.0), measured_level(m, 2.0), measured_level(m, 40.0)
        (16, 1, None)
    """
    if not model.levels or not model.level_choices:
        return None
    if not min(model.levels) <= batch <= max(model.levels):
        return None
    near = model.nearest_level(batch)
    if near is None or near not in model.level_choices:
        return None
    return near


# --- staleness ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """One window's verdict: the alternative, its gain over the served K (with an interval), the state."""

    assessment: Assessment
    alarm: bool  # this window predicts an alternative better than the served K by more than the margin
    streak: int  # consecutive better windows (when better) or calm ones (otherwise): Staleness
    alternative: int
    gain: Estimate  # pooled over the better run's last windows (Staleness; one window: a point)
    stale: bool
    changed: bool  # the state flipped at this window
    windows_to_stale: int
    idle: bool = False
    better: bool = False  # this window predicts an alternative better than the served K (gain > 1)
    interval_from: str = "windows"  # "tune": the gain's interval is the tune's measurement (tune_measured)


def tune_measured(assessments: Sequence[Assessment], k: int) -> Estimate | None:
    """The tune's measured ratio that gives the interval of these windows' gain of K=``k``, or None.

    Where a window has no live acceptance (speculation off, a quiet window), sits at a tuned level
    and names that level's measured choice over the profile's chosen K there, its prediction is a
    function of the profile alone: every such window is the same number, so the windows' spread
    (:func:`autotune.stats.paired_ratio` over them) is a zero-width interval that says nothing.
    The uncertainty there is the tune's own measurement of those two K at that level
    (``Assessment.measured``), so that is the interval, when every window carries the same one
    and names ``k``. Else None: the windows are the repeats.
    """
    found = {a.measured for a in assessments}
    measured = found.pop() if len(found) == 1 else None
    if measured is None or any(a.alternative != k for a in assessments):
        return None
    return measured


def scaled_to(gain: float, measured: Estimate) -> Estimate:
    """``measured``'s 95% interval scaled to the predicted ``gain``, with its rounds as n.

    Example:
        >>> e = scaled_to(1.14, Estimate(1.2, 1.08, 1.32, 3))
        >>> round(e.low, 3), round(e.high, 3), e.n
        (1.026, 1.254, 3)
    """
    return Estimate(
        gain, gain * measured.low / measured.value, gain * measured.high / measured.value, measured.n
    )


def streak_gain(assessments: Sequence[Assessment]) -> tuple[int, Estimate]:
    """The one K best over these windows and its gain over each window's served K, with a 95% interval.

    The K maximising the geometric mean of the per-window ratios; the interval is
    :func:`autotune.stats.paired_ratio` of the windows' predicted tokens/s (the windows are the
    repeats: their spread in acceptance and load is the noise), except where the gain rests on the
    profile alone: then it is the tune's measured one, scaled to the gain (:func:`tune_measured`).
    """
    n = min(len(a.tps) for a in assessments)

    def score(k: int) -> float:
        return sum(math.log(a.tps[k] / a.tps[a.served_k]) for a in assessments)

    best = max(range(n), key=lambda k: (score(k), -k))
    est = paired_ratio([a.tps[best] for a in assessments], [a.tps[a.served_k] for a in assessments])
    measured = tune_measured(assessments, best)
    return best, est if measured is None else scaled_to(est.value, measured)


class Staleness:
    """The hysteresis. A window is *better* when it predicts some K above the served one (gain > 1);
    the profile turns stale once ``windows_to_stale`` better windows run in a row and, pooled over
    the last of them (at most ``2 x windows_to_stale``: recent enough to follow a change), their
    common alternative's gain exceeds ``margin`` with the interval's lower bound above 1. It turns
    fresh again after as many *calm* windows in a row, whose gain is at most half the margin
    (1.025 for 1.05). Idle windows change nothing.

    The margin is held by the pooled gain, not by each window: where the true gain sits near the
    margin (1.06 at saturation here), single windows scatter to both sides of it (1.01-1.10) and a
    rule that wanted every window above it never fired (benchmarks/results/watch_drift_vllm_intel*);
    the band between half the margin and the margin keeps a stale verdict from flapping there.

    Example:
        >>> s = Staleness(windows_to_stale=1, margin=1.05)
        >>> s.stale, s.calm_below
        (False, 1.025)
    """

    def __init__(self, windows_to_stale: int = 3, margin: float = 1.05) -> None:
        if windows_to_stale < 1:
            raise ConfigError(f"--windows-to-stale: must be >= 1 (got {windows_to_stale})")
        if margin < 1.0:
            raise ConfigError(f"--margin: must be >= 1.0 (got {margin})")
        self.windows_to_stale, self.margin = windows_to_stale, margin
        self.calm_below = 1.0 + (margin - 1.0) / 2
        self.recent: deque[Assessment] = deque(maxlen=2 * windows_to_stale)  # the pool
        self.stale = False
        self.better = 0  # current run of windows predicting an alternative better (gain > 1)
        self.calm = 0  # current run of calm windows (gain <= calm_below)

    def update(self, a: Assessment) -> Verdict:
        n_needed = self.windows_to_stale
        if a.idle:
            point = Estimate(a.gain, a.gain, a.gain, 1)
            return Verdict(a, False, 0, a.alternative, point, self.stale, False, n_needed, idle=True)
        better = a.gain > 1.0
        self.recent.append(a)
        self.better = self.better + 1 if better else 0
        self.calm = self.calm + 1 if a.gain <= self.calm_below else 0
        if better:
            pooled = list(self.recent)[-min(self.better, 2 * n_needed) :]
            alternative, gain = streak_gain(pooled)
            measured = tune_measured(pooled, alternative)
        else:
            alternative, measured = a.alternative, tune_measured([a], a.alternative)
            gain = Estimate(a.gain, a.gain, a.gain, 1) if measured is None else scaled_to(a.gain, measured)
        interval_from = "windows" if measured is None else "tune"
        was = self.stale
        if not self.stale and self.better >= n_needed:
            confident = gain.low > 1.0 if gain.n >= 2 else True
            self.stale = gain.value > self.margin and confident
        elif self.stale and self.calm >= n_needed:
            self.stale = False
        return Verdict(
            a,
            a.gain > self.margin,
            self.better if better else self.calm,
            alternative,
            gain,
            self.stale,
            self.stale != was,
            n_needed,
            better=better,
            interval_from=interval_from,
        )


# --- output ------------------------------------------------------------------------------------------


def _k(k: int) -> str:
    return "K=0 (speculation off)" if k == 0 else f"K={k}"


def _plural(n: float, word: str) -> str:
    return f"{n:.0f} {word}" + ("" if round(n) == 1 else "s")


def profile_acceptance_at(model: ProfileModel, k: int) -> float | None:
    """The profile's acceptance rate at K: the mean of its first K per-position acceptances."""
    if k <= 0:
        return None
    acc = extend_acceptance(model.acceptance, k)
    return sum(acc[:k]) / k


def render_line(v: Verdict, model: ProfileModel) -> str:
    """One human line per window.

    ``acceptance 0.41 (profile 0.65) at ~3 requests running: predicted K=2 1.18x over the served
    K=5 (95% CI 1.09-1.27) for 6 windows: profile stale``
    """
    a, w = v.assessment, v.assessment.window
    state = "profile stale" if v.stale else "fresh"
    if v.idle:
        busy = f" with ~{_plural(w.running, 'request')} running" if w.running else ""
        return f"idle: no tokens counted in {w.seconds:.0f} s{busy}: no verdict ({state})"
    prof = profile_acceptance_at(model, a.served_k)
    prof_text = f"profile {prof:.2f}" if prof is not None else "profile: speculation off here"
    if a.acceptance_source == "live" and w.acceptance_rate is not None:
        acc = f"acceptance {w.acceptance_rate:.2f} ({prof_text})"
    else:
        why = "speculation off" if a.served_k == 0 else f"{w.drafts or 0:.0f} drafts"
        acc = f"acceptance n/a ({why}; the profile's assumed)"
    load = f"at ~{_plural(w.running or 0, 'request')} running"
    if w.waiting:
        load += f", {w.waiting:.0f} waiting"
    g = v.gain
    head = f"{acc} {load}: predicted {_k(v.alternative)} {g.value:.2f}x over the served {_k(a.served_k)}"
    if v.better:
        by = ", measured by the tune" if v.interval_from == "tune" else ""
        ci = f" (95% CI {g.low:.2f}-{g.high:.2f}{by})" if g.n >= 2 else ""
        head += f"{ci} for {_plural(v.streak, 'window')}"
        if not v.stale and v.alarm:
            state = f"fresh ({min(v.streak, v.windows_to_stale)} of {v.windows_to_stale} windows to stale)"
    elif v.stale:
        state = f"profile stale (fresh after {_plural(v.windows_to_stale - v.streak, 'more calm window')})"
    return f"{head}: {state}"


def _round(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


def verdict_json(v: Verdict, model: ProfileModel, stack: str) -> dict[str, Any]:
    """The ``--json`` object of one window (docs/watch.md lists the keys)."""
    a, w = v.assessment, v.assessment.window
    near = model.nearest_level(a.batch)
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "backend": stack,
        "profile_id": model.profile_id,
        "window_s": _round(w.seconds, 3),
        "idle": v.idle,
        "requests_running": _round(w.running, 3),
        "requests_waiting": _round(w.waiting, 3),
        "generated_tokens_per_second": _round(w.tokens_per_second, 3),
        "drafts_per_second": _round(w.drafts_per_second, 3),
        "mean_accepted_length": _round(w.mean_accepted_length),
        "mean_draft_length": _round(w.mean_draft_length),
        "acceptance_rate": _round(w.acceptance_rate),
        "live_acceptance": [round(x, 4) for x in w.per_position_acceptance],
        "acceptance_source": a.acceptance_source,
        "profile_acceptance": [round(x, 4) for x in model.acceptance],
        "profile_acceptance_rate": _round(profile_acceptance_at(model, a.served_k)),
        "profile_levels": list(model.levels),
        "nearest_level": near,
        "level_choice_k": model.level_choices.get(near) if near is not None else None,
        "outside_tuned_levels": bool(model.levels) and not min(model.levels) <= a.batch <= max(model.levels),
        "served_k": a.served_k,
        "served_k_from": a.served_from,
        "predicted_tokens_per_second": {str(k): round(t, 3) for k, t in enumerate(a.tps)},
        "predicted_with": a.costs,
        "calibrated_at_level": a.calibrated_at,
        "calibration": [round(c, 4) for c in a.calibration] or None,
        "extrapolated_from_position": a.observed_positions + 1 if a.acceptance_source == "live" else None,
        "alternative_k": v.alternative,
        "predicted_gain": round(v.gain.value, 4),
        "gain_ci95": [round(v.gain.low, 4), round(v.gain.high, 4)] if v.gain.n >= 2 else None,
        "gain_ci95_from": v.interval_from if v.gain.n >= 2 else None,
        "gain_windows": v.gain.n
        if v.interval_from == "windows"
        else min(v.streak, 2 * v.windows_to_stale)
        if v.better
        else 1,
        "alarm": v.alarm,
        "better": v.better,
        "streak": v.streak,
        "windows_to_stale": v.windows_to_stale,
        "stale": v.stale,
        "changed": v.changed,
    }


def metrics_text(
    v: Verdict | None, stack: str | None, windows: int, errors: int, resets: int, profile_id: int | None
) -> str:
    """The watch's own Prometheus text (served on ``--metrics-port``)."""
    out: list[str] = []

    def metric(name: str, kind: str, help_: str, rows: Sequence[tuple[str, float | None]]) -> None:
        rows = [(labels, val) for labels, val in rows if val is not None]
        if not rows:
            return
        out.extend([f"# HELP {name} {help_}", f"# TYPE {name} {kind}"])
        out.extend(f"{name}{labels} {val:g}" for labels, val in rows)

    info = f'{{backend="{stack or "unknown"}",profile="{profile_id if profile_id is not None else ""}"}}'
    metric("autotune_watch_info", "gauge", "What is watched, against which stored profile.", [(info, 1)])
    metric("autotune_windows_total", "counter", "Windows derived from two scrapes.", [("", windows)])
    metric("autotune_scrape_errors_total", "counter", "Failed or unreadable scrapes.", [("", errors)])
    metric(
        "autotune_counter_resets_total", "counter", "Windows skipped: the server restarted.", [("", resets)]
    )
    if v is not None:
        a, w = v.assessment, v.assessment.window
        live = w.per_position_acceptance if a.acceptance_source == "live" else []
        metric(
            "autotune_live_acceptance",
            "gauge",
            "Live acceptance at draft position (1-based, unconditional) in the last window.",
            [(f'{{position="{i + 1}"}}', x) for i, x in enumerate(live)],
        )
        metric(
            "autotune_requests_running",
            "gauge",
            "Mean requests running in the last window.",
            [("", w.running)],
        )
        metric(
            "autotune_generated_tokens_per_second",
            "gauge",
            "Generated tokens/s in the last window.",
            [("", w.tokens_per_second)],
        )
        metric("autotune_served_k", "gauge", "The profile's K at the live load.", [("", a.served_k)])
        metric("autotune_alternative_k", "gauge", "The best other K predicted.", [("", v.alternative)])
        metric(
            "autotune_predicted_gain",
            "gauge",
            "Predicted tokens/s of the alternative K over the served K.",
            [("", v.gain.value)],
        )
        metric(
            "autotune_predicted_gain_low",
            "gauge",
            "Lower bound of the gain's 95% interval over the alarm streak.",
            [("", v.gain.low)],
        )
        metric("autotune_profile_stale", "gauge", "1 when the profile is stale.", [("", int(v.stale))])
    else:
        metric("autotune_profile_stale", "gauge", "1 when the profile is stale.", [("", 0)])
    return "\n".join(out) + "\n"


class MetricsServer:
    """The watch's own /metrics (http.server in a daemon thread); ``close`` stops it."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._text = metrics_text(None, None, 0, 0, 0, None)
        self._lock = threading.Lock()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                    self.send_error(404)
                    return
                body = owner.text.encode("utf-8")
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        try:
            self._server = http.server.ThreadingHTTPServer((host, port), Handler)
        except OSError as exc:
            raise ConfigError(
                f"--metrics-port {port}: cannot listen on {host}:{port} ({exc.strerror})"
            ) from None
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="autotune-watch-metrics")
        self._thread.daemon = True
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def text(self) -> str:
        with self._lock:
            return self._text

    def update(self, text: str) -> None:
        with self._lock:
            self._text = text

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


# --- the loop ----------------------------------------------------------------------------------------


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


def json_line(obj: Mapping[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"))
