"""A table may hold "off" where the backend skips the drafter at a table's K=0 (vLLM with the plugin).

Checked here: :func:`autotune.decide.selection.plan_table` with and without the skip (the K >= 1
plan kept as the fallback), :func:`autotune.decide.selection.fallback_schedule`, the backends'
``skips_drafter_at_k0`` (vLLM: ``backend.vllm.k0_skip``; the engine: False, since its K=0 step
still runs the drafter's forward), and a whole ``run_tune`` on a skipping stand-in backend: the
profile serves the off range, records the plugin need and its fallback, and the vLLM export writes
the fallback file.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import torch

from autotune.backends import vllm as vllm_backend
from autotune.backends.engine import EngineBackend
from autotune.cli.render import render_tune
from autotune.decide.selection import fallback_schedule, plan_table
from autotune.jobs.tune import run_tune
from autotune.knobs import Knobs
from autotune.records import Point
from engine.drafters import ModelDrafter
from engine.speculative import Request, SpecConfig, SpecEngine
from profiles.exporters.vllm import FALLBACK_FILENAME
from profiles.schema import Profile
from tests.autotune.fakes import FakeBackend, synthetic_run
from tests.autotune.test_backends import _cfg
from tests.engine.conftest import perturbed_copy, random_model, tiny_config

LEVELS = [1, 4, 16]


def pt(gamma: int, *per_level: tuple[float, float, float]) -> Point:
    """A constant K measured at LEVELS, three paired rounds each."""
    rounds = dict(zip(LEVELS, per_level, strict=True))
    return Point(
        Knobs("model", gamma), 0, 0, per_batch={b: r[0] for b, r in rounds.items()}, per_batch_rounds=rounds
    )


# no speculation wins at 16 by far; K=5 at 1; K=2 in between (a schedule that turns off under load)
OFF = pt(0, (50, 52, 51), (150, 152, 149), (400, 404, 398))
K2 = pt(2, (80, 82, 79), (190, 195, 191), (330, 334, 331))
K5 = pt(5, (99, 103, 100), (170, 172, 171), (300, 302, 299))


def test_without_the_skip_a_table_holds_k_positive_everywhere() -> None:
    plan = plan_table([OFF, K2, K5], LEVELS, K5, K5, "model")
    assert [c.gamma for c in plan.levels] == [5, 2, 0]  # the measurement says off at 16
    assert plan.table == ((1, 5), (4, 2), (16, 2)) and plan.fallback is None


def test_with_the_skip_the_table_serves_off_where_the_levels_say_so() -> None:
    plan = plan_table([OFF, K2, K5], LEVELS, K5, K5, "model", skips_drafter_at_k0=True)
    assert plan.table == ((1, 5), (4, 2), (16, 0)) and plan.unserved == ""
    assert plan.fallback is not None and plan.fallback.table == ((1, 5), (4, 2), (16, 2))
    assert plan.fallback == plan_table([OFF, K2, K5], LEVELS, K5, K5, "model")  # today's plan, kept whole


def test_with_the_skip_and_no_speculation_the_best_constant_a_table_still_speculates_at_low_load() -> None:
    """Off over the sweep: without the skip the K >= 1 table cannot win (off is faster at 16 than any
    K), with it the table is off at 16 and K=5 at 1, where K=5 beats off."""
    without = plan_table([OFF, K2, K5], LEVELS, OFF, K5, "model")
    assert without.unserved.endswith("the table cannot win there, so it is not served")
    plan = plan_table([OFF, K2, K5], LEVELS, OFF, K5, "model", skips_drafter_at_k0=True)
    assert plan.table == ((1, 5), (4, 2), (16, 0)) and plan.unserved == ""
    assert plan.fallback is not None and plan.fallback.unserved == without.unserved


def test_with_the_skip_choices_without_off_make_the_same_plan() -> None:
    fast_k2 = pt(2, (80, 82, 79), (190, 195, 191), (420, 424, 418))  # K=2 beats off at 16 too
    points = [OFF, fast_k2, K5]
    assert plan_table(points, LEVELS, K5, K5, "model", skips_drafter_at_k0=True) == plan_table(
        points, LEVELS, K5, K5, "model"
    )


def test_with_the_skip_off_everywhere_is_no_table() -> None:
    slow = [pt(g, (40, 41, 40), (100, 101, 100), (200, 201, 200)) for g in (2, 5)]
    plan = plan_table([OFF, *slow], LEVELS, OFF, slow[1], "model", skips_drafter_at_k0=True)
    assert plan.unserved.startswith("the per-level choices agree on K=0") and plan.fallback is None


def test_the_fallback_is_the_k_positive_table_where_it_won_else_the_constant() -> None:
    table = Knobs.for_table("model", ((1, 5), (4, 2), (16, 2)), 16)
    rounds = {1: (99, 103, 100), 4: (190, 195, 191), 16: (330, 334, 331)}
    k_positive = Point(table, 0, 0, per_batch={b: r[0] for b, r in rounds.items()}, per_batch_rounds=rounds)
    pairs, why = fallback_schedule(k_positive, K5, OFF, LEVELS, "")
    assert pairs == ((1, 5), (4, 2), (16, 2)) and "better at" in why
    pairs, why = fallback_schedule(None, K5, OFF, LEVELS, "budget")
    assert pairs == ((1, 5), (4, 5), (16, 5)) and why.endswith("(budget)")
    losing = Point(
        table, 0, 0, per_batch={b: 1.0 for b in LEVELS}, per_batch_rounds={b: (1, 1, 1) for b in LEVELS}
    )
    assert fallback_schedule(losing, K5, OFF, LEVELS, "")[0] == ((1, 5), (4, 5), (16, 5))


def test_vllm_skips_the_drafter_at_k0_only_with_the_plugin_switch(tmp_path, tiny_pair_dirs) -> None:
    for k0_skip in (False, True):
        cfg = _cfg(tmp_path, tiny_pair_dirs, vllm={"command": sys.executable, "k0_skip": k0_skip})
        ctx = SimpleNamespace(
            cfg=cfg, fingerprint={"label": "CPU", "key": "k"}, requests=[], longest_sequence=128
        )
        backend = vllm_backend.VllmBackend(ctx)
        assert backend.skips_drafter_at_k0 is k0_skip
        described = backend.describe()
        assert (
            ("SPEC_AUTOTUNE_K0_SKIP", "1") in backend.deployment.env
            if k0_skip
            else "k0_skip" not in described
        )
        if k0_skip:
            assert described["k0_skip"] == {
                "plugin": "spec-autotune-vllm-plugin",
                "env": "SPEC_AUTOTUNE_K0_SKIP",
            }


def test_the_engine_runs_the_drafter_at_a_tables_k0_so_it_does_not_skip() -> None:
    """One request alone under the table 1:0 2:2: every step is K=0, and each still runs a draft forward."""
    assert EngineBackend.skips_drafter_at_k0 is False
    target = random_model(tiny_config(), seed=0)
    draft = perturbed_copy(target, seed=1, sigma=0.03)
    engine = SpecEngine(
        target, ModelDrafter(draft), SpecConfig(gamma=2, batch_gammas=((1, 0), (2, 2))), 2, 32
    )
    engine.add([Request([1, 2, 3, 4], 6)])
    steps = 0
    with torch.inference_mode():
        while engine.n:
            engine.step()
            engine.retire()
            steps += 1
    assert engine.stats.verify_slots == steps  # the pending token alone: K=0 at every step
    assert engine.stats.draft_forwards >= steps  # yet the drafter ran every step (Drafter.catch_up)


class SkippingBackend(FakeBackend):
    """The stand-in backend as vLLM with the plugin: a table's K=0 is off (here the synthetic run
    already runs a table's K=0 range at no speculation's speed)."""

    name = "vllm"
    skips_drafter_at_k0 = True

    def describe(self) -> dict:
        return {
            "name": self.name,
            "version": "0.32.0",
            "k0_skip": {"plugin": "spec-autotune-vllm-plugin", "env": "SPEC_AUTOTUNE_K0_SKIP"},
        }


def test_tune_with_the_skip_serves_off_at_high_load_and_records_the_plugin_and_fallback(tune_config) -> None:
    """``synthetic_run``: speculation gains 10 tok/s per K at batch 1 and loses as much at batch 2.
    Without the skip the table would hold K=1 everywhere and is not served
    (tests/autotune/test_tune.py); with it the table 1:1 2:0 is served live and wins at batch 2."""
    cfg = tune_config(search={"gamma": {"low": 0, "high": 2}, "confidence_threshold": 0.0})
    lines: list[str] = []
    profile = run_tune(cfg, say=lines.append, backend_for=lambda ctx: SkippingBackend(ctx, synthetic_run))

    decision = profile["table_decision"]
    assert decision["served"] and decision["won"], decision["reason"]
    assert decision["table"] == [[1, 1], [2, 0]]
    assert [(e["batch_size"], e["gamma"]) for e in profile["schedule"]] == [(1, 1), (2, 0)]
    assert profile["crossover_batch_size"] == 2
    need = decision["needs_plugin"]
    assert need["plugin"] == "spec-autotune-vllm-plugin" and need["vllm_version"] == "0.32.0"
    assert need["fallback"] == [[1, 1], [2, 1]]  # the K >= 1 plan is one K: the best constant, K=1
    assert "the best constant" in need["fallback_reason"] and "one K, no table" in need["fallback_reason"]
    assert any("only with the spec-autotune-vllm-plugin" in line for line in lines)
    assert Profile.from_json(profile).to_json() == profile
    summary = render_tune(profile)
    assert "needs       the spec-autotune-vllm-plugin (SPEC_AUTOTUNE_K0_SKIP=1, vLLM 0.32.0)" in summary
    assert "without it: B=1: 1, B=2: 1" in summary

    exports = cfg.export.dir
    config = json.loads((exports / "vllm-speculative-config.json").read_text())
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 1, 1], [2, 2, 0]]
    fallback = json.loads((exports / FALLBACK_FILENAME).read_text())
    assert fallback["num_speculative_tokens"] == 1 and "num_speculative_tokens_per_batch_size" not in fallback
    sidecar = json.loads((exports / "vllm-speculative-config.json.meta.json").read_text())
    assert sidecar["command"].startswith("SPEC_AUTOTUNE_K0_SKIP=1 vllm serve")
    assert "SPEC_AUTOTUNE_K0_SKIP" not in sidecar["fallback_command"]
