"""``autotune.tune.run_tune`` end to end on the tiny pair: stored profile, failed trials, interrupt and resume.

The profiler runs for real once per module (a template database); each test copies that
database so the stored measurement is reused and only the study itself runs. Trials run the
real engine; tests wrap ``autotune.study.evaluate`` to inject a fault, and one replaces it with
a deterministic stand-in to check the schedule wiring against a known answer.
"""

from __future__ import annotations

import json
import signal
from types import SimpleNamespace

import optuna
import pytest
import yaml

from autotune import study as study_mod
from autotune.tune import Interrupted, run_tune
from profiles.schema import Profile
from profiles.store import Store

N_TRIALS = 3
COMPLETE = optuna.trial.TrialState.COMPLETE
FAIL = optuna.trial.TrialState.FAIL


def synthetic_evaluate(ctx, params, seed):  # noqa: ARG001 - same signature as the real one
    """Deterministic stand-in for a load run: speculation helps at B=1 and hurts at B=2."""
    g, thr = int(params["gamma"]), float(params["confidence_threshold"])
    per_level = {}
    for c in ctx.cfg.concurrency:
        tps = 100.0 * c + (10.0 * g if c == 1 else -10.0 * g) + thr
        level = dict.fromkeys(study_mod.LEVEL_KEYS, 1.0)
        level.update(
            tokens_per_second=tps,
            tpot_ms_p95=40.0 - g - thr,
            acceptance_rate=0.5,
            generated_tokens=12,
            wall_s=12 / tps,
        )
        per_level[c] = level
    tokens = sum(lv["generated_tokens"] for lv in per_level.values())
    wall = sum(lv["wall_s"] for lv in per_level.values())
    return {
        "tokens_per_second": tokens / wall,
        "latency_ms": max(lv["tpot_ms_p95"] for lv in per_level.values()),
        "per_level": per_level,
    }


def counting(fault_on_call: int, fault: BaseException):
    """An ``evaluate`` that raises ``fault`` on its n-th call and otherwise runs the real one."""
    real = study_mod.evaluate
    calls = {"n": 0}

    def evaluate(ctx, params, seed):
        calls["n"] += 1
        if calls["n"] == fault_on_call:
            raise fault
        return real(ctx, params, seed)

    return evaluate


def only_study(storage: str) -> str:
    (summary,) = optuna.get_all_study_summaries(storage, include_best_trial=False)
    return summary.study_name


def test_run_tune_end_to_end_stores_profile_and_writes_exports(tune_config, tmp_path) -> None:
    cfg = tune_config()
    lines: list[str] = []

    profile = run_tune(cfg, say=lines.append)

    assert any("reused stored measurement" in line for line in lines)
    with Store(cfg.storage) as store:
        stored = store.get_profile(profile["id"])
    for key in ("chosen", "schedule", "pareto_front", "metrics", "baseline", "classification", "curves"):
        assert stored[key] == profile[key], key
    # the profile's JSON keys and their order, as before the typed Profile; it reads back unchanged
    assert list(profile) == [
        "schema_version",
        "tool_version",
        "created_at",
        "device",
        "pair",
        "workload",
        "study",
        "chosen",
        "selection",
        "schedule",
        "crossover_batch_size",
        "metrics",
        "baseline",
        "trials",
        "pareto_front",
        "remeasure",
        "remeasured",
        "classification",
        "ceilings",
        "knee_tokens",
        "curves",
        "acceptance",
        "predicted_vs_measured",
        "host_noise",
        "backend",
        "id",
        "exports",
    ]
    assert list(profile["chosen"]) == [
        "drafter",
        "gamma",
        "confidence_threshold",
        "gamma_schedule",
        "max_batch_size",
        "prompt_lookup_min",
        "prompt_lookup_max",
    ]
    assert list(profile["study"])[-3:] == ["trials_planned", "trials_run", "provisional"]
    typed = Profile.from_json(stored)
    assert typed.to_json() == stored and list(typed.to_json()) == list(stored)
    assert (
        typed.chosen.gamma == stored["chosen"]["gamma"]
        and typed.schedule.crossover_batch_size == stored["crossover_batch_size"]
    )
    chosen = stored["chosen"]
    assert chosen["drafter"] in ("model", "none") and 0 <= chosen["gamma"] <= 2
    assert chosen["max_batch_size"] == 2
    assert [e["batch_size"] for e in stored["schedule"]] == [1, 2]
    assert all(e["gamma"] in (0, 1, 2) and e["tokens_per_second"] > 0 for e in stored["schedule"])
    assert stored["pareto_front"] and all(p["tokens_per_second"] > 0 for p in stored["pareto_front"])
    assert stored["study"]["n_trials"] == N_TRIALS and stored["study"]["failed_trials"] == 0
    assert sorted(int(b) for b in stored["metrics"]["per_level"]) == [1, 2]
    assert stored["metrics"]["speedup"] > 0

    study = optuna.load_study(study_name=stored["study"]["name"], storage=cfg.storage)
    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [COMPLETE] * N_TRIALS
    assert trials[0].user_attrs["warm_start"] == "baseline (gamma=0)"
    assert trials[0].user_attrs["params"]["gamma"] == 0
    assert all(sorted(t.user_attrs["per_level"]) == ["1", "2"] for t in trials)

    exports = tmp_path / "exports"
    assert profile["exports"] == [
        str(exports / "vllm-speculative-config.json"),
        str(exports / "profile.yaml"),
    ]
    vllm = json.loads((exports / "vllm-speculative-config.json").read_text())
    max_gamma = 0 if chosen["drafter"] == "none" else max(e["gamma"] for e in stored["schedule"])
    assert (vllm is None) if max_gamma == 0 else (vllm["num_speculative_tokens"] == max_gamma)
    assert yaml.safe_load((exports / "profile.yaml").read_text())["chosen"]["gamma"] == chosen["gamma"]


def test_failing_trial_is_recorded_and_the_study_goes_on(tune_config, monkeypatch) -> None:
    cfg = tune_config()
    monkeypatch.setattr(study_mod, "evaluate", counting(2, RuntimeError("boom")))

    profile = run_tune(cfg, say=lambda _: None)

    study = optuna.load_study(study_name=only_study(cfg.storage), storage=cfg.storage)
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert states == [COMPLETE, FAIL, COMPLETE]
    failed = study.get_trials(deepcopy=False)[1]
    assert "boom" in failed.user_attrs["error"]
    assert failed.user_attrs["error"].startswith("RuntimeError")
    assert "boom" in failed.user_attrs["traceback"]
    assert profile["study"]["failed_trials"] == 1 and profile["study"]["n_trials"] == 2
    with Store(cfg.storage) as store:
        assert store.get_profile(profile["id"])["chosen"] == profile["chosen"]


def test_interrupt_keeps_finished_trials_and_resume_completes_the_study(tune_config, monkeypatch) -> None:
    cfg = tune_config()
    real = study_mod.evaluate
    monkeypatch.setattr(study_mod, "evaluate", counting(3, KeyboardInterrupt()))
    handler = signal.getsignal(signal.SIGTERM)

    with pytest.raises(Interrupted, match="2 finished trials are kept"):
        run_tune(cfg, say=lambda _: None)

    assert signal.getsignal(signal.SIGTERM) is handler
    name = only_study(cfg.storage)
    first = optuna.load_study(study_name=name, storage=cfg.storage).get_trials(deepcopy=False)
    assert [t.state for t in first] == [COMPLETE, COMPLETE, FAIL]  # the interrupted trial is not left RUNNING
    before = {t.number: (t.params, t.values) for t in first if t.state == COMPLETE}
    with Store(cfg.storage) as store:
        assert store.list_profiles() == []  # nothing half-chosen is stored

    monkeypatch.setattr(study_mod, "evaluate", real)
    lines: list[str] = []
    profile = run_tune(cfg, resume=True, say=lines.append)

    assert only_study(cfg.storage) == name  # continued, not a new study
    assert profile["study"]["name"] == name
    assert any("resumed, 2 finished trials kept" in line and "1 trials" in line for line in lines)
    after = optuna.load_study(study_name=name, storage=cfg.storage).get_trials(deepcopy=False)
    complete = [t for t in after if t.state == COMPLETE]
    assert len(complete) == N_TRIALS
    assert {t.number: (t.params, t.values) for t in complete if t.number in before} == before
    assert profile["study"]["n_trials"] == N_TRIALS


def test_resume_without_a_study_is_a_config_error(tune_config) -> None:
    from autotune.errors import ConfigError

    cfg = tune_config()
    with pytest.raises(ConfigError, match="--resume: no study named"):
        run_tune(cfg, resume=True, say=lambda _: None)


def test_second_run_without_resume_starts_a_new_study(tune_config) -> None:
    cfg = tune_config(storage={"study_name": "bench-host"})

    first = run_tune(cfg, say=lambda _: None)
    second = run_tune(cfg, say=lambda _: None)
    third = run_tune(cfg, say=lambda _: None)

    assert [first["study"]["name"], second["study"]["name"], third["study"]["name"]] == [
        "bench-host",
        "bench-host-run2",
        "bench-host-run3",
    ]
    names = {s.study_name for s in optuna.get_all_study_summaries(cfg.storage, include_best_trial=False)}
    assert names == {"bench-host", "bench-host-run2", "bench-host-run3"}
    for name in names:
        trials = optuna.load_study(study_name=name, storage=cfg.storage).get_trials(deepcopy=False)
        assert [t.state for t in trials] == [COMPLETE] * N_TRIALS
    assert second["id"] != first["id"]


def test_synthetic_schedule_turns_speculation_off_at_batch_two(tune_config, monkeypatch) -> None:
    """Speculation gains 10 tok/s per gamma at B=1 and loses as much at B=2: the schedule says so."""
    cfg = tune_config(search={"gamma": {"low": 0, "high": 2}, "confidence_threshold": 0.0})
    monkeypatch.setattr(study_mod, "evaluate", synthetic_evaluate)

    profile = run_tune(cfg, say=lambda _: None)

    by_batch = {e["batch_size"]: e["gamma"] for e in profile["schedule"]}
    assert by_batch[1] > 0 and by_batch[2] == 0
    assert profile["crossover_batch_size"] == 2
    # the chosen point is compared with the best static-gamma configuration re-measured, not with its trial
    m = profile["metrics"]
    static = m["best_static"]
    assert static is not None and static["gamma"] > 0 and static["gamma_schedule"] == "constant"
    want = synthetic_evaluate(SimpleNamespace(cfg=cfg), static, 0)["tokens_per_second"]
    assert m["speedup_over_best_static"] == pytest.approx(m["tokens_per_second"] / want)
    same = all(static[k] == profile["chosen"][k] for k in ("gamma", "confidence_threshold", "gamma_schedule"))
    assert m["chosen_is_best_static"] == same


def test_unrelated_study_with_a_similar_name_does_not_break_naming(tune_config, monkeypatch) -> None:
    """A fleet database holds ``llama-runpod`` next to ``llama``: not one of ``llama``'s runs."""
    cfg = tune_config(storage={"study_name": "llama"})
    optuna.create_study(study_name="llama-runpod", storage=cfg.storage)
    monkeypatch.setattr(study_mod, "evaluate", synthetic_evaluate)

    first = run_tune(cfg, say=lambda _: None)
    second = run_tune(cfg, say=lambda _: None)
    assert (first["study"]["name"], second["study"]["name"]) == ("llama", "llama-run2")


@pytest.mark.parametrize(
    ("slo", "met", "constraint"),
    [
        ({"tpot_ms_p95": 38.5}, True, -0.5),  # gamma 2: tpot 38 meets it; the gamma 0 baseline (40) does not
        ({"min_tokens_per_second": 1000.0}, False, 1000.0 - 144.0),  # nothing reaches it
    ],
)
def test_slos_become_constraints_and_drive_the_choice(tune_config, monkeypatch, slo, met, constraint) -> None:
    cfg = tune_config(search={"gamma": 2, "confidence_threshold": 0.0}, objectives={"slo": slo})
    monkeypatch.setattr(study_mod, "evaluate", synthetic_evaluate)

    profile = run_tune(cfg, say=lambda _: None)

    study = optuna.load_study(study_name=profile["study"]["name"], storage=cfg.storage)
    ((key, _),) = slo.items()
    for trial in study.get_trials(deepcopy=False):
        assert trial.constraints == {key: pytest.approx(constraint)}
    assert profile["selection"]["met_slo"] is met
    assert ("closest" in profile["selection"]["reason"]) is not met
    assert profile["chosen"]["gamma"] == 2  # feasible and fastest / closest: 144 tok/s beats 133
    assert all(p["feasible"] is met for p in profile["pareto_front"])
    assert profile["study"]["slo"] == slo


def noisy_evaluate(gain_per_gamma: float):
    """``synthetic_evaluate`` scaled by a seeded host-drift factor per call (+-8%)."""
    import random

    calls = []

    def evaluate(ctx, params, seed):
        calls.append((seed, int(params["gamma"])))
        out = synthetic_evaluate(ctx, {**params, "confidence_threshold": 0.0}, seed)
        factor = random.Random(len(calls)).uniform(0.92, 1.08) * (1 + gain_per_gamma * int(params["gamma"]))
        for lv in out["per_level"].values():
            lv["tokens_per_second"] = 100.0 * factor
        out["tokens_per_second"] = 100.0 * factor
        out["latency_ms"] = 40.0
        return out

    evaluate.calls = calls
    return evaluate


def test_remeasurement_interleaves_paired_rounds_and_reports_intervals(tune_config, monkeypatch) -> None:
    cfg = tune_config(budget={"repeats": 4, "remeasure_top": 2})
    fake = noisy_evaluate(0.25)
    monkeypatch.setattr(study_mod, "evaluate", fake)

    profile = run_tune(cfg, say=lambda _: None)

    remeasure = [c for c in fake.calls if c[0] != cfg.seed]
    k = len(remeasure) // 4
    assert len(remeasure) == 4 * k and k >= 2
    assert [seed for seed, _ in remeasure] == [
        s for s in (1, 2, 3, 4) for _ in range(k)
    ]  # A B A B, round by round
    assert (
        len({tuple(g for _, g in remeasure[i * k : (i + 1) * k]) for i in range(4)}) == 1
    )  # same order each round
    assert profile["remeasure"] == {"repeats": 4, "order": "interleaved"}
    m = profile["metrics"]
    assert m["repeats"] == 4 and m["speedup_ci95"][0] <= m["speedup"] <= m["speedup_ci95"][1]
    assert m["tokens_per_second_ci95"][0] < m["tokens_per_second_ci95"][1]
    assert all(len(r["rounds"]) == 4 for r in profile["remeasured"])
    assert profile["chosen"]["gamma"] > 0 and m["speedup_significant"]  # +25% per gamma step beats 8% noise


def test_a_gain_inside_the_noise_keeps_speculation_off_and_says_why(tune_config, monkeypatch) -> None:
    cfg = tune_config(
        search={"gamma": {"low": 0, "high": 2}, "confidence_threshold": 0.0}, budget={"repeats": 4}
    )
    monkeypatch.setattr(study_mod, "evaluate", noisy_evaluate(0.005))

    profile = run_tune(cfg, say=lambda _: None)

    assert profile["chosen"]["gamma"] == 0
    assert "no significant difference (ratio " in profile["selection"]["reason"]
    assert all(e["gamma"] == 0 and e["significant"] is False for e in profile["schedule"])


def test_on_a_server_backend_a_configurations_repeats_run_back_to_back() -> None:
    from autotune.tune import _remeasure

    seen = []
    backend = SimpleNamespace(evaluate=lambda params, seed: seen.append((params["gamma"], seed)) or {})
    ctx = SimpleNamespace(cfg=SimpleNamespace(seed=0), backend=backend)
    _, order = _remeasure(ctx, [{"gamma": 0}, {"gamma": 4}], 3)
    assert seen == [(0, 1), (0, 2), (0, 3), (4, 1), (4, 2), (4, 3)] and order == "back-to-back per server"


def test_trial_lines_say_done_planned_and_eta_from_the_clock() -> None:
    from autotune.tune import _trial_logger

    now, lines = [100.0], []
    cfg = SimpleNamespace(latency="tpot_ms_p95")
    log = _trial_logger(cfg, 3, lines.append, clock=lambda: now[0])
    params = {
        "gamma": 2,
        "confidence_threshold": 0.1,
        "gamma_schedule": "constant",
        "max_batch_size": 4,
        "drafter": "model",
    }
    now[0] = 130.0
    log(0, params, {"tokens_per_second": 50.0, "latency_ms": 12.0})
    now[0] = 190.0
    log(1, params, None)
    assert lines[0] == (
        "  trial 0: 50.0 tok/s, tpot_ms_p95 12.0 ms | gamma=2 thr=0.10 constant B=4 model "
        "| best so far 50.0 tok/s [1/3, ETA 1m00s]"
    )
    assert lines[1] == f"  trial 1: failed ({params}) [2/3, ETA 45s]"
