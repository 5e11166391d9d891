"""Exports of a profile that chose a token tree or the hybrid drafter (issue 13).

SGLang takes the tree (STANDALONE with --speculative-eagle-topk > 1); every other stack gets the
best measured chain with a note; the hybrid drafter is exported as the draft model with a note.
Profiles without trees export byte-identically (the golden tests in test_exporters.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profiles.errors import ProfileError
from profiles.exporters import FORMATS, export, sglang
from profiles.schema import Chosen

GOLDEN = Path(__file__).parent / "golden"
BEST_CHAIN = {
    "gamma": 4,
    "confidence_threshold": 0.3,
    "gamma_schedule": "constant",
    "tokens_per_second": 700.0,
}


@pytest.fixture
def tree_profile(make_profile):
    """The sample profile (chain gamma 4, threshold 0.3) with the tree 2,1,1 chosen over that chain."""
    return make_profile(gamma=3, confidence_threshold=0.0, tree_topk="2,1,1", best_chain=dict(BEST_CHAIN))


def _flags(text: str) -> dict[str, str]:
    lines = [ln.strip().rstrip("\\").strip() for ln in text.splitlines() if ln.strip().startswith("--")]
    return dict(ln.split(" ", 1) for ln in lines if " " in ln)


def test_sglang_exports_the_tree_as_standalone_topk(tree_profile) -> None:
    out = export(tree_profile, "sglang")
    flags = _flags(out.text)
    assert flags["--speculative-algorithm"] == "STANDALONE"
    assert (
        flags["--speculative-num-steps"],
        flags["--speculative-eagle-topk"],
        flags["--speculative-num-draft-tokens"],
    ) == ("3", "2", "7")  # 6 nodes + the verified token
    assert any(
        "STANDALONE accepts --speculative-eagle-topk > 1" in n and "_handle_eagle_family" in n
        for n in out.notes
    )
    assert not any("confidence_threshold" in n for n in out.notes)  # a tree has none


def test_sglang_caps_draft_tokens_at_the_trees_candidates(make_profile) -> None:
    profile = make_profile(gamma=3, confidence_threshold=0.0, tree_topk="2,2,2", best_chain=dict(BEST_CHAIN))
    flags = _flags(export(profile, "sglang").text)
    assert flags["--speculative-num-draft-tokens"] == "11"  # 14 nodes, 2 + 2 * 4 = 10 candidates


def test_sglang_exports_a_dynamic_tree_one_to_one(make_profile) -> None:
    """SGLang's tree is EAGLE-2's selection: top-k, steps and verified nodes map directly (no cap, no reshaping)."""
    out = export(
        make_profile(gamma=6, confidence_threshold=0.0, tree_topk="2x6/10", best_chain=dict(BEST_CHAIN)),
        "sglang",
    )
    flags = _flags(out.text)
    assert (
        flags["--speculative-num-steps"],
        flags["--speculative-eagle-topk"],
        flags["--speculative-num-draft-tokens"],
    ) == ("6", "2", "11")
    note = next(n for n in out.notes if "Token tree 2x6/10 (dynamic" in n)
    assert "the engine measured this selection" in note and "not this exact static shape" not in note


@pytest.mark.parametrize("fmt", ["vllm", "trtllm", "llamacpp", "hf"])
def test_chain_stacks_export_the_best_chain_for_a_dynamic_tree(fmt, make_profile, profile) -> None:
    out = export(
        make_profile(gamma=6, confidence_threshold=0.0, tree_topk="2x6/10", best_chain=dict(BEST_CHAIN)), fmt
    )
    assert any("token tree 2x6/10 (dynamic, EAGLE-2" in n and "best measured chain" in n for n in out.notes)
    if fmt in ("vllm", "hf"):
        assert out.text == export(profile, fmt).text


def _head_tree(make_profile, tree_topk: str, gamma: int) -> dict:
    """The sample profile with an EAGLE-3 head's tree chosen over the head's best chain (BEST_CHAIN)."""
    out = make_profile(
        drafter="eagle3",
        gamma=gamma,
        confidence_threshold=0.0,
        tree_topk=tree_topk,
        best_chain=dict(BEST_CHAIN),
    )
    out["pair"]["draft"] = "/m/head"
    return out


@pytest.mark.parametrize(
    ("tree_topk", "gamma", "flags"),
    [("2,1,1", 3, ("3", "2", "7")), ("2x6/10", 6, ("6", "2", "11"))],
)
def test_sglang_exports_a_heads_tree_as_eagle3_topk(make_profile, tree_topk, gamma, flags) -> None:
    """The head's static or dynamic tree: EAGLE3 with the head folder and the tree's three flags."""
    out = export(_head_tree(make_profile, tree_topk, gamma), "sglang")
    got = _flags(out.text)
    assert (got["--speculative-algorithm"], got["--speculative-draft-model-path"]) == ("EAGLE3", "/m/head")
    assert (
        got["--speculative-num-steps"],
        got["--speculative-eagle-topk"],
        got["--speculative-num-draft-tokens"],
    ) == flags
    assert any(
        f"Token tree {tree_topk}" in n and "EAGLE3 accepts --speculative-eagle-topk > 1" in n
        for n in out.notes
    )


@pytest.mark.parametrize("fmt", ["vllm", "trtllm", "llamacpp"])
def test_chain_stacks_export_the_heads_best_chain_for_its_tree(fmt, make_profile) -> None:
    """Stacks exported without trees get the head's best measured chain (``chosen.best_chain``), as the
    head: the same file as a profile that chose that chain of the head."""
    out = export(_head_tree(make_profile, "2,1,1", 3), fmt)
    note = next(n for n in out.notes if "token tree 2,1,1" in n)
    assert "best measured chain of the EAGLE-3 head instead: gamma 4" in note and "draft model" not in note
    chain = make_profile(drafter="eagle3")
    chain["pair"]["draft"] = "/m/head"
    want = export(chain, fmt)
    if fmt == "vllm":
        assert out.text == want.text and json.loads(out.text)["method"] == "eagle3"
    else:
        body = [ln for ln in out.text.splitlines() if not ln.startswith("#")]
        assert body == [ln for ln in want.text.splitlines() if not ln.startswith("#")]


def test_chosen_takes_a_tree_of_the_head() -> None:
    chosen = Chosen.from_json({"drafter": "eagle3", "gamma": 2, "tree_topk": "2,1"})
    assert chosen.tree_shape == (2, 1)
    assert Chosen.from_json({"drafter": "eagle3", "gamma": 3, "tree_topk": "2x3/5"}).tree_nodes == 5


@pytest.mark.parametrize(
    "args, message",
    [
        ({"--speculative-eagle-topk": 2}, "with topk > 1 set --speculative-num-draft-tokens"),
        (
            {"--speculative-eagle-topk": 2, "--speculative-num-draft-tokens": 12},
            "exceeds the tree's 10 candidate nodes",
        ),
    ],
)
def test_sglang_validate_refuses_impossible_trees(args, message) -> None:
    base = {
        "--model-path": "/m/t",
        "--speculative-algorithm": "STANDALONE",
        "--speculative-draft-model-path": "/m/d",
        "--speculative-num-steps": 3,
    }
    with pytest.raises(ProfileError, match=message):
        sglang.validate({**base, **args})


@pytest.mark.parametrize("fmt", ["vllm", "trtllm", "llamacpp", "hf"])
def test_chain_stacks_export_the_best_chain_with_a_note(fmt, tree_profile, profile) -> None:
    """The best chain here is the sample's own chosen chain, so the exported settings equal the golden file's."""
    out, chain = export(tree_profile, fmt), export(profile, fmt)
    note = next(n for n in out.notes if "token tree 2,1,1" in n)
    assert "takes no token tree for a draft-model drafter" in note and "best measured chain" in note
    if fmt in ("vllm", "hf"):
        assert out.text == chain.text  # the JSON itself; the note is in the sidecar
        assert note in json.loads(out.sidecar)["notes"]
    else:
        body = [ln for ln in out.text.splitlines() if not ln.startswith("#")]
        assert body == [ln for ln in chain.text.splitlines() if not ln.startswith("#")]


def test_tgi_notes_the_tree_too(tree_profile) -> None:
    out = export(tree_profile, "tgi")
    assert "--speculate 4" in out.text and any("token tree 2,1,1" in n for n in out.notes)


def test_without_a_measured_chain_the_trees_depth_is_exported(make_profile) -> None:
    out = export(make_profile(gamma=3, confidence_threshold=0.0, tree_topk="2,1,1"), "vllm")
    assert json.loads(out.text)["num_speculative_tokens"] == 5  # the schedule's largest gamma
    assert any("the study measured no chain" in n and "gamma 3" in n for n in out.notes)


def test_chain_chosen_in_a_tree_study_exports_as_before(make_profile, profile) -> None:
    chain = make_profile(tree_topk="chain")
    for fmt in FORMATS:
        if fmt != "yaml":
            assert export(chain, fmt).text == export(profile, fmt).text, fmt


def _hybrid(make_profile, profile):
    out = make_profile(drafter="hybrid")
    out["pair"]["draft"] = profile["pair"]["draft"]
    return out


@pytest.mark.parametrize("fmt", ["vllm", "sglang", "trtllm", "llamacpp", "hf", "tgi"])
def test_hybrid_is_exported_as_the_draft_model_with_a_note(fmt, make_profile, profile) -> None:
    out, model = export(_hybrid(make_profile, profile), fmt), export(profile, fmt)
    assert any("hybrid drafter" in n and "no per-row switch" in n for n in out.notes)
    if fmt in ("vllm", "hf"):
        assert out.text == model.text
    else:
        assert [ln for ln in out.text.splitlines() if not ln.startswith("#")] == [
            ln for ln in model.text.splitlines() if not ln.startswith("#")
        ]


def test_hybrid_needs_the_draft_path(make_profile) -> None:
    profile = make_profile(drafter="hybrid")  # the fixture drops pair.draft for drafters other than model
    with pytest.raises(ProfileError, match=r"missing key 'pair.draft' \(the chosen drafter is 'hybrid'"):
        export(profile, "vllm")


@pytest.mark.parametrize(
    "chosen, message",
    [
        (
            {"drafter": "model", "gamma": 3, "tree_topk": "2,x,1"},
            "'chosen.tree_topk' must be 'chain', a per-depth",
        ),
        (
            {
                "drafter": "ngram",
                "gamma": 2,
                "tree_topk": "2,1",
                "prompt_lookup_min": 2,
                "prompt_lookup_max": 4,
            },
            "'chosen.tree_topk' '2,1' needs the 'model' or 'eagle3' drafter",
        ),
        ({"drafter": "model", "gamma": 4, "tree_topk": "2,1"}, "has depth 2 but 'chosen.gamma' is 4"),
        ({"drafter": "model", "gamma": 4, "tree_topk": "2x3/5"}, "has depth 3 but 'chosen.gamma' is 4"),
        (
            {"drafter": "model", "gamma": 3, "tree_topk": "2x3/11"},
            r"'2x3/11': a dynamic tree 'KxD/N' needs K >= 2",
        ),
        (
            {"drafter": "model", "gamma": 3, "tree_topk": "1x3/2"},
            r"'1x3/2': a dynamic tree 'KxD/N' needs K >= 2",
        ),
        (
            {"drafter": "model", "gamma": 2, "tree_topk": "2,1", "best_chain": {"gamma": 0}},
            "'chosen.best_chain.gamma' must be >= 1",
        ),
    ],
)
def test_chosen_refuses_bad_trees(chosen, message) -> None:
    with pytest.raises(ProfileError, match=message):
        Chosen.from_json(chosen)


def test_chosen_with_a_tree_round_trips_in_order() -> None:
    data = {
        "drafter": "model",
        "gamma": 3,
        "confidence_threshold": 0.0,
        "gamma_schedule": "constant",
        "max_batch_size": 4,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
        "tree_topk": "2,1,1",
        "best_chain": dict(BEST_CHAIN),
    }
    chosen = Chosen.from_json(data)
    assert (
        chosen.tree_shape == (2, 1, 1) and chosen.to_json() == data and list(chosen.to_json()) == list(data)
    )
    assert Chosen.from_json({"drafter": "model", "gamma": 2}).tree_shape == ()


def test_golden_files_are_untouched() -> None:
    """The golden exports are those of a chain profile; trees add nothing to them."""
    for path in GOLDEN.iterdir():
        assert "tree" not in path.read_text(encoding="utf-8"), path.name
