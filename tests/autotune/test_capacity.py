"""Memory and dtype before anything loads (autotune.device.capacity), and what the tool does with them:
a pair that cannot fit is refused in one line with exit 2 and nothing written; a serving-stack run
holds no weights, and goes on without the engine's prior where the pair does not fit in it."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open
from safetensors.torch import save_file

from autotune import context
from autotune.cli import main
from autotune.config import load_config
from autotune.device import capacity
from autotune.device.capacity import GIB, Need, check_fits, read_checkpoint, resolve_dtype
from autotune.errors import ConfigError
from engine.demo import DEMO_DRAFT, DEMO_TARGET
from tests.autotune.conftest import write_config


def _header_bytes(path: Path) -> int:
    with path.open("rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
    return 8 + length


def test_sizes_from_headers_equal_the_files_they_describe() -> None:
    """The demo pair's tensors as their headers declare them fill the files exactly; loaded in another
    dtype they scale by its width (the loader casts float tensors)."""
    for folder in (DEMO_TARGET, DEMO_DRAFT):
        ck = read_checkpoint(folder)
        (f,) = list(folder.glob("*.safetensors"))
        assert ck.stored_bytes == f.stat().st_size - _header_bytes(f) == ck.file_bytes - _header_bytes(f)
        with safe_open(str(f), framework="pt") as st:  # the library's own reading of every tensor
            tensors = [st.get_tensor(name) for name in st.keys()]
        assert sum(t.numel() * t.element_size() for t in tensors) == ck.stored_bytes
        assert sum(t.numel() for t in tensors if t.is_floating_point()) == ck.float_params
        assert ck.weights_bytes("float32") == ck.float_params * 4 + ck.other_bytes
        assert ck.weights_bytes("bfloat16") * 2 == ck.weights_bytes("float32")


def test_a_bf16_checkpoint_is_sized_per_dtype_and_kv_per_token(tmp_path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    save_file(
        {"w": torch.zeros(64, 32, dtype=torch.bfloat16), "i": torch.zeros(10, dtype=torch.int64)},
        str(folder / "model.safetensors"),
    )
    config = {
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "hidden_size": 256,
        "torch_dtype": "bfloat16",
    }
    (folder / "config.json").write_text(json.dumps(config))
    ck = read_checkpoint(folder)
    assert ck.float_params == 2048 and ck.other_bytes == 80 and ck.stored_bytes == 2048 * 2 + 80
    assert ck.weights_bytes("bfloat16") == 4176 and ck.weights_bytes("float32") == 8272
    assert ck.torch_dtype == "bfloat16"
    assert ck.kv_bytes_per_token("bfloat16") == 2 * 4 * 2 * 32 * 2  # K and V, layers, kv heads, head_dim


def _declare_more_than_held(folder: Path, gib: int) -> None:
    """Rewrite folder's checkpoint so its header declares a ``gib``-GiB tensor the file does not hold."""
    header = json.dumps(
        {"w": {"dtype": "F32", "shape": [gib * GIB // 4], "data_offsets": [0, gib * GIB]}}
    ).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(64))


def test_a_header_declaring_more_than_its_file_holds_is_refused_by_name(tmp_path) -> None:
    folder = tmp_path / "big"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    _declare_more_than_held(folder, 300)
    with pytest.raises(
        ConfigError, match=r"model.safetensors: its header declares 300 GiB of tensors but the file holds"
    ):
        read_checkpoint(folder)
    (folder / "model.safetensors").write_bytes(b"\x00\x01")
    with pytest.raises(ConfigError, match="not a safetensors file"):
        read_checkpoint(folder)


def test_check_fits_names_every_size_and_the_knob() -> None:
    needs = [Need("target weights (bfloat16)", 140 * GIB), Need("KV cache (16 x 2048 tokens)", 10 * GIB)]
    with pytest.raises(ConfigError) as err:
        check_fits(needs, 80 * GIB, "cuda:0", "backend.vllm.tensor_parallel_size")
    assert str(err.value) == (
        "does not fit on cuda:0: target weights (bfloat16) 140 GiB + KV cache (16 x 2048 tokens) 10.00 GiB "
        "= 150 GiB, free 80.00 GiB (change backend.vllm.tensor_parallel_size)"
    )
    assert check_fits(needs, 200 * GIB, "cuda:0", "x").startswith("memory: target weights")
    assert "not checked" in check_fits(needs, None, "cpu", "x")


@pytest.mark.parametrize(
    ("requested", "declared", "device", "bf16_cpu", "bf16_gpu", "want"),
    [
        ("auto", "bfloat16", "cuda:0", False, True, "bfloat16"),
        ("auto", "bfloat16", "cuda", False, False, "float16"),
        ("auto", "float16", "cuda:1", False, False, "float16"),
        ("auto", "bfloat16", "cpu", True, False, "bfloat16"),
        ("auto", "bfloat16", "cpu", False, False, "float32"),
        ("auto", "float16", "cpu", True, False, "float32"),
        ("auto", None, "cpu", True, False, "float32"),
        ("float16", "bfloat16", "cpu", False, False, "float16"),
    ],
)
def test_dtype_auto_is_the_checkpoints_where_the_device_runs_it(
    monkeypatch, requested, declared, device, bf16_cpu, bf16_gpu, want
) -> None:
    monkeypatch.setattr(capacity, "cpu_has_bf16", lambda cpuinfo=None: bf16_cpu)
    dtype, why = resolve_dtype(requested, declared, device, lambda: bf16_gpu)
    assert dtype == want and why


def test_cpu_bf16_is_read_from_the_flags() -> None:
    assert capacity.cpu_has_bf16("flags : fpu avx2 avx512f avx512_bf16 amx_tile")
    assert not capacity.cpu_has_bf16("flags : fpu avx2 avx512f")


def test_free_memory_of_a_gpu_is_its_own_answer(monkeypatch) -> None:
    asked = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: asked.append(i) or (7 * GIB, 80 * GIB))
    assert capacity.free_bytes("cuda:3") == 7 * GIB and asked == [3]
    assert capacity.free_bytes("cuda") == 7 * GIB and asked == [3, 0]
    assert capacity.free_bytes("cpu") is None or capacity.free_bytes("cpu") > 0


def _stored_files(tmp_path: Path) -> list[str]:
    return sorted(
        str(p.relative_to(tmp_path))
        for p in tmp_path.rglob("*")
        if p.suffix in (".db", ".json", ".yaml") and "pair" not in p.parts
    )


def test_a_pair_that_does_not_fit_is_one_line_exit_2_and_nothing_written(
    tmp_path, tiny_pair_dirs, monkeypatch
) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "def add(a, b):\n"}) + "\n")
    config = write_config(tmp_path, tiny_pair_dirs, prompts, tmp_path / "store.db")
    monkeypatch.setattr(context, "free_bytes", lambda device: 1024)
    result = CliRunner().invoke(main, ["tune", "--config", str(config)])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: does not fit on cpu: target weights (float32)")
    assert "free 0.00 GiB (change models.dtype" in lines[0]
    assert not (tmp_path / "store.db").exists() and not (tmp_path / "exports").exists()


def test_a_checkpoint_that_lies_about_its_size_is_refused_before_anything_loads(
    tmp_path, tiny_pair_dirs
) -> None:
    target = tmp_path / "pair" / "target"
    shutil.copytree(tiny_pair_dirs[0], target)
    _declare_more_than_held(target, 500)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "x"}) + "\n")
    config = write_config(
        tmp_path, (target, tiny_pair_dirs[1]), prompts, tmp_path / "store.db", backend={"name": "vllm"}
    )
    result = CliRunner().invoke(main, ["tune", "--config", str(config)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"error: {target / 'model.safetensors'}: its header declares 500 GiB of tensors but the file holds 0.00 GiB "
        "(truncated or not a checkpoint)"
    ]
    assert not (tmp_path / "store.db").exists()


def test_a_stack_run_whose_pair_does_not_fit_the_engine_goes_on_without_its_prior(
    tmp_path, tiny_pair_dirs, monkeypatch
) -> None:
    """No weights are loaded and nothing is stored as an engine measurement; the note says why."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "def add(a, b):\n"}) + "\n")
    cfg = load_config(
        write_config(tmp_path, tiny_pair_dirs, prompts, tmp_path / "store.db", backend={"name": "vllm"})
    )
    ctx = context.build(cfg)
    monkeypatch.setattr(context, "free_bytes", lambda device: 1024)
    loads = []
    monkeypatch.setattr(context, "load_engine", lambda *a, **k: loads.append(1))
    measurement, reused = context.ensure_profile(ctx)
    assert not reused and loads == [] and ctx.loaded is None
    assert measurement["engine"] == "not loaded" and measurement["curves"] == {}
    assert ctx.notes[-1].startswith(
        "engine prior: none, the pair does not fit in the engine here (does not fit on cpu"
    )
    assert ctx.store.latest_measurement(ctx.device_key, ctx.pair_id, ctx.workload_hash, "profiler") is None
    from autotune.records import Measurement
    from autotune.search.study import Space, shape_space, warm_starts

    space = shape_space(
        cfg.with_overrides({"search.gamma": {"low": 0, "high": 8}, "profile.gamma_max": 8}), measurement
    )
    assert isinstance(space, Space) and space.gamma_high == 8 and space.search_gamma_cap is None
    assert not Measurement.from_json(measurement).has_engine
    starts = warm_starts(ctx, space, measurement, None, in_stack=True)
    assert [p["gamma"] for _, p in starts] == [0, 0, 3, 6]
    with pytest.raises(RuntimeError, match="not loaded"):
        _ = ctx.pair


def test_a_context_reads_the_pair_from_files_only_for_a_stack_backend(tmp_path, tiny_pair_dirs) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "def add(a, b):\n", "max_new_tokens": 5}) + "\n")
    cfg = load_config(
        write_config(tmp_path, tiny_pair_dirs, prompts, tmp_path / "store.db", backend={"name": "vllm"})
    )
    ctx = context.build(cfg)
    assert ctx.loaded is None and ctx.files.target.folder == tiny_pair_dirs[0]
    assert ctx.longest_sequence == len(ctx.requests[0].prompt_ids) + 5 + 20
    assert ctx.notes[0] == "dtype: float32 (models.dtype: float32)"


def test_a_stack_runs_engine_prior_stops_at_its_share_of_the_budget(tmp_path, tiny_pair_dirs) -> None:
    """Profiling that passes its share of budget.minutes stops; the engine is released, nothing is
    stored, and the run goes on without the prior."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "def add(a, b):\n"}) + "\n")
    cfg = load_config(
        write_config(tmp_path, tiny_pair_dirs, prompts, tmp_path / "store.db", backend={"name": "vllm"})
    )
    ctx = context.build(cfg)
    steps = []

    def progress(step: str) -> None:
        steps.append(step)
        if step.startswith("verify/draft"):
            raise context.PriorOverBudget("5 min spent, over 20% of budget.minutes")

    measurement, reused = context.ensure_profile(ctx, progress=progress)
    assert not reused and measurement["engine"] == "not loaded" and ctx.loaded is None
    assert steps[:2] == ["fingerprint", "ceilings"]
    assert ctx.notes[-1] == (
        "engine prior: stopped (5 min spent, over 20% of budget.minutes); the study starts without the "
        "cost model's prior"
    )
    assert ctx.store.latest_measurement(ctx.device_key, ctx.pair_id, ctx.workload_hash, "profiler") is None


def test_the_budget_check_never_comes_after_the_last_profiling_step(
    tmp_path, tiny_pair_dirs, monkeypatch
) -> None:
    """Profiling reports progress between its steps only: the last call comes before the acceptance
    pass, so a run over its budget share stops before that pass and never throws away a finished
    measurement (a 1B pair's acceptance pass ran minutes and was then discarded)."""
    from autotune.device import profiler

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "def add(a, b):\n"}) + "\n")
    cfg = load_config(
        write_config(tmp_path, tiny_pair_dirs, prompts, tmp_path / "store.db", backend={"name": "vllm"})
    )
    ctx = context.build(cfg)
    events = []
    real = profiler.measure_acceptance
    monkeypatch.setattr(
        profiler, "measure_acceptance", lambda *a, **k: (events.append("acceptance pass"), real(*a, **k))[1]
    )
    measurement, reused = context.ensure_profile(ctx, progress=lambda step: events.append(step))
    assert not reused and measurement.get("engine") != "not loaded" and "curves" in measurement
    assert events[-1] == "acceptance pass", events
    assert events[-2].startswith("engine step overhead"), events
