"""The ``autotune`` command line through click's CliRunner: bench, profile, tune and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from tokenizers import Tokenizer

from autotune.cli import main

PROMPTS = ["def add(a, b):\n", "for i in range(10):\n", "class Point:\n"]
METRIC_KEYS = (
    "tokens_per_second",
    "ttft_ms_p50",
    "ttft_ms_p95",
    "tpot_ms_p50",
    "tpot_ms_p95",
    "e2e_ms_p50",
    "e2e_ms_p95",
    "requests_per_second",
    "mean_batch_size",
)


@pytest.fixture
def workload(tmp_path):
    """``workload(lines)`` -> a prompts.jsonl in tmp_path holding those raw lines."""

    def make(lines: list[str]) -> Path:
        path = tmp_path / "prompts.jsonl"
        path.write_text("".join(line + "\n" for line in lines))
        return path

    return make


@pytest.fixture
def good_prompts(workload) -> Path:
    return workload([json.dumps({"prompt": p}) for p in PROMPTS])


def bench(pair: tuple[Path, Path], prompts: Path, *extra: str):
    target, draft = pair
    args = [
        "bench",
        "--target",
        str(target),
        "--draft",
        str(draft),
        "--prompts",
        str(prompts),
        "--max-new-tokens",
        "6",
        "--num-requests",
        "2",
        "--device",
        "cpu",
        *extra,
    ]
    return CliRunner().invoke(main, args)


def one_line_error(result) -> str:
    """The run failed as bad input: exit code 2 and exactly one ``error: ...`` line on stderr."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


# ------------------------------------------------------------------------------------------
# bench


def test_bench_json_has_the_documented_keys(tiny_pair_dirs, good_prompts) -> None:
    result = bench(tiny_pair_dirs, good_prompts, "--gamma", "2", "--batch-size", "2", "--json")

    assert result.exit_code == 0, (result.output, result.exception)
    out = json.loads(result.stdout)
    for key in METRIC_KEYS:
        assert isinstance(out[key], (int, float)), key
        assert isinstance(out[f"baseline_{key}"], (int, float)), f"baseline_{key}"
    for key in ("speedup", "acceptance_rate"):
        assert isinstance(out[key], (int, float)), key
    assert out["tokens_per_second"] > 0 and out["baseline_tokens_per_second"] > 0
    assert 0.0 <= out["acceptance_rate"] <= 1.0
    assert out["speedup"] > 0
    assert out["ttft_ms_p50"] <= out["ttft_ms_p95"] and out["e2e_ms_p50"] <= out["e2e_ms_p95"]
    assert out["tpot_ms_p50"] <= out["tpot_ms_p95"]
    assert 1 <= out["mean_batch_size"] <= 2
    assert out["greedy_match"] is True  # temperature 0: speculation changes nothing in the output
    assert (out["gamma"], out["drafter"], out["batch_size"], out["device"]) == (2, "model", 2, "cpu")


def test_bench_prefill_token_budget(tiny_pair_dirs, good_prompts) -> None:
    ok = bench(tiny_pair_dirs, good_prompts, "--batch-size", "2", "--max-prefill-tokens", "3", "--json")
    assert ok.exit_code == 0, (ok.output, ok.exception)
    assert json.loads(ok.stdout)["greedy_match"] is True
    assert "--max-prefill-tokens" in one_line_error(
        bench(tiny_pair_dirs, good_prompts, "--max-prefill-tokens", "0")
    )


def test_bench_table_for_people(tiny_pair_dirs, good_prompts) -> None:
    result = bench(tiny_pair_dirs, good_prompts, "--gamma", "1")
    assert result.exit_code == 0, (result.output, result.exception)
    assert "drafter=model gamma=1" in result.stdout
    for label in ("tokens/s", "speedup (x)", "acceptance rate", "tpot ms p95", "e2e ms p50"):
        assert label in result.stdout
    assert "greedy_match: true" in result.stdout


def test_bench_malformed_json_line_names_file_and_line(tiny_pair_dirs, workload) -> None:
    prompts = workload([json.dumps({"prompt": "x"}), '{"prompt": "unclosed'])
    line = one_line_error(bench(tiny_pair_dirs, prompts))
    assert f"{prompts}:2: malformed JSON" in line
    assert "prompts.jsonl:2" in line


def test_bench_empty_prompt_names_file_and_line(tiny_pair_dirs, workload) -> None:
    prompts = workload([json.dumps({"prompt": "x"}), json.dumps({"prompt": "y"}), json.dumps({"prompt": ""})])
    line = one_line_error(bench(tiny_pair_dirs, prompts))
    assert f"{prompts}:3: prompt" in line and "non-empty" in line


def test_bench_negative_max_new_tokens_in_workload(tiny_pair_dirs, workload) -> None:
    prompts = workload([json.dumps({"prompt": "x", "max_new_tokens": -3})])
    line = one_line_error(bench(tiny_pair_dirs, prompts))
    assert f"{prompts}:1: max_new_tokens" in line and "-3" in line


def test_bench_negative_max_new_tokens_flag_is_one_line(tiny_pair_dirs, good_prompts) -> None:
    """cli.py promises ``error: <one line>`` and exit 2 for a bad flag value too."""
    target, draft = tiny_pair_dirs
    result = CliRunner().invoke(
        main,
        [
            "bench",
            "--target",
            str(target),
            "--draft",
            str(draft),
            "--prompts",
            str(good_prompts),
            "--max-new-tokens",
            "-1",
        ],
    )
    line = one_line_error(result)
    assert "--max-new-tokens" in line and "-1" in line


def test_bench_missing_model_folder(tiny_pair_dirs, good_prompts, tmp_path) -> None:
    missing = tmp_path / "no-such-model"
    _, draft = tiny_pair_dirs
    line = one_line_error(bench((missing, draft), good_prompts))
    assert str(missing) in line and "not found" in line


def long_prompt(target: Path) -> tuple[str, int]:
    """A prompt of far more tokens than the tiny target's 512-token context, and its length."""
    text = "class Point:\n    def __init__(self, x, y):\n        self.x = x\n" * 120
    return text, len(Tokenizer.from_file(str(target / "tokenizer.json")).encode(text).ids)


def test_bench_prompt_longer_than_context_gives_length_and_limit(tiny_pair_dirs, workload) -> None:
    text, n_tokens = long_prompt(tiny_pair_dirs[0])
    prompts = workload([json.dumps({"prompt": "x"}), json.dumps({"prompt": text})])
    line = one_line_error(bench(tiny_pair_dirs, prompts))
    assert str(prompts) in line
    assert f"{n_tokens} tokens" in line
    assert "limit of 486" in line  # 512 context - 6 new tokens - 20 reserved


def test_bench_prompt_longer_than_context_names_its_line(tiny_pair_dirs, workload) -> None:
    """workload.py: every problem is ``<file>:<line>: <what>``; a blank line must not shift it."""
    text, _ = long_prompt(tiny_pair_dirs[0])
    prompts = workload([json.dumps({"prompt": "x"}), "", json.dumps({"prompt": text})])
    line = one_line_error(bench(tiny_pair_dirs, prompts))
    assert f"{prompts}:3:" in line


def test_bench_prompt_plus_max_new_tokens_past_context_is_refused_or_truncated(
    tiny_pair_dirs, workload
) -> None:
    """The prompt alone fits the tiny target's 512 tokens; with its line's max_new_tokens it does not."""
    prompt = "def add(a, b):\n    return a + b\n" * 4
    n_tokens = len(Tokenizer.from_file(str(tiny_pair_dirs[0] / "tokenizer.json")).encode(prompt).ids)
    max_new = 512 - 20 - n_tokens + 3
    prompts = workload(
        [json.dumps({"prompt": "x"}), json.dumps({"prompt": prompt, "max_new_tokens": max_new})]
    )
    line = one_line_error(bench(tiny_pair_dirs, prompts))
    assert f"{prompts}:2: prompt is {n_tokens} tokens" in line and f"limit of {n_tokens - 3}" in line, line

    result = bench(tiny_pair_dirs, prompts, "--truncate-prompts", "--json")
    assert result.exit_code == 0, (result.output, result.exception)
    assert json.loads(result.stdout)["greedy_match"] is True


# ------------------------------------------------------------------------------------------
# profile and tune


def write_config(folder: Path, pair: tuple[Path, Path], prompts: Path, **overrides) -> Path:
    target, draft = pair
    raw = {
        "models": {
            "target": str(target),
            "draft": str(draft),
            "device": "cpu",
            "dtype": "float32",
            "compile": False,
        },
        "workload": {"prompts": str(prompts), "max_new_tokens": 6, "concurrency": [1, 2], "num_requests": 2},
        "search": {"gamma": {"low": 0, "high": 2}, "max_batch_size": [2]},
        "budget": {"n_trials": 2, "remeasure_top": 1},
        "storage": {"url": "sqlite:///state/autotune.db"},
        "export": {"formats": ["yaml"], "dir": "exports"},
        "profile": {"gamma_max": 2},
    }
    for section, values in overrides.items():
        raw[section] = {**raw.get(section, {}), **values}
    path = folder / "tune.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_profile_prints_the_classification_table(tiny_pair_dirs, good_prompts, tmp_path) -> None:
    config = write_config(tmp_path, tiny_pair_dirs, good_prompts)

    result = CliRunner().invoke(main, ["profile", "--config", str(config)])

    assert result.exit_code == 0, (result.output, result.exception)
    out = result.stdout
    for heading in ("device", "bandwidth", "matmul", "ridge", "knee n*", "acceptance  "):
        assert any(line.startswith(heading) for line in out.splitlines()), heading
    assert "at gamma 2" in out
    header = next(line for line in out.splitlines() if line.lstrip().startswith("batch"))
    assert "label" in header and "best gamma" in header and "gamma=2+1" in header
    rows = [line.split() for line in out.splitlines() if line.split() and line.split()[0] in ("1", "2")]
    assert [r[0] for r in rows] == ["1", "2"]
    assert all(any(lbl in r for lbl in ("memory-bound", "transitional", "compute-bound")) for r in rows)
    assert (tmp_path / "state" / "autotune.db").is_file()  # the measurement is stored
    assert "measured: knee curve" in result.stderr


def test_profile_json(tiny_pair_dirs, good_prompts, tmp_path) -> None:
    config = write_config(tmp_path, tiny_pair_dirs, good_prompts)
    result = CliRunner().invoke(main, ["profile", "--config", str(config), "--json"])
    assert result.exit_code == 0, (result.output, result.exception)
    data = json.loads(result.stdout)
    assert data["acceptance"]["gamma_max"] == 2
    assert sorted(data["curves"]["t_verify"]) == ["1", "2"]
    assert [r["batch_size"] for r in data["classification"]["batch_sizes"]] == [1, 2]


@pytest.mark.parametrize("command", ["profile", "tune"])
@pytest.mark.parametrize(
    "in_yaml, flag, runs",
    [(False, "--compile", "true"), (True, "--no-compile", "false"), ("auto", None, "auto")],
)
def test_compile_flag_overrides_models_compile(
    tiny_pair_dirs, good_prompts, tmp_path, monkeypatch, command, in_yaml, flag, runs
) -> None:
    from autotune import context

    seen = []

    def stop(cfg, say=None, reprofile=False):  # noqa: ARG001 - the config the command would build its engine from
        seen.append(cfg.models.compile)
        raise KeyboardInterrupt

    monkeypatch.setattr(context, "build", stop)
    config = write_config(tmp_path, tiny_pair_dirs, good_prompts, models={"compile": in_yaml})
    CliRunner().invoke(main, [command, "--config", str(config), *([flag] if flag else [])])
    assert seen == [runs]


def test_tune_invalid_config_exits_2_names_the_key_and_writes_nothing(
    tiny_pair_dirs, good_prompts, tmp_path
) -> None:
    config = write_config(tmp_path, tiny_pair_dirs, good_prompts, search={"gamma": {"low": 4, "high": 2}})

    result = CliRunner().invoke(main, ["tune", "--config", str(config)])

    line = one_line_error(result)
    assert line == "error: search.gamma.high: must be >= search.gamma.low (got 2 < 4)"
    assert not (tmp_path / "state").exists()
    assert not (tmp_path / "exports").exists()
    assert result.stdout == ""


def test_tune_unknown_key_exits_2(tiny_pair_dirs, good_prompts, tmp_path) -> None:
    config = write_config(tmp_path, tiny_pair_dirs, good_prompts, budget={"n_trails": 3})
    line = one_line_error(CliRunner().invoke(main, ["tune", "--config", str(config)]))
    assert line == "error: budget.n_trails: unknown key"
    assert not (tmp_path / "state").exists()


def test_tune_missing_config_exits_2(tmp_path) -> None:
    missing = tmp_path / "nope.yaml"
    line = one_line_error(CliRunner().invoke(main, ["tune", "--config", str(missing)]))
    assert line == f"error: {missing}: config file not found"


def test_tune_runs_and_prints_the_summary(tiny_pair_dirs, good_prompts, tmp_path) -> None:
    config = write_config(tmp_path, tiny_pair_dirs, good_prompts)

    result = CliRunner().invoke(main, ["tune", "--config", str(config), "--trials", "2"])

    assert result.exit_code == 0, (result.output, result.exception)
    assert "profile #1 for" in result.stdout and "(2 trials on engine, study " in result.stdout
    for heading in ("chosen ", "overall ", "classes ", "schedule ", "stored ", "exports "):
        assert any(line.startswith(heading) for line in result.stdout.splitlines()), heading
    assert (tmp_path / "exports" / "profile.yaml").is_file()
    assert "trial 1:" in result.stderr and "[2/2, ETA 0s]" in result.stderr  # progress with an ETA


def test_tune_strict_on_a_busy_host_exits_2_in_one_line_and_stores_nothing(
    tiny_pair_dirs, good_prompts, tmp_path, monkeypatch
) -> None:
    from autotune.device import hostnoise

    busy = {
        "cv": 0.3,
        "median_ms": 1.0,
        "repeats": 20,
        "others_cpu_share": 0.7,
        "loadavg_1m": 3.0,
        "cpus": 2,
        "busy": True,
        "reasons": ["other processes used 70% of the CPU > 25%"],
        "thresholds": {},
    }
    monkeypatch.setattr(hostnoise, "measure", lambda gpus=None: busy)
    config = write_config(tmp_path, tiny_pair_dirs, good_prompts)

    result = CliRunner().invoke(main, ["tune", "--config", str(config), "--strict"])

    assert result.exit_code == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [result.stderr.splitlines()[-1]] and "--strict: busy host before tuning" in errors[0]
    assert not (tmp_path / "exports").exists()
    from profiles.store import Store

    assert Store(f"sqlite:///{tmp_path / 'state' / 'autotune.db'}").list_profiles() == []


def test_schedule_line_says_worse_when_the_interval_is_below_one() -> None:
    from autotune.cli import _schedule_text

    worse = _schedule_text(
        {"batch_size": 1, "gamma": 0, "ratio": {"value": 0.75, "ci95": [0.59, 0.96], "n": 3}}
    )
    same = _schedule_text({"batch_size": 2, "gamma": 0, "ratio": {"value": 1.02, "ci95": [0.9, 1.1], "n": 3}})
    better = _schedule_text(
        {"batch_size": 4, "gamma": 5, "ratio": {"value": 1.4, "ci95": [1.2, 1.6], "n": 3}}
    )
    assert "significantly worse (ratio 0.75, 95% CI 0.59-0.96)" in worse
    assert "no significant difference (ratio 1.02" in same and "significantly better (ratio 1.40" in better
