"""Token trees in the study (issue 13): tune.yaml's search.tree_topk, the constrained space, the cost model's
tree prediction, the profiler's tree extension, warm starts, and a short real study with trees searched."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest

from autotune.config import ModelsConfig, Range, SearchConfig, TuneConfig, WorkloadConfig, parse
from autotune.cost.costmodel import best_tree, predict_tree, tree_expected_tokens
from autotune.errors import ConfigError
from autotune.jobs.tune import run_tune
from autotune.knobs import Knobs
from autotune.records import Curves, TrialResult
from autotune.search import study as study_mod
from engine.tree import DynamicTree
from profiles.exporters import export
from profiles.store import Store
from tests.autotune.fakes import backend_of, result_of


def _raw(root: Path, **search) -> dict:
    for d in ("target", "draft"):
        (root / d).mkdir(exist_ok=True)
    (root / "prompts.jsonl").write_text('{"prompt": "x"}\n')
    return {
        "models": {"target": "target", "draft": "draft"},
        "workload": {"prompts": "prompts.jsonl"},
        "search": search,
    }


# --- tune.yaml -----------------------------------------------------------------------------------


def test_tree_topk_defaults_to_the_chain_only(tmp_path) -> None:
    cfg = parse(_raw(tmp_path), tmp_path)
    assert cfg.search.tree_topk == ((),) and not cfg.trees_searched


@pytest.mark.parametrize(
    "value, shapes",
    [
        (["chain", "2,1,1"], ((), (2, 1, 1))),
        ("2,1", ((2, 1),)),
        ([3, 1], ((3, 1),)),  # a list of integers is one shape
        (["1", "1,1", "2"], ((), (2,))),  # all ones is the chain, duplicates dropped
        (
            ["chain", "2x6/10", " 3 x 4 / 8 "],
            ((), DynamicTree(2, 6, 10), DynamicTree(3, 4, 8)),
        ),  # dynamic trees
    ],
)
def test_tree_topk_values(tmp_path, value, shapes) -> None:
    assert parse(_raw(tmp_path, tree_topk=value), tmp_path).search.tree_topk == shapes


@pytest.mark.parametrize(
    "search, message",
    [
        ({"tree_topk": "2,x"}, r"^search.tree_topk: '2,x' is not 'chain' or a per-depth top-k list"),
        ({"tree_topk": ["chain", "0,1"]}, r"^search.tree_topk: '0,1' is not 'chain'"),
        (
            {"tree_topk": []},
            r"^search.tree_topk: must be 'chain', a shape like '2,1,1', a dynamic tree like '2x6/10' or a "
            r"non-empty list",
        ),
        ({"tree_topk": {"a": 1}}, r"^search.tree_topk: \{'a': 1\} is not 'chain'"),
        ({"tree_topk": "16,16"}, r"^search.tree_topk: '16,16': \[16, 16\] has 272 nodes \(at most 256\)"),
        (
            {"tree_topk": "2,1", "drafter": ["ngram"]},
            r"^search.tree_topk: a tree needs the 'model' or 'eagle3' drafter",
        ),
        (
            {"tree_topk": "2,1,1,1,1,1,1,1,1"},
            r"^search.tree_topk: '2,1,1,1,1,1,1,1,1' has depth 9 > profile.gamma_max 8",
        ),
        (
            {"drafter": ["hybrid"]},
            r"^search.drafter: 'hybrid' drafts with the draft model too; list 'model' with it",
        ),
        ({"tree_topk": "1x4/3"}, r"^search.tree_topk: '1x4/3': a dynamic tree needs top-k >= 2 \(got 1\)"),
        (
            {"tree_topk": "2x3/11"},
            r"^search.tree_topk: '2x3/11': must be in 1..10 for top-k 2 and depth 3 \(got 11\)",
        ),
        ({"tree_topk": "2x/4"}, r"^search.tree_topk: '2x/4': '2x/4' is not a dynamic tree 'KxD/N'"),
        ({"tree_topk": "2x9/10"}, r"^search.tree_topk: '2x9/10' has depth 9 > profile.gamma_max 8"),
    ],
)
def test_bad_tree_values_are_one_line_config_errors(tmp_path, search, message) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse(_raw(tmp_path, **search), tmp_path)
    assert "\n" not in str(info.value)


def test_hybrid_is_accepted_next_to_model(tmp_path) -> None:
    assert parse(_raw(tmp_path, drafter=["model", "hybrid"]), tmp_path).search.drafter == ("model", "hybrid")


def test_bad_tree_value_exits_2_via_the_cli(tmp_path) -> None:
    from click.testing import CliRunner

    from autotune.cli import main

    raw = _raw(tmp_path, tree_topk="2,x")
    path = tmp_path / "tune.yaml"
    path.write_text(json.dumps(raw))
    result = CliRunner().invoke(main, ["tune", "--config", str(path)])
    assert result.exit_code == 2, result.output
    assert "search.tree_topk: '2,x'" in result.output


@pytest.mark.parametrize("backend", ["vllm", "llamacpp"])
def test_trees_and_hybrid_with_a_serving_stack_backend_exit_2_before_anything_runs(
    tmp_path, monkeypatch, backend
) -> None:
    """A stack backend runs chains of the model / n-gram / no drafter: a tree trial would run there as
    a chain of the tree's depth, a hybrid one as an n-gram without its window, under their own names.
    Refused in one line, from tune.yaml or --backend, before loading anything."""
    from click.testing import CliRunner

    import autotune.context as ctx_mod
    from autotune.cli import main

    monkeypatch.setattr(
        ctx_mod, "build", lambda cfg, say=None, reprofile=False: pytest.fail("loaded models before refusing")
    )
    path = tmp_path / "tune.yaml"
    path.write_text(json.dumps(_raw(tmp_path, tree_topk=["chain", "2x3/4"])))
    result = CliRunner().invoke(main, ["tune", "--config", str(path), "--backend", backend])
    assert result.exit_code == 2, result.output
    assert f"search.tree_topk: the {backend} backend runs chains only (no token trees)" in result.output
    assert "['chain', '2x3/4']" in result.output and "Traceback" not in result.output
    path.write_text(json.dumps(_raw(tmp_path, drafter=["model", "hybrid"])))  # hybrid: an n-gram trial there
    result = CliRunner().invoke(main, ["tune", "--config", str(path), "--backend", backend])
    assert result.exit_code == 2, result.output
    assert f"search.drafter: the {backend} backend has no 'hybrid' drafter" in result.output
    path.write_text(
        json.dumps(_raw(tmp_path, tree_topk=["chain"], drafter=["model", "ngram"]))
    )  # what stacks take
    monkeypatch.setattr(
        ctx_mod, "build", lambda cfg, say=None, reprofile=False: (_ for _ in ()).throw(KeyboardInterrupt)
    )
    assert CliRunner().invoke(main, ["tune", "--config", str(path), "--backend", backend]).exit_code == 130


# --- the space -----------------------------------------------------------------------------------

CFG = TuneConfig(
    ModelsConfig(Path("t"), Path("d"), device="cpu"),
    WorkloadConfig(Path("p"), concurrency=(1, 2)),
    SearchConfig(
        drafter=("model", "ngram"),
        gamma=Range(0, 4),
        gamma_schedule=("constant", "heuristic"),
        max_batch_size=(2,),
        tree_topk=((), (2, 1)),
        gamma_cap="off",
    ),
)


def test_without_trees_the_space_and_params_are_unchanged() -> None:
    space = study_mod.shape_space(
        dataclasses.replace(CFG, search=dataclasses.replace(CFG.search, tree_topk=((),))), measurement={}
    )
    assert "tree_topk" not in space.to_json() and "tree_topk" not in space.searched()
    k = space.suggest(
        optuna.trial.FixedTrial(
            {"drafter": "model", "gamma": 2, "confidence_threshold": 0.1, "gamma_schedule": "heuristic"}
        )
    )
    assert "tree_topk" not in space.params(k)
    assert k.spec_config().tree_topk == ()


def test_a_tree_trial_never_takes_settings_the_engine_refuses() -> None:
    """The tree fixes gamma (depth), threshold 0 and the constant policy; the chain knobs are not suggested."""
    space = study_mod.shape_space(CFG, measurement={})
    assert space.to_json()["tree_topk"] == ("chain", "2,1") and "tree_topk" in space.searched()
    study = optuna.create_study(
        directions=["maximize", "minimize"],
        sampler=optuna.samplers.TPESampler(seed=0, multivariate=True, n_startup_trials=6),
    )
    seen = set()
    for _ in range(40):
        trial = study.ask()
        k = space.suggest(trial)
        p = space.params(k)
        spec = k.spec_config()  # raises EngineInputError for a refused combination
        if p["drafter"] != "model":
            assert p["tree_topk"] == "chain" and "tree_topk" not in trial.params and spec.tree_topk == ()
        if p["tree_topk"] != "chain":
            assert (p["gamma"], p["confidence_threshold"], p["gamma_schedule"]) == (2, 0.0, "constant")
            assert spec.tree_topk == (2, 1) and "gamma" not in trial.params
            assert "confidence_threshold" not in trial.params and "gamma_schedule" not in trial.params
        seen.add((p["drafter"], p["tree_topk"]))
        study.tell(trial, [1.0, 1.0])
    assert ("model", "2,1") in seen and ("model", "chain") in seen


def test_clip_keeps_a_tree_warm_start_inside_the_space() -> None:
    space = study_mod.shape_space(CFG, measurement={})
    assert space.clip(Knobs("model", 2, max_batch_size=2, tree=(2, 1))) == {
        "drafter": "model",
        "tree_topk": "2,1",
    }
    assert (
        space.clip(Knobs("model", 3, max_batch_size=2, tree=(3, 3)))["tree_topk"] == "chain"
    )  # not searched
    assert "tree_topk" not in space.clip(Knobs("ngram", 3, tree=(2, 1)))
    only_trees = dataclasses.replace(space, tree_shapes=((2, 1),))
    assert only_trees.clip(Knobs("model", 3)) == {"drafter": "model"}  # the one shape is fixed


def test_the_eagle3_head_drafts_trees_in_the_space_and_ngram_never_does() -> None:
    """With the head searched beside the draft model, tree shapes are suggested for both (a head's tree
    is a tree knob like the draft model's); n-gram trials stay chains."""
    space = dataclasses.replace(
        study_mod.shape_space(CFG, measurement={}), drafters=("model", "eagle3", "ngram")
    )
    study = optuna.create_study(
        directions=["maximize", "minimize"],
        sampler=optuna.samplers.TPESampler(seed=0, multivariate=True, n_startup_trials=10),
    )
    seen = set()
    for _ in range(60):
        trial = study.ask()
        k = space.suggest(trial)
        p = space.params(k)
        spec = k.spec_config()  # raises EngineInputError for a refused combination
        if p["tree_topk"] != "chain":
            assert p["drafter"] in ("model", "eagle3") and k.is_tree and spec.tree_topk == (2, 1)
            assert (p["gamma"], p["confidence_threshold"], p["gamma_schedule"]) == (2, 0.0, "constant")
        seen.add((p["drafter"], p["tree_topk"]))
        study.tell(trial, [1.0, 1.0])
    assert {("eagle3", "2,1"), ("eagle3", "chain"), ("model", "2,1")} <= seen
    assert ("ngram", "2,1") not in seen
    head_tree = Knobs.for_tree((2, 1), 2, "eagle3")
    assert head_tree.is_tree and head_tree.tree_name == "2,1" and head_tree.spec_config().tree_topk == (2, 1)
    assert space.clip(head_tree) == {"drafter": "eagle3", "tree_topk": "2,1"}
    assert "tree_topk" not in space.clip(Knobs("ngram", 3, tree=(2, 1)))
    assert not Knobs("ngram", 2, tree=(2, 1)).is_tree and not Knobs("hybrid", 2, tree=(2, 1)).is_tree


def test_a_tree_is_less_simple_than_a_chain_of_the_same_policy() -> None:
    chain = Knobs("model", 2, 0.3, "constant")
    tree = Knobs("model", 2, 0.0, "constant", tree=(2, 1))
    assert chain.simplicity < tree.simplicity
    assert tree.label == "gamma=2 thr=0.00 constant tree=2,1" and "tree" not in chain.label


# --- cost model ----------------------------------------------------------------------------------


def test_tree_expected_tokens_reduces_to_the_greedy_chain_and_grows_with_width() -> None:
    ranks = [[0, 0, 1, 0, 2, 0, 0, 5], [1, 0, 0]]
    chain = tree_expected_tokens(ranks, (1, 1, 1))
    # the chain's E from the same data: count leading zeros (rank 0 = the draft's argmax = greedy acceptance)
    starts = [seq[t:] for seq in ranks for t in range(len(seq))]
    lead = [next((i for i, r in enumerate(s[:3]) if r != 0), min(3, len(s))) for s in starts]
    assert chain == pytest.approx(1 + sum(lead) / len(lead))
    assert tree_expected_tokens(ranks, (2, 1, 1)) > chain
    assert tree_expected_tokens(ranks, (3, 3, 3)) >= tree_expected_tokens(ranks, (2, 2, 2))


def test_best_tree_pays_only_where_verify_width_is_cheap() -> None:
    ranks = [[0, 1, 0, 1, 0, 1, 1, 0, 2, 0]] * 3
    flat = Curves({1: dict.fromkeys(range(1, 12), 0.010)}, {1: 0.001})  # memory-bound: width is free
    steep = Curves({1: {k: 0.010 * k for k in range(1, 12)}}, {1: 0.001})  # compute-bound
    shapes = [(1, 1), (2, 1), (2, 2), (3, 1, 1)]
    best_flat, _ = best_tree(flat, ranks, shapes, 1)
    best_steep, _ = best_tree(steep, ranks, shapes, 1)
    assert best_flat != (1, 1) and best_steep == (1, 1)
    # two draft forwards of one token, one verify of 1 + 2 tokens: what a chain of gamma 2 costs
    assert predict_tree(flat, ranks, (1, 1), 1).step_time_s == pytest.approx(0.012)


# --- the profiler's extension and warm starts ----------------------------------------------------


def test_extend_for_trees_measures_only_what_is_missing(tiny_pair_dirs, tune_config) -> None:
    from autotune import context
    from autotune.device import profiler

    cfg = tune_config(search={"tree_topk": ["chain", "2,1"]})
    ctx = context.build(cfg)
    try:
        measurement, reused = context.ensure_profile(ctx)
        assert reused and "tree_ranks" not in measurement["acceptance"]
        extended = profiler.extend_for_trees(ctx.pair, ctx.requests, measurement, cfg.search.tree_topk)
        for b, row in extended["curves"]["t_verify"].items():
            assert sorted(map(int, row)) == [1, 2, 3, 4, 5], b  # gamma_max 2 -> 3; the tree's 4 nodes -> 5
            for k in ("1", "2", "3"):
                assert row[k] == measurement["curves"]["t_verify"][b][k]  # nothing measured changes
        ranks = extended["acceptance"]["tree_ranks"]
        assert ranks and all(0 <= r <= 16 for seq in ranks for r in seq)
        assert profiler.extend_for_trees(ctx.pair, ctx.requests, extended, cfg.search.tree_topk) is None
        warm = study_mod.warm_starts(ctx, study_mod.shape_space(cfg, extended), extended, None)
        labels = [label for label, _ in warm]
        assert any(label.startswith("cost model best tree at batch") for label in labels)
        tree_points = [p for label, p in warm if label.startswith("cost model best tree")]
        assert tree_points[0]["tree_topk"] == "2,1"
    finally:
        ctx.store.close()


def test_tree_ranks_pair_each_output_with_its_own_prompt(tiny_pair_dirs) -> None:
    """Draft == target, greedy: every target token is the draft's argmax, so every rank is 0 -- but
    only if each output is ranked after its own prompt. The profiler passes a spread of the
    workload (ids like 5, 17, 30), while a run numbers its records 0, 1, 2: pairing by the
    request's id once kept 1 request in 8 and ranked outputs after other prompts."""
    from autotune.device.profiler import measure_tree_ranks
    from engine.loader import load_pair
    from engine.speculative import Request

    target, _ = tiny_pair_dirs
    pair = load_pair(target, target)
    prompts = [[5, 9, 2, 7], [11, 3], [4, 4, 8, 1, 6, 2], [13]]
    requests = [Request(p, 8, id=i) for i, p in zip((5, 17, 30, 41), prompts, strict=True)]
    ranks = measure_tree_ranks(pair, requests)
    assert [len(r) for r in ranks] == [8, 8, 8, 8]
    assert all(rank == 0 for seq in ranks for rank in seq)


def test_autotune_profile_measures_what_trees_need_when_they_are_searched(tune_config) -> None:
    """`autotune profile` stores the same tree extension `autotune tune` would measure (widths, ranks)."""
    from click.testing import CliRunner

    from autotune.cli import main

    cfg = tune_config(search={"tree_topk": ["chain", "2,1"]})
    result = CliRunner().invoke(main, ["profile", "--config", str(cfg.source), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert all(sorted(map(int, row)) == [1, 2, 3, 4, 5] for row in data["curves"]["t_verify"].values())
    assert data["acceptance"]["tree_ranks"]
    from autotune import context

    ctx = context.build(cfg)  # what the next `autotune tune` finds stored
    try:
        stored, reused = context.ensure_profile(ctx)
    finally:
        ctx.store.close()
    assert reused and stored["acceptance"]["tree_ranks"] == data["acceptance"]["tree_ranks"]


# --- a short real study with trees searched ------------------------------------------------------


def test_real_study_searches_trees_and_stores_the_shape(tune_config) -> None:
    """Trials run the real engine on the tiny pair; a tree trial runs, the space and trials carry the shape."""
    cfg = tune_config(
        search={"tree_topk": ["chain", "2,1"], "confidence_threshold": 0.0, "gamma": {"low": 0, "high": 2}},
        budget={"n_trials": 4, "repeats": 1, "remeasure_top": 1},
        export={"formats": ["sglang", "vllm", "yaml"]},
    )
    lines: list[str] = []
    profile = run_tune(cfg, say=lines.append)
    assert any("tree verify widths and draft ranks measured and stored" in line for line in lines)
    assert profile["study"]["space"]["tree_topk"] == ["chain", "2,1"]
    trees = [t for t in profile["trials"] if t["params"].get("tree_topk") == "2,1"]
    assert trees and all(
        t["params"]["gamma"] == 2 and t["params"]["confidence_threshold"] == 0.0 for t in trees
    )
    assert profile["chosen"]["tree_topk"] in ("chain", "2,1")
    with Store(cfg.storage.url) as store:
        assert store.get_profile(profile["id"])["chosen"] == profile["chosen"]


def _tree_wins(cfg, knobs: Knobs, seed: int) -> TrialResult:  # noqa: ARG001 - a backend run's signature
    """Deterministic stand-in: the 2,1 tree is the fastest configuration at every level."""
    g = knobs.gamma
    per_level = {}
    for c in cfg.workload.concurrency:
        tps = 100.0 * c + 10.0 * g + (50.0 if knobs.is_tree else 0.0) - 5.0 * knobs.confidence_threshold
        per_level[c] = {
            "tokens_per_second": tps,
            "tpot_ms_p95": 30.0,
            "generated_tokens": 12,
            "wall_s": 12 / tps,
        }
    return result_of(per_level)


def test_a_chosen_tree_is_stored_and_exported(tune_config, tmp_path) -> None:
    cfg = tune_config(
        search={"tree_topk": ["chain", "2,1"]},
        budget={"n_trials": 6, "repeats": 3},
        export={"formats": ["sglang", "vllm", "trtllm", "yaml"]},
    )
    profile = run_tune(cfg, say=lambda s: None, backend_for=backend_of(_tree_wins))
    chosen = profile["chosen"]
    assert chosen["tree_topk"] == "2,1" and chosen["gamma"] == 2
    assert chosen["best_chain"]["gamma"] >= 1 and list(chosen)[:5] == [
        "drafter",
        "gamma",
        "confidence_threshold",
        "gamma_schedule",
        "max_batch_size",
    ]
    assert all(
        e["gamma"] <= cfg.search.gamma.high for e in profile["schedule"]
    )  # the schedule is a chain table
    assert profile["predicted_vs_measured"][0]["tree_topk"] == "2,1"
    sglang = Path(cfg.export.dir, "sglang-args.sh").read_text()
    assert "--speculative-eagle-topk 2" in sglang and "--speculative-num-draft-tokens 5" in sglang
    vllm = json.loads(Path(cfg.export.dir, "vllm-speculative-config.json").read_text())
    assert vllm["method"] == "draft_model"
    meta = json.loads(Path(cfg.export.dir, "vllm-speculative-config.json.meta.json").read_text())
    assert any("token tree 2,1" in n and "best measured chain" in n for n in meta["notes"])
    assert "token tree 2,1" in export(profile, "trtllm").text.replace("\n#   ", " ")


def test_real_study_searches_dynamic_trees(tune_config) -> None:
    """A dynamic tree is a value of search.tree_topk: its trials run the engine's dynamic tree."""
    cfg = tune_config(
        search={"tree_topk": ["chain", "2x2/4"], "confidence_threshold": 0.0, "gamma": {"low": 0, "high": 2}},
        budget={"n_trials": 5, "repeats": 1, "remeasure_top": 1},
    )
    profile = run_tune(cfg, say=lambda s: None)
    assert profile["study"]["space"]["tree_topk"] == ["chain", "2x2/4"]
    dyn = [t for t in profile["trials"] if t["params"].get("tree_topk") == "2x2/4"]
    assert dyn and all(t["params"]["gamma"] == 2 and t["tokens_per_second"] > 0 for t in dyn)  # ran: measured
    assert Knobs.from_params(dyn[0]["params"]).spec_config().tree == DynamicTree(2, 2, 4)


def test_a_chosen_dynamic_tree_is_stored_exported_and_not_predicted(tune_config) -> None:
    """The dynamic tree wins (deterministic stand-in): stored by name, exported to SGLang one to one,
    no cost-model prediction beside it."""
    cfg = tune_config(
        search={"tree_topk": ["chain", "2x2/4"]},
        budget={"n_trials": 6, "repeats": 3},
        export={"formats": ["sglang", "vllm"]},
    )
    profile = run_tune(cfg, say=lambda s: None, backend_for=backend_of(_tree_wins))
    assert profile["chosen"]["tree_topk"] == "2x2/4" and profile["chosen"]["gamma"] == 2
    assert profile["predicted_vs_measured"] == []
    sglang = Path(cfg.export.dir, "sglang-args.sh").read_text()
    assert "--speculative-num-steps 2" in sglang and "--speculative-eagle-topk 2" in sglang
    assert "--speculative-num-draft-tokens 5" in sglang


def test_the_engine_backend_passes_the_tree_and_the_ngram_window_to_the_engine(monkeypatch) -> None:
    from autotune.backends import engine as engine_backend

    seen = {}

    def run_load(pair, requests, spec, drafter, load, seed, time_limit_s=None, **kw):  # noqa: ARG001
        seen.update(spec=spec, drafter=drafter, kw=kw)
        return SimpleNamespace(metrics={"generated_tokens": 4, "wall_s": 0.2, "tpot_ms_p95": 1.0})

    monkeypatch.setattr(engine_backend, "run_load", run_load)
    cfg = dataclasses.replace(
        CFG,
        workload=dataclasses.replace(CFG.workload, concurrency=(1,)),
        budget=dataclasses.replace(CFG.budget, trial_timeout_s=None),
    )
    backend = engine_backend.EngineBackend(SimpleNamespace(cfg=cfg, pair=None, requests=[]))
    backend.run(Knobs("model", 2, max_batch_size=2, tree=(2, 1)), 0)
    assert seen["spec"].tree_topk == (2, 1) and seen["spec"].gamma == 2 and seen["kw"] == {}
    backend.run(Knobs("hybrid", 3, 0.1, "constant", 2), 0)
    assert seen["drafter"] == "hybrid" and seen["kw"] == {"ngram": (2, 4)} and seen["spec"].tree_topk == ()
