"""Fixtures for the profile store and exporter tests: a fixed sample profile and a temp store."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from profiles.reading import SCHEMA_VERSION
from profiles.schema import BatchSchedule, Chosen, Profile, ScheduleEntry
from profiles.store import Store

# The device section the golden exports were generated from (tests/profiles/golden).
GOLDEN_DEVICE: dict[str, Any] = {
    "key": "ab12cd34ef56",
    "label": "NVIDIA H200 141GB",
    "kind": "cuda",
    "name": "NVIDIA H200",
    "memory_gib": 141,
}
# The goldens' section order: classification before pareto_front (autotune tune writes pareto_front first).
GOLDEN_KEY_ORDER = (
    "schema_version",
    "tool_version",
    "created_at",
    "device",
    "pair",
    "workload",
    "chosen",
    "schedule",
    "crossover_batch_size",
    "metrics",
    "baseline",
    "classification",
    "pareto_front",
    "ceilings",
    "predicted_vs_measured",
)

SAMPLE = Profile(
    schema_version=SCHEMA_VERSION,
    tool_version="0.1.0",
    created_at="2026-11-30T01:30:00+00:00",
    device=GOLDEN_DEVICE,
    pair={
        "target": "/srv/models/llama-target",
        "draft": "/srv/models/llama-draft",
        "drafter": "model",
        "target_hash": "t" * 64,
        "draft_hash": "d" * 64,
    },
    workload={
        "hash": "w" * 64,
        "prompts": "prompts.jsonl",
        "max_new_tokens": 64,
        "temperature": 0.0,
        "concurrency": [1, 2, 4, 8],
    },
    chosen=Chosen(
        drafter="model",
        gamma=4,
        confidence_threshold=0.3,
        gamma_schedule="constant",
        max_batch_size=8,
        prompt_lookup_min=2,
        prompt_lookup_max=4,
    ),
    schedule=BatchSchedule(tuple(ScheduleEntry(b, g) for b, g in [(1, 5), (2, 4), (4, 2), (8, 0)]), 8),
    metrics={"tokens_per_second": 812.5, "tpot_ms_p95": 9.8, "speedup": 1.74},
    baseline={"tokens_per_second": 467.0, "tpot_ms_p95": 14.1},
    classification=[{"batch_size": 1, "label": "memory-bound"}, {"batch_size": 8, "label": "compute-bound"}],
    pareto_front=[{"gamma": 5, "tokens_per_second": 640.0, "tpot_ms_p95": 7.5}],
    ceilings={"bandwidth_gbs": 4800.0, "flops": 9.89e14},
    predicted_vs_measured=[{"gamma": 4, "predicted": 800.0, "measured": 812.5}],
    key_order=GOLDEN_KEY_ORDER,
)
"""The sample profile, typed; exporters read its JSON (:data:`SAMPLE_PROFILE`).

Its ``device`` is not the shape :func:`autotune.device.hardware.fingerprint` produces, on purpose: the
``yaml`` export dumps the whole profile, so tests/profiles/golden/profile.yaml pins this dict
verbatim (``key``, ``label``, ``kind`` are a fingerprint's top-level fields; ``name`` and
``memory_gib`` are two of ``hardware.identity_fields``, which a real fingerprint hashes into
``key`` and keeps under ``device``/``nvml`` instead), and the goldens must stay byte-identical.
The other exports read only ``device.label`` and ``device.key``. Tests that store or look up
a device use :func:`real_device_profile` (a real CPU fingerprint, tests/conftest.py).
"""
SAMPLE_PROFILE: dict[str, Any] = copy.deepcopy(SAMPLE.to_json())


@pytest.fixture
def profile() -> dict[str, Any]:
    """A fresh deep copy of the fixed sample profile (draft-model drafter).

    Built from the types (:data:`SAMPLE`); its ``device`` keeps the shape the golden exports pin,
    which is not a real fingerprint's (see :data:`SAMPLE`; ``real_device_profile`` has a real one).
    """
    return copy.deepcopy(SAMPLE_PROFILE)


@pytest.fixture
def make_profile() -> Callable[..., dict[str, Any]]:
    """Build sample variants: ``make_profile(schedule=[(1, 4), (8, 0)], drafter="ngram", **chosen)``."""

    def build(
        schedule: list[tuple[int, int]] | None = None, drafter: str | None = None, **chosen: Any
    ) -> dict[str, Any]:
        out = copy.deepcopy(SAMPLE_PROFILE)
        if schedule is not None:
            out["schedule"] = BatchSchedule(tuple(ScheduleEntry(b, g) for b, g in schedule)).to_json()
        if drafter is not None:
            out["chosen"]["drafter"] = drafter
            if drafter != "model":
                out["pair"]["draft"] = None
        out["chosen"].update(chosen)  # raw: the bad-value tests write what Chosen would refuse
        return out

    return build


@pytest.fixture
def real_device_profile(cpu_fingerprint) -> dict[str, Any]:
    """The sample profile on a real-shaped CPU fingerprint (``autotune.device.hardware.fingerprint``'s own output)."""
    return Profile.from_json({**copy.deepcopy(SAMPLE_PROFILE), "device": cpu_fingerprint()}).to_json()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A Store on a fresh SQLite file under tmp_path."""
    with Store(f"sqlite:///{tmp_path / 'autotune.db'}") as opened:
        yield opened
