"""``autotune.device.profiler``: the measurement's shape on the tiny pair and its JSON round trip."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer

from autotune.device.profiler import (
    curves_from_json,
    measure_acceptance,
    measure_curves,
    powers_of_two,
    samples_from_json,
    spread,
)
from autotune.records import Curves, StepSample
from autotune.workload.runner import Sampling, build_requests
from engine.loader import load_pair
from engine.workload import WorkloadItem


@pytest.fixture(scope="module")
def pair(tiny_pair_dirs):
    return load_pair(*tiny_pair_dirs)


@pytest.fixture(scope="module")
def requests(tiny_pair_dirs):
    tok = Tokenizer.from_file(str(tiny_pair_dirs[0] / "tokenizer.json"))
    items = [WorkloadItem(p, line=i + 1) for i, p in enumerate(["def f(x):\n", "import os\n", "class A:\n"])]
    return build_requests(items, tok, Sampling(max_new_tokens=8), 512)


def test_powers_of_two_end_at_the_limit_and_spread_is_even() -> None:
    assert powers_of_two(1) == [1] and powers_of_two(8) == [1, 2, 4, 8] and powers_of_two(6) == [1, 2, 4, 6]
    assert spread(list(range(10)), 3) == [0, 3, 6] and spread([1, 2], 5) == [1, 2]


def test_curves_cover_every_batch_size_and_width_and_survive_json(pair) -> None:
    curves = measure_curves(pair, [1, 2], gamma_max=2, context=16, repeats=3, prompt_tokens=8)
    assert set(curves["t_verify"]) == {1, 2} and all(
        set(row) == {1, 2, 3} for row in curves["t_verify"].values()
    )
    assert set(curves["t_draft"]) == {1, 2} and set(curves["t_prefill"]) == {1, 2}
    assert set(curves["t_verify_samples"][1]) == {1, 3}  # the classifier's evidence: k = 1 and gamma_max + 1
    assert min(curves["knee_curve"]) == 1 and max(curves["knee_curve"]) == 64
    stored = json.loads(json.dumps(curves))  # as the store keeps it: mapping keys become strings
    cv = curves_from_json(stored)
    assert isinstance(cv, Curves) and cv.t_verify == curves["t_verify"] and cv.t_draft == curves["t_draft"]
    assert cv.prefill_tokens == 8 and cv.overhead == {}


def test_acceptance_pass_records_a_sample_per_step(pair, requests) -> None:
    acc = measure_acceptance(pair, requests, "model", gamma_max=3, seed=0)
    assert acc["gamma_max"] == 3 and acc["drafter"] == "model" and len(acc["per_position_acceptance"]) == 3
    samples = samples_from_json(json.loads(json.dumps(acc)))
    assert samples and all(isinstance(s, StepSample) and 0 <= s.n_accepted <= 3 for s in samples)
    assert all(len(s.confidence) == 3 for s in samples)
