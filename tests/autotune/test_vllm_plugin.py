"""The vLLM plugin (autotune/vllm_plugin) without vLLM: its lag bookkeeping, its catch-up passes, its
version refusal, that it is inert without its switch, that it imports only vLLM, torch and the
standard library, that no module of the tool imports it, and the ``backend.vllm.k0_skip`` key.
The real-vLLM tests are in test_vllm_plugin_real.py."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from autotune.backends import vllm as vllm_backend
from autotune.config import load_config
from autotune.errors import ConfigError
from autotune.vllm_plugin import ENV, _k0_skip, refusal, register
from autotune.vllm_plugin._engine_core import (
    HOLD_ENV,
    _wrap_post_step,
    _wrap_update_after_schedule,
    _wrap_update_from_output,
    hold_tokens,
)
from autotune.vllm_plugin._k0_skip import Lag, passes
from engine.demo import DEMO_DRAFT, DEMO_PROMPTS, DEMO_TARGET

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "autotune" / "vllm_plugin"


def test_a_skipped_step_makes_its_rows_lag_and_the_next_k_step_catches_them_up() -> None:
    lag = Lag()
    assert lag.due(["a", "b"], [0, 0]) == []  # first K>0 step: prefills, nothing lags
    lag.skipped(["a", "b"], [7, 9])  # K=0: the drafter saw nothing from here on
    lag.skipped(["a", "b"], [8, 10])  # the lag keeps its first position
    assert lag.due(["b", "a"], [12, 11]) == [(0, 9, 12), (1, 7, 11)]  # rows in this step's order
    assert lag.due(["a", "b"], [12, 13]) == []  # caught up: the lag is cleared


def test_a_prefix_hit_lags_from_position_zero_and_a_recomputed_request_needs_nothing() -> None:
    lag = Lag()
    assert lag.due(["hit"], [32]) == [(0, 0, 32)]  # first seen past 0: its cached draft KV is not trusted
    lag.skipped(["new"], [16])  # a prefix hit in a skipped step lags from 0 too
    assert lag.due(["new"], [17]) == [(0, 0, 17)]
    lag.skipped(["p"], [0])
    lag.skipped(["p"], [5])
    assert lag.due(["p"], [0]) == []  # preempted and recomputed from 0 in a K>0 step: upstream writes it all


def test_finished_requests_are_forgotten() -> None:
    lag = Lag()
    lag.skipped(["a"], [0])
    lag.forget(["a"])
    assert lag.start == {} and lag.seen == set()


def test_catch_up_passes_hold_at_most_the_buffer_and_keep_a_rows_pieces_in_order() -> None:
    assert passes([(0, 0, 3), (1, 5, 6)], 8) == [[(0, 0, 3), (1, 5, 6)]]
    assert passes([(2, 0, 10)], 4) == [[(2, 0, 4)], [(2, 4, 8)], [(2, 8, 10)]]
    assert passes([(0, 0, 3), (1, 0, 3)], 4) == [[(0, 0, 3)], [(1, 0, 3)]]


def test_with_the_stats_file_set_each_catch_up_appends_its_rows_tokens_and_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    forwards: list[list[tuple[int, int, int]]] = []
    monkeypatch.setattr(_k0_skip, "_forward", lambda proposer, chunk, *_: forwards.append(chunk))
    proposer = SimpleNamespace(input_ids=torch.zeros(4), device="cpu")
    stats = tmp_path / "catchups.jsonl"
    _k0_skip.catch_up(proposer, [(0, 2, 5)], None, None)  # no stats file asked: nothing written
    assert not stats.exists() and forwards == [[(0, 2, 5)]]
    monkeypatch.setenv(_k0_skip.STATS_ENV, str(stats))
    _k0_skip.catch_up(proposer, [(0, 0, 6), (1, 3, 4)], None, None)
    _k0_skip.catch_up(proposer, [(2, 7, 8)], None, None)
    lines = [json.loads(x) for x in stats.read_text().splitlines()]
    assert [(x["rows"], x["tokens"], x["passes"]) for x in lines] == [(2, 7, 2), (1, 1, 1)]
    assert all(x["seconds"] >= 0 for x in lines)
    assert forwards[1:] == [[(0, 0, 4)], [(0, 4, 6), (1, 3, 4)], [(2, 7, 8)]]


class _Scheduler:
    """vLLM's scheduler as the engine core's wrappers see it: each step's output is given back to it."""

    def __init__(self) -> None:
        self.updated: list[int] = []

    def update_from_output(self, scheduler_output: SimpleNamespace, model_output: object) -> None:
        self.updated.append(scheduler_output.num_spec_tokens_to_schedule)


class _Engine:
    """vLLM's EngineCore as the wrappers see it: ``post_step`` asks the worker for the step's drafts."""

    def __init__(self, method: str) -> None:
        self.vllm_config = SimpleNamespace(speculative_config=SimpleNamespace(method=method))
        self.scheduler = _Scheduler()
        self.asked = 0

    def post_step(self, model_executed: bool) -> None:
        self.asked += model_executed


def _steps(method: str, ks: list[int], monkeypatch: pytest.MonkeyPatch) -> tuple[int, list[int]]:
    """Run steps scheduled at ``ks`` through the wrapped engine: (worker round trips, the K each
    step's output carried to the scheduler)."""
    monkeypatch.setattr(
        _Scheduler, "update_from_output", _wrap_update_from_output(_Scheduler.update_from_output)
    )
    monkeypatch.setattr(_Engine, "post_step", _wrap_post_step(_Engine.post_step))
    engine = _Engine(method)
    for k in ks:
        engine.scheduler.update_from_output(SimpleNamespace(num_spec_tokens_to_schedule=k), None)
        engine.post_step(True)
    engine.post_step(False)  # a step that ran no model asks nothing, as upstream
    return engine.asked, engine.scheduler.updated


def test_after_a_k0_step_the_engine_core_does_not_ask_the_worker_for_drafts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked, updated = _steps("draft_model", [3, 0, 0, 2, 0], monkeypatch)
    assert asked == 2 and updated == [3, 0, 0, 2, 0]  # only the K>0 steps ask; the scheduler sees every step
    assert _steps("ngram", [0, 1], monkeypatch)[0] == 1


def test_a_method_whose_k0_step_may_draft_still_asks_after_every_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _steps("eagle3", [0, 0, 1], monkeypatch)[0] == 3


class _HoldScheduler:
    """vLLM's scheduler as the hold rule sees it: its requests, the method, the step it just
    scheduled handed to ``_update_after_schedule`` (which records the K the worker will be given)."""

    def __init__(self, method: str, left: dict[str, int]) -> None:
        self.vllm_config = SimpleNamespace(speculative_config=SimpleNamespace(method=method))
        self.requests = {
            rid: SimpleNamespace(max_tokens=n + 5, num_output_tokens=5) for rid, n in left.items()
        }
        self.given: list[int] = []

    def _update_after_schedule(self, scheduler_output: SimpleNamespace) -> None:
        self.given.append(scheduler_output.num_spec_tokens_to_schedule)

    def update_from_output(self, scheduler_output: SimpleNamespace, model_output: object) -> None:
        pass


def _held(n: int, left: dict[str, int], ks: list[int], method: str = "draft_model") -> list[int]:
    """The K the worker is given for steps whose lookup asks ``ks``, every request in every step,
    with ``left`` tokens left each (they do not change here), the rule at ``n``."""
    wrapped = {
        "_update_after_schedule": _wrap_update_after_schedule(_HoldScheduler._update_after_schedule, n=n),
        "update_from_output": _wrap_update_from_output(_HoldScheduler.update_from_output),
    }
    scheduler = type("Wrapped", (_HoldScheduler,), wrapped)(method, left)
    for k in ks:
        out = SimpleNamespace(num_spec_tokens_to_schedule=k, num_scheduled_tokens=dict.fromkeys(left, 1))
        scheduler._update_after_schedule(out)
        scheduler.update_from_output(out, None)
    return scheduler.given


def test_the_hold_rule_keeps_k0_after_a_k0_step_while_no_request_has_more_than_n_tokens_left() -> None:
    few = {"a": 16, "b": 3}
    assert _held(16, few, [4, 0, 4, 4]) == [4, 0, 0, 0]  # held once off, to the end
    assert _held(16, {**few, "c": 17}, [0, 4, 0]) == [0, 4, 0]  # one request with 17: drafts
    assert _held(0, few, [0, 4]) == [0, 4]  # N=0: the rule is off
    assert _held(16, {}, [0, 4]) == [0, 4]  # a step without requests is not held
    assert _held(16, few, [0, 4], method="ngram") == [0, 4]  # nothing to catch up: no hold


def test_the_hold_rules_n_comes_from_the_environment_and_a_bad_value_is_one_line() -> None:
    assert hold_tokens({}) == 0 and hold_tokens({HOLD_ENV: "24"}) == 24
    with pytest.raises(ValueError, match=r"^spec-autotune k0 skip: SPEC_AUTOTUNE_K0_HOLD_TOKENS='-1' is not"):
        hold_tokens({HOLD_ENV: "-1"})


class _DraftModel:
    """Stands for vLLM's DraftModelProposer."""


class _Runner:
    """Upstream's ``_prepare_inputs`` reads ``speculative_config`` once to decide whether to build
    the speculative decode metadata; this one records what it saw."""

    def __init__(self, hybrid: bool = False, drafter: object | None = None) -> None:
        self.speculative_config = "spec"
        self.model_config = SimpleNamespace(is_hybrid=hybrid)
        self.drafter = drafter if drafter is not None else _DraftModel()
        self.seen: list[object] = []

    def _prepare_inputs(self, scheduler_output: object, num_scheduled_tokens: object) -> str:
        self.seen.append(self.speculative_config)
        if num_scheduled_tokens == "fail":
            raise RuntimeError("upstream failed")
        return "inputs"


def _prepared(runner: _Runner, k: int, drafts: dict, tokens: object = None) -> object:
    wrapped = _k0_skip._wrap_prepare_inputs(_Runner._prepare_inputs, model_drafter=_DraftModel)
    out = SimpleNamespace(num_spec_tokens_to_schedule=k, scheduled_spec_decode_tokens=drafts)
    return wrapped(runner, out, tokens)


def test_a_k0_step_without_drafts_prepares_its_inputs_as_without_speculation() -> None:
    runner = _Runner()
    assert _prepared(runner, 0, {}) == "inputs"
    assert runner.seen == [None] and runner.speculative_config == "spec"  # restored after the call
    with pytest.raises(RuntimeError):
        _prepared(runner, 0, {}, "fail")
    assert runner.speculative_config == "spec"  # restored when upstream raises too


def test_a_step_with_drafts_a_hybrid_target_or_another_drafter_keeps_upstreams_path() -> None:
    for runner, k, drafts in (
        (_Runner(), 3, {"r": [1, 2, 3]}),  # a K>0 step
        (_Runner(), 0, {"r": [1]}),  # drafts made before the table went to 0
        (_Runner(hybrid=True), 0, {}),  # recurrent layers read the zero-draft rows
        (_Runner(drafter=object()), 0, {}),  # n-gram, EAGLE: not the draft-model proposer
    ):
        _prepared(runner, k, drafts)
        assert runner.seen == ["spec"]


def test_only_the_tested_vllm_line_is_accepted() -> None:
    assert refusal("0.32.0") is None and refusal("0.32.3+cpu") is None
    line = refusal("0.33.0")
    assert line is not None and "\n" not in line and "0.33.0" in line and ENV in line
    assert refusal("0.3.2") is not None


def test_without_its_switch_the_plugin_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    register()  # vLLM is not in this venv: registering would fail on importing it
    assert "vllm" not in sys.modules
    monkeypatch.setenv(ENV, "0")
    register()


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            out.add((node.module or "").split(".")[0])
    return out


def test_the_plugin_imports_only_vllm_torch_and_the_standard_library() -> None:
    found = set().union(*(_imports(p) for p in PLUGIN.glob("*.py")))
    foreign = {m for m in found if m not in sys.stdlib_module_names and m not in ("vllm", "torch")}
    assert not foreign, f"autotune/vllm_plugin imports {sorted(foreign)}: it runs in vLLM's venv"


def test_no_module_of_the_tool_imports_the_plugin() -> None:
    for package in ("autotune", "engine", "profiles", "benchmarks"):
        for path in (ROOT / package).rglob("*.py"):
            if PLUGIN in path.parents:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            names = [
                n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0
            ] + [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
            assert not any("vllm_plugin" in name for name in names), path


def _config(tmp_path: Path, vllm: dict):
    raw = {
        "models": {"target": str(DEMO_TARGET), "draft": str(DEMO_DRAFT), "device": "cpu", "dtype": "float32"},
        "workload": {"prompts": str(DEMO_PROMPTS), "max_new_tokens": 8},
        "backend": {"name": "vllm", "vllm": vllm},
    }
    (tmp_path / "tune.yaml").write_text(yaml.safe_dump(raw))
    return load_config(tmp_path / "tune.yaml")


def test_the_k0_skip_key_puts_the_plugins_switch_in_the_servers_environment(tmp_path: Path) -> None:
    on = vllm_backend.deployment(_config(tmp_path, {"k0_skip": True}), {"kind": "cpu"}, 64)
    off = vllm_backend.deployment(_config(tmp_path, {}), {"kind": "cpu"}, 64)
    assert dict(on.env)[vllm_backend.K0_SKIP_ENV] == "1" == dict(on.env).get(ENV)
    assert (
        vllm_backend.K0_STATS_ENV == _k0_skip.STATS_ENV
    )  # the benchmark's name for the plugin's catch-up record
    assert ENV not in dict(off.env) and vllm_backend.K0_HOLD_ENV not in dict(on.env)
    with pytest.raises(ConfigError, match=r"^backend\.vllm\.k0_skip: must be true or false \(got 'yes'\)$"):
        _config(tmp_path, {"k0_skip": "yes"})


def test_the_hold_key_puts_its_n_in_the_servers_environment_beside_the_switch(tmp_path: Path) -> None:
    held = vllm_backend.deployment(
        _config(tmp_path, {"k0_skip": True, "k0_hold_tokens": 16}), {"kind": "cpu"}, 64
    )
    assert dict(held.env)[HOLD_ENV] == "16" and dict(held.env)[ENV] == "1"
    assert vllm_backend.K0_HOLD_ENV == HOLD_ENV  # the tool's copy of the plugin's name
    with pytest.raises(
        ConfigError, match=r"^backend\.vllm\.k0_hold_tokens: needs backend\.vllm\.k0_skip: true"
    ):
        _config(tmp_path, {"k0_hold_tokens": 16})
    with pytest.raises(ConfigError, match=r"^backend\.vllm\.k0_hold_tokens: must be >= 0 \(got -1\)$"):
        _config(tmp_path, {"k0_skip": True, "k0_hold_tokens": -1})


def test_the_launcher_refuses_the_switch_without_the_plugin_or_on_another_vllm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from importlib.metadata import EntryPoint

    from autotune.backends import vllm_launcher

    monkeypatch.delenv(ENV, raising=False)
    assert vllm_launcher._k0_skip_refusal() is None  # switch off: nothing checked
    monkeypatch.setenv(ENV, "1")
    monkeypatch.setattr(vllm_launcher.metadata, "entry_points", lambda group: [])
    line = vllm_launcher._k0_skip_refusal()
    assert line is not None and "not installed" in line and "tools/install_vllm_cpu.sh" in line
    plugin = EntryPoint("spec_autotune_k0_skip", "autotune.vllm_plugin:register", "vllm.general_plugins")
    monkeypatch.setattr(vllm_launcher.metadata, "entry_points", lambda group: [plugin])
    monkeypatch.setattr(vllm_launcher.metadata, "version", lambda name: "0.33.0")
    assert vllm_launcher._k0_skip_refusal() == refusal("0.33.0")
    monkeypatch.setattr(vllm_launcher.metadata, "version", lambda name: "0.32.0+cpu")
    assert vllm_launcher._k0_skip_refusal() is None
