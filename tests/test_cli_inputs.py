"""Bad input through the ``autotune`` CLI (one line, exit 2), ``autotune init``, and bench's engine rows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from autotune.cli import main
from autotune.config import load_config
from engine.demo import DEMO_DRAFT, DEMO_PROMPTS, DEMO_TARGET

REPO = Path(__file__).resolve().parents[1]
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}


def one_line_error(result) -> str:
    """The run failed as bad input: exit code 2 and exactly one ``error: ...`` line on stderr."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


def invoke(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args])


# ------------------------------------------------------------------------------------------
# malformed config.json of the target, through `autotune bench`


def _edit(raw: dict, **changes) -> dict:
    out = dict(raw)
    for key, value in changes.items():
        if value is _DROP:
            out.pop(key, None)
        else:
            out[key] = value
    return out


_DROP = object()
MALFORMED = [  # (id, change to the tiny target's config.json (or a whole replacement), key named)
    ("array", [], "must be a JSON object"),
    ("null", None, "must be a JSON object"),
    ("zero-heads", {"num_attention_heads": 0}, "num_attention_heads"),
    ("negative-layers", {"num_hidden_layers": -1}, "num_hidden_layers"),
    ("zero-intermediate", {"intermediate_size": 0}, "intermediate_size"),
    ("string-hidden", {"hidden_size": "48"}, "hidden_size"),
    ("float-vocab", {"vocab_size": 300.5}, "vocab_size"),
    ("list-eps", {"rms_norm_eps": [1e-6]}, "rms_norm_eps"),
    ("missing-vocab", {"vocab_size": _DROP}, "vocab_size"),
    ("llama3-without-factor", {"rope_scaling": {"rope_type": "llama3"}}, "rope_scaling.factor"),
    (
        "llama3-without-high",
        {"rope_scaling": {k: v for k, v in LLAMA3.items() if k != "high_freq_factor"}},
        "rope_scaling.high_freq_factor",
    ),
    ("yarn", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling.rope_type"),
    ("gelu-fast", {"hidden_act": "gelu_fast"}, "hidden_act"),
    ("softcap", {"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ("llama-sliding-window", {"sliding_window": 8}, "sliding_window"),
    ("unknown-model-type", {"model_type": "gpt2"}, "model_type"),
]


@pytest.fixture
def prompts(tmp_path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "def add(a, b):\n"}) + "\n")
    return path


@pytest.mark.parametrize("change, key", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_target_config_is_one_line_naming_file_and_key(
    tiny_pair_dirs, prompts, tmp_path, change, key
):
    target, draft = tiny_pair_dirs
    bad = tmp_path / "target"
    shutil.copytree(target, bad)
    raw = json.loads((target / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps(_edit(raw, **change) if isinstance(change, dict) else change))

    line = one_line_error(
        invoke(
            "bench",
            "--target",
            bad,
            "--draft",
            draft,
            "--prompts",
            prompts,
            "--max-new-tokens",
            2,
            "--num-requests",
            1,
            "--device",
            "cpu",
        )
    )

    assert str(bad / "config.json") in line and key in line, line


# ------------------------------------------------------------------------------------------
# a device this host lacks


@pytest.fixture
def cuda_config(tmp_path, monkeypatch):
    """A tune.yaml asking for cuda on a host where torch sees none, next to an existing database."""
    import torch

    from profiles.store import Store

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    db = tmp_path / "autotune.db"
    Store(f"sqlite:///{db}").close()
    path = tmp_path / "tune.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "models": {"target": "demo", "draft": "demo", "device": "cuda"},
                "workload": {"prompts": "demo"},
                "storage": {"url": f"sqlite:///{db}"},
            }
        )
    )
    return path


@pytest.mark.parametrize(
    "args",
    [
        ("profiles", "show", "current"),
        ("export", "current", "--format", "vllm"),
        ("report", "current"),
        ("profile",),
        ("tune",),
    ],
)
def test_cuda_on_a_host_without_cuda_is_one_line(cuda_config, args):
    line = one_line_error(invoke(*args, "--config", cuda_config))
    assert str(cuda_config) in line and "models.device" in line and "no CUDA device" in line, line


# ------------------------------------------------------------------------------------------
# autotune init


def test_init_without_models_writes_the_bundled_file_for_the_demo_pair(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("init", "--sweep", "bundled")
    assert result.exit_code == 0, (result.output, result.exception)
    written = (tmp_path / "tune.yaml").read_text()
    bundled = (REPO / "tune.yaml").read_text()

    assert written == bundled  # the bundled file names the demo pair and prompts with `demo` too
    cfg = load_config(tmp_path / "tune.yaml")
    assert (cfg.models.target, cfg.models.draft, cfg.workload.prompts) == (
        DEMO_TARGET,
        DEMO_DRAFT,
        DEMO_PROMPTS,
    )


def test_init_writes_absolute_paths_and_the_file_works_anywhere(
    tiny_pair_dirs, tiny_prompts, tmp_path, monkeypatch
):
    target, draft = tiny_pair_dirs
    out = tmp_path / "a" / "my tune.yaml"
    out.parent.mkdir()
    monkeypatch.chdir(tmp_path)
    result = invoke("init", "--target", target, "--draft", draft, "--prompts", tiny_prompts, "-o", out)
    assert result.exit_code == 0, (result.output, result.exception)
    moved = tmp_path / "elsewhere" / "tune.yaml"
    moved.parent.mkdir()
    shutil.copy(out, moved)  # what a user does before editing it
    cfg = load_config(moved)
    assert (cfg.models.target, cfg.models.draft, cfg.workload.prompts) == (
        target.resolve(),
        draft.resolve(),
        tiny_prompts.resolve(),
    )
    assert "# HF-style folder" in moved.read_text()


def test_init_sizes_the_load_sweep_on_this_host_from_one_request_to_the_targets_saturation(
    tiny_pair_dirs, tiny_prompts, tmp_path
):
    target, draft = tiny_pair_dirs
    out = tmp_path / "tune.yaml"
    result = invoke("init", "--target", target, "--draft", draft, "--prompts", tiny_prompts, "-o", out)
    assert result.exit_code == 0, (result.output, result.exception)
    assert "sweep: concurrency [1" in result.output and "per doubling of the batch" in result.output
    cfg = load_config(out)
    levels = list(cfg.workload.concurrency)
    assert levels == [2**i for i in range(len(levels))] and len(levels) >= 2  # 1, 2, 4, ... measured
    assert list(cfg.search.max_batch_size) == [levels[-1]]
    assert cfg.workload.num_requests == 8  # the floor; each level runs max(8, min_batches x concurrency)
    assert cfg.workload.requests_at(1) == 8 and cfg.workload.requests_at(levels[-1]) == max(8, 3 * levels[-1])
    bundled = (REPO / "tune.yaml").read_text().splitlines()
    written = out.read_text().splitlines()
    changed = {a.split(":")[0].strip() for a, b in zip(bundled, written, strict=True) if a != b}
    assert changed <= {"target", "draft", "prompts", "concurrency", "num_requests", "max_batch_size"}


def test_the_sweep_init_writes_comes_from_the_measurement_it_is_given(tiny_pair_dirs, tmp_path):
    from autotune.device.sizing import Sweep
    from autotune.jobs.init import write_tune_yaml

    target, draft = tiny_pair_dirs
    seen = []

    def measured(folder):
        seen.append(folder)
        return Sweep((1, 2, 4, 8, 16, 32), "cpu", {1: 1.0, 2: 1.9, 4: 3.5, 8: 6.0, 16: 9.0, 32: 9.5})

    out = write_tune_yaml(tmp_path / "t.yaml", target, draft, sweep=measured)
    assert seen == [target.resolve()]
    cfg = load_config(out)
    assert list(cfg.workload.concurrency) == [1, 2, 4, 8, 16, 32]
    assert cfg.workload.num_requests == 8 and list(cfg.search.max_batch_size) == [32]
    assert measured(target).describe().startswith("concurrency [1, 2, 4, 8, 16, 32]: the target's decode")


def test_init_refuses_to_overwrite_without_force(tmp_path):
    out = tmp_path / "tune.yaml"
    out.write_text("mine\n")
    line = one_line_error(invoke("init", "-o", out))
    assert str(out) in line and "--force" in line
    assert out.read_text() == "mine\n"
    assert invoke("init", "-o", out, "--force").exit_code == 0
    assert load_config(out).models.target == DEMO_TARGET


@pytest.mark.parametrize("case", ["target-only", "missing-folder", "bad-config", "bad-prompts", "no-parent"])
def test_init_bad_input_is_one_line(tiny_pair_dirs, tmp_path, case):
    target, draft = tiny_pair_dirs
    out = tmp_path / "tune.yaml"
    bad_prompts = tmp_path / "p.jsonl"
    bad_prompts.write_text("{not json\n")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("[]")
    args, want = {
        "target-only": (("--target", target), "--draft"),
        "missing-folder": (("--target", tmp_path / "nope", "--draft", draft), str(tmp_path / "nope")),
        "bad-config": (("--target", broken, "--draft", draft), str(broken / "config.json")),
        "bad-prompts": (("--prompts", bad_prompts), f"{bad_prompts}:1"),
        "no-parent": (("-o", tmp_path / "no" / "tune.yaml"), str(tmp_path / "no")),
    }[case]
    line = one_line_error(invoke("init", *(args if case == "no-parent" else (*args, "-o", out))))
    assert want in line, line
    assert not out.exists()


def test_a_relative_path_that_does_not_resolve_hints_at_the_demo_keyword(tmp_path):
    text = (REPO / "tune.yaml").read_text()
    copied = tmp_path / "tune.yaml"
    copied.write_text(text.replace("  target: demo ", "  target: engine/demo/pair/target ", 1))
    line = one_line_error(invoke("tune", "--config", copied))  # relative to tmp_path: not there
    assert "models.target" in line and "`demo`" in line, line


# ------------------------------------------------------------------------------------------
# bench: --concurrency sets the engine's rows unless --max-batch-size says otherwise


def _bench_json(pair, prompts, *extra):
    target, draft = pair
    result = invoke(
        "bench",
        "--target",
        target,
        "--draft",
        draft,
        "--prompts",
        prompts,
        "--max-new-tokens",
        4,
        "--num-requests",
        4,
        "--device",
        "cpu",
        "--json",
        *extra,
    )
    assert result.exit_code == 0, (result.output, result.exception)
    return json.loads(result.stdout)


def test_bench_concurrency_runs_that_many_rows(tiny_pair_dirs, tiny_prompts):
    out = _bench_json(tiny_pair_dirs, tiny_prompts, "--concurrency", 3)
    assert out["batch_size"] == 3
    assert out["mean_batch_size"] > 1


def test_bench_explicit_smaller_batch_size_is_honoured(tiny_pair_dirs, tiny_prompts):
    out = _bench_json(tiny_pair_dirs, tiny_prompts, "--concurrency", 3, "--max-batch-size", 1)
    assert out["batch_size"] == 1
    assert out["mean_batch_size"] == 1


def test_bench_help_says_concurrency_sets_the_rows():
    text = " ".join(invoke("bench", "--help").output.split())
    assert "Without --max-batch-size the engine runs this many rows" in text
