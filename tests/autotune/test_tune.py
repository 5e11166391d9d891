"""``autotune.jobs.tune.run_tune`` end to end on the tiny pair: stored profile, failed trials, interrupt and resume.

The profiler runs for real once per module (a template database); each test copies that
database so the stored measurement is reused and only the study itself runs. Trials run the
real engine; tests pass a backend that injects a fault into it, or a deterministic stand-in
(tests/autotune/fakes.py) to check the schedule wiring against a known answer.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import yaml

from autotune.jobs.tune import Interrupted, run_tune
from autotune.knobs import Knobs
from autotune.records import TrialResult
from profiles.schema import Profile
from profiles.store import Store
from tests.autotune.fakes import FakeBackend, backend_of, faulty_engine, result_of, synthetic_run

N_TRIALS = 3
COMPLETE = optuna.trial.TrialState.COMPLETE
FAIL = optuna.trial.TrialState.FAIL


SYNTHETIC = backend_of(synthetic_run)


def only_study(storage: str) -> str:
    (summary,) = optuna.get_all_study_summaries(storage, include_best_trial=False)
    return summary.study_name


def test_run_tune_end_to_end_stores_profile_and_writes_exports(tune_config, tmp_path) -> None:
    cfg = tune_config()
    lines: list[str] = []

    profile = run_tune(cfg, say=lines.append)

    assert any("reused stored measurement" in line for line in lines)
    with Store(cfg.storage.url) as store:
        stored = store.get_profile(profile["id"])
    for key in ("chosen", "schedule", "pareto_front", "metrics", "baseline", "classification", "curves"):
        assert stored[key] == profile[key], key
    # the profile's JSON keys and their order, as before the typed Profile; it reads back unchanged
    assert (
        list(profile)
        == [
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
            "table_decision",
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
            "stack_cost",  # the trials' constant chains and no speculation fit a step cost (autotune.cost.stackcost)
            "id",
            "exports",
        ]
    )
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

    study = optuna.load_study(study_name=stored["study"]["name"], storage=cfg.storage.url)
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


def test_failing_trial_is_recorded_and_the_study_goes_on(tune_config) -> None:
    cfg = tune_config()
    profile = run_tune(cfg, say=lambda _: None, backend_for=faulty_engine(2, RuntimeError("boom")))

    study = optuna.load_study(study_name=only_study(cfg.storage.url), storage=cfg.storage.url)
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert states == [COMPLETE, FAIL, COMPLETE]
    failed = study.get_trials(deepcopy=False)[1]
    assert "boom" in failed.user_attrs["error"]
    assert failed.user_attrs["error"].startswith("RuntimeError")
    assert "boom" in failed.user_attrs["traceback"]
    assert profile["study"]["failed_trials"] == 1 and profile["study"]["n_trials"] == 2
    with Store(cfg.storage.url) as store:
        assert store.get_profile(profile["id"])["chosen"] == profile["chosen"]


def test_interrupt_keeps_finished_trials_and_resume_completes_the_study(tune_config) -> None:
    cfg = tune_config()
    handler = signal.getsignal(signal.SIGTERM)

    with pytest.raises(Interrupted, match="2 finished trials are kept"):
        run_tune(cfg, say=lambda _: None, backend_for=faulty_engine(3, KeyboardInterrupt()))

    assert signal.getsignal(signal.SIGTERM) is handler
    name = only_study(cfg.storage.url)
    first = optuna.load_study(study_name=name, storage=cfg.storage.url).get_trials(deepcopy=False)
    assert [t.state for t in first] == [COMPLETE, COMPLETE, FAIL]  # the interrupted trial is not left RUNNING
    before = {t.number: (t.params, t.values) for t in first if t.state == COMPLETE}
    with Store(cfg.storage.url) as store:
        assert store.list_profiles() == []  # nothing half-chosen is stored

    lines: list[str] = []
    profile = run_tune(cfg, resume=True, say=lines.append)

    assert only_study(cfg.storage.url) == name  # continued, not a new study
    assert profile["study"]["name"] == name
    assert any("resumed, 2 finished trials kept" in line and "1 trials" in line for line in lines)
    after = optuna.load_study(study_name=name, storage=cfg.storage.url).get_trials(deepcopy=False)
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
    names = {s.study_name for s in optuna.get_all_study_summaries(cfg.storage.url, include_best_trial=False)}
    assert names == {"bench-host", "bench-host-run2", "bench-host-run3"}
    for name in names:
        trials = optuna.load_study(study_name=name, storage=cfg.storage.url).get_trials(deepcopy=False)
        assert [t.state for t in trials] == [COMPLETE] * N_TRIALS
    assert second["id"] != first["id"]


def test_synthetic_schedule_says_off_at_batch_two_but_a_table_cannot(tune_config) -> None:
    """Speculation gains 10 tok/s per gamma at B=1 and loses as much at B=2: the per-level choices say
    off at batch 2; a table cannot say off (its K=0 range still runs the drafter), and with only K=1
    measured it would hold K=1 everywhere: one K, so the constant is exported and no table served."""
    cfg = tune_config(search={"gamma": {"low": 0, "high": 2}, "confidence_threshold": 0.0})
    profile = run_tune(cfg, say=lambda _: None, backend_for=SYNTHETIC)

    assert profile["chosen"]["gamma"] == 1
    assert [(e["batch_size"], e["gamma"], e["level_gamma"]) for e in profile["schedule"]] == [
        (1, 1, 1),
        (2, 1, 0),
    ]
    assert profile["crossover_batch_size"] is None
    decision = profile["table_decision"]
    assert not decision["served"] and decision["table"] == [[1, 1], [2, 1]]
    assert "its K=0 range still runs the drafter" in decision["reason"], decision["reason"]
    # the chosen point is compared with the best static-gamma configuration re-measured, not with its trial
    m = profile["metrics"]
    static = m["best_static"]
    assert static is not None and static["gamma"] > 0 and static["gamma_schedule"] == "constant"
    want = synthetic_run(cfg, Knobs.from_params(static), 0).tokens_per_second
    assert m["speedup_over_best_static"] == pytest.approx(m["tokens_per_second"] / want)
    assert m["chosen_is_best_static"] is True  # no table: the constant K=1 is the choice


def test_unrelated_study_with_a_similar_name_does_not_break_naming(tune_config) -> None:
    """A fleet database holds ``llama-runpod`` next to ``llama``: not one of ``llama``'s runs."""
    cfg = tune_config(storage={"study_name": "llama"})
    optuna.create_study(study_name="llama-runpod", storage=cfg.storage.url)
    first = run_tune(cfg, say=lambda _: None, backend_for=SYNTHETIC)
    second = run_tune(cfg, say=lambda _: None, backend_for=SYNTHETIC)
    assert (first["study"]["name"], second["study"]["name"]) == ("llama", "llama-run2")


@pytest.mark.parametrize(
    ("slo", "met", "constraint"),
    [
        ({"tpot_ms_p95": 38.5}, True, -0.5),  # gamma 2: tpot 38 meets it; the gamma 0 baseline (40) does not
        ({"min_tokens_per_second": 1000.0}, False, 1000.0 - 144.0),  # nothing reaches it
    ],
)
def test_slos_become_constraints_and_drive_the_choice(tune_config, slo, met, constraint) -> None:
    cfg = tune_config(search={"gamma": 2, "confidence_threshold": 0.0}, objectives={"slo": slo})
    profile = run_tune(cfg, say=lambda _: None, backend_for=SYNTHETIC)

    study = optuna.load_study(study_name=profile["study"]["name"], storage=cfg.storage.url)
    ((key, _),) = slo.items()
    for trial in study.get_trials(deepcopy=False):
        assert trial.constraints == {key: pytest.approx(constraint)}
    assert profile["selection"]["met_slo"] is met
    assert ("closest" in profile["selection"]["reason"]) is not met
    assert profile["chosen"]["gamma"] == 2  # feasible and fastest / closest: 144 tok/s beats 133
    assert all(p["feasible"] is met for p in profile["pareto_front"])
    assert profile["study"]["slo"] == slo


def noisy_run(gain_per_gamma: float):
    """``synthetic_run`` scaled by a seeded noise factor per run (+-8%), drawn from the run's seed and
    gamma so it does not hang on the order the runs are made in; ``.calls`` lists (seed, gamma)."""
    import random

    calls = []

    def run(cfg, knobs: Knobs, seed: int) -> TrialResult:
        calls.append((seed, knobs.gamma))
        factor = random.Random(f"{seed}/{knobs.gamma}").uniform(0.92, 1.08) * (
            1 + gain_per_gamma * knobs.gamma
        )
        levels = {
            c: {"tokens_per_second": 100.0 * factor, "tpot_ms_p95": 40.0} for c in cfg.workload.concurrency
        }
        out = result_of({c: {**lv, "generated_tokens": 12, "wall_s": 1.0} for c, lv in levels.items()})
        return TrialResult(100.0 * factor, 40.0, out.per_level)

    run.calls = calls
    return run


def test_remeasurement_interleaves_paired_rounds_and_reports_intervals(tune_config) -> None:
    cfg = tune_config(budget={"repeats": 4, "remeasure_top": 2})
    fake = noisy_run(0.25)

    profile = run_tune(cfg, say=lambda _: None, backend_for=backend_of(fake))

    remeasure = [c for c in fake.calls if c[0] != cfg.budget.seed]
    k = len(remeasure) // 4
    assert len(remeasure) == 4 * k and k >= 2
    assert [seed for seed, _ in remeasure] == [
        s for s in (1, 2, 3, 4) for _ in range(k)
    ]  # A B A B, round by round
    orders = [tuple(g for _, g in remeasure[i * k : (i + 1) * k]) for i in range(4)]
    assert orders == [
        orders[0][i % k :] + orders[0][: i % k] for i in range(4)
    ]  # each round starts one later
    assert profile["remeasure"] == {"repeats": 4, "order": "interleaved"}
    m = profile["metrics"]
    assert m["repeats"] == 4 and m["speedup_ci95"][0] <= m["speedup"] <= m["speedup_ci95"][1]
    assert m["tokens_per_second_ci95"][0] < m["tokens_per_second_ci95"][1]
    assert all(len(r["rounds"]) == 4 for r in profile["remeasured"])
    assert profile["chosen"]["gamma"] > 0 and m["speedup_significant"]  # +25% per gamma step beats 8% noise


def test_an_interleaved_remeasurement_starts_every_server_first_and_rotates_the_rounds(tune_config) -> None:
    """Every run of an interleaved re-measurement has the same servers beside it (all prepared before
    the first run) and no configuration is always first; back to back prepares nothing ahead."""
    from autotune.decide.decision import remeasure

    cfg, run, events = tune_config(), noisy_run(0.0), []

    class Kept:
        def __init__(self, order: str) -> None:
            self.order = order

        def remeasure_order(self, n: int) -> str:
            return self.order

        def prepare(self, knobs: Knobs) -> None:
            events.append(("prepare", knobs.gamma))

        def run(self, knobs: Knobs, seed: int, **kw) -> TrialResult:
            events.append(("run", knobs.gamma))
            return run(cfg, knobs, seed)

    configs = [(Knobs("model", g, max_batch_size=2), None) for g in (0, 1, 2)]
    done = remeasure(cfg, Kept("interleaved"), configs, lambda _: None, "re-measuring", repeats=3)
    assert events[:3] == [("prepare", 0), ("prepare", 1), ("prepare", 2)]
    assert [g for _, g in events[3:]] == [0, 1, 2, 1, 2, 0, 2, 0, 1]
    assert [len(r) for r in done.rounds] == [3, 3, 3] and done.order == "interleaved"
    events.clear()
    remeasure(cfg, Kept("back-to-back per server"), configs, lambda _: None, "again", repeats=2)
    assert events == [("run", 0), ("run", 0), ("run", 1), ("run", 1), ("run", 2), ("run", 2)]


def test_a_gain_inside_the_noise_keeps_speculation_off_and_says_why(tune_config) -> None:
    cfg = tune_config(
        search={"gamma": {"low": 0, "high": 2}, "confidence_threshold": 0.0}, budget={"repeats": 4}
    )
    profile = run_tune(cfg, say=lambda _: None, backend_for=backend_of(noisy_run(0.005)))

    assert profile["chosen"]["gamma"] == 0
    assert "no significant difference (ratio " in profile["selection"]["reason"]
    assert all(e["gamma"] == 0 and e["level_gamma"] == 0 for e in profile["schedule"])
    assert profile["table_decision"]["served"] is False
    assert "agree on K=0 at every load level" in profile["table_decision"]["reason"]


def ratio_by_round(ratios: dict[int, float]):
    """A trial run whose speculating configurations run ``ratios[seed]`` x no speculation."""

    def run(cfg, knobs: Knobs, seed: int) -> TrialResult:
        factor = ratios.get(seed, 1.2) if knobs.gamma else 1.0
        levels = {
            c: {"tokens_per_second": 100.0 * factor, "tpot_ms_p95": 40.0} for c in cfg.workload.concurrency
        }
        out = result_of({c: {**lv, "generated_tokens": 12, "wall_s": 1.0} for c, lv in levels.items()})
        return TrialResult(100.0 * factor, 40.0, out.per_level)

    return run


# Rounds 1-3: 1.35x, 1.05x, 1.25x (95% CI of the paired ratio includes 1); rounds 4-6 add 1.30x,
# 1.15x, 1.20x, and the six exclude it.
UNDECIDED_THEN_FASTER = {1: 1.35, 2: 1.05, 3: 1.25, 4: 1.30, 5: 1.15, 6: 1.20}


def test_an_undecided_choice_gets_more_paired_rounds_and_is_made_on_all_of_them(tune_config) -> None:
    cfg = tune_config(search={"gamma": {"low": 0, "high": 2}, "confidence_threshold": 0.0})
    lines: list[str] = []
    profile = run_tune(cfg, say=lines.append, backend_for=backend_of(ratio_by_round(UNDECIDED_THEN_FASTER)))

    assert profile["remeasure"] == {"repeats": 6, "order": "interleaved", "first_repeats": 3}
    assert all(len(r["rounds"]) == 6 for r in profile["remeasured"])
    assert profile["metrics"]["repeats"] == 6  # the medians are of six rounds
    assert profile["chosen"]["gamma"] > 0 and profile["metrics"]["speedup_significant"]
    assert any(line.startswith("undecided on 3 rounds (kept gamma=0 (no speculation): ") for line in lines)


def test_without_a_second_look_the_same_rounds_keep_speculation_off(tune_config) -> None:
    cfg = tune_config(
        search={"gamma": {"low": 0, "high": 2}, "confidence_threshold": 0.0}, budget={"max_repeats": 3}
    )
    profile = run_tune(cfg, say=lambda _: None, backend_for=backend_of(ratio_by_round(UNDECIDED_THEN_FASTER)))

    assert profile["remeasure"] == {"repeats": 3, "order": "interleaved"}
    assert profile["chosen"]["gamma"] == 0
    assert "no significant difference (ratio " in profile["selection"]["reason"]


def ratio_by_level_and_round(at_two: dict[int, float]):
    """Speculating configurations: 2x no speculation at concurrency 1 (and over the sweep) every
    round, ``at_two[seed]`` x at concurrency 2."""

    def run(cfg, knobs: Knobs, seed: int) -> TrialResult:
        factor = {1: 2.0 if knobs.gamma else 1.0, 2: at_two.get(seed, 0.8) if knobs.gamma else 1.0}
        levels = {
            c: {
                "tokens_per_second": 100.0 * factor[c],
                "tpot_ms_p95": 40.0,
                "generated_tokens": 12,
                "wall_s": 1.0,
            }
            for c in cfg.workload.concurrency
        }
        out = result_of(levels)
        return TrialResult(100.0 * factor[1], 40.0, out.per_level)

    return run


# At concurrency 2, speculation runs 0.75x, 0.97x, 0.80x no speculation on rounds 1-3 (off is the
# faster on the medians, the interval includes 1), then 0.78x, 0.82x, 0.79x: six rounds exclude 1.
OFF_AT_TWO_UNDECIDED = {1: 0.75, 2: 0.97, 3: 0.80, 4: 0.78, 5: 0.82, 6: 0.79}


def test_a_level_whose_choice_is_not_its_fastest_gets_more_rounds_and_is_decided_on_all(tune_config) -> None:
    """The sweep is decided on three rounds (2x), batch 2 is not: rounds 4-6 run at batch 2 only,
    every finalist alike, and the sweep's aggregate stays the medians of its three full rounds."""
    cfg = tune_config(search={"gamma": {"low": 0, "high": 2}, "confidence_threshold": 0.0})
    lines: list[str] = []
    run = ratio_by_level_and_round(OFF_AT_TWO_UNDECIDED)
    backends: list[FakeBackend] = []
    profile = run_tune(
        cfg, say=lines.append, backend_for=lambda ctx: backends.append(FakeBackend(ctx, run)) or backends[-1]
    )

    assert any(
        line.startswith("undecided on 3 rounds (at batch size 2 the per-level choice is not the fastest")
        for line in lines
    ), lines
    assert any("x 3 repeats (rounds 4-6) at batch size 2 only" in line for line in lines), lines
    assert profile["remeasure"] == {
        "repeats": 6,
        "order": "interleaved",
        "first_repeats": 3,
        "second_look_levels": [2],
    }
    second = [lv for lv in backends[0].levels_run if lv is not None]
    assert second and set(second) == {(2,)}  # only batch 2 ran again
    assert len(second) == 3 * len(profile["remeasured"])  # rounds 4-6 of every finalist
    assert profile["metrics"]["repeats"] == 3  # the sweep's medians: the full rounds only
    assert {b: r["n"] for b, r in profile["metrics"]["per_level_speedup"].items()} == {"1": 3, "2": 6}
    assert all(len(r["rounds"]) == 3 for r in profile["remeasured"])
    assert profile["chosen"]["gamma"] > 0  # 2x over the sweep: decided on the first rounds
    levels = {lv["batch_size"]: lv for lv in profile["table_decision"]["levels"]}
    assert levels[1]["gamma"] > 0 and levels[2]["gamma"] == 0, levels  # off at 2, significant on six


def test_the_same_level_on_three_rounds_keeps_the_constant(tune_config) -> None:
    cfg = tune_config(
        search={"gamma": {"low": 0, "high": 2}, "confidence_threshold": 0.0}, budget={"max_repeats": 3}
    )
    profile = run_tune(
        cfg, say=lambda _: None, backend_for=backend_of(ratio_by_level_and_round(OFF_AT_TWO_UNDECIDED))
    )

    assert profile["remeasure"] == {"repeats": 3, "order": "interleaved"}
    levels = {lv["batch_size"]: lv for lv in profile["table_decision"]["levels"]}
    assert levels[2]["gamma"] == profile["chosen"]["gamma"] > 0
    assert "no significant difference" in levels[2]["reason"], levels[2]["reason"]


def test_a_decided_choice_gets_no_more_rounds(tune_config) -> None:
    cfg = tune_config(search={"gamma": {"low": 0, "high": 2}, "confidence_threshold": 0.0})
    profile = run_tune(
        cfg, say=lambda _: None, backend_for=backend_of(ratio_by_round({}))
    )  # 1.2x every round

    assert profile["remeasure"] == {"repeats": 3, "order": "interleaved"} and profile["chosen"]["gamma"] > 0


def test_on_a_server_backend_a_configurations_repeats_run_back_to_back() -> None:
    from autotune.decide.decision import remeasure

    seen = []

    def run(cfg, knobs, seed):  # noqa: ARG001
        seen.append((knobs.gamma, seed))
        return result_of({1: {"tokens_per_second": 10.0, "generated_tokens": 1, "wall_s": 0.1}})

    cfg = SimpleNamespace(budget=SimpleNamespace(seed=0, repeats=3), objectives=SimpleNamespace(slo={}))
    backend = FakeBackend(SimpleNamespace(cfg=cfg), run)
    backend.order = "back-to-back per server"
    configs = [(Knobs("model", 0), None), (Knobs("model", 4), 1)]
    out = remeasure(cfg, backend, configs, lambda _: None, "finalists")
    assert seen == [(0, 1), (0, 2), (0, 3), (4, 1), (4, 2), (4, 3)]
    assert out.order == "back-to-back per server" and [p.rounds for p in out.points][0] == ((10.0, 1.0),) * 3


def test_each_level_records_the_measured_ratio_of_its_choice_over_the_chosen_configuration() -> None:
    """Speculation off is chosen; at batch 1 K=3 is significantly faster (the per-level choice), at
    batch 4 off stays. ``table_decision.levels[].over_chosen`` holds K=3 over off at batch 1, the
    paired ratio of their rounds there; batch 4's choice is the chosen configuration: no key."""
    from autotune.decide.decision import Remeasured, serve_table
    from autotune.records import Point
    from autotune.stats import paired_ratio

    def pt(gamma: int, r1: tuple[float, ...], r4: tuple[float, ...]) -> Point:
        return Point(
            Knobs("model", gamma), 0, 0, per_batch={1: r1[0], 4: r4[0]}, per_batch_rounds={1: r1, 4: r4}
        )

    off = pt(0, (100.0, 104.0, 98.0), (200.0, 204.0, 198.0))
    k3 = pt(3, (150.0, 160.0, 155.0), (190.0, 196.0, 191.0))
    remeasured = Remeasured([(off, None), (k3, None)], 3, "interleaved")
    cfg = SimpleNamespace(batch_sizes=[1, 4])
    backend = SimpleNamespace(name="llamacpp", serves_table=False, skips_drafter_at_k0=False)
    contest = serve_table(cfg, backend, remeasured, off, off, k3, lambda _: None)
    levels = contest.table_decision().to_json()["levels"]
    assert [(lv["batch_size"], lv["gamma"]) for lv in levels] == [(1, 3), (4, 0)] and contest.served is None
    want = paired_ratio([150.0, 160.0, 155.0], [100.0, 104.0, 98.0])
    assert levels[0]["over_chosen"] == {"value": want.value, "ci95": [want.low, want.high], "n": 3}
    assert want.low > 1.0 and "over_chosen" not in levels[1]


def test_trial_lines_say_done_planned_and_eta_from_the_clock() -> None:
    from autotune.jobs.tune import _trial_logger

    now, lines = [100.0], []
    cfg = SimpleNamespace(objectives=SimpleNamespace(latency="tpot_ms_p95"))
    log = _trial_logger(cfg, 3, lines.append, Path("study.log"), clock=lambda: now[0])
    knobs = Knobs("model", 2, 0.1, "constant", 4)
    now[0] = 130.0
    log(0, knobs, TrialResult(50.0, 12.0, {}), None)
    now[0] = 190.0
    log(1, knobs, None, "RuntimeError: boom")
    assert lines[0] == (
        "  trial 0: 50.0 tok/s, tpot_ms_p95 12.0 ms | gamma=2 thr=0.10 constant B=4 model "
        "| best so far 50.0 tok/s [1/3, ETA 1m00s]"
    )
    assert lines[1] == (
        "  trial 1: failed (RuntimeError: boom) | gamma=2 thr=0.10 constant B=4 model "
        "(traceback in study.log) [2/3, ETA 45s]"
    )


def test_trial_lines_name_a_server_start_only_where_the_trial_started_one() -> None:
    """A stack serves the same knobs again in the same server (the in-stack study's second
    no-speculation round); a failed trial's server is dropped, so the next one starts anew."""
    from autotune.jobs.tune import _trial_logger

    lines: list[str] = []
    cfg = SimpleNamespace(objectives=SimpleNamespace(latency="tpot_ms_p95"))
    log = _trial_logger(cfg, 5, lines.append, Path("study.log"), clock=lambda: 0.0)
    off, k3 = Knobs("model", 0, 0.0, "constant", 16), Knobs("model", 3, 0.0, "constant", 16)
    log(0, off, TrialResult(50.0, 12.0, {}, startup_s=35.0), None)
    log(1, off, TrialResult(51.0, 12.0, {}, startup_s=35.0), None)
    log(2, k3, TrialResult(60.0, 12.0, {}, startup_s=36.0), None)
    log(3, k3, None, "ServerError: died")
    log(4, k3, TrialResult(61.0, 12.0, {}, startup_s=40.0), None)
    assert "failed (ServerError: died)" in lines[3]
    starts = [line.split("tok/s")[-1].split(" [")[0] for line in lines if "failed" not in line]
    assert starts == [
        " (server start 35 s)",
        " (same server)",
        " (server start 36 s)",
        " (server start 40 s)",
    ]
