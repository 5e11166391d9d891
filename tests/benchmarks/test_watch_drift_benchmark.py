"""benchmarks/watch/watch_drift.py: how the watch's windows are assigned to phases and judged, and the
bundled prose prompts."""

from __future__ import annotations

from benchmarks.watch import watch_drift
from engine.workload import load_workload


def window(
    at: float,
    stale: bool,
    alarm: bool | None = None,
    k: int = 5,
    alt: int = 2,
    idle: bool = False,
    changed: bool | None = None,
) -> dict:
    return {
        "changed": changed if changed is not None else stale,
        "received_s": at,
        "window_s": 10.0,
        "idle": idle,
        "stale": stale,
        "alarm": stale if alarm is None else alarm,
        "served_k": k,
        "alternative_k": alt,
        "predicted_gain": 1.2 if stale else 1.01,
        "gain_ci95": [1.1, 1.3] if stale else None,
        "acceptance_rate": 0.3 if stale else 0.6,
        "requests_running": 1.0,
        "level_choice_k": k,
        "predicted_with": "stack",
    }


def test_a_window_belongs_to_the_phase_its_middle_falls_in() -> None:
    phase = {"start_s": 100.0, "end_s": 200.0}
    windows = [window(104.0, False), window(106.0, False), window(204.0, False), window(206.0, False)]
    # middles 99, 101, 199, 201
    assert [w["received_s"] for w in watch_drift.phase_windows(windows, phase)] == [106.0, 204.0]


def test_the_first_stale_window_gives_the_delay_from_the_phase_start_and_the_named_alternative() -> None:
    phase = {"start_s": 100.0, "end_s": 200.0}
    windows = [window(110.0, False), window(120.0, False, alarm=True), window(130.0, False, alarm=True)]
    windows += [window(140.0, True), window(150.0, True, changed=False), window(160.0, False, alarm=False)]
    judged = watch_drift.judge(phase, windows)
    assert judged["windows"] == 6
    assert judged["alarm_windows"] == 4
    assert judged["stale_windows"] == 2
    assert judged["first_stale"]["after_s"] == 40.0
    assert judged["first_stale"]["window"] == 4
    assert judged["first_stale"]["alternative_k"] == 2
    assert judged["first_stale"]["gain_ci95"] == [1.1, 1.3]
    assert judged["fresh_again_window"] == 6
    assert not judged["stale_at_end"]


def test_a_phase_entered_stale_is_no_detection() -> None:
    phase = {"start_s": 0.0, "end_s": 100.0}
    windows = [window(20.0, True, changed=False), window(30.0, False, alarm=False, changed=True)]
    judged = watch_drift.judge(phase, windows)
    assert judged["first_stale"] is None and judged["stale_at_start"] and judged["stale_windows"] == 1


def test_a_steady_phase_without_stale_windows_has_no_first_stale_and_idle_windows_are_counted_apart() -> None:
    phase = {"start_s": 0.0, "end_s": 100.0}
    windows = [window(20.0, False), window(30.0, False, idle=True), window(40.0, False)]
    judged = watch_drift.judge(phase, windows)
    assert judged["first_stale"] is None
    assert judged["fresh_again_window"] is None
    assert judged["idle_windows"] == 1
    assert judged["acceptance_rate"] == 0.6
    assert judged["served_k"] == 5


def test_the_bundled_prose_prompts_load_and_are_not_code() -> None:
    items = load_workload(watch_drift.PROSE)
    assert len(items) >= 32
    for item in items:
        assert len(item.prompt) >= 250
        assert sum(c.isalpha() or c == " " for c in item.prompt) / len(item.prompt) > 0.9


def test_a_phase_re_tune_reads_the_phase_prompts_with_its_sampling(tmp_path) -> None:
    """The sampled phase is re-tuned on the same prompts at temperature 1, set on every line (the
    workload reader takes it per line); other phases keep the lines as they are."""
    src = tmp_path / "src.jsonl"
    src.write_text(
        '{"prompt": "def f(", "max_new_tokens": 8}\n\n{"prompt": "import os", "temperature": 0.0}\n'
    )
    sampled = load_workload(watch_drift.phase_prompts(src, 1.0, tmp_path / "sampled.jsonl"))
    assert [(r.prompt, r.temperature) for r in sampled] == [("def f(", 1.0), ("import os", 1.0)]
    assert sampled[0].max_new_tokens == 8
    same = load_workload(watch_drift.phase_prompts(src, None, tmp_path / "same.jsonl"))
    assert [(r.prompt, r.temperature) for r in same] == [("def f(", None), ("import os", 0.0)]
