"""``autotune init`` for the models people serve: dtype, device, an EAGLE-3 head without a draft model,
the backend, and a target that does not fit refused in one line (never a traceback)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from click.testing import CliRunner

from autotune.cli import main
from autotune.config import load_config
from autotune.device import sizing


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_init_writes_dtype_device_backend_and_a_head_without_a_draft(tiny_pair_dirs, tmp_path) -> None:
    target, _ = tiny_pair_dirs
    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text("{}")
    out = tmp_path / "tune.yaml"
    result = invoke(
        "init",
        "--target",
        target,
        "--eagle3",
        head,
        "--dtype",
        "bfloat16",
        "--device",
        "cpu",
        "--backend",
        "vllm",
        "--sweep",
        "bundled",
        "-o",
        out,
    )
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "  draft: null" in text and "  drafter: [eagle3]" in text
    cfg = load_config(out)
    assert (cfg.models.dtype, cfg.models.device, cfg.backend.name) == ("bfloat16", "cpu", "vllm")
    assert cfg.models.draft is None and cfg.models.eagle3 == head.resolve()
    assert cfg.search.drafter == ("eagle3",)


def test_init_sizes_the_sweep_in_the_dtype_it_writes(tiny_pair_dirs, tmp_path, monkeypatch) -> None:
    target, draft = tiny_pair_dirs
    seen = []
    real = sizing.size_sweep

    def spy(folder, device="auto", dtype="float32", *a, **k):
        seen.append((device, dtype))
        return real(folder, device, dtype, *a, **k)

    monkeypatch.setattr(sizing, "size_sweep", spy)
    out = tmp_path / "tune.yaml"
    result = invoke("init", "--target", target, "--draft", draft, "--dtype", "bfloat16", "-o", out)
    assert result.exit_code == 0, result.output
    assert seen == [("auto", "bfloat16")] and load_config(out).models.dtype == "bfloat16"


def test_init_on_a_target_whose_batch_one_does_not_fit_is_one_line(
    tiny_pair_dirs, tmp_path, monkeypatch
) -> None:
    target, draft = tiny_pair_dirs

    def oom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr("autotune.device.timing.forward_timer", oom)
    out = tmp_path / "tune.yaml"
    result = invoke("init", "--target", target, "--draft", draft, "-o", out)
    assert result.exit_code == 2 and not out.exists()
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: ") and "one decode step at batch 1 does not fit on cpu" in line


def test_init_refuses_a_target_larger_than_memory_before_loading(
    tiny_pair_dirs, tmp_path, monkeypatch
) -> None:
    target = tmp_path / "target"
    shutil.copytree(tiny_pair_dirs[0], target)
    monkeypatch.setattr("autotune.device.capacity.free_bytes", lambda where: 100)
    out = tmp_path / "tune.yaml"
    result = invoke("init", "--target", target, "--draft", tiny_pair_dirs[1], "-o", out)
    assert result.exit_code == 2 and not out.exists()
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: does not fit on cpu: target weights") and "--sweep bundled" in line
    assert Path(out).exists() is False
