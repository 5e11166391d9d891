"""The eagle3 drafter through the tuner: tune.yaml -> context -> profiler -> study -> profile -> exports.

A random EAGLE-3 head for the tiny target, written in vLLM's layout (tests/engine/test_eagle3.py
makes and checks heads; here one is only carried through). The profiler runs for real on it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import optuna
import pytest
import yaml

from autotune.config import load_config
from autotune.errors import ConfigError
from autotune.jobs.tune import run_tune
from autotune.knobs import Knobs
from autotune.records import TrialResult
from engine.loader import load_pair
from profiles.errors import ProfileError
from profiles.exporters import EAGLE3_FORMATS, FORMATS, export
from profiles.store import Store
from tests.autotune.conftest import write_config
from tests.autotune.fakes import backend_of, result_of
from tests.engine.test_eagle3 import head_config, random_head, write_vllm_folder


@pytest.fixture(scope="module")
def head_dir(tiny_pair_dirs, tmp_path_factory):
    target = load_pair(tiny_pair_dirs[0], None).target
    c = target.config
    raw = head_config(c, c.vocab_size, ids=[0, 1, c.num_hidden_layers])
    head = random_head(target, raw, None, seed=0, std=0.05)
    return write_vllm_folder(tmp_path_factory.mktemp("head") / "eagle3", raw, head)


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "def add(a, b):\\n"}\n{"prompt": "for i in range(10):\\n"}\n')
    return path


def eagle3_config(tmp_path, tiny_pair_dirs, prompts, head_dir, **overrides):
    over = {"models": {"eagle3": str(head_dir)}, "search": {"drafter": ["eagle3"]}, **overrides}
    return load_config(write_config(tmp_path, tiny_pair_dirs, prompts, tmp_path / "a.db", **over))


def test_a_tune_of_the_eagle3_drafter_profiles_the_head_and_keys_the_pair_by_it(
    tmp_path, tiny_pair_dirs, prompts, head_dir
) -> None:
    cfg = eagle3_config(tmp_path, tiny_pair_dirs, prompts, head_dir)
    assert cfg.draft_folder == head_dir
    profile = run_tune(cfg, say=lambda line: None)
    assert profile["pair"]["drafter"] == "eagle3" and profile["pair"]["draft"] == str(head_dir)
    assert profile["pair"]["draft_hash"]
    assert set(profile["curves"]["t_draft"]) == set(profile["curves"]["t_verify"])  # the head was timed
    assert all(t > 0 for t in profile["curves"]["t_draft"].values())
    assert profile["acceptance"]["drafter"] == "eagle3"
    assert profile["chosen"]["drafter"] in ("eagle3", "none")
    drafters = {t["params"]["drafter"] for t in profile["trials"] if "params" in t}
    assert drafters <= {"eagle3"}
    with Store(cfg.storage.url) as store:
        assert store.get_profile(profile["id"])["pair"] == profile["pair"]


def test_one_study_searches_the_draft_model_the_head_and_ngram_and_keys_the_pair_by_the_draft(
    tmp_path, tiny_pair_dirs, prompts, head_dir
) -> None:
    """``search.drafter: [eagle3, model, ngram]``: the profiler measures the draft model (the pair's
    drafter, whatever the order), every drafter is measured live from the warm starts on, and the
    profile names the head beside the pair (``pair.eagle3``) for the exports."""
    drafters = ["eagle3", "model", "ngram"]
    cfg = eagle3_config(
        tmp_path, tiny_pair_dirs, prompts, head_dir, search={"drafter": drafters}, budget={"n_trials": 7}
    )
    assert cfg.draft_folder == tiny_pair_dirs[1] and cfg.head_beside == head_dir
    lines: list[str] = []
    profile = run_tune(cfg, say=lines.append)
    pair = profile["pair"]
    assert (pair["drafter"], pair["draft"], pair["eagle3"]) == (
        "model",
        str(tiny_pair_dirs[1]),
        str(head_dir),
    )
    assert pair["draft_hash"] and pair["eagle3_hash"] and pair["eagle3_hash"] != pair["draft_hash"]
    assert profile["acceptance"]["drafter"] == "model"
    study = optuna.load_study(study_name=profile["study"]["name"], storage=cfg.storage.url)
    warm = {t.user_attrs.get("warm_start"): t.params.get("drafter") for t in study.get_trials(deepcopy=False)}
    assert (
        warm["eagle3 at the cost model's gamma"] == "eagle3"
        and warm["ngram at the cost model's gamma"] == "ngram"
    )
    tried = {t["params"]["drafter"] for t in profile["trials"] if t["params"].get("gamma", 0) > 0}
    assert {"model", "eagle3", "ngram"} <= tried
    if profile["chosen"]["drafter"] == "eagle3":
        assert profile["predicted_vs_measured"] == []  # the profiler timed the draft model, not the head


def test_a_head_chosen_beside_the_draft_model_is_what_the_stacks_load(head_dir) -> None:
    profile = {
        "tool_version": "0.1.0",
        "created_at": "2026-12-01T00:00:00+00:00",
        "device": {"key": "k", "label": "CPU"},
        "pair": {"target": "/m/t", "draft": "/m/d", "drafter": "model", "eagle3": str(head_dir)},
        "chosen": {"drafter": "eagle3", "gamma": 2},
        "schedule": [{"batch_size": 1, "gamma": 2}],
    }
    out = export(profile, "vllm")
    assert '"method": "eagle3"' in out.text and f'"model": "{head_dir}"' in out.text
    as_model = {**profile, "chosen": {"drafter": "model", "gamma": 2}}
    assert '"model": "/m/d"' in export(as_model, "vllm").text


def test_an_eagle3_profile_exports_to_every_stack_that_serves_a_head_and_is_refused_elsewhere(
    head_dir, tiny_pair_dirs
) -> None:
    profile = {
        "tool_version": "0.1.0",
        "created_at": "2026-12-01T00:00:00+00:00",
        "device": {"key": "k", "label": "CPU"},
        "pair": {"target": "/m/t", "draft": str(head_dir), "drafter": "eagle3"},
        "chosen": {"drafter": "eagle3", "gamma": 3},
        "schedule": [{"batch_size": 1, "gamma": 3}, {"batch_size": 4, "gamma": 1}],
    }
    out = export(profile, "vllm")
    assert '"method": "eagle3"' in out.text and f'"model": "{head_dir}"' in out.text
    assert '"num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 4, 1]]' in out.text.replace("\n", "")
    assert export(profile, "yaml").text
    gguf = {**profile, "pair": {**profile["pair"], "target": "/g/t.gguf", "draft": "/g/head.gguf"}}
    script = export(gguf, "llamacpp").command
    assert "--spec-type draft-eagle3 -md /g/head.gguf --spec-draft-n-max 3 --spec-draft-n-min 0" in script
    sglang = export(profile, "sglang").command
    assert (
        f"--speculative-algorithm EAGLE3 --speculative-draft-model-path {head_dir} --speculative-num-steps 3 "
        "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
    ) in sglang
    trt = yaml.safe_load(export(profile, "trtllm").text)["speculative_config"]
    n_layers = load_pair(tiny_pair_dirs[0], None).target.config.num_hidden_layers
    assert trt == {
        "decoding_type": "Eagle3",
        "max_draft_len": 3,
        "speculative_model": str(head_dir),
        "eagle3_layers_to_capture": [0, 1, n_layers],  # the head's eagle_config ids, read from its folder
        "draft_len_schedule": {1: 3, 4: 1},
    }
    elsewhere = copy.deepcopy(profile)  # a head folder not on this machine: no layer ids, and a note
    elsewhere["pair"]["draft"] = "/not/here/eagle3"
    away = export(elsewhere, "trtllm")
    assert "eagle3_layers_to_capture" not in yaml.safe_load(away.text)["speculative_config"]
    assert any("set eagle3_layers_to_capture" in note for note in away.notes)
    assert sorted(set(FORMATS) - set(EAGLE3_FORMATS)) == ["hf", "tgi"]
    for fmt in sorted(set(FORMATS) - set(EAGLE3_FORMATS)):
        with pytest.raises(ProfileError, match=rf"^{fmt} export: the chosen drafter is 'eagle3'"):
            export(profile, fmt)
    off = copy.deepcopy(profile)  # a stack of one K reads chosen.gamma, not the schedule: refused too
    off["schedule"] = [{"batch_size": 1, "gamma": 0}]
    with pytest.raises(ProfileError, match="^tgi export: the chosen drafter is 'eagle3'"):
        export(off, "tgi")
    missing = copy.deepcopy(profile)
    missing["pair"]["draft"] = None
    with pytest.raises(ProfileError, match="missing key 'pair.draft'.*EAGLE-3 head folder"):
        export(missing, "vllm")


def test_the_vllm_backend_serves_the_head_as_the_vllm_export_says(
    tmp_path, tiny_pair_dirs, prompts, head_dir
) -> None:
    """A vLLM trial of the eagle3 drafter serves ``method: eagle3`` with the head folder, byte for byte
    the flags the vllm export of the same choice writes."""
    import json
    import shlex
    import sys
    from pathlib import Path

    from autotune.backends import vllm as vllm_backend
    from autotune.knobs import Knobs

    cfg = eagle3_config(
        tmp_path,
        tiny_pair_dirs,
        prompts,
        head_dir,
        backend={"name": "vllm", "vllm": {"command": sys.executable}},
    )
    fp = {"label": "CPU", "key": "k"}
    knobs = Knobs("eagle3", 3, max_batch_size=2)
    cmd = vllm_backend.serve_command(Path(sys.executable), vllm_backend.trial_inputs(cfg, fp, knobs))
    served = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert served["method"] == "eagle3" and served["model"] == str(head_dir)
    assert served["num_speculative_tokens"] == 3
    profile = {
        "tool_version": "0",
        "created_at": "2026-12-01T00:00:00+00:00",
        "device": fp,
        "pair": {"target": str(cfg.models.target), "draft": str(head_dir), "drafter": "eagle3"},
        "chosen": {"drafter": "eagle3", "gamma": 3, "max_batch_size": 2},
        "schedule": [{"batch_size": 2, "gamma": 3}],
    }
    assert ["vllm", *cmd[2 : cmd.index("--host")]] == shlex.split(export(profile, "vllm").command)
    off = vllm_backend.trial_inputs(cfg, fp, Knobs("none", 0, max_batch_size=2))
    assert "--speculative-config" not in vllm_backend.serve_command(Path(sys.executable), off)


def _head_tree_wins(cfg, knobs: Knobs, seed: int) -> TrialResult:  # noqa: ARG001 - a backend run's signature
    """Deterministic stand-in: the head's trees are the fastest configurations at every level."""
    per_level = {}
    for c in cfg.workload.concurrency:
        tps = 100.0 * c + 10.0 * knobs.gamma + (50.0 if knobs.is_tree and knobs.drafter == "eagle3" else 0.0)
        per_level[c] = {
            "tokens_per_second": tps,
            "tpot_ms_p95": 30.0,
            "generated_tokens": 12,
            "wall_s": 12 / tps,
        }
    return result_of(per_level)


def test_the_heads_trees_are_searched_chosen_and_exported(
    tmp_path, tiny_pair_dirs, prompts, head_dir
) -> None:
    """``search.tree_topk`` with the draft model and the head: the head's tree trials run in the engine
    (measured), and a head's tree that wins is stored with its drafter and exported to SGLang as an
    EAGLE3 tree (num-steps = depth, eagle-topk, num-draft-tokens = nodes + 1)."""
    search = {"drafter": ["model", "eagle3"], "tree_topk": ["2,1", "2x2/3"], "confidence_threshold": 0.0}
    cfg = eagle3_config(
        tmp_path,
        tiny_pair_dirs,
        prompts,
        head_dir,
        search=search,
        budget={"n_trials": 4, "repeats": 1, "remeasure_top": 1},
    )
    profile = run_tune(cfg, say=lambda line: None)
    heads = [t for t in profile["trials"] if t["params"].get("drafter") == "eagle3"]
    assert heads and all(
        t["params"]["tree_topk"] in ("2,1", "2x2/3") and t["params"]["gamma"] == 2 for t in heads
    )
    assert all(t["tokens_per_second"] > 0 for t in heads)  # ran in the engine: measured
    assert Knobs.from_params(heads[0]["params"]).spec_config().tree is not None

    cfg = eagle3_config(
        tmp_path,
        tiny_pair_dirs,
        prompts,
        head_dir,
        search={**search, "tree_topk": ["2,1"]},
        budget={"n_trials": 4, "repeats": 3},
        export={"formats": ["sglang", "vllm"]},
    )
    profile = run_tune(cfg, say=lambda line: None, backend_for=backend_of(_head_tree_wins))
    chosen = profile["chosen"]
    assert (chosen["drafter"], chosen["tree_topk"], chosen["gamma"]) == ("eagle3", "2,1", 2)
    assert profile["predicted_vs_measured"] == []  # the cost model predicts the draft model's trees only
    assert "--speculative-algorithm EAGLE3" in Path(cfg.export.dir, "sglang-args.sh").read_text()
    assert (
        f"--speculative-algorithm EAGLE3 --speculative-draft-model-path {head_dir} --speculative-num-steps 2 "
        "--speculative-eagle-topk 2 --speculative-num-draft-tokens 5"  # 2 + 2 nodes of 2 + 4 candidates, + 1
    ) in export(profile, "sglang").command
    vllm = json.loads(Path(cfg.export.dir, "vllm-speculative-config.json").read_text())
    assert vllm["method"] == "eagle3" and vllm["model"] == str(head_dir)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"models": {"eagle3": None}}, "models.eagle3: required when search.drafter includes 'eagle3'"),
        (
            {"search": {"drafter": ["ngram"], "tree_topk": ["2,1"]}},
            "a tree needs the 'model' or 'eagle3' drafter in search.drafter",
        ),
    ],
)
def test_eagle3_config_mistakes_are_one_line(
    tmp_path, tiny_pair_dirs, prompts, head_dir, overrides, message
) -> None:
    over = {"models": {"eagle3": str(head_dir)}, "search": {"drafter": ["eagle3"]}}
    for section, values in overrides.items():
        over[section] = {**over.get(section, {}), **values}
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(write_config(tmp_path, tiny_pair_dirs, prompts, tmp_path / "a.db", **over))


def test_the_head_alone_searches_trees(tmp_path, tiny_pair_dirs, prompts, head_dir) -> None:
    """No draft model is needed for the head's trees: an eagle3-only study takes search.tree_topk."""
    over = {"models": {"eagle3": str(head_dir)}, "search": {"drafter": ["eagle3"], "tree_topk": ["2,1"]}}
    cfg = load_config(write_config(tmp_path, tiny_pair_dirs, prompts, tmp_path / "a.db", **over))
    assert cfg.trees_searched and cfg.search.drafter == ("eagle3",)


def test_bench_runs_the_eagle3_drafter_and_matches_the_target(tiny_pair_dirs, prompts, head_dir) -> None:
    import json

    from click.testing import CliRunner

    from autotune.cli import main

    base = ["bench", "--target", str(tiny_pair_dirs[0]), "--drafter", "eagle3", "--gamma", "2"]
    base += ["--num-requests", "2", "--max-new-tokens", "6", "--prompts", str(prompts), "--device", "cpu"]
    result = CliRunner().invoke(main, [*base, "--eagle3", str(head_dir), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["drafter"] == "eagle3" and out["greedy_match"] is True, out
    result = CliRunner().invoke(main, base)
    assert result.exit_code == 2 and "--drafter eagle3 needs --eagle3 HEAD_FOLDER" in result.output


def test_chain_stacks_get_the_best_chain_of_the_chosen_trees_drafter() -> None:
    """A head's tree exports to chain-only stacks as the head's fastest chain, even where a draft
    model chain measured faster (that gamma was measured for another drafter)."""
    from autotune.decide.decision import _best_chain
    from autotune.records import Point

    model4 = Point(Knobs("model", 4), 300.0, 10.0)
    head2, head3 = Point(Knobs("eagle3", 2), 200.0, 10.0), Point(Knobs("eagle3", 3), 250.0, 10.0)
    tree = Point(Knobs.for_tree((2, 1), 16, "eagle3"), 400.0, 10.0)
    remeasured = [tree, Point(Knobs("eagle3", 3), 240.0, 10.0)]
    chain = _best_chain([model4, head2, head3, tree], remeasured, "eagle3")
    assert chain is not None and (chain["gamma"], chain["tokens_per_second"]) == (3, 240.0)
    assert _best_chain([model4, head2, head3, tree], [tree], "eagle3")["tokens_per_second"] == 250.0
    assert _best_chain([model4, head2, tree], [], "model")["gamma"] == 4
    assert _best_chain([tree], [], "eagle3") is None
