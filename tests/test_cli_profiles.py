"""`autotune profiles list/show/delete`, `autotune export` and `autotune report` on a real store."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from autotune.cli import main
from profiles.store import Store


def sample_profile() -> dict:
    level = {"tokens_per_second": 120.0, "tpot_ms_p50": 8.0, "tpot_ms_p95": 9.5, "ttft_ms_p95": 30.0,
             "e2e_ms_p95": 400.0, "acceptance_rate": 0.7}
    base_level = {**level, "tokens_per_second": 80.0}
    return {
        "schema_version": 1, "tool_version": "0.1.0", "created_at": "2026-11-30T01:30:00+00:00",
        "device": {"key": "k" * 16, "label": "Test CPU (2 cores)", "kind": "cpu"},
        "pair": {"target": "/models/t", "draft": "/models/d", "drafter": "model", "target_hash": "th",
                 "draft_hash": "dh"},
        "workload": {"hash": "w" * 16},
        "study": {"name": "s", "storage": "sqlite:///x.db", "n_trials": 3, "slo": {"tpot_ms_p95": 12.0}},
        "chosen": {"drafter": "model", "gamma": 4, "confidence_threshold": 0.1, "gamma_schedule": "constant",
                   "max_batch_size": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4},
        "selection": {"met_slo": True, "reason": "highest throughput meeting every SLO", "trial": 1},
        "schedule": [{"batch_size": 1, "gamma": 4, "tokens_per_second": 60.0, "baseline_tokens_per_second": 30.0},
                     {"batch_size": 4, "gamma": 2, "tokens_per_second": 120.0, "baseline_tokens_per_second": 80.0},
                     {"batch_size": 16, "gamma": 0, "tokens_per_second": 200.0, "baseline_tokens_per_second": 200.0}],
        "crossover_batch_size": 16,
        "metrics": {"tokens_per_second": 120.0, "latency_ms": 9.5, "latency_metric": "tpot_ms_p95",
                    "per_level": {"4": level}, "speedup": 1.5, "speedup_over_best_static": 1.05},
        "baseline": {"tokens_per_second": 80.0, "latency_ms": 12.0, "per_level": {"4": base_level}},
        "trials": [{"trial": 0, "params": {"gamma": 0}, "tokens_per_second": 80.0, "latency_ms": 12.0,
                    "feasible": True, "per_batch_tokens_per_second": {"4": 80.0}},
                   {"trial": 1, "params": {"gamma": 4}, "tokens_per_second": 120.0, "latency_ms": 9.5,
                    "feasible": True, "per_batch_tokens_per_second": {"4": 120.0}}],
        "pareto_front": [{"trial": 1, "params": {"gamma": 4, "confidence_threshold": 0.1,
                                                 "gamma_schedule": "constant"},
                          "tokens_per_second": 120.0, "latency_ms": 9.5, "feasible": True}],
        "classification": {"knee_tokens": 16, "gamma_max": 8, "batch_sizes": [
            {"batch_size": 1, "verify_cost": 1.05, "label": "memory-bound", "best_gamma": 4, "predicted_speedup": 2.0},
            {"batch_size": 4, "verify_cost": 3.0, "label": "transitional", "best_gamma": 2, "predicted_speedup": 1.2}]},
        "knee_tokens": 16,
        "curves": {"t_verify": {"1": {"1": 0.01, "2": 0.0101}, "4": {"1": 0.012, "2": 0.02}},
                   "knee_curve": {"1": 0.01, "8": 0.0105, "16": 0.02}},
        "predicted_vs_measured": [{"batch_size": 4, "gamma": 4, "predicted_tokens_per_second": 130.0,
                                   "measured_tokens_per_second": 120.0}],
    }


@pytest.fixture
def store_url(tmp_path):
    url = f"sqlite:///{tmp_path / 'autotune.db'}"
    with Store(url) as store:
        store.save_profile(sample_profile())
    return url


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


@pytest.mark.parametrize("args", [("profiles", "show", "7"), ("export", "7", "--format", "vllm"),
                                  ("profiles", "delete", "7"), ("report", "7")])
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
    assert cfg["num_speculative_tokens_per_batch_size"] == [[1, 1, 4], [2, 4, 2], [5, 16, 0]]  # between tuned sizes: the next larger one's gamma
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
