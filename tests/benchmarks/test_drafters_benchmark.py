"""benchmarks/stacks/drafters.py: every drafter through the engine part, exact outputs, the goal arithmetic."""

from __future__ import annotations

from benchmarks.stacks import drafters
from engine.loader import load_pair
from engine.speculative import Request
from tests.engine.test_eagle3 import head_config, random_head


def test_engine_part_runs_every_drafter_exactly_and_picks_each_ones_best_gamma(tiny_pair_dirs) -> None:
    pair = load_pair(*tiny_pair_dirs)
    c = pair.target.config
    pair.eagle3 = random_head(
        pair.target, head_config(c, c.vocab_size, ids=[0, 1, c.num_hidden_layers]), None, 0, 0.05
    )
    requests = [Request([1 + i, 2, 3, 4, 1, 2, 3], 8, 0.0, id=i) for i in range(3)]
    out = drafters.engine_part(pair, requests, list(drafters.DRAFTERS), [1, 3], [1, 2], rounds=2, seed=0)
    assert len(out["rows"]) == len(drafters.DRAFTERS) * 2 * 2
    for row in out["rows"]:
        assert row["greedy_match"] is True, row  # speculation never changes a greedy output
        assert len(row["rounds"]["tokens_per_second"]) == 2
        assert 1.0 <= row["mean_acceptance_length"] <= row["gamma"] + 1
        assert (row["draft_cost_ratio"] is None) == (row["drafter"] == "ngram")
    for key, best in out["best"].items():
        drafter, load = key.split("@")
        mine = [r for r in out["rows"] if r["drafter"] == drafter and r["concurrency"] == int(load)]
        assert best["over_no_speculation"]["value"] == max(r["over_no_speculation"]["value"] for r in mine)


def test_engine_goals_compare_the_heads_best_with_the_draft_models() -> None:
    best = {
        "eagle3@1": {"mean_acceptance_length": 3.0, "draft_cost_ratio": 0.05},
        "model@1": {"mean_acceptance_length": 2.5, "draft_cost_ratio": 0.2},
        "eagle3@4": {"mean_acceptance_length": 2.0, "draft_cost_ratio": 0.05},
        "model@4": {"mean_acceptance_length": 2.5, "draft_cost_ratio": 0.2},
    }
    goals = drafters.engine_goals(best, [1, 4], [])
    assert goals["1"]["goal_met"] and goals["1"]["draft_cost_head_over_model"] == 0.25
    assert not goals["4"]["goal_met"] and goals["4"]["accepted_length_head_over_model"] == 0.8
    assert goals["1"]["head_ceiling_over_model"] is None  # no rows: no gamma measured for both


def test_the_heads_ceiling_is_its_length_and_cost_advantage_at_one_gamma() -> None:
    """The measured case: equal accepted length, the head at 0.13 of an AR step per drafted token
    against the draft model's 0.17: at gamma 4 at most (1 + 4 x 0.17) / (1 + 4 x 0.13) = 1.105x."""

    def row(drafter: str, k: int, length: float, cost: float | None, c: int = 1) -> dict:
        return {
            "drafter": drafter,
            "gamma": k,
            "concurrency": c,
            "mean_acceptance_length": length,
            "draft_cost_ratio": cost,
        }

    rows = [
        row("model", 2, 2.5, 0.17),
        row("eagle3", 2, 2.5, 0.13),
        row("model", 4, 3.8, 0.17),
        row("eagle3", 4, 3.8, 0.13),
        row("eagle3", 5, 4.2, 0.13),  # no draft model at gamma 5: no ratio there
        row("ngram", 4, 1.6, None),
        row("eagle3", 4, 9.0, 0.01, c=4),  # another load
    ]
    top = drafters.head_ceiling(rows, 1)
    assert top is not None and top["gamma"] == 4
    assert abs(top["value"] - 1.68 / 1.52) < 1e-12
