"""`autotune profiles list/show/delete`, `autotune export` and `autotune report` on a real store.

The rendered outputs are pinned byte for byte under tests/cli_golden; regenerate them after an
intended change with ``SPEC_AUTOTUNE_UPDATE_GOLDEN=1 pytest tests/test_cli_profiles.py`` and
review the diff.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from autotune.cli import main
from autotune.cli.render import render_profile, render_show, render_tune
from autotune.records import LevelMetrics, Measurement, StepSample
from profiles.schema import BatchSchedule, Chosen, Profile, ScheduleEntry
from profiles.store import Store


def sample_measurement(fingerprint: dict) -> Measurement:
    """A profiler measurement in the shape ``autotune.device.profiler.measure`` returns (fixed numbers)."""
    return Measurement(
        fingerprint=fingerprint,
        ceilings={
            "copy_bandwidth": {"median_bytes_per_s": 12.5e9},
            "matmul": {"median_flops": 0.21e12},
            "ridge_flops_per_byte": 16.8,
        },
        curves={
            "t_verify": {"1": {"1": 0.01, "2": 0.0101}, "4": {"1": 0.012, "2": 0.02}},
            "t_draft": {"1": 0.002, "4": 0.003},
            "t_prefill": {"1": 0.02, "4": 0.05},
            "overhead": {"1": 0.001, "4": 0.001},
            "draft_overhead": {"1": 0.0005, "4": 0.0005},
            "knee_curve": {"1": 0.01, "8": 0.0105, "16": 0.02},
            "prompt_tokens": 40,
            "context_tokens": 44,
            "repeats": 7,
        },
        knee_tokens=16,
        acceptance={
            "gamma_max": 8,
            "drafter": "model",
            "acceptance_rate": 0.71,
            "per_position_acceptance": [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2],
            "samples": [StepSample(3, (0.9, 0.8, 0.7, 0.2)).to_json()],
        },
        verification_efficiency={"1": 0.95, "4": 0.4},
        draft_cost_ratio={"1": 0.2, "4": 0.15},
        classification={
            "knee_tokens": 16,
            "knee_tokens_ci95": [12, None],
            "gamma_max": 8,
            "batch_sizes": [
                {
                    "batch_size": 1,
                    "verify_cost": 1.05,
                    "verify_cost_ci95": [1.01, 1.09],
                    "label": "memory-bound",
                    "best_gamma": 4,
                    "best_threshold": 0.1,
                    "predicted_speedup": 2.0,
                },
                {
                    "batch_size": 4,
                    "verify_cost": 3.0,
                    "verify_cost_ci95": [2.2, 3.7],
                    "separable": False,
                    "label": "transitional",
                    "best_gamma": 2,
                    "best_threshold": 0.0,
                    "predicted_speedup": 1.2,
                },
            ],
        },
    )


def sample_profile(fingerprint: dict) -> dict:
    """A stored profile built from the typed records, with every optional section the views render.

    ``fingerprint`` has the real shape (tests/conftest.py ``cpu_fingerprint``); the measured
    sections come from :class:`Measurement` and the per-level metrics from :class:`LevelMetrics`,
    as ``autotune.jobs.tune`` assembles them.
    """
    m = sample_measurement(fingerprint)
    level = LevelMetrics(
        tokens_per_second=120.0,
        tpot_ms_p50=8.0,
        tpot_ms_p95=9.5,
        ttft_ms_p50=20.0,
        ttft_ms_p95=30.0,
        e2e_ms_p50=300.0,
        e2e_ms_p95=400.0,
        acceptance_rate=0.7,
        mean_acceptance_length=2.1,
        rollback_frequency=0.3,
        batch_utilization=0.9,
        mean_batch_size=3.6,
        requests_per_second=1.5,
        generated_tokens=480,
        wall_s=4.0,
    )
    level1 = dataclasses.replace(level, tokens_per_second=60.0, tpot_ms_p50=7.0, tpot_ms_p95=8.0)
    base_level = dataclasses.replace(level, tokens_per_second=80.0, acceptance_rate=None)
    noise = {"cv": 0.021, "busy": False, "reasons": []}
    profile = Profile(
        tool_version="0.1.0",
        created_at="2026-11-30T01:30:00+00:00",
        device=fingerprint,
        pair={
            "target": "/models/t",
            "draft": "/models/d",
            "drafter": "model",
            "target_hash": "th",
            "draft_hash": "dh",
        },
        workload={"prompts": "prompts.jsonl", "max_new_tokens": 64, "concurrency": [1, 4], "hash": "w" * 16},
        study={
            "name": "s",
            "storage": "sqlite:///x.db",
            "n_trials": 3,
            "failed_trials": 0,
            "slo": {"tpot_ms_p95": 12.0},
            "objectives": ["tokens_per_second", "tpot_ms_p95"],
            "trials_planned": 5,
            "trials_run": 3,
            "provisional": True,
        },
        chosen=Chosen("model", 4, 0.1, "constant", 4, 2, 4),
        selection={"met_slo": True, "reason": "highest throughput meeting every SLO", "trial": 1},
        schedule=BatchSchedule(
            (
                ScheduleEntry(1, 4, 60.0, 30.0, {"value": 2.0, "ci95": [1.8, 2.2], "n": 3}, True),
                ScheduleEntry(4, 2, 120.0, 80.0),
                ScheduleEntry(16, 0, 200.0, 200.0),
            ),
            16,
        ),
        metrics={
            "tokens_per_second": 120.0,
            "latency_ms": 9.5,
            "latency_metric": "tpot_ms_p95",
            "tokens_per_second_ci95": [115.0, 125.0],
            "latency_ms_ci95": [9.5, 9.5],
            "per_level": {"1": level1.to_json(), "4": level.to_json()},
            "per_level_speedup": {"4": {"value": 1.5, "ci95": [1.4, 1.6], "n": 3}},
            "speedup": 1.5,
            "speedup_ci95": [1.4, 1.6],
            "speedup_over_best_static": 1.05,
            "speedup_over_best_static_ci95": [0.98, 1.12],
            "chosen_is_best_static": False,
            "repeats": 3,
        },
        baseline={"tokens_per_second": 80.0, "latency_ms": 12.0, "per_level": {"4": base_level.to_json()}},
        trials=[
            {
                "trial": 0,
                "params": {"gamma": 0},
                "tokens_per_second": 80.0,
                "latency_ms": 12.0,
                "feasible": True,
                "per_batch_tokens_per_second": {"1": 30.0, "4": 80.0},
            },
            {
                "trial": 1,
                "params": {"gamma": 4},
                "tokens_per_second": 120.0,
                "latency_ms": 9.5,
                "feasible": True,
                "per_batch_tokens_per_second": {"1": 60.0, "4": 120.0},
            },
            {
                "trial": 2,
                "params": {"gamma": 2},
                "tokens_per_second": 110.0,
                "latency_ms": 9.0,
                "feasible": True,
                "per_batch_tokens_per_second": {"1": 50.0, "4": 110.0},
            },
        ],
        pareto_front=[
            {
                "trial": 2,
                "params": {"gamma": 2, "confidence_threshold": 0.0, "gamma_schedule": "heuristic"},
                "tokens_per_second": 110.0,
                "latency_ms": 9.0,
                "feasible": True,
            },
            {
                "trial": 1,
                "params": {"gamma": 4, "confidence_threshold": 0.1, "gamma_schedule": "constant"},
                "tokens_per_second": 120.0,
                "latency_ms": 9.5,
                "feasible": True,
            },
        ],
        remeasure={"repeats": 3, "order": "interleaved"},
        classification=m.classification,
        ceilings=m.ceilings,
        knee_tokens=m.knee_tokens,
        curves=m.curves,
        acceptance={k: v for k, v in m.acceptance.items() if k != "samples"},
        predicted_vs_measured=[
            {
                "batch_size": 1,
                "gamma": 4,
                "predicted_tokens_per_second": 65.0,
                "measured_tokens_per_second": 60.0,
            },
            {
                "batch_size": 4,
                "gamma": 4,
                "predicted_tokens_per_second": 130.0,
                "measured_tokens_per_second": 120.0,
            },
        ],
        host_noise={"busy": False, "before": noise, "after": {**noise, "cv": 0.034}},
        backend={"name": "engine"},
    )
    return json.loads(json.dumps(profile.to_json()))  # the stored form: string keys, JSON values


@pytest.fixture
def store_url(tmp_path, cpu_fingerprint):
    url = f"sqlite:///{tmp_path / 'autotune.db'}"
    with Store(url) as store:
        store.save_profile(sample_profile(cpu_fingerprint()))
    return url


GOLDEN = Path(__file__).parent / "cli_golden"
UPDATE = os.environ.get("SPEC_AUTOTUNE_UPDATE_GOLDEN") == "1"


def assert_golden(name: str, text: str) -> None:
    golden = GOLDEN / name
    if UPDATE:
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text, encoding="utf-8")
    assert text == golden.read_text(encoding="utf-8"), f"{name} differs from its golden file"


def run(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_list_and_show(store_url):
    code, out = run("profiles", "list", "--storage", store_url)
    assert code == 0 and "Test CPU (2 cores)" in out and "t / d" in out
    code, out = run("profiles", "list", "--storage", store_url, "--json")
    rows = json.loads(out)
    assert code == 0 and rows[0]["gamma"] == 4 and rows[0]["tokens_per_second"] == 120.0
    code, out = run("profiles", "show", "1", "--storage", store_url)
    assert code == 0 and "gamma=4" in out and "memory-bound" in out and "pareto front" in out
    code, out = run("profiles", "show", "1", "--storage", store_url, "--json")
    assert code == 0 and json.loads(out)["schedule"][1]["gamma"] == 2


@pytest.mark.parametrize(
    "args",
    [
        ("profiles", "show", "7"),
        ("export", "7", "--format", "vllm"),
        ("profiles", "delete", "7"),
        ("report", "7"),
    ],
)
def test_unknown_id_is_one_line_exit_2(store_url, args):
    code, out = run(*args, "--storage", store_url)
    assert code == 2
    assert out.strip().splitlines() == ["error: no profile with id 7 (see `autotune profiles list`)"]


def test_empty_database_is_a_clear_error(tmp_path):
    url = f"sqlite:///{tmp_path / 'none.db'}"
    for args in (("profiles", "list"), ("profiles", "show", "1"), ("export", "1", "--format", "hf")):
        code, out = run(*args, "--storage", url)
        assert code == 2 and "no profile database yet" in out and len(out.strip().splitlines()) == 1
    assert not (tmp_path / "none.db").exists()


def test_export_prints_or_writes_with_path_overrides(store_url, tmp_path):
    code, out = run("export", "1", "--format", "vllm", "--storage", store_url, "--draft-model", "/srv/draft")
    cfg = json.loads(out)
    assert code == 0 and cfg["model"] == "/srv/draft" and cfg["num_speculative_tokens"] == 4
    assert cfg["num_speculative_tokens_per_batch_size"] == [
        [1, 1, 4],
        [2, 4, 2],
        [5, 16, 0],
    ]  # between tuned sizes: the next larger one's gamma
    dest = tmp_path / "out" / "extra.yaml"
    code, _ = run("export", "1", "--format", "trtllm", "--storage", store_url, "-o", str(dest))
    spec = yaml.safe_load(dest.read_text())["speculative_config"]
    assert code == 0 and spec["max_draft_len"] == 4 and spec["decoding_type"] == "Draft_Target"


def test_delete_then_list_is_empty(store_url):
    assert run("profiles", "delete", "1", "--storage", store_url)[0] == 0
    code, out = run("profiles", "list", "--storage", store_url)
    assert code == 0 and "no profiles stored yet" in out


def test_report_writes_plots_and_summary(store_url, tmp_path):
    pytest.importorskip("matplotlib")
    folder = tmp_path / "report"
    code, out = run("report", "1", "--storage", store_url, "-o", str(folder))
    assert code == 0
    for name in ("pareto.png", "throughput_by_batch.png", "verify_cost.png"):
        assert (folder / name).stat().st_size > 1000
    md = (folder / "report.md").read_text()
    assert "gamma **4**" in md and "pareto.png" in md and "speculation off from batch size 16" in md


def test_rendered_outputs_are_pinned(store_url, tmp_path, cpu_fingerprint):
    """`profiles list/show` (text and --json) and `report`'s Markdown, byte for byte."""
    for name, args in [
        ("profiles-list.txt", ("profiles", "list")),
        ("profiles-list.json", ("profiles", "list", "--json")),
        ("profiles-show.txt", ("profiles", "show", "1")),
        ("profiles-show.json", ("profiles", "show", "1", "--json")),
    ]:
        code, out = run(*args, "--storage", store_url)
        assert code == 0, out
        assert_golden(name, out)
    pytest.importorskip("matplotlib")
    code, out = run("report", "1", "--storage", store_url, "-o", str(tmp_path / "report"))
    assert code == 0 and out == f"wrote {tmp_path / 'report' / 'report.md'}\n"
    assert_golden("report.md", (tmp_path / "report" / "report.md").read_text(encoding="utf-8"))


def test_a_profile_without_the_engine_prior_renders_without_classes(cpu_fingerprint):
    """A serving-stack run whose engine prior did not run stores no classification (its measurement
    is ``context.no_engine_measurement``); `autotune tune` and `profiles show` say so instead of
    failing on the missing batch sizes."""
    prof = copy.deepcopy(sample_profile(cpu_fingerprint()))
    prof["classification"] = {}
    prof["backend"] = {"name": "vllm", "version": "0.32.0"}
    for text in (render_tune(prof), render_show(prof), render_tune(Profile.from_json(prof))):
        assert "classes     not measured: the engine did not profile this pair" in text


def test_tune_and_profile_views_are_pinned(cpu_fingerprint):
    """`autotune tune`'s summary on the branches `profiles show` does not reach, and `autotune profile`'s view."""
    prof = copy.deepcopy(sample_profile(cpu_fingerprint()))
    prof["metrics"].update(chosen_is_best_static=True, repeats=None)
    del prof["metrics"]["per_level_speedup"], prof["metrics"]["speedup_ci95"]
    prof["study"]["provisional"] = False
    prof["schedule"][-1]["gamma"] = 1
    prof["crossover_batch_size"] = None
    prof["host_noise"] = {
        "busy": True,
        "before": None,
        "after": {"cv": 0.3, "busy": True, "reasons": ["load average 3.1 on 2 cores"]},
    }
    prof["backend"] = {"name": "vllm", "version": "0.32.0"}
    prof.update(id=7, exports=["exports/vllm-speculative-config.json", "exports/profile.yaml"])
    assert_golden("tune.txt", render_tune(prof) + "\n")
    assert render_tune(Profile.from_json(prof)) == render_tune(prof)  # the JSON is read typed first
    measurement = sample_measurement(cpu_fingerprint())
    assert_golden("profile.txt", render_profile(measurement.to_json()) + "\n")
    assert render_profile(measurement) == render_profile(measurement.to_json())


@pytest.mark.parametrize(
    "args",
    [
        ("profiles", "show", "1"),
        ("profiles", "show", "1", "--json"),
        ("export", "1", "--format", "vllm"),
        ("report", "1"),
    ],
)
def test_a_profile_of_an_unknown_schema_is_one_line_naming_the_version(store_url, tmp_path, args):
    from sqlalchemy import update

    from profiles.profile import SCHEMA_VERSION
    from profiles.store import ProfileRow

    with Store(store_url) as store:
        data = store.get_profile(1)
        del data["id"]
        with store.engine.begin() as conn:  # as a newer spec-autotune sharing the database would write it
            conn.execute(
                update(ProfileRow).where(ProfileRow.id == 1).values(data={**data, "schema_version": 99})
            )
    code, out = run(
        *args, "--storage", store_url, *(("-o", str(tmp_path / "r")) if args[0] == "report" else ())
    )
    assert code == 2 and out.strip().splitlines() == [
        f"error: profile: schema_version 99 is newer than this spec-autotune reads ({SCHEMA_VERSION}); "
        "upgrade spec-autotune"
    ]
    assert not (tmp_path / "r").exists()
