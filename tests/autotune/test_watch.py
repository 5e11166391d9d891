"""``autotune watch``: scrape parsing of both stacks' recorded /metrics texts, windows from two scrapes,
the staleness rule with hysteresis on synthetic windows, the watch's own metrics endpoint, and the
CLI against a tiny in-process fake server (no vLLM, no llama-server).

The recorded texts (tests/autotune/data/metrics_*.txt) are in each stack's exact exposition format:
vLLM's rendered by the prometheus_client vLLM uses (label order, ``_total``/``_created``, ``NaN``),
llama-server's as ``server_task_result_metrics::to_metrics`` writes them (C++ ``<<`` on a double:
six significant digits, ``1.23457e+06``, ``nan``; the per-position series only once it has counts).
"""

from __future__ import annotations

import copy
import dataclasses
import http.server
import json
import math
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from autotune.cli import main
from autotune.errors import ConfigError
from autotune.stats import Estimate
from autotune.watch import endpoint, loop, output, predict, profile_model, scrape, staleness, windows
from profiles.errors import ProfileError
from profiles.schema import Profile
from profiles.store import Store

DATA = Path(__file__).parent / "data"
ALPHA = 0.8  # the profile's conditional acceptance: per-position acceptance 0.8^i
BATCHES = (1, 2, 4, 8)


def recorded(name: str) -> str:
    return (DATA / f"metrics_{name}.txt").read_text()


def curves_json() -> dict[str, Any]:
    """Synthetic step costs (as the profiler stores them: string keys): verify grows with rows x width."""
    return {
        "t_verify": {
            str(b): {str(k): 0.020 * (1 + 0.15 * (b - 1)) + 0.0005 * b * (k - 1) for k in range(1, 8)}
            for b in BATCHES
        },
        "t_draft": {str(b): 0.0025 * (1 + 0.1 * (b - 1)) for b in BATCHES},
    }


PROFILE: dict[str, Any] = {
    "tool_version": "0.1.0",
    "created_at": "2026-11-30T01:30:00+00:00",
    "device": {"key": "ab12cd34ef56", "label": "CPU test", "kind": "cpu"},
    "pair": {
        "target": "/m/target",
        "draft": "/m/draft",
        "drafter": "model",
        "target_hash": "t" * 64,
        "draft_hash": "d" * 64,
    },
    "workload": {"hash": "w" * 64, "concurrency": [1, 2, 4]},
    "chosen": {"drafter": "model", "gamma": 5, "confidence_threshold": 0.0, "max_batch_size": 4},
    # under ALPHA and these curves K=5 is best at one row, K=4 from two rows on
    "schedule": [{"batch_size": 1, "gamma": 5}, {"batch_size": 2, "gamma": 4}, {"batch_size": 4, "gamma": 4}],
    "table_decision": {"levels": [{"batch_size": 1, "gamma": 5}, {"batch_size": 4, "gamma": 4}]},
    "curves": curves_json(),
    "acceptance": {"gamma_max": 6, "per_position_acceptance": [ALPHA**i for i in range(1, 7)]},
    "backend": {"name": "vllm"},
}


def model(**changes: Any) -> profile_model.ProfileModel:
    return profile_model.ProfileModel.from_profile(
        Profile.from_json({**copy.deepcopy(PROFILE), **changes, "id": 7})
    )


def live_window(alpha: float, running: float = 1.0, drafts: int = 600, k: int = 5) -> windows.Window:
    """A 15 s window of ``drafts`` drafts of K tokens whose conditional acceptance is ``alpha``."""
    per_pos = tuple(float(round(drafts * alpha**i)) for i in range(1, k + 1))
    accepted = sum(per_pos)
    return windows.Window(15.0, drafts, drafts * k, accepted, per_pos, drafts + accepted, running, 0.0)


# --- parsing -----------------------------------------------------------------------------------------


def test_vllm_recorded_texts_parse_and_difference_into_a_window() -> None:
    a = scrape.read_scrape(recorded("vllm_a"), at=100.0)
    b = scrape.read_scrape(recorded("vllm_b"), at=115.0)
    assert a.stack == "vllm" and a.spec.drafts == 12000 and a.counters["generated"] == 45000
    assert a.spec.accepted_per_pos == (9600, 7700, 5500, 3700, 2500)
    assert a.gauges["running"] == 3 and a.gauges["started"] == pytest.approx(1764500000.25)
    win = windows.window(a, b)
    assert win.seconds == 15 and win.drafts == 600 and win.draft_tokens == 3000 and win.accepted == 726
    assert win.per_position_acceptance == pytest.approx([0.62, 0.38, 0.14, 0.05, 0.02])
    assert win.acceptance_rate == pytest.approx(0.242) and win.mean_accepted_length == pytest.approx(2.21)
    assert win.tokens_per_second == pytest.approx(1326 / 15) and win.drafts_per_second == 40
    assert win.running == 3 and win.waiting == 0.5 and win.mean_draft_length == 5 and not win.idle


def test_the_watch_and_the_tuner_read_one_scrape_with_one_reader_and_one_rule(monkeypatch) -> None:
    """The same two scrapes through the watch (a window) and through the tuner (a load level's
    counts, as HttpBackend.run_command takes them): both call prometheus.read_spec_counts and get
    the same per-position acceptance. The later scrape counts position 3 ahead of position 2 (a
    scrape between two of one step's increments): both hold it at position 2's."""
    from autotune.backends import http_backend, prometheus

    before = recorded("vllm_a")
    after = recorded("vllm_b").replace('position="3"} 3730.0', 'position="3"} 3790.0')
    real, calls = prometheus.read_spec_counts, []

    def spy(samples: prometheus.Samples, prefix: str) -> prometheus.SpecCounts | None:
        calls.append(prefix)
        return real(samples, prefix)

    monkeypatch.setattr(prometheus, "read_spec_counts", spy)
    watched = windows.window(scrape.read_scrape(before, at=0.0), scrape.read_scrape(after, at=15.0))
    assert calls == ["vllm", "vllm"]
    level = http_backend.spec_counts(after, "vllm") - http_backend.spec_counts(before, "vllm")
    assert calls == ["vllm"] * 4
    assert level.accepted_per_pos == watched.accepted_per_pos == (372.0, 228.0, 84.0, 90.0, 12.0)
    tuned = level.metrics()["per_position_acceptance"]
    assert tuned == watched.per_position_acceptance == pytest.approx([0.62, 0.38, 0.14, 0.14, 0.02])


def test_vllm_requests_running_is_the_windows_time_average_not_two_point_samples() -> None:
    """Little's law: the seconds finished requests spent running over the window's seconds. The
    gauge's two point samples (8 and 14 of a closed loop of 16 here) only stand in where no request
    finished, or where requests are long next to the window (each is counted whole where it ends)."""

    def scraped(running: float, busy_s: float, finished: float, at: float) -> scrape.Scrape:
        text = (
            recorded("vllm_a")
            .replace('model_name="demo-target"} 3.0', f'model_name="demo-target"}} {running}', 1)
            .replace(
                'inference_time_seconds_sum{engine="0",model_name="demo-target"} 900.0',
                f'inference_time_seconds_sum{{engine="0",model_name="demo-target"}} {busy_s}',
            )
            .replace(
                'inference_time_seconds_count{engine="0",model_name="demo-target"} 400.0',
                f'inference_time_seconds_count{{engine="0",model_name="demo-target"}} {finished}',
            )
        )
        s = scrape.read_scrape(text, at=at)
        assert s.gauges["running"] == running and s.counters["running_seconds"] == busy_s
        return s

    start = scraped(8.0, 900.0, 400.0, at=0.0)
    # 16 in flight for 15 s: 108 requests of 2.2 s finished, 237.6 running-seconds
    assert windows.window(start, scraped(14.0, 1137.6, 508.0, at=15.0)).running == pytest.approx(15.84)
    # none finished in the window: the gauges' mean
    assert windows.window(start, scraped(14.0, 900.0, 400.0, at=15.0)).running == 11.0
    # requests of 40 s in a 15 s window: whole ones would overstate it, the gauges' mean
    assert windows.window(start, scraped(2.0, 980.0, 402.0, at=15.0)).running == 5.0


def _two_engines(text: str) -> str:
    """A ``--data-parallel-size 2`` server's text: every ``engine="0"`` sample repeated for ``engine="1"``."""
    lines = text.splitlines()
    return "\n".join(
        lines + [line.replace('engine="0"', 'engine="1"') for line in lines if 'engine="0"' in line]
    )


def test_data_parallel_engines_are_counted_and_the_load_is_per_engine() -> None:
    """Two engines each running 3 requests: totals double, the batch each engine's table lookup
    sees stays 3; a server whose engine count changes between scrapes restarted."""
    one_a, one_b = (
        scrape.read_scrape(recorded("vllm_a"), at=0.0),
        scrape.read_scrape(recorded("vllm_b"), at=15.0),
    )
    two_a = scrape.read_scrape(_two_engines(recorded("vllm_a")), at=0.0)
    two_b = scrape.read_scrape(_two_engines(recorded("vllm_b")), at=15.0)
    assert (one_a.engines, two_a.engines) == (1, 2)
    assert two_a.gauges["running"] == 2 * one_a.gauges["running"]
    one, two = windows.window(one_a, one_b), windows.window(two_a, two_b)
    assert two.engines == 2 and two.generated == 2 * one.generated
    assert two.running == pytest.approx(one.running) and two.waiting == pytest.approx(one.waiting)
    assert two.per_position_acceptance == pytest.approx(one.per_position_acceptance)
    with pytest.raises(windows.CounterReset, match="engines changed"):
        windows.window(one_a, two_b)


def test_llamacpp_recorded_texts_parse_and_difference_into_a_window() -> None:
    a = scrape.read_scrape(recorded("llamacpp_a"), at=0.0)
    b = scrape.read_scrape(recorded("llamacpp_b"), at=15.0)
    assert a.stack == "llamacpp" and a.counters["generated"] == 18432 and a.counters["decodes"] == 9120
    win = windows.window(a, b)
    assert win.drafts == 300 and win.draft_tokens == 1400 and win.accepted == 420
    assert win.per_position_acceptance == pytest.approx([190 / 300, 120 / 300, 70 / 300, 0.1, 10 / 300])
    assert win.tokens_per_second == 48
    # mean busy slots per decode in the window (1500 / 600), from the since-start gauge x n_decode_total
    assert win.running == pytest.approx(2.5, abs=1e-3)
    assert win.waiting == 0.5  # requests_deferred 0 -> 1


def test_llamacpp_six_significant_digits_and_speculation_off() -> None:
    big = scrape.read_scrape(recorded("llamacpp_big"))
    assert big.counters["generated"] == 1234570.0 and big.spec.drafts == 700001
    off = scrape.read_scrape(recorded("llamacpp_nospec"))
    assert off.spec.drafts == 0 and off.spec.accepted_per_pos == ()  # no per-position series printed
    assert "busy_per_decode" not in off.gauges and off.gauges["running"] == 2  # its nan is ignored
    later = scrape.read_scrape(
        recorded("llamacpp_nospec").replace("tokens_predicted_total 18432", "tokens_predicted_total 18900"),
        at=15,
    )
    win = windows.window(off, later)
    assert win.drafts == 0 and win.per_position_acceptance == [] and win.running == 2 and win.generated == 468


def test_nan_and_missing_series_are_absent_not_zero() -> None:
    b = scrape.read_scrape(recorded("vllm_b"), at=0)
    nan = scrape.read_scrape(recorded("vllm_nan"), at=15)  # speculation off, running gauge NaN
    assert "running" not in nan.gauges and nan.spec is None
    win = windows.window(b, nan)
    assert win.drafts is None and win.per_position_acceptance == [] and win.generated == 674
    assert win.running == 3  # only the first scrape's gauge is known
    no_pos = scrape.read_scrape(
        "\n".join(line for line in recorded("vllm_b").splitlines() if "per_pos" not in line), at=30
    )
    assert windows.window(b, no_pos).accepted_per_pos == ()  # a series gone: no per-position acceptance


def test_counter_reset_and_restart_are_detected() -> None:
    b = scrape.read_scrape(recorded("vllm_b"), at=0)
    with pytest.raises(windows.CounterReset, match="went down|process_start_time"):
        windows.window(b, scrape.read_scrape(recorded("vllm_restarted"), at=15))
    # a restart whose counters already passed the old values: the start time still tells
    grown = recorded("vllm_b").replace(
        "process_start_time_seconds 1.76450000025e+09", "process_start_time_seconds 1.7645009e+09"
    )
    with pytest.raises(windows.CounterReset, match="process_start_time_seconds"):
        windows.window(b, scrape.read_scrape(grown, at=15))
    a = scrape.read_scrape(recorded("llamacpp_b"))
    with pytest.raises(
        windows.CounterReset, match=r"llamacpp:spec_decode_num_drafts_total went down \(4900 -> 4600\)"
    ):
        windows.window(a, scrape.read_scrape(recorded("llamacpp_a"), at=15))


def test_unreadable_texts_are_metrics_errors() -> None:
    for text in ("<html><body>502 Bad Gateway</body></html>", "", "up 1\nprocess_cpu_seconds_total 3"):
        with pytest.raises(scrape.MetricsError):
            scrape.read_scrape(text)
    with pytest.raises(scrape.MetricsError, match="no llamacpp: metrics"):
        scrape.read_scrape(recorded("vllm_a"), "llamacpp")


def test_metrics_url_checks_the_url() -> None:
    assert scrape.metrics_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/metrics"
    for bad in ("127.0.0.1:8000", "ftp://h/", "http://", "http://h:99999"):
        with pytest.raises(ConfigError, match="--url"):
            scrape.metrics_url(bad)


# --- the cost model and the rule ---------------------------------------------------------------------


def test_profile_model_serves_the_tuned_k_and_predicts_it_best_on_the_profiles_own_acceptance() -> None:
    m = model()
    assert m.gamma_max == 6 and m.levels == (1, 2, 4) and m.level_choices == {1: 5, 4: 4}
    assert [m.served_k("vllm", b) for b in (1, 1.4, 2, 3, 4, 9)] == [5, 5, 4, 4, 4, 4]
    assert m.served_k("llamacpp", 4) == 5  # llama-server takes one K
    for b in (1, 2, 4):
        tps = [predict.engine_tokens_per_second(m.curves, m.acceptance, k, b) for k in range(7)]
        assert max(range(7), key=tps.__getitem__) == m.served_k("vllm", b)
    a = predict.assess(m, live_window(ALPHA), "vllm")
    assert a.acceptance_source == "live" and a.served_k == 5 and a.gain < 1.0
    assert a.acceptance[5] == pytest.approx(ALPHA**6, rel=0.02)  # position 6 extrapolated


def test_a_load_switch_is_stale_where_the_profile_serves_the_wrong_k_there() -> None:
    """At 8 rows the verify cost grows steeply with width: K=2 is best there. vLLM serves the
    profile's table (K=2 at 8 rows): fresh; llama-server serves one K=5 everywhere: stale."""
    curves = curves_json()
    curves["t_verify"]["8"] = {str(k): 0.044 + 0.016 * (k - 1) for k in range(1, 8)}
    schedule = [*PROFILE["schedule"], {"batch_size": 8, "gamma": 2}]
    m = model(curves=curves, schedule=schedule)
    tps = [predict.engine_tokens_per_second(m.curves, m.acceptance, k, 8) for k in range(7)]
    assert max(range(7), key=tps.__getitem__) == 2 and tps[2] / tps[5] > 1.1
    for stack, stale in (("vllm", False), ("llamacpp", True)):
        rule = staleness.Staleness(windows_to_stale=3)

        def served(running: float, stack: str = stack) -> windows.Window:  # drafts of the K the stack serves
            return live_window(ALPHA, running=running, k=m.served_k(stack, running))

        quiet = [rule.update(predict.assess(m, served(1), stack)) for _ in range(3)]
        busy = [rule.update(predict.assess(m, served(8), stack)) for _ in range(3)]
        assert not any(v.stale for v in quiet) and busy[-1].stale == stale, stack
        assert busy[-1].assessment.served_k == (2 if stack == "vllm" else 5)
    assert busy[-1].alternative == 2


def test_the_server_running_fewer_positions_than_the_profiles_k_is_what_is_served() -> None:
    a = predict.assess(model(), live_window(ALPHA, k=3), "vllm")
    assert a.served_k == 3 and a.served_from == "server" and a.observed_positions == 3
    assert predict.assess(model(), live_window(ALPHA), "vllm").served_from == "profile"


def test_a_vllm_server_drafting_another_k_than_the_profiles_is_held_at_its_own_k() -> None:
    """vLLM drafts the K it serves for every running request: 600 drafts of 3 tokens each, with
    counters for 5 positions (a table whose largest K is 5, serving 3 at this load), say K=3 is
    served whatever the profile exported (5); llama-server's drafts stop early on the draft's
    confidence, so there the counted positions stay its K."""
    win = live_window(ALPHA, k=5)
    win = dataclasses.replace(win, draft_tokens=win.drafts * 3)
    a = predict.assess(model(), win, "vllm")
    assert a.served_k == 3 and a.served_from == "server" and a.observed_positions == 5
    assert predict.assess(model(), win, "llamacpp").served_k == 5


def k1_best_at_4_requests():
    """A stack cost fit whose per-token cost at 4 requests makes K=1 the best there."""
    from autotune.cost.stackcost import LevelCost, StackCost

    return StackCost(
        "model",
        {1: LevelCost(0.02, 0.002, 0.002, 1.0), 4: LevelCost(0.03, 0.002, 0.02, 4.0)},
        tuple(ALPHA**i for i in range(1, 7)),
        (0, 2, 6),
        "linear",
    )


def test_the_stack_that_measured_the_profile_is_predicted_with_its_own_fitted_costs() -> None:
    """``profile["stack_cost"]`` (autotune.cost.stackcost) replaces the engine curves for the stack that
    measured it: here its per-token cost at 4 requests makes K=1 the best there, which the engine
    curves would not say; llama-server (another stack) keeps the curves."""
    fit = k1_best_at_4_requests()
    m = model(stack_cost=fit.to_json(), table_decision={})  # no measured per-level choice to defer to
    assert m.stack_cost is not None and m.stack_cost.levels.keys() == {1, 4}
    a = predict.assess(m, live_window(ALPHA, running=4), "vllm")
    assert a.costs == "stack" and a.calibrated_at is None
    assert a.tps[1] == pytest.approx(fit.predict_at_load(4, 1, a.acceptance))
    assert max(range(len(a.tps)), key=a.tps.__getitem__) == 1 and a.alternative == 1 and a.gain > 1
    other = predict.assess(m, live_window(ALPHA, running=4), "llamacpp")
    assert other.costs == "engine" and other.tps[1] == pytest.approx(
        predict.engine_tokens_per_second(m.curves, other.acceptance, 1, 4)
    )
    with pytest.raises(ProfileError, match="unreadable 'stack_cost'"):
        model(stack_cost={"levels": {}})


def test_at_a_tuned_level_whose_measured_choice_is_served_only_a_change_of_acceptance_alarms() -> None:
    """The fit predicts K=1 best at 4 requests, but the tune measured the served K=4 best there
    (table_decision): at the profile's own acceptance that claim is the model's error, so a load
    switch to that level stays fresh; an acceptance drop at the same load still goes stale. Outside
    the tuned levels nothing is calibrated."""
    fit = k1_best_at_4_requests()
    m = model(stack_cost=fit.to_json())
    raw = model(stack_cost=fit.to_json(), table_decision={})
    assert (
        predict.assess(raw, live_window(ALPHA, running=4, k=4), "vllm").gain > 1.05
    )  # the uncalibrated claim
    a = predict.assess(m, live_window(ALPHA, running=4, k=4), "vllm")
    assert (
        a.calibrated_at == 4 and a.served_k == 4 and a.gain == pytest.approx(1.0, rel=1e-3)
    )  # counts rounded
    assert all(c >= 1.0 for c in a.calibration) and a.calibration[4] == 1.0
    rule = staleness.Staleness(windows_to_stale=3)
    steady = [rule.update(predict.assess(m, live_window(ALPHA, running=4, k=4), "vllm")) for _ in range(5)]
    assert not any(v.alarm or v.stale for v in steady)
    dropped = [rule.update(predict.assess(m, live_window(0.4, running=4, k=4), "vllm")) for _ in range(3)]
    assert dropped[-1].stale and dropped[-1].alternative != 4
    assert predict.measured_level(m, 9.0) is None  # above the tuned levels (1, 2, 4)
    assert output.verdict_json(steady[0], m, "vllm")["calibrated_at_level"] == 4


def off_level_with_k4_at_4_requests(ratio: float | None) -> profile_model.ProfileModel:
    """A fit that has speculation off a hair above the served K=4 at 4 requests (1.01x) at the
    profile's acceptance, where the tune measured K=4 best (table_decision) and, when ``ratio`` is
    given, K=4 ``ratio`` x no speculation there (``schedule[].ratio``)."""
    from autotune.cost.stackcost import LevelCost, StackCost

    fit = StackCost(
        "model",
        {1: LevelCost(0.02, 0.002, 0.002, 1.0), 4: LevelCost(0.03, 0.032, 0.01, 4.0)},
        tuple(ALPHA**i for i in range(1, 7)),
        (0, 2, 6),
        "linear",
    )
    at_4 = {"batch_size": 4, "gamma": 4}
    if ratio is not None:
        at_4["ratio"] = {"value": ratio, "ci95": [ratio - 0.1, ratio + 0.1], "n": 3}
    schedule = [{"batch_size": 1, "gamma": 5}, {"batch_size": 2, "gamma": 4}, at_4]
    return model(stack_cost=fit.to_json(), schedule=schedule)


def test_speculation_off_is_held_where_the_tune_measured_it_not_at_the_models_parity() -> None:
    """At the profile's acceptance the model has K=0 1.01x the served K=4; the tune measured K=4
    1.2x K=0 there. An acceptance 6% under the profile's (0.75 vs 0.8 conditional) makes the model
    claim K=0 ~1.1x: with the measured ratio that is K=0 ~0.92x (fresh), without it (a profile from
    before the key) the model's parity holds K=0 and the window alarms. A collapse of acceptance
    is stale either way."""
    held = off_level_with_k4_at_4_requests(1.2)
    assert held.off_ratios == {4: 1.2}
    a = predict.assess(held, live_window(0.75, running=4, k=4), "vllm")
    base = [held.stack_cost.predict_at_load(4, k, held.stack_cost.acceptance) for k in range(5)]
    assert base[0] / base[4] == pytest.approx(1.01, abs=0.01)
    assert (
        a.calibrated_at == 4
        and a.served_k == 4
        and a.calibration[0] == pytest.approx(base[0] * 1.2 / base[4])
    )
    assert a.tps[0] / a.tps[4] < 0.95 and a.gain < 1.0
    old = predict.assess(off_level_with_k4_at_4_requests(None), live_window(0.75, running=4, k=4), "vllm")
    assert old.alternative == 0 and old.gain > 1.05
    rule = staleness.Staleness(windows_to_stale=3)
    assert not any(
        rule.update(predict.assess(held, live_window(0.75, running=4, k=4), "vllm")).alarm for _ in range(6)
    )
    collapsed = [
        rule.update(predict.assess(held, live_window(0.3, running=4, k=4), "vllm")) for _ in range(3)
    ]
    assert collapsed[-1].stale and collapsed[-1].alternative == 0


def test_at_a_tuned_level_whose_measured_choice_is_not_served_the_measurement_is_named() -> None:
    """The tune served K=4 at 4 requests but measured K=2 best there (one K for a sweep does that);
    the fit claims K=1. At the profile's own acceptance the watch names the measured K=2, with the
    model's gain of K=2 over the served K, and goes stale on it: the measurement wins over the model."""
    fit = k1_best_at_4_requests()
    levels = [{"batch_size": 1, "gamma": 5}, {"batch_size": 4, "gamma": 2}]
    m = model(stack_cost=fit.to_json(), table_decision={"levels": levels})
    a = predict.assess(m, live_window(ALPHA, running=4, k=4), "vllm")
    assert a.served_k == 4 and a.calibrated_at == 4 and a.alternative == 2
    base = [fit.predict_at_load(4, k, a.acceptance) for k in range(len(a.tps))]
    assert a.gain == pytest.approx(base[2] / base[4], rel=1e-3) and a.gain > 1.05
    rule = staleness.Staleness(windows_to_stale=3)
    verdicts = [rule.update(predict.assess(m, live_window(ALPHA, running=4, k=4), "vllm")) for _ in range(3)]
    assert verdicts[-1].stale and verdicts[-1].alternative == 2


def measured_at_4(over: dict[str, Any] | None) -> profile_model.ProfileModel:
    """The profile above (served K=4 at 4 requests, K=2 measured best there), its level-4 entry
    carrying the tune's paired ratio of K=2 over the served K=4 there (``over_chosen``) when given."""
    level = {"batch_size": 4, "gamma": 2, **({"over_chosen": over} if over is not None else {})}
    levels = [{"batch_size": 1, "gamma": 5}, level]
    return model(stack_cost=k1_best_at_4_requests().to_json(), table_decision={"levels": levels})


def no_drafts(running: float = 4.0) -> windows.Window:
    """A window without drafts (speculation off, a quiet window): no live acceptance."""
    return windows.Window(15.0, generated=900.0, running=running)


def test_without_live_acceptance_at_a_tuned_level_the_gains_interval_is_the_tunes_measurement() -> None:
    """Every window without live acceptance predicts the same gain, so over the windows the interval
    is a point; the tune measured K=2 over the served K=4 at 4 requests at 1.20x (1.08-1.32, 3
    rounds), and that interval, scaled to the predicted gain, is the verdict's: it excludes 1, so
    the profile goes stale after the windows. A window with live acceptance keeps the windows."""
    m = measured_at_4({"value": 1.2, "ci95": [1.08, 1.32], "n": 3})
    assert m.level_ratios == {4: Estimate(1.2, 1.08, 1.32, 3)} and m.chosen_k_at(4) == 4
    rule = staleness.Staleness(windows_to_stale=3)
    out = [rule.update(predict.assess(m, no_drafts(), "vllm")) for _ in range(3)]
    a, g = out[-1].assessment, out[-1].gain
    assert a.acceptance_source == "profile" and a.calibrated_at == 4 and a.served_k == 4
    assert a.alternative == out[-1].alternative == 2 and a.measured == Estimate(1.2, 1.08, 1.32, 3)
    assert g.value == pytest.approx(a.gain) and a.gain > 1.05 and g.n == 3
    assert g.low == pytest.approx(a.gain * 1.08 / 1.2) and g.high == pytest.approx(a.gain * 1.32 / 1.2)
    assert [v.stale for v in out] == [False, False, True] and out[-1].interval_from == "tune"
    line = output.render_line(out[-1], m)
    assert line.endswith(
        f"(95% CI {g.low:.2f}-{g.high:.2f}, measured by the tune) for 3 windows: profile stale"
    )
    obj = output.verdict_json(out[-1], m, "vllm")
    assert obj["gain_ci95"] == [round(g.low, 4), round(g.high, 4)] and obj["gain_ci95_from"] == "tune"
    assert obj["gain_windows"] == 3
    assert predict.assess(m, live_window(ALPHA, running=4, k=4), "vllm").measured is None  # live: windows
    with pytest.raises(ProfileError, match=r"missing key 'table_decision.levels\[1\].over_chosen.ci95'"):
        measured_at_4({"value": 1.2})


def test_without_live_acceptance_a_measured_interval_including_one_raises_no_false_alarm() -> None:
    """The same level with a measured 1.07x (0.89-1.28): the predicted gain is above the margin, so
    every window alarms, but the tune's interval includes 1, so a steady workload never goes stale."""
    m = measured_at_4({"value": 1.07, "ci95": [0.89, 1.28], "n": 3})
    rule = staleness.Staleness(windows_to_stale=3)
    out = [rule.update(predict.assess(m, no_drafts(), "vllm")) for _ in range(8)]
    assert all(v.alarm and v.gain.value > 1.05 for v in out) and not any(v.stale for v in out)
    assert all(v.gain.low < 1.0 < v.gain.high and v.interval_from == "tune" for v in out)


def test_without_live_acceptance_a_profile_without_the_measured_ratio_keeps_the_windows() -> None:
    """Profiles from before ``over_chosen``: the windows are the repeats, as before (identical
    windows: a zero-width interval, stale after the windows)."""
    m = measured_at_4(None)
    assert m.level_ratios == {}
    rule = staleness.Staleness(windows_to_stale=3)
    out = [rule.update(predict.assess(m, no_drafts(), "vllm")) for _ in range(3)]
    g = out[-1].gain
    assert out[-1].assessment.measured is None and out[-1].interval_from == "windows"
    assert g.n == 3 and g.low == pytest.approx(g.value) == pytest.approx(g.high) and out[-1].stale
    obj = output.verdict_json(out[-1], m, "vllm")
    assert obj["gain_ci95_from"] == "windows" and obj["gain_windows"] == 3


def test_a_stored_version_1_profile_gives_the_watch_its_measured_ratios() -> None:
    """A profile stored at schema version 1 (``over_chosen`` as ``{value, low, high, n}``) is read
    through the typed table decision: the watch gets the same choices and measured ratios."""
    v1 = json.loads((Path(__file__).parents[1] / "profiles" / "data" / "stored_v1_vllm.json").read_text())
    m = profile_model.ProfileModel.from_profile(Profile.from_json(v1))
    levels = v1["table_decision"]["levels"]
    assert (
        m.level_choices == {lv["batch_size"]: lv["gamma"] for lv in levels} == {1: 5, 2: 5, 4: 5, 8: 2, 16: 0}
    )
    over = {lv["batch_size"]: lv["over_chosen"] for lv in levels if "over_chosen" in lv}
    assert m.level_ratios == {b: Estimate(o["value"], o["low"], o["high"], o["n"]) for b, o in over.items()}
    assert set(m.level_ratios) == {8, 16} and m.stack_cost is not None and m.backend == "vllm"


def test_a_profile_without_curves_or_acceptance_is_one_line() -> None:
    with pytest.raises(ProfileError, match="no 'curves'"):
        profile_model.ProfileModel.from_profile(
            Profile.from_json({k: v for k, v in PROFILE.items() if k != "curves"})
        )
    with pytest.raises(ProfileError, match="per_position_acceptance"):
        model(acceptance={"gamma_max": 6})


def test_speculation_off_uses_the_profiles_acceptance() -> None:
    a = predict.assess(model(), windows.Window(15.0, generated=900.0, running=2.0), "vllm")
    assert a.acceptance_source == "profile" and a.served_k == 4 and not a.idle


def verdicts(m: profile_model.ProfileModel, alphas: list[float], n: int = 3) -> list[staleness.Verdict]:
    rule = staleness.Staleness(windows_to_stale=n, margin=1.05)
    return [rule.update(predict.assess(m, live_window(x), "vllm")) for x in alphas]


def test_steady_workload_never_alarms() -> None:
    jitter = [0.0, 0.02, -0.015, 0.01, -0.02, 0.015, -0.01, 0.005] * 4
    out = verdicts(model(), [ALPHA + j for j in jitter])
    assert not any(v.alarm or v.stale for v in out)


def test_a_sustained_acceptance_drop_is_stale_after_n_windows_and_clears_after_n() -> None:
    m = model()
    out = verdicts(m, [ALPHA] * 4 + [0.5, 0.52, 0.48, 0.5, 0.51] + [ALPHA] * 4)
    stale = [v.stale for v in out]
    assert stale == [False] * 4 + [False, False, True, True, True] + [True, True, False, False]
    first = out[6]
    assert first.changed and first.alternative == 2 and first.streak == 3 and first.gain.n == 3
    assert first.gain.low > 1.0 and first.gain.value == pytest.approx(1.2, abs=0.05)
    assert out[11].changed and not out[11].stale
    line = output.render_line(first, m)
    assert line.startswith("acceptance 0.")
    assert "(profile 0.54) at ~1 request running: predicted K=2 1.2" in line
    assert "over the served K=5 (95% CI 1." in line and line.endswith("for 3 windows: profile stale")
    assert output.render_line(out[9], m).endswith("profile stale (fresh after 2 more calm windows)")
    assert output.render_line(out[10], m).endswith("profile stale (fresh after 1 more calm window)")
    assert output.render_line(out[5], m).endswith("fresh (2 of 3 windows to stale)")


def test_a_single_outlier_window_raises_no_alarm_state() -> None:
    out = verdicts(model(), [ALPHA, ALPHA, 0.4, ALPHA, ALPHA, 0.45, ALPHA])
    assert [v.alarm for v in out] == [False, False, True, False, False, True, False]
    assert not any(v.stale for v in out)


def test_idle_windows_change_nothing() -> None:
    m, rule = model(), staleness.Staleness(windows_to_stale=2)
    rule.update(predict.assess(m, live_window(0.5), "vllm"))
    idle = rule.update(predict.assess(m, windows.Window(15.0, 0, 0, 0, (), 0, 0.0), "vllm"))
    assert (
        idle.idle
        and not idle.alarm
        and output.render_line(idle, m).startswith("idle: no tokens counted in 15 s")
    )
    assert rule.update(
        predict.assess(m, live_window(0.5), "vllm")
    ).stale  # the streak went on across the idle one


def fake(gains: list[float]) -> list[predict.Assessment]:
    """Assessments whose K=1 is predicted ``gain`` x the served K=0."""
    win = live_window(ALPHA)
    return [predict.Assessment(win, 1.0, 0, (0.5,), "live", 1, (100.0, 100.0 * g), 1, g) for g in gains]


def test_an_alarm_streak_whose_interval_includes_one_is_not_stale() -> None:
    rule = staleness.Staleness(windows_to_stale=3, margin=1.05)
    out = [rule.update(a) for a in fake([1.06, 1.06, 1.9])]
    assert all(v.alarm for v in out) and not out[-1].stale and out[-1].gain.low < 1.0
    rule = staleness.Staleness(windows_to_stale=3, margin=1.05)
    out = [rule.update(a) for a in fake([1.3, 1.32, 1.28])]
    assert out[-1].stale and out[-1].gain.low > 1.0
    assert staleness.streak_gain(fake([1.2, 1.2]))[1] == Estimate(
        pytest.approx(1.2), pytest.approx(1.2), pytest.approx(1.2), 2
    )


def test_a_gain_near_the_margin_is_held_by_the_pooled_windows_and_does_not_flap() -> None:
    """The saturation case measured on vLLM: K=0 predicted 1.01-1.10x per window, never three in a
    row above 1.05. The better windows pool: stale once their pooled gain clears the margin with an
    interval above 1; windows between half the margin and the margin keep it stale."""
    gains = [1.06, 1.08, 1.03, 1.10, 1.05, 1.06, 1.09, 1.01, 1.08, 1.08, 1.05]
    rule = staleness.Staleness(windows_to_stale=3, margin=1.05)
    out = [rule.update(a) for a in fake(gains)]
    assert max(len(run) for run in "".join("a" if g > 1.05 else " " for g in gains).split()) < 3
    first = next(i for i, v in enumerate(out) if v.stale)
    assert first >= 2 and out[first].gain.value > 1.05 and out[first].gain.low > 1.0
    assert out[first].streak == first + 1 and out[first].gain.n == min(first + 1, 6)
    assert all(v.stale for v in out[first:])  # 1.01 is one calm window, not three
    # fresh after three calm windows (gain <= 1.025); a window in the band resets the count
    after = [rule.update(a) for a in fake([1.0, 1.02, 1.04, 0.99, 1.0, 1.01])]
    assert [v.stale for v in after] == [True, True, True, True, True, False]
    # gains that stay inside the margin never turn it stale, however long they last
    rule = staleness.Staleness(windows_to_stale=3, margin=1.05)
    assert not any(rule.update(a).stale for a in fake([1.01, 1.02, 1.03, 1.02, 1.01] * 6))


def test_once_decides_on_the_single_window() -> None:
    rule = staleness.Staleness(windows_to_stale=1, margin=1.05)
    assert rule.update(fake([1.07])[0]).stale
    assert not staleness.Staleness(windows_to_stale=1, margin=1.1).update(fake([1.07])[0]).stale


def test_json_object_of_a_window() -> None:
    m = model()
    v = verdicts(m, [0.5] * 3)[-1]
    obj = json.loads(output.json_line(output.verdict_json(v, m, "vllm")))
    assert obj["stale"] and obj["alternative_k"] == 2 and obj["served_k"] == 5 and obj["profile_id"] == 7
    assert obj["live_acceptance"][:2] == [0.5, 0.25] and obj["extrapolated_from_position"] == 6
    assert obj["nearest_level"] == 1 and obj["level_choice_k"] == 5 and not obj["outside_tuned_levels"]
    assert obj["gain_ci95"][0] > 1 and set(obj["predicted_tokens_per_second"]) == {str(k) for k in range(7)}


# --- the metrics endpoint ----------------------------------------------------------------------------


def test_metrics_text_and_endpoint() -> None:
    m = model()
    v = verdicts(m, [0.5] * 3)[-1]
    text = endpoint.metrics_text(v, "vllm", 3, 1, 0, 7)
    assert 'autotune_live_acceptance{position="1"} 0.5\n' in text
    assert 'autotune_live_acceptance{position="5"} 0.0316667\n' in text
    assert "autotune_profile_stale 1\n" in text and "autotune_windows_total 3\n" in text
    assert "# TYPE autotune_windows_total counter" in text and "autotune_scrape_errors_total 1\n" in text
    assert 'autotune_watch_info{backend="vllm",profile="7"} 1' in text
    gain = float(text.split("\nautotune_predicted_gain ")[1].split()[0])
    assert gain == pytest.approx(v.gain.value, rel=1e-5)
    server = endpoint.MetricsServer("127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{server.port}"
        assert (
            "autotune_profile_stale 0" in urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
        )
        server.update(text)
        assert urllib.request.urlopen(url + "/metrics", timeout=5).read().decode() == text
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(url + "/other", timeout=5)
    finally:
        server.close()


# --- the loop and the CLI against a fake server -------------------------------------------------------


def vllm_text(alpha: float, step: int, running: int = 1) -> str:
    """The recorded vLLM text with its counters at ``step`` x 600 drafts of K=5 at conditional ``alpha``."""
    drafts = 600 * step
    per_pos = [round(drafts * alpha**i) for i in range(1, 6)]
    values = {
        "vllm:spec_decode_num_drafts_total": drafts,
        "vllm:spec_decode_num_draft_tokens_total": 5 * drafts,
        "vllm:spec_decode_num_accepted_tokens_total": sum(per_pos),
        "vllm:generation_tokens_total": drafts + sum(per_pos),
        "vllm:num_requests_running": running,
    }
    out = []
    for line in recorded("vllm_a").splitlines():
        name = line.split("{", 1)[0]
        if not line.startswith("#") and name in values:
            line = f"{line.rsplit(' ', 1)[0]} {float(values[name])}"
        elif name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
            pos = int(line.split('position="')[1].split('"')[0])
            line = f"{line.rsplit(' ', 1)[0]} {float(per_pos[pos])}"
        out.append(line)
    return "\n".join(out) + "\n"


@pytest.fixture
def fake_server() -> Iterator[tuple[str, Any]]:
    """An http.server on 127.0.0.1 serving scripted /metrics texts in turn (the last one repeats);
    ``serve(*texts)`` starts a new script."""
    script: list[str] = []
    served = {"n": 0}

    def serve(*texts: str) -> None:
        script[:] = texts
        served["n"] = 0

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            if self.path != "/metrics" or not script:
                self.send_error(404)
                return
            body = script[min(served["n"], len(script) - 1)].encode()
            served["n"] += 1
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", serve
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def storage(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'autotune.db'}"
    with Store(url) as store:
        store.save_profile(copy.deepcopy(PROFILE))
    return url


def watch_cli(*args: str) -> Any:
    return CliRunner().invoke(main, ["watch", *args])


def test_once_exits_0_when_fresh_and_1_when_stale(fake_server, storage) -> None:
    url, serve = fake_server
    serve(vllm_text(ALPHA, 1), vllm_text(ALPHA, 2))
    result = watch_cli("--url", url, "--storage", storage, "--once", "--interval", "0.2")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().endswith(": fresh") and "the served K=5" in result.stdout
    serve(vllm_text(0.5, 1), vllm_text(0.5, 2))
    result = watch_cli("--url", url, "--storage", storage, "--once", "--interval", "0.2")
    assert result.exit_code == 1, result.output
    line = result.stdout.strip()
    assert line.startswith("acceptance 0.19 (profile 0.54) at ~1 request running: predicted K=2 1.2")
    assert line.endswith("over the served K=5 for 1 window: profile stale")
    assert "against profile #1 (the newest tuned on vllm)" in result.stderr
    serve(vllm_text(0.5, 1), vllm_text(0.5, 2))
    result = watch_cli("--url", url, "--storage", storage, "--once", "--interval", "0.2", "--json")
    obj = json.loads(result.stdout)
    assert result.exit_code == 1 and obj["stale"] and obj["alternative_k"] == 2 and obj["backend"] == "vllm"


def test_usage_errors_are_one_line_and_exit_2(fake_server, storage, tmp_path) -> None:
    url, serve = fake_server
    serve(vllm_text(ALPHA, 1))
    cases = [
        (["--url", "localhost:8000", "--storage", storage], "--url: need http://HOST:PORT"),
        (["--url", url, "--storage", f"sqlite:///{tmp_path / 'none.db'}"], "no profile database"),
        (["--url", url, "--storage", "sqlite://"], "no profile in the store"),
        (["--url", url, "--storage", storage, "--profile", "9"], "no profile with id 9"),
        (["--url", url, "--storage", storage, "--backend", "sglang"], "Invalid value for '--backend'"),
        (
            ["--url", "http://127.0.0.1:9/", "--storage", storage, "--once", "--interval", "0.2"],
            "cannot read",
        ),
    ]
    for args, message in cases:
        result = watch_cli(*args)
        assert result.exit_code == 2, (args, result.output)
        err = result.stderr.strip().splitlines()
        assert err[-1].startswith("error: ") and message in err[-1] and "Traceback" not in result.output


def test_the_loop_warns_and_goes_on_through_faults() -> None:
    texts = iter(
        [
            vllm_text(ALPHA, 1),
            "<html>502</html>",  # malformed: warning, no window
            "<html>502</html>",  # the same failure again: counted, not warned again
            vllm_text(ALPHA, 2),  # a window against the first scrape
            vllm_text(ALPHA, 1).replace("1.76450000025e+09", "1.7645009e+09"),  # restarted
            vllm_text(ALPHA, 2).replace("1.76450000025e+09", "1.7645009e+09"),
        ]
    )

    def fetch() -> str:
        return next(texts)

    warnings: list[str] = []
    clock = {"t": 0.0}
    state = loop.Watch(fetch, None, warnings.append, clock=lambda: clock["t"])
    state.baseline = state.scrape()
    out: list[staleness.Verdict] = []

    def sleep(s: float) -> None:
        clock["t"] += s

    code = loop.run(state, model(), staleness.Staleness(), out.append, 15.0, sleep=sleep, max_windows=2)
    assert code == 0 and len(out) == 2 and state.windows == 2 and state.resets == 1
    assert [x.split(" (")[0] for x in warnings] == [
        "warning: scrape failed",
        "note: scraping again after 2 failed scrapes",
        "warning: counter reset, server restarted?",
    ]
    assert state.errors == 2 and out[0].assessment.window.seconds == 45  # failed ticks inside the window
    assert not any(v.stale for v in out)


def test_ctrl_c_exits_0_and_closes_the_metrics_server(fake_server, storage, monkeypatch) -> None:
    url, serve = fake_server
    serve(vllm_text(ALPHA, 1), vllm_text(ALPHA, 2))
    closed = []
    real_close = endpoint.MetricsServer.close

    def close(self: endpoint.MetricsServer) -> None:
        closed.append(self.port)
        real_close(self)

    def interrupted(*args: Any, **kwargs: Any) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(endpoint.MetricsServer, "close", close)
    monkeypatch.setattr(loop, "run", interrupted)
    result = watch_cli("--url", url, "--storage", storage, "--metrics-port", "0")
    assert result.exit_code == 0 and "stopped" in result.stderr and len(closed) == 1
    assert "serving the watch's metrics on http://127.0.0.1:" in result.stderr
    assert math.isfinite(closed[0])


# ------------------------------------------------------------------------------------------
# --retune: one re-tune when the profile turns stale (autotune.jobs.retune)


def test_live_levels_bracket_the_live_load() -> None:
    from autotune.jobs.retune import live_levels

    assert [live_levels(b, 16) for b in (0.2, 1.0, 1.5, 2.0, 5.9, 16.0, 40.0)] == [
        (1,),
        (1,),
        (1, 2),
        (2,),
        (4, 8),
        (16,),
        (16,),
    ]
    assert live_levels(12.0, 12) == (8, 12)  # capped at the largest max_batch_size


def test_retune_config_changes_prompts_load_and_backend_only(tmp_path) -> None:
    from autotune.config import load_config
    from autotune.jobs.retune import retune_config

    prompts = tmp_path / "recent.jsonl"
    prompts.write_text('{"prompt": "def f(x):"}\n')
    cfg = load_config(Path(__file__).resolve().parents[2] / "tune.yaml")
    new = retune_config(cfg, prompts, "vllm", 3.2)
    assert new.workload.prompts == prompts.resolve()
    assert new.workload.concurrency == (2, 4) and new.backend.name == "vllm"
    assert new.search == cfg.search and new.budget == cfg.budget and new.storage == cfg.storage


def test_a_stale_profile_is_retuned_once_and_the_new_flags_printed(
    fake_server, storage, tmp_path, monkeypatch
) -> None:
    import autotune.jobs.tune

    calls: list[Any] = []

    def fake_run_tune(cfg: Any, say: Any = print, **kwargs: Any) -> dict:
        calls.append(cfg)
        say("(the study would run here)")
        new = copy.deepcopy(PROFILE)
        new["chosen"] = {**new["chosen"], "gamma": 2}
        new["schedule"] = [{**e, "gamma": 2} for e in new["schedule"]]
        return {**new, "id": 2, "exports": []}

    monkeypatch.setattr(autotune.jobs.tune, "run_tune", fake_run_tune)
    prompts = tmp_path / "recent.jsonl"
    prompts.write_text('{"prompt": "The weather today"}\n')
    config = Path(__file__).resolve().parents[2] / "tune.yaml"
    url, serve = fake_server
    base = ["--url", url, "--storage", storage, "--once", "--interval", "0.2", "--config", str(config)]
    serve(vllm_text(0.5, 1), vllm_text(0.5, 2))  # stale
    result = watch_cli(*base, "--retune", str(prompts))
    assert result.exit_code == 1, result.output
    assert len(calls) == 1
    assert calls[0].backend.name == "vllm" and calls[0].workload.concurrency == (1,)
    assert calls[0].workload.prompts == prompts.resolve()
    err = result.stderr
    assert "profile #1 stale: predicted K=2" in err and "re-tuning on vllm" in err
    assert "re-tuned: profile #2 stored" in err
    launch = next(line for line in err.splitlines() if line.startswith("new vllm launch: "))
    assert launch.startswith("new vllm launch: vllm serve /m/target --speculative-config ")
    assert '"num_speculative_tokens": 2}' in launch  # the new profile's K, not the stale one's 5
    assert "restart the server with the new flags" in err
    serve(vllm_text(ALPHA, 1), vllm_text(ALPHA, 2))  # fresh: no re-tune
    assert watch_cli(*base, "--retune", str(prompts)).exit_code == 0 and len(calls) == 1


def test_a_failing_retune_is_a_warning_and_a_missing_prompts_file_a_usage_error(
    fake_server, storage, tmp_path, monkeypatch
) -> None:
    import autotune.jobs.tune
    from autotune.errors import ConfigError

    def failing(cfg: Any, **kwargs: Any) -> dict:
        raise ConfigError("models.target: /gone does not exist")

    monkeypatch.setattr(autotune.jobs.tune, "run_tune", failing)
    prompts = tmp_path / "recent.jsonl"
    prompts.write_text('{"prompt": "x"}\n')
    config = Path(__file__).resolve().parents[2] / "tune.yaml"
    url, serve = fake_server
    base = ["--url", url, "--storage", storage, "--once", "--interval", "0.2", "--config", str(config)]
    serve(vllm_text(0.5, 1), vllm_text(0.5, 2))
    result = watch_cli(*base, "--retune", str(prompts))
    assert result.exit_code == 1, result.output
    assert "warning: re-tune failed: models.target: /gone does not exist; the watch goes on" in result.stderr
    result = watch_cli(*base, "--retune", str(tmp_path / "none.jsonl"))
    assert result.exit_code == 2 and result.stderr.strip().splitlines()[-1].startswith("error: --retune: ")
