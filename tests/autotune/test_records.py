"""``autotune.records`` and the cost model's inputs read and write their stored JSON unchanged."""

from __future__ import annotations

import json

from autotune.device.profiler import curves_from_json, samples_from_json
from autotune.records import LEVEL_KEYS, Curves, LevelMetrics, Measurement, StepSample, TrialResult
from profiles.schema import MISSING

CURVES = {
    "t_verify": {"1": {"1": 0.01, "2": 0.012}, "2": {"1": 0.011, "2": 0.014}},
    "t_draft": {"1": 0.002, "2": 0.0025},
    "t_prefill": {"1": 0.02, "2": 0.03},
    "overhead": {"1": 0.001, "2": 0.001},
    "draft_overhead": {"1": 0.0005},
    "knee_curve": {"1": 0.01, "64": 0.05},
    "prompt_tokens": 40,
    "context_tokens": 44,
    "repeats": 7,
}
ACCEPTANCE = {
    "gamma_max": 2,
    "drafter": "model",
    "acceptance_rate": 0.6,
    "per_position_acceptance": [0.7, 0.5],
    "samples": [[2, [0.9, 0.8]], [0, [0.3, 0.2]]],
}


def test_curves_and_samples_from_the_stored_json_match_the_profilers_readers() -> None:
    stored = json.loads(json.dumps(CURVES))
    assert Curves.from_json(stored) == curves_from_json(stored)
    assert Curves.from_json(stored).t_verify == {1: {1: 0.01, 2: 0.012}, 2: {1: 0.011, 2: 0.014}}
    assert Curves.from_json(json.loads(json.dumps(Curves.from_json(stored).to_json()))) == Curves.from_json(
        stored
    )
    samples = [StepSample.from_json(s) for s in ACCEPTANCE["samples"]]
    assert samples == samples_from_json(ACCEPTANCE) == [StepSample(2, (0.9, 0.8)), StepSample(0, (0.3, 0.2))]
    assert [s.to_json() for s in samples] == ACCEPTANCE["samples"]


def test_measurement_round_trips_and_gives_the_cost_model_inputs() -> None:
    data = {
        "fingerprint": {"key": "k", "label": "cpu"},
        "ceilings": {"ridge_flops_per_byte": 3.0},
        "curves": CURVES,
        "knee_tokens": 16,
        "acceptance": ACCEPTANCE,
        "verification_efficiency": {},
        "draft_cost_ratio": {},
        "classification": {"batch_sizes": []},
    }
    m = Measurement.from_json(data)
    assert m.to_json() == data and list(m.to_json()) == list(data)
    assert m.gamma_max == 2 and m.cost_curves().prefill_tokens == 40 and len(m.samples()) == 2
    assert Measurement.from_json({**data, "later": 1}).to_json() == {**data, "later": 1}


def test_a_trial_result_keeps_every_level_key_and_the_server_start_up_only_when_there() -> None:
    level = dict.fromkeys(LEVEL_KEYS, 1.0) | {"generated_tokens": 12}
    engine = {
        "tokens_per_second": 10.0,
        "latency_ms": 5.0,
        "per_level": {1: level, 4: dict.fromkeys(LEVEL_KEYS)},
    }
    typed = TrialResult.from_json(engine)
    assert typed.startup_s is MISSING and typed.per_level[1] == LevelMetrics(**level)
    assert typed.to_json() == engine and list(typed.to_json()["per_level"][1]) == list(LEVEL_KEYS)
    server = {**engine, "startup_s": 42.0}
    assert TrialResult.from_json(server).to_json() == server
    assert LevelMetrics.from_metrics({"tokens_per_second": 3.0, "verify_step_ms": 9.0}).to_json() == {
        k: (3.0 if k == "tokens_per_second" else None) for k in LEVEL_KEYS
    }
