"""benchmarks/noise_robustness.py: the agreement summary, and one tiny run per condition end to end."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import noise_robustness  # noqa: E402


def run(
    gamma: int,
    speedup: float,
    significant: bool,
    label: str = "transitional",
    separable: bool = True,
    no_diff: bool = False,
) -> dict:
    return {
        "chosen_gamma": gamma,
        "speedup": speedup,
        "speedup_significant": significant,
        "labels": {"1": label},
        "separable": {"1": separable},
        "no_significant_difference": no_diff,
    }


def test_summary_counts_agreement_explicit_no_difference_and_wrongly_off() -> None:
    quiet = [run(6, 1.5, True), run(6, 1.45, True), run(5, 1.5, True)]
    busy = [
        run(6, 1.3, True),
        run(0, 1.0, False, no_diff=True),
        run(0, 0.9, False),
        run(6, 1.4, True, label="memory-bound", separable=False),
        run(4, 1.4, True, label="compute-bound"),
    ]
    s = noise_robustness.summarize(quiet, busy)
    assert s["quiet_majority"] == {
        "chosen_gamma": 6,
        "labels": {"1": "transitional"},
        "significant_gain": True,
    }
    assert s["decision_agreement"] == 3 / 5  # same gamma twice, explicit no-difference once
    assert s["label_agreement"] == 4 / 5  # a flipped, separable label is the one disagreement
    assert s["speculation_off_despite_quiet_gain"] == 2 and s["goal_met"] is False
    assert s["speedup_spread"]["busy"] == {"median": 1.3, "min": 0.9, "max": 1.4}


def test_quiet_runs_without_a_gain_do_not_count_speculation_off_against_busy_runs() -> None:
    quiet = [run(0, 1.01, False, no_diff=True)] * 2
    s = noise_robustness.summarize(quiet, [run(0, 0.99, False)])
    assert s["speculation_off_despite_quiet_gain"] == 0 and s["goal_met"] is True


def test_tiny_run_writes_the_json_and_leaves_no_hog(
    tmp_path, tiny_pair_dirs, tiny_prompts, monkeypatch
) -> None:
    started = []
    real_start = noise_robustness.start_hog

    def start(procs, max_s):
        hog = real_start(procs, 30.0)
        started.extend(hog)
        return hog

    monkeypatch.setattr(noise_robustness, "start_hog", start)
    target, draft = tiny_pair_dirs
    config = tmp_path / "tune.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "models": {"target": str(target), "draft": str(draft), "device": "cpu", "compile": False},
                "workload": {
                    "prompts": str(tiny_prompts),
                    "max_new_tokens": 6,
                    "concurrency": [1, 2],
                    "num_requests": 2,
                },
                "search": {"gamma": {"low": 0, "high": 2}, "max_batch_size": [2]},
                "profile": {"gamma_max": 2},
            }
        )
    )
    out = tmp_path / "noise_robustness.json"

    result = noise_robustness.main(
        [
            "--config",
            str(config),
            "--k",
            "1",
            "--trials",
            "2",
            "--repeats",
            "2",
            "--hog-procs",
            "1",
            "--out",
            str(out),
        ]
    )

    assert len(started) == 1 and all(p.poll() is not None for p in started)
    stored = json.loads(out.read_text())
    assert [len(stored["runs"][c]) for c in ("quiet", "busy")] == [1, 1]
    assert stored["summary"] == json.loads(json.dumps(result["summary"]))
    assert set(stored["runs"]["busy"][0]) >= {"chosen_gamma", "speedup", "labels", "host_busy", "reason"}
