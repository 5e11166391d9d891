"""autotune.context: the pair as tune.yaml asks for it (models.compile) and what keys its measurements."""

from __future__ import annotations

import json

import pytest
import torch

from autotune import context
from autotune.config import ConfigError, load_config
from autotune.context import _compile
from autotune.device import hostnoise, profiler
from engine.errors import EngineInputError
from engine.loader import load_pair
from engine.model import Transformer
from tests.autotune.conftest import write_config  # noqa: I001


def _config(tmp_path, tiny_pair_dirs, compile_value):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "def add(a, b):\n"}) + "\n")
    return load_config(
        write_config(
            tmp_path, tiny_pair_dirs, prompts, tmp_path / "db.sqlite", models={"compile": compile_value}
        )
    )


def test_compile_true_compiles_both_models_and_keys_the_workload_apart(tmp_path, tiny_pair_dirs):
    eager = context.build(_config(tmp_path, tiny_pair_dirs, False))
    compiled = context.build(_config(tmp_path, tiny_pair_dirs, True))
    assert not eager.pair.target.compiled and eager.compile_note == "engine: eager (models.compile: false)"
    assert compiled.pair.target.compiled and compiled.pair.draft.compiled
    assert compiled.compile_note.startswith("engine: compiled decode/verify in ")
    assert compiled.pair.compile_s > 0
    # compiled timings are a different measurement: stored profiler data is not reused across modes
    assert "engine" not in eager.workload and compiled.workload["engine"] == "compiled"
    assert compiled.workload_hash != eager.workload_hash


def test_auto_falls_back_to_eager_and_says_why_when_compile_fails(tiny_pair_dirs, monkeypatch):
    def broken(self, mode=None, trees=()):
        raise RuntimeError("Compiler: cc not found\nmore detail")

    monkeypatch.setattr(Transformer, "compile_decode", broken)
    pair = load_pair(*tiny_pair_dirs)
    note = _compile(pair, "auto")
    assert note == "engine: eager (models.compile: auto, torch.compile failed: Compiler: cc not found)"
    assert not pair.target.compiled and pair.compile_s is None
    with pytest.raises(
        EngineInputError,
        match=r"^models.compile: torch.compile failed on this host "
        r"\(Compiler: cc not found\)$",
    ):
        _compile(pair, "true")


@pytest.mark.parametrize("value", ["yes", 1, "on"])
def test_models_compile_takes_auto_true_or_false(tmp_path, tiny_pair_dirs, value):
    with pytest.raises(ConfigError, match=r"models.compile: must be auto, true or false"):
        _config(tmp_path, tiny_pair_dirs, value)


@pytest.mark.parametrize(
    "mode, ratio, compiled", [("auto", 0.7, True), ("auto", 1.2, False), ("true", 1.2, True)]
)
def test_auto_keeps_eager_where_the_compiled_decode_is_slower(
    tiny_pair_dirs, monkeypatch, mode, ratio, compiled
):
    monkeypatch.setattr(profiler, "compiled_over_eager", lambda model: ratio)
    pair = load_pair(*tiny_pair_dirs)
    note = _compile(pair, mode)
    assert pair.target.compiled is compiled and pair.draft.compiled is compiled
    assert f"decode {ratio:.2f}x eager's time here" in note
    if compiled:
        assert note.startswith("engine: compiled decode/verify in ") and pair.compile_s > 0
    else:
        assert note.startswith("engine: eager (models.compile: auto; compiled in ") and pair.compile_s is None


def test_compiled_over_eager_times_both_paths_and_leaves_the_model_compiled(
    tiny_pair_dirs, monkeypatch
) -> None:
    pair = load_pair(*tiny_pair_dirs, compile=True)
    eager_calls = []
    real = Transformer.forward

    def counting(self, *args, **kw):  # eager decodes call forward; compiled ones run the traced graph
        eager_calls.append(self.compiled)
        return real(self, *args, **kw)

    monkeypatch.setattr(Transformer, "forward", counting)
    ratio = profiler.compiled_over_eager(pair.target, widths=(1,), rounds=2)
    assert ratio > 0 and pair.target.compiled
    assert eager_calls.count(False) >= 2 * 5  # every round timed 5 eager calls


@pytest.mark.parametrize("shapes, warmed", [(["chain"], [()]), (["chain", "2,1"], [(), (2, 1)])])
def test_the_compile_warm_up_includes_the_tree_forward_when_trees_are_searched(
    tmp_path, tiny_pair_dirs, monkeypatch, shapes, warmed
):
    seen = []

    def record(self, mode=None, trees=()):
        seen.append(list(trees))
        self.compiled = True
        return 0.5

    monkeypatch.setattr(Transformer, "compile_decode", record)
    monkeypatch.setattr(profiler, "compiled_over_eager", lambda model: 0.7)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "def add(a, b):\n"}) + "\n")
    cfg = load_config(
        write_config(
            tmp_path,
            tiny_pair_dirs,
            prompts,
            tmp_path / "db.sqlite",
            models={"compile": True},
            search={"tree_topk": shapes},
        )
    )
    ctx = context.build(cfg)
    assert seen == [warmed, warmed]  # target and draft: the searched shapes (chain = ())
    assert ctx.pair.compile_s == 1.0


BUSY_HOST = {"window_s": 0.5, "others_cpu_share": 0.5, "loadavg_1m": 2.0, "cpus": 2}


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_auto_keeps_eager_without_compiling_when_another_process_holds_a_core(
    tiny_pair_dirs, monkeypatch, two_threads
):
    compiled = []
    monkeypatch.setattr(
        Transformer, "compile_decode", lambda self, mode=None, trees=(): compiled.append(self)
    )
    monkeypatch.setattr(hostnoise, "others_now", lambda: BUSY_HOST)
    said: list[str] = []
    note = _compile(load_pair(*tiny_pair_dirs), "auto", say=said.append)
    assert compiled == [] and said == []  # minutes of compiling not spent
    assert note == (
        "engine: eager (models.compile: auto; other processes used 50% of 2 CPUs before compiling, and a "
        "compiled/eager comparison under that load decides nothing; models.compile: true compiles anyway)"
    )


def test_the_compile_comparison_runs_on_the_free_cores(tiny_pair_dirs, monkeypatch, two_threads):
    def record(self, mode=None, trees=()):
        self.compiled = True
        return 0.5

    threads = []
    monkeypatch.setattr(Transformer, "compile_decode", record)
    monkeypatch.setattr(hostnoise, "others_now", lambda: BUSY_HOST)
    monkeypatch.setattr(
        profiler, "compiled_over_eager", lambda model: threads.append(torch.get_num_threads()) or 0.7
    )
    note = _compile(load_pair(*tiny_pair_dirs), "true")
    assert threads == [1] and torch.get_num_threads() == 2
    assert "decode 0.70x eager's time here (timed on 1 of 2 threads: other processes held a core)" in note


@pytest.mark.parametrize("stored", ["compiled", "eager"])
def test_a_stack_backend_loads_the_engine_only_to_profile_and_releases_it(
    tmp_path, tiny_pair_dirs, monkeypatch, stored
):
    """With --backend vllm|llamacpp the tool holds no weights: build reads the pair's files only;
    ensure_profile loads (and compiles) the engine to profile when nothing is stored and releases it
    before any server starts; a stored profile of this workload (the compiled one first) is reused
    without loading, under the key it was stored with; --reprofile loads it again."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "def add(a, b):\n"}) + "\n")
    path = write_config(
        tmp_path,
        tiny_pair_dirs,
        prompts,
        tmp_path / "db.sqlite",
        models={"compile": "auto"},
        backend={"name": "vllm"},
    )
    cfg = load_config(path)
    compiles, measured = [], []
    monkeypatch.setattr(context, "_compile", lambda *a, **k: compiles.append(1) or "engine: eager (stub)")
    monkeypatch.setattr(context, "_measure", lambda ctx, progress: measured.append(ctx.pair) or {"x": 1})
    first = context.build(cfg)
    assert compiles == [] and first.loaded is None
    assert first.compile_note.startswith("engine: not loaded yet (the vllm backend runs every trial")
    data, reused = context.ensure_profile(first)
    assert (data, reused) == ({"x": 1}, False) and compiles == [1] and len(measured) == 1
    assert first.loaded is None  # released before the first server starts
    assert any(
        n.startswith("engine prior: the pair is loaded to profile, then released") for n in first.notes
    )
    workload = {**first.workload, **({"engine": "compiled"} if stored == "compiled" else {})}
    from profiles.hashing import hash_json

    first.store.save_measurement(first.device_key, first.pair_id, hash_json(workload), "profiler", {"x": 2})
    again = context.build(cfg)
    assert compiles == [1] and again.loaded is None
    assert again.compile_note.startswith("engine: not loaded (the vllm backend runs every trial")
    assert again.workload_hash == hash_json(workload) and f"measured {stored}" in again.compile_note
    assert context.ensure_profile(again) == ({"x": 2}, True) and compiles == [1]
    fresh = context.build(cfg, reprofile=True)
    context.ensure_profile(fresh, reprofile=True)
    assert compiles == [1, 1] and fresh.loaded is None


@pytest.mark.parametrize("layer_type", ["llama", "qwen3"])
def test_a_stack_run_with_a_head_the_engine_refuses_goes_on_without_the_prior(
    tmp_path, tiny_pair_dirs, monkeypatch, layer_type
):
    """A published head in the ``speculators`` layout with --backend vllm: building the run reads its
    files only; the engine prior loads it where the engine implements it (a Llama layer) and, where
    it does not (a Qwen3 layer, which vLLM serves), the run goes on without the prior instead of
    stopping: nothing is held, nothing stored, a note says why."""
    from tests.engine.test_eagle3 import head_config, random_head
    from tests.engine.test_eagle3_formats import write_speculators_folder

    target = load_pair(tiny_pair_dirs[0], None).target
    c = target.config
    raw = head_config(c, c.vocab_size, ids=[0, 1, c.num_hidden_layers])
    head = random_head(target, raw, None, seed=0, std=0.05)
    folder = write_speculators_folder(tmp_path / "head", raw, head, target)
    config = json.loads((folder / "config.json").read_text())
    config["transformer_layer_config"]["model_type"] = layer_type
    (folder / "config.json").write_text(json.dumps(config))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "def add(a, b):\n"}) + "\n")
    models = {"draft": None, "eagle3": str(folder)}
    path = write_config(
        tmp_path,
        tiny_pair_dirs,
        prompts,
        tmp_path / "db.sqlite",
        models=models,
        search={"drafter": ["eagle3"]},
        backend={"name": "vllm"},
    )
    measured = []
    monkeypatch.setattr(context, "_measure", lambda ctx, progress: measured.append(ctx.pair) or {"x": 1})
    ctx = context.build(load_config(path))
    assert ctx.loaded is None and ctx.files.head is not None and ctx.pair_drafter == "eagle3"
    data, reused = context.ensure_profile(ctx)
    assert ctx.loaded is None and not reused
    if layer_type == "llama":
        assert data == {"x": 1} and measured[0].eagle3 is not None  # the prior profiled the head
        return
    assert measured == [] and data["engine"] == "not loaded" and data["curves"] == {}
    assert ctx.store.latest_measurement(ctx.device_key, ctx.pair_id, ctx.workload_hash, "profiler") is None
    (note,) = [n for n in ctx.notes if n.startswith("engine prior:")]
    assert "engine prior: none, the engine does not load this pair" in note and "qwen3" in note
    assert note.endswith("the vllm servers load it themselves")


def test_a_max_new_tokens_every_line_overrides_is_named_in_the_notes(tmp_path, tiny_pair_dirs):
    prompts = tmp_path / "prompts.jsonl"
    lines = [{"prompt": "def add(a, b):\n", "max_new_tokens": 5}, {"prompt": "x = ", "max_new_tokens": 7}]
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    ctx = context.build(load_config(write_config(tmp_path, tiny_pair_dirs, prompts, tmp_path / "db.sqlite")))
    assert [r.max_new_tokens for r in ctx.requests] == [5, 7]  # the lines' own, not the key's 6
    note = "workload.max_new_tokens: 6 reaches no request: every line of prompts.jsonl sets its own"
    assert [n for n in ctx.notes if n.startswith("workload.")] == [f"{note} max_new_tokens (5-7)"]
    prompts.write_text(json.dumps(lines[0]) + "\n" + json.dumps({"prompt": "y = "}) + "\n")
    ctx = context.build(load_config(write_config(tmp_path, tiny_pair_dirs, prompts, tmp_path / "db2.sqlite")))
    assert [r.max_new_tokens for r in ctx.requests] == [5, 6]
    assert not [n for n in ctx.notes if n.startswith("workload.")]
