"""Memory- vs compute-bound classification on synthetic T(B, k) curves with known shapes."""

from __future__ import annotations

import pytest

from autotune.device.classify import classify, knee, label
from autotune.records import Curves, StepSample

GAMMA_MAX = 3
BATCHES = (1, 2, 4, 8)
T_DRAFT = 0.0005


def accepting(gamma_max: int = GAMMA_MAX) -> list[StepSample]:
    """A near-perfect draft: every profiled step accepts all gamma_max tokens."""
    return [StepSample(gamma_max, (0.99,) * gamma_max)] * 8


def curves_from(t_of_tokens) -> Curves:
    """T_verify(B, k) = t_of_tokens(B * k), k = 1 .. GAMMA_MAX + 1."""
    return Curves(
        {b: {k: t_of_tokens(b * k) for k in range(1, GAMMA_MAX + 2)} for b in BATCHES},
        {b: T_DRAFT for b in BATCHES},
    )


def knee_curve_from(t_of_tokens) -> dict[int, float]:
    return {n: t_of_tokens(n) for n in (1, 2, 4, 8, 16, 32, 64)}


def memory_bound(n: int) -> float:
    return 0.010


def compute_bound(n: int) -> float:
    return 0.001 * n


def knee_at_16(n: int) -> float:
    return 0.010 if n <= 8 else 0.010 * n / 8


def test_memory_bound_curve_all_memory_bound_best_gamma_max() -> None:
    table = classify(curves_from(memory_bound), knee_curve_from(memory_bound), accepting(), GAMMA_MAX)
    rows = table["batch_sizes"]
    assert [r["batch_size"] for r in rows] == list(BATCHES)
    assert all(r["label"] == "memory-bound" for r in rows)
    assert all(r["verify_cost"] == pytest.approx(1.0) for r in rows)
    assert all(r["best_gamma"] == GAMMA_MAX for r in rows)
    assert all(r["predicted_speedup"] > 1 for r in rows)
    assert table["knee_tokens"] is None
    assert table["memory_bound_batch_sizes"] == list(BATCHES)
    assert table["gamma_max"] == GAMMA_MAX


def test_compute_bound_curve_all_compute_bound_best_gamma_zero() -> None:
    table = classify(curves_from(compute_bound), knee_curve_from(compute_bound), accepting(), GAMMA_MAX)
    rows = table["batch_sizes"]
    assert all(r["label"] == "compute-bound" for r in rows)
    assert all(r["verify_cost"] == pytest.approx(GAMMA_MAX + 1) for r in rows)
    assert all(r["best_gamma"] == 0 for r in rows)
    assert all(r["predicted_speedup"] == pytest.approx(1.0) for r in rows)
    assert table["knee_tokens"] == 2
    assert table["memory_bound_batch_sizes"] == []


def test_knee_at_16_splits_small_and_large_batches() -> None:
    assert knee(knee_curve_from(knee_at_16)) == 16
    table = classify(curves_from(knee_at_16), knee_curve_from(knee_at_16), accepting(), GAMMA_MAX)
    labels = {r["batch_size"]: r["label"] for r in table["batch_sizes"]}
    # B * (gamma_max + 1) tokens: 4 and 8 fit under the knee; 16 and 32 are past it
    assert labels == {1: "memory-bound", 2: "memory-bound", 4: "compute-bound", 8: "compute-bound"}
    best = {r["batch_size"]: r["best_gamma"] for r in table["batch_sizes"]}
    assert best[1] == best[2] == GAMMA_MAX
    assert best[8] == 0
    assert table["knee_tokens"] == 16
    assert table["memory_bound_batch_sizes"] == [1, 2]
    assert [r["tokens_in_verify"] for r in table["batch_sizes"]] == [4, 8, 16, 32]


def test_gentle_bend_is_transitional_at_gamma_max() -> None:
    """Past the knee at half the per-token price: cost 1.5 at gamma 3 is neither label's extreme."""

    def gentle(n: int) -> float:
        return 0.010 if n <= 8 else 0.010 * (1 + (n - 8) / 16)

    table = classify(curves_from(gentle), knee_curve_from(gentle), accepting(), GAMMA_MAX)
    row = next(r for r in table["batch_sizes"] if r["batch_size"] == 4)
    assert row["verify_cost"] == pytest.approx(1.5)
    assert row["label"] == "transitional"  # 1.2 <= 1.5 < (3 + 1) / 2


def test_knee_is_relative_to_the_smallest_n() -> None:
    assert knee({1: 1.0, 2: 1.1, 4: 1.1001}) == 4  # strictly above 1.1 x T(1)
    assert knee({4: 2.0, 1: 1.0, 2: 1.0}) == 4  # unsorted input
    assert knee({1: 1.0, 2: 1.05}) is None


@pytest.mark.parametrize(
    ("cost", "gamma", "expected"),
    [
        (1.0, 4, "memory-bound"),
        (1.19, 4, "memory-bound"),
        (1.2, 4, "transitional"),
        (2.49, 4, "transitional"),
        (2.5, 4, "compute-bound"),
        (5.0, 4, "compute-bound"),
    ],
)
def test_label_thresholds(cost, gamma, expected) -> None:
    assert label(cost, gamma) == expected


# ------------------------------------------------------------------------------------------
# labels with evidence (repeated timings)


def jittered(value: float, spread: float, n: int = 7) -> list[float]:
    """n deterministic samples spread +-spread (relative) around value."""
    return [value * (1 + spread * (2 * i / (n - 1) - 1)) for i in range(n)]


def test_tight_timings_keep_the_label_and_carry_its_interval() -> None:
    curves = curves_from(memory_bound)
    cost_samples = {b: (jittered(0.010, 0.01), jittered(0.010, 0.01)) for b in BATCHES}
    table = classify(curves, knee_curve_from(memory_bound), accepting(), GAMMA_MAX, cost_samples=cost_samples)
    for row in table["batch_sizes"]:
        assert row["label"] == "memory-bound" and row["separable"] is True
        low, high = row["verify_cost_ci95"]
        assert low <= row["verify_cost"] <= high < 1.2


def test_noise_that_straddles_a_boundary_is_reported_not_flipped() -> None:
    """Cost 1.15 measured with +-20% noise: memory-bound or transitional, not separable here."""
    curves = Curves(
        {b: {1: 0.010, 2: 0.0105, 3: 0.011, 4: 0.0115} for b in BATCHES}, {b: T_DRAFT for b in BATCHES}
    )
    cost_samples = {b: (jittered(0.010, 0.2), jittered(0.0115, 0.2)) for b in BATCHES}
    table = classify(
        curves, knee_curve_from(memory_bound), accepting(), GAMMA_MAX, cost_samples=cost_samples, seed=1
    )
    for row in table["batch_sizes"]:
        assert row["point_label"] == "memory-bound"
        assert row["label"] == "transitional" and row["separable"] is False
        assert row["label_range"][0] == "memory-bound" and row["label_range"][1] != "memory-bound"
    assert table["memory_bound_batch_sizes"] == []


def test_classification_is_seeded() -> None:
    curves = curves_from(knee_at_16)
    cost_samples = {
        b: (jittered(0.010, 0.1), jittered(knee_at_16(b * (GAMMA_MAX + 1)), 0.1)) for b in BATCHES
    }
    knee_samples = {n: jittered(knee_at_16(n), 0.02) for n in (1, 2, 4, 8, 16, 32, 64)}
    runs = [
        classify(
            curves,
            knee_curve_from(knee_at_16),
            accepting(),
            GAMMA_MAX,
            cost_samples=cost_samples,
            knee_samples=knee_samples,
            seed=3,
        )
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    assert runs[0]["knee_tokens_ci95"] == [16, 16]
