"""benchmarks/tuner/noise_robustness.py: the agreement summary, and one tiny run per condition end to end."""

from __future__ import annotations

import json
import os
import time
from datetime import datetime

import pytest
import yaml

from benchmarks.tuner import noise_robustness


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


def at(second: int) -> datetime:
    return datetime(2025, 1, 1, 0, 0, second)


def test_hog_overlap_names_the_trials_it_overlapped_and_the_marked_ones_on_the_front() -> None:
    trials = [
        {
            "trial": 0,
            "start": at(0),
            "end": at(10),
            "state": "complete",
            "marked": False,
        },  # ends as it starts
        {"trial": 1, "start": at(10), "end": at(20), "state": "complete", "marked": True},
        {"trial": 2, "start": at(20), "end": at(30), "state": "complete", "marked": False},
        {"trial": 3, "start": at(30), "end": at(40), "state": "pruned", "marked": True},
        {"trial": 4, "start": at(50), "end": at(55), "state": "complete", "marked": False},  # after it
    ]
    o = noise_robustness.hog_overlap(trials, at(10), at(35), front={0, 1, 2})
    assert [r["trial"] for r in o["overlapping"]] == [1, 2, 3]
    assert o["all_marked"] is False and o["marked_on_front"] == [1] and o["unmarked_on_front"] == [2]
    assert noise_robustness._overlap_text(o) == (
        "trials 1 d, 2, 3 d (pruned); disturbed on the front: [1]; NOT marked, on the front: [2]"
    )


def test_midstudy_summary_holds_runs_to_agreement_wall_time_and_marking() -> None:
    quiet = [dict(run(6, 1.5, True), wall_s=100.0)] * 3
    good = {"all_marked": True, "marked_on_front": [], "unmarked_on_front": []}
    mid = [dict(quiet[0], wall_s=120.0, hog=good), dict(quiet[0], wall_s=140.0, hog=good)]
    s = noise_robustness.summarize_midstudy(quiet, mid)
    assert s["decision_agreement"] == 1.0 and s["wall_over_quiet"] == [1.2, 1.4] and s["goal_met"] is True
    slow = noise_robustness.summarize_midstudy(quiet, [*mid, dict(quiet[0], wall_s=160.0, hog=good)])
    assert slow["goal_met"] is False  # 1.6x the quiet median
    missed = dict(quiet[0], wall_s=100.0, hog={**good, "all_marked": False, "unmarked_on_front": [2]})
    s = noise_robustness.summarize_midstudy(quiet, [missed])
    assert s["all_overlapping_marked"] is False and s["unmarked_overlapping_on_front"] == 1
    assert s["goal_met"] is False


def test_tiny_run_writes_the_json_and_leaves_no_hog(
    tmp_path, tiny_pair_dirs, tiny_prompts, monkeypatch
) -> None:
    started = []
    real_start = noise_robustness.start_hog

    def start(procs, max_s, **kw):
        hog = real_start(procs, min(max_s, 30.0), **kw)
        started.extend(hog)
        return hog

    monkeypatch.setattr(noise_robustness, "start_hog", start)
    target, draft = tiny_pair_dirs
    config = tmp_path / "tune.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "models": {
                    "target": str(target),
                    "draft": str(draft),
                    "device": "cpu",
                    "dtype": "float32",
                    "compile": False,
                },
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

    assert len(started) == 2 and not any(
        noise_robustness._alive(pid) for pid in started
    )  # busy's, then midstudy's
    stored = json.loads(out.read_text())
    assert [len(stored["runs"][c]) for c in ("quiet", "busy", "midstudy")] == [1, 1, 1]
    assert stored["summary"] == json.loads(json.dumps(result["summary"]))
    assert set(stored["runs"]["busy"][0]) >= {"chosen_gamma", "speedup", "labels", "host_busy", "reason"}
    hog = stored["runs"]["midstudy"][0]["hog"]
    assert hog["seconds"] == stored["runs"]["quiet"][0]["study_s"] / 2
    assert set(hog) == {"seconds", "overlapping", "all_marked", "marked_on_front", "unmarked_on_front"}
    assert {"decision_agreement", "wall_over_quiet", "goal_met"} <= set(stored["summary"]["midstudy"])


def test_conditions_must_be_known(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        noise_robustness.main(["--conditions", "quiet,loud"])
    assert exit_info.value.code == 2
    assert (
        capsys.readouterr().err == "error: --conditions: unknown 'loud' (choose from quiet, busy, midstudy)\n"
    )


def test_a_hog_is_no_child_of_the_tune_so_the_disturbance_reading_sees_it() -> None:
    """The tune counts its own descendants' CPU as its work: a hog started as this process's child
    was invisible by construction. start_hog detaches it (re-parented away) and stop_hog ends it."""
    from autotune.device import hostnoise

    hog = noise_robustness.start_hog(1, 30.0, spin_up_s=0.5)
    try:
        assert all(noise_robustness._alive(pid) for pid in hog)
        with open(f"/proc/{hog[0]}/stat") as fh:
            assert int(fh.read().rsplit(")", 1)[1].split()[1]) != os.getpid()  # not our child
        start = hostnoise.CpuSample.read()
        time.sleep(1.0)
        seen = hostnoise.CpuSample.read().since(start)
        assert seen["others_cpu_share"] * seen["cpus"] > 0.5  # more than half a core: another's
    finally:
        noise_robustness.stop_hog(hog)
    assert not any(noise_robustness._alive(pid) for pid in hog)
