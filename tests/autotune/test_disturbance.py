"""Per-trial disturbance (autotune.search.guard): re-runs, pruning, threads on the free cores, proportional
time-outs; the host is scripted (tests/autotune/fakes.py: ScriptedHost), the clock faked, nothing hogs."""

from __future__ import annotations

import optuna
import pytest
import torch

from autotune.backends.base import run_levels
from autotune.device import hostnoise
from autotune.errors import ConfigError
from autotune.jobs.tune import run_tune
from autotune.knobs import Knobs
from autotune.search import guard as disturbance
from profiles.store import Store
from tests.autotune.conftest import N_TRIALS
from tests.autotune.fakes import FakeBackend, ScriptedHost, backend_of, synthetic_run

COMPLETE, FAIL, PRUNED = (
    optuna.trial.TrialState.COMPLETE,
    optuna.trial.TrialState.FAIL,
    optuna.trial.TrialState.PRUNED,
)
BUSY = "other processes 48% of the CPU, load 1.96 on 2 CPUs"


@pytest.fixture(autouse=True)
def quiet_before_and_after(monkeypatch):
    """The host checks before and after tuning read quiet: only the per-trial readings are scripted."""
    noise = {"cv": 0.02, "others_cpu_share": 0.0, "loadavg_1m": 1.0, "cpus": 2, "busy": False, "reasons": []}
    monkeypatch.setattr(hostnoise, "measure", lambda gpus=None: dict(noise))


@pytest.fixture
def torch_threads():
    """``torch_threads(n)``: the study runs on n threads; torch's count is restored after the test."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def scripted(monkeypatch, host: ScriptedHost) -> ScriptedHost:
    monkeypatch.setattr(disturbance, "open_watch", lambda: host)
    return host


def recording(calls: list, slow_calls: set[int] = frozenset()):
    """synthetic_run, recording (knobs, seed, torch threads); the calls numbered in ``slow_calls`` run at a tenth."""

    def run(cfg, knobs: Knobs, seed: int):
        calls.append((knobs, seed, torch.get_num_threads()))
        result = synthetic_run(cfg, knobs, seed)
        if len(calls) - 1 in slow_calls:
            return type(result)(result.tokens_per_second / 10, result.latency_ms * 10, result.per_level)
        return result

    return run


def trials_of(cfg, profile) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=profile["study"]["name"], storage=cfg.storage.url).get_trials()


def test_a_disturbed_trial_is_re_run_and_the_re_run_is_what_the_study_records(
    tune_config, monkeypatch, torch_threads
):
    torch_threads(2)  # on 2 CPUs: another process holding a core takes one the study's threads need
    host = scripted(monkeypatch, ScriptedHost(during=[0.0, 0.48]))  # trial 1's first run beside a busy loop
    calls: list = []
    lines: list[str] = []
    cfg = tune_config()
    profile = run_tune(cfg, say=lines.append, backend_for=backend_of(recording(calls, slow_calls={1})))

    trials = trials_of(cfg, profile)
    assert [t.state for t in trials] == [COMPLETE] * N_TRIALS
    (knobs, seed, _), (again, seed_again, _) = calls[1], calls[2]
    assert (again, seed_again) == (knobs, seed)  # the same knobs, the same seed
    expected = synthetic_run(cfg, knobs, seed)
    assert trials[1].values == [
        expected.tokens_per_second,
        expected.latency_ms,
    ]  # the re-run, not the disturbed run
    (kept,) = trials[1].user_attrs["disturbed"]
    assert kept["reason"] == BUSY and kept["host"]["others_cpu_share"] == 0.48
    assert kept["result"]["tokens_per_second"] == pytest.approx(
        expected.tokens_per_second / 10
    )  # nothing lost
    assert trials[1].user_attrs["host"]["others_cpu_share"] == 0.0
    at = lines.index(f"  trial 1: disturbed ({BUSY}): re-running")
    assert lines[at + 1].startswith(f"  trial 1: {expected.tokens_per_second:.1f} tok/s")
    assert host.windows == 2  # the first trial's sizing, then one quiet window before the re-run


@pytest.mark.parametrize(
    "host, runs, why",
    [
        (ScriptedHost(during=[0.0, 0.0, 0.48, 0.48, 0.48]), 3, f"{BUSY}; disturbed in all 3 runs"),
        (
            ScriptedHost(during=[0.0, 0.0, 0.48], between=[0.0], idle=0.48),
            1,
            f"{BUSY}; the host stayed busy for 60 s",
        ),
    ],
    ids=["every-re-run-disturbed", "host-never-quiet"],
)
def test_a_trial_disturbed_every_time_is_pruned_with_its_reason_and_kept_off_the_front(
    tune_config, monkeypatch, torch_threads, host, runs, why
):
    torch_threads(2)
    scripted(monkeypatch, host)
    calls: list = []
    lines: list[str] = []
    cfg = tune_config()
    profile = run_tune(cfg, say=lines.append, backend_for=backend_of(recording(calls)))

    trials = trials_of(cfg, profile)
    assert [t.state for t in trials] == [COMPLETE, COMPLETE, PRUNED]
    pruned = trials[2]
    assert pruned.values is None and pruned.user_attrs["pruned"] == why
    kept = pruned.user_attrs["disturbed"]
    assert len(kept) == runs and all(r["reason"] == BUSY and "result" in r for r in kept)  # nothing lost
    assert [k for k, _, _ in calls[2 : 2 + runs]] == [Knobs.from_params(pruned.user_attrs["params"])] * runs
    with Store(cfg.storage.url) as store:
        stored = store.get_profile(profile["id"])
    assert 2 not in [t["trial"] for t in stored["trials"]]
    assert 2 not in [t["trial"] for t in stored["pareto_front"]]
    assert stored["study"]["n_trials"] == 2
    assert any(line.startswith(f"  trial 2: pruned ({why}) | ") for line in lines)


def test_a_quiet_study_runs_each_trial_once_and_records_its_host(tune_config, monkeypatch):
    scripted(monkeypatch, ScriptedHost())
    calls: list = []
    lines: list[str] = []
    cfg = tune_config()
    profile = run_tune(cfg, say=lines.append, backend_for=backend_of(recording(calls)))

    trials = trials_of(cfg, profile)
    assert [t.state for t in trials] == [COMPLETE] * N_TRIALS
    assert [Knobs.from_params(t.user_attrs["params"]) for t in trials] == [k for k, _, _ in calls[:N_TRIALS]]
    for t, (knobs, seed, threads) in zip(trials, calls, strict=False):
        expected = synthetic_run(cfg, knobs, seed)
        assert t.values == [expected.tokens_per_second, expected.latency_ms]
        assert "disturbed" not in t.user_attrs and t.user_attrs["torch_threads"] == threads
        assert t.user_attrs["host"]["others_cpu_share"] == 0.0
    assert not any("disturbed" in line or "pruned" in line for line in lines)


def test_a_servers_start_up_is_outside_the_runs_host_reading(tune_config, monkeypatch) -> None:
    """The backend's ``prepare`` (a server backend: start the server; its compile workers exit and
    their CPU time would read as another process's) runs before the reading opens, every run."""
    events: list[str] = []

    class Host(ScriptedHost):
        def mark(self) -> None:
            events.append("mark")

    class Starting(FakeBackend):
        def prepare(self, knobs: Knobs) -> None:
            events.append("prepare")

    scripted(monkeypatch, Host())
    run = recording([])

    def logged(cfg, knobs, seed):
        events.append("run")
        return run(cfg, knobs, seed)

    run_tune(tune_config(), say=lambda _: None, backend_for=lambda ctx: Starting(ctx, logged))
    study = events[: 3 * N_TRIALS]
    assert study == ["prepare", "mark", "run"] * N_TRIALS


def test_threads_follow_the_free_cores_per_run_and_are_restored(tune_config, monkeypatch, torch_threads):
    torch_threads(2)
    # another process holds a core when the first trial starts, and goes away during it
    scripted(monkeypatch, ScriptedHost(during=[0.5], between=[0.5]))
    calls: list = []
    lines: list[str] = []
    cfg = tune_config()
    profile = run_tune(cfg, say=lines.append, backend_for=backend_of(recording(calls)))

    assert [threads for _, _, threads in calls[:2]] == [
        1,
        2,
    ]  # on the free core, then re-run on the study's 2
    assert torch.get_num_threads() == 2
    first = trials_of(cfg, profile)[0]
    assert first.state == COMPLETE and first.user_attrs["torch_threads"] == 2
    (kept,) = first.user_attrs["disturbed"]
    assert kept["host"]["torch_threads"] == 1
    assert kept["reason"].startswith(
        "ran on 1 of the study's 2 torch threads; other processes 50% of the CPU"
    )
    assert any(
        line.startswith("  trial 0: disturbed (ran on 1 of the study's 2 torch threads") for line in lines
    )


def clocked(now: list[float], cut_calls: set[int], seen_left: list):
    """Trials through run_levels on a fake clock: 1 s and 12 tokens per level; the calls numbered in
    ``cut_calls`` would take 1000 s, so they run out whatever limit their level gets."""
    calls: list = []

    def run(cfg, knobs: Knobs, seed: int):  # noqa: ARG001
        calls.append(knobs)
        slow = len(calls) - 1 in cut_calls

        def level(load, left):  # noqa: ARG001
            seen_left.append(left)
            if slow:
                now[0] += left
                raise TimeoutError
            now[0] += 1.0
            return {"tokens_per_second": 12.0, "tpot_ms_p95": 40.0, "generated_tokens": 12, "wall_s": 1.0}

        return run_levels(cfg, knobs.max_batch_size, level, clock=lambda: now[0])

    return run


@pytest.mark.parametrize("others", [0.0, 0.6], ids=["quiet-host-fails", "busy-host-re-runs"])
def test_a_trial_far_slower_than_expected_is_cut_after_a_few_times_its_expectation(
    tune_config, monkeypatch, torch_threads, others
):
    torch_threads(1)
    scripted(monkeypatch, ScriptedHost(during=[0.0, 0.0, 0.0, others]))
    now, seen_left = [0.0], []
    lines: list[str] = []
    cfg = tune_config(budget={"n_trials": 4})
    profile = run_tune(cfg, say=lines.append, backend_for=backend_of(clocked(now, {3}, seen_left)))

    cut = "trial cut after 30 s, 4x the 2.0 s expected from 3 finished trials, at least 30 s (0 of 2 load levels done)"
    assert seen_left[6] == 30.0  # the fourth trial's first level: not budget.trial_timeout_s=300
    trial = trials_of(cfg, profile)[3]
    assert trial.user_attrs["expected_s"] == pytest.approx(2.0)
    if others == 0.0:  # the host says nothing: the configuration is that slow, the trial fails in one line
        assert trial.state == FAIL and trial.user_attrs["error"] == f"TimeoutError: {cut}"
        assert any(line.startswith(f"  trial 3: failed (TimeoutError: {cut})") for line in lines)
    else:  # the host says another process took a core the run needed: disturbed, re-run
        assert trial.state == COMPLETE
        (kept,) = trial.user_attrs["disturbed"]
        assert kept["error"] == f"TimeoutError: {cut}"
        assert kept["reason"] == "cut by its time limit; other processes 60% of the CPU, load 2.20 on 2 CPUs"


def test_budget_disturbed_reruns_is_a_count(tune_config) -> None:
    assert tune_config(budget={"disturbed_reruns": 0}).budget.disturbed_reruns == 0
    with pytest.raises(ConfigError, match=r"^budget.disturbed_reruns: must be >= 0 \(got -1\)$"):
        tune_config(budget={"disturbed_reruns": -1})


def test_proc_watch_reads_other_processes_over_the_run(tmp_path) -> None:
    (tmp_path / "self").mkdir()

    def write(busy: int, total: int, own: int, load: float) -> None:
        idle = total - busy
        (tmp_path / "stat").write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\n")
        (tmp_path / "self" / "stat").write_text("1 (python) R " + " ".join(["0"] * 10) + f" {own} 0 0 0\n")
        (tmp_path / "loadavg").write_text(f"{load} 1.00 0.50 2/100 999\n")

    write(100, 1000, 10, 0.5)
    watch = disturbance.ProcWatch(tmp_path)
    watch.mark()
    write(500, 1400, 210, 1.9)  # 400 busy ticks of 400, 200 of them this process's
    reading = watch.since_mark()
    assert reading["others_cpu_share"] == 0.5 and reading["loadavg_1m"] == 1.9
    assert disturbance.verdict({**reading, "cpus": 2}, study_threads=2) == (
        "other processes 50% of the CPU, load 1.90 on 2 CPUs"
    )
