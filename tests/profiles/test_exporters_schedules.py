"""Schedule conversion for vLLM and TensorRT-LLM on edge cases, and the per-stack validators."""

from __future__ import annotations

import bisect
import json

import pytest
import yaml

from profiles.errors import ProfileError
from profiles.exporters import VALIDATORS, export
from profiles.exporters._common import batch_ranges
from profiles.exporters.trtllm import draft_len_schedule


def _vllm(make_profile, schedule: list[tuple[int, int]]) -> dict | None:
    return json.loads(export(make_profile(schedule=schedule), "vllm").text)


def _trtllm(make_profile, schedule: list[tuple[int, int]]) -> dict:
    return yaml.safe_load(export(make_profile(schedule=schedule), "trtllm").text)


# -- the stacks' own lookup rules, replayed from their documented upstream functions ----------
# (docs/stacks/vllm.md and docs/stacks/trtllm.md name the file and commit each was read from)


def vllm_build_dynamic_sd_schedule_lookup(
    table: list[list[int]], max_batch_size: int, num_speculative_tokens: int
) -> list[int]:
    """vLLM's ``build_dynamic_sd_schedule_lookup`` after ``validate_and_normalize_dynamic_sd_schedule``
    (vllm/v1/spec_decode/dynamic/utils.py at 14b450ca).

    Validation: entries ``[lo, hi, K]`` with 0 < lo <= hi and K >= 0, sorted by lo, non-overlapping,
    the first starting at 1. Lookup: ``dense[b]`` (b = 1..max_batch_size; index 0 unused) is the K
    of the range holding b; a gap takes the previous range's K; past the last range the last K;
    every K is clamped to ``num_speculative_tokens``.
    """
    ranges = sorted((int(lo), int(hi), int(k)) for lo, hi, k in table)
    assert ranges and ranges[0][0] == 1, "the first range must start at 1"
    assert all(0 < lo <= hi and k >= 0 for lo, hi, k in ranges)
    assert all(nxt[0] > prev[1] for prev, nxt in zip(ranges, ranges[1:], strict=False)), (
        "ranges must not overlap"
    )
    dense = [0]
    for b in range(1, max_batch_size + 1):
        k = [k for lo, _hi, k in ranges if lo <= b][-1]  # its range, or the previous one's (gap, tail)
        dense.append(min(k, num_speculative_tokens))
    return dense


def trtllm_get_draft_len_for_batch_size(
    schedule: dict[int, int] | None, batch_size: int, max_draft_len: int
) -> int:
    """TensorRT-LLM's standalone ``get_draft_len_for_batch_size`` (tensorrt_llm/_torch/speculative/), the
    semantics llm_args.py documents at 00043967 and the exporter targets: no schedule -> max_draft_len;
    else the value of the first key >= batch_size (``bisect_left`` over the sorted keys: "up to that
    key"); above the largest key 0 (speculation off)."""
    if schedule is None:
        return max_draft_len
    keys = sorted(schedule)
    i = bisect.bisect_left(keys, batch_size)
    return schedule[keys[i]] if i < len(keys) else 0


def trtllm_older_drafter_get_draft_len_for_batch_size(schedule: dict[int, int], batch_size: int) -> int:
    """Older releases' ``Drafter.get_draft_len_for_batch_size``: the value of the largest key <= batch_size
    (``bisect_right``: "from that key on"). The exporter does not target these releases."""
    keys = sorted(schedule)
    i = bisect.bisect_right(keys, batch_size)
    assert i > 0, "batch sizes start at 1 and key 1 is always exported"
    return schedule[keys[i - 1]]


def tuned_gamma_at(schedule, batch: int) -> int | None:
    """What the tuned schedule means at ``batch``: the gamma of the smallest tuned batch size >= batch
    (None above the largest tuned batch size, where each stack has its own rule)."""
    return next((g for b, g in sorted(schedule) if b >= batch), None)


# -- vLLM -------------------------------------------------------------------------------------


def test_vllm_all_zero_schedule_exports_null_and_says_so(make_profile) -> None:
    exported = export(make_profile(schedule=[(1, 0), (4, 0), (16, 0)]), "vllm")
    assert exported.text == "null\n" and exported.speculation is False
    assert "Speculation off" in exported.notes[0] and "--speculative-config" not in exported.command
    assert json.loads(exported.sidecar)["speculation"] is False


def test_vllm_one_batch_size_needs_no_table(make_profile) -> None:
    assert _vllm(make_profile, [(1, 3)]) == {
        "method": "draft_model",
        "model": "/srv/models/llama-draft",
        "num_speculative_tokens": 3,
    }


def test_vllm_constant_schedule_needs_no_table(make_profile) -> None:
    assert "num_speculative_tokens_per_batch_size" not in _vllm(make_profile, [(1, 4), (8, 4), (64, 4)])


def test_vllm_gaps_become_contiguous_ranges(make_profile) -> None:
    config = _vllm(make_profile, [(1, 4), (4, 2), (16, 1)])
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 1, 4], [2, 4, 2], [5, 16, 1]]
    assert config["num_speculative_tokens"] == 4


def test_vllm_decreasing_gammas_merge_equal_neighbours(make_profile) -> None:
    config = _vllm(make_profile, [(1, 5), (2, 5), (4, 3), (8, 3), (16, 0), (32, 0)])
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 2, 5], [3, 8, 3], [9, 32, 0]]


def test_vllm_non_monotone_gammas_keep_their_ranges(make_profile) -> None:
    config = _vllm(make_profile, [(1, 2), (4, 5), (16, 0), (32, 1)])
    assert config["num_speculative_tokens"] == 5
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 1, 2], [2, 4, 5], [5, 16, 0], [17, 32, 1]]


def test_vllm_schedule_starting_above_one_still_starts_at_one(make_profile) -> None:
    config = _vllm(make_profile, [(4, 3), (16, 1)])
    assert config["num_speculative_tokens_per_batch_size"][0] == [1, 4, 3]


@pytest.mark.parametrize(
    "schedule",
    [
        [(1, 5), (2, 4), (4, 2), (8, 0)],
        [(1, 4), (4, 2), (16, 1)],
        [(1, 2), (4, 5), (16, 0), (32, 1)],
        [(3, 0), (9, 2)],
    ],
)
def test_vllm_table_reproduces_every_tuned_point(make_profile, schedule: list[tuple[int, int]]) -> None:
    config = _vllm(make_profile, schedule)
    last = max(b for b, _ in schedule)
    dense = vllm_build_dynamic_sd_schedule_lookup(
        config["num_speculative_tokens_per_batch_size"], 4 * last, config["num_speculative_tokens"]
    )
    for batch, gamma in schedule:
        assert dense[batch] == gamma
    for batch in range(1, 4 * last + 1):  # between tuned points the next larger one; past the last, the last
        assert dense[batch] == (tuned_gamma_at(schedule, batch) if batch <= last else dict(schedule)[last])


# -- TensorRT-LLM -----------------------------------------------------------------------------


def test_trtllm_all_zero_schedule_exports_an_empty_mapping(make_profile) -> None:
    exported = export(make_profile(schedule=[(1, 0), (8, 0)]), "trtllm")
    assert yaml.safe_load(exported.text) == {} and exported.speculation is False
    assert "Speculation off" in exported.notes[0]


def test_trtllm_one_batch_size(make_profile) -> None:
    config = _trtllm(make_profile, [(1, 3)])["speculative_config"]
    assert (config["max_draft_len"], config["draft_len_schedule"]) == (3, {1: 3})


def test_trtllm_gaps(make_profile) -> None:
    config = _trtllm(make_profile, [(1, 4), (4, 2), (16, 1)])["speculative_config"]
    assert (config["max_draft_len"], config["draft_len_schedule"]) == (4, {1: 4, 4: 2, 16: 1})


def test_trtllm_first_tuned_batch_above_one_still_has_key_one(make_profile) -> None:
    config = _trtllm(make_profile, [(4, 3), (16, 1)])["speculative_config"]
    assert config["draft_len_schedule"] == {1: 3, 4: 3, 16: 1}


def test_trtllm_drops_trailing_zero_keys(make_profile) -> None:
    config = _trtllm(make_profile, [(1, 5), (2, 4), (4, 2), (8, 0), (16, 0)])["speculative_config"]
    assert config["draft_len_schedule"] == {1: 5, 2: 4, 4: 2}


def test_trtllm_clamps_a_later_larger_gamma_and_says_so(make_profile) -> None:
    exported = export(make_profile(schedule=[(1, 2), (4, 5), (16, 0), (32, 1)]), "trtllm")
    config = yaml.safe_load(exported.text)["speculative_config"]
    assert config["max_draft_len"] == 2
    assert config["draft_len_schedule"] == {1: 2, 4: 2, 16: 0, 32: 1}
    assert any("clamped" in note for note in exported.notes) and "clamped" in exported.text


def test_trtllm_speculation_cannot_start_above_the_smallest_batch(make_profile) -> None:
    exported = export(make_profile(schedule=[(1, 0), (4, 3)]), "trtllm")
    assert yaml.safe_load(exported.text) == {} and exported.speculation is False
    assert "smallest" in exported.notes[0]


@pytest.mark.parametrize(
    "schedule",
    [((1, 5), (2, 4), (4, 2), (8, 0)), ((1, 4), (4, 2), (16, 1)), ((1, 6), (2, 6), (8, 1)), ((2, 3), (8, 0))],
)
def test_trtllm_schedule_reproduces_every_non_increasing_point(schedule: tuple[tuple[int, int], ...]) -> None:
    max_draft_len, table, notes = draft_len_schedule(schedule)
    assert notes == [] and table[min(table)] == max_draft_len
    last = max(b for b, _ in schedule)
    for batch in range(1, 4 * last + 1):
        expected = tuned_gamma_at(schedule, batch) if batch <= last else 0
        assert trtllm_get_draft_len_for_batch_size(table, batch, max_draft_len) == expected


def test_trtllm_exports_target_the_up_to_key_release_not_the_older_from_key_one(make_profile) -> None:
    """The same file means another schedule under the older ``bisect_right`` lookup (docs/stacks/trtllm.md)."""
    schedule = [(1, 4), (4, 2), (16, 1)]
    config = _trtllm(make_profile, schedule)["speculative_config"]
    table, max_draft_len = config["draft_len_schedule"], config["max_draft_len"]
    newest = [trtllm_get_draft_len_for_batch_size(table, b, max_draft_len) for b in range(1, 18)]
    older = [trtllm_older_drafter_get_draft_len_for_batch_size(table, b) for b in range(1, 18)]
    assert newest == [tuned_gamma_at(schedule, b) or 0 for b in range(1, 18)]
    assert newest[1:4] == [2, 2, 2] and older[1:4] == [4, 4, 2]  # batch sizes 2-4: the tuned 2, or 4
    assert trtllm_get_draft_len_for_batch_size(None, 7, max_draft_len) == max_draft_len


def test_batch_ranges_merge_and_cover_from_one() -> None:
    assert batch_ranges([(8, 0), (1, 3), (2, 3)]) == [(1, 2, 3), (3, 8, 0)]
    assert batch_ranges([(5, 1)]) == [(1, 5, 1)]


# -- validators: each rejects what its stack would reject -------------------------------------

GOOD = {
    "vllm": {
        "method": "draft_model",
        "model": "/m/d",
        "num_speculative_tokens": 3,
        "num_speculative_tokens_per_batch_size": [[1, 4, 3], [5, 8, 0]],
    },
    "sglang": {
        "--model-path": "/m/t",
        "--speculative-algorithm": "STANDALONE",
        "--speculative-draft-model-path": "/m/d",
        "--speculative-num-steps": 3,
        "--speculative-eagle-topk": 1,
        "--speculative-num-draft-tokens": 4,
    },
    "trtllm": {
        "speculative_config": {
            "decoding_type": "Draft_Target",
            "max_draft_len": 3,
            "speculative_model": "/m/d",
            "draft_len_schedule": {1: 3, 8: 1},
        }
    },
    "tgi": {"--model-id": "/m/t", "--speculate": 3},
    "hf": {
        "num_assistant_tokens": 3,
        "num_assistant_tokens_schedule": "heuristic",
        "assistant_confidence_threshold": 0.4,
    },
    "llamacpp": {
        "-m": "t.gguf",
        "--spec-type": "draft-simple",
        "-md": "d.gguf",
        "--spec-draft-n-max": 3,
        "--spec-draft-n-min": 0,
        "--spec-draft-p-min": 0.5,
    },
}

BAD = [
    ("vllm", {"num_speculative_tokens": 0}, "num_speculative_tokens must be an integer > 0"),
    ("vllm", {"disable_by_batch_size": 4}, "unknown SpeculativeConfig key"),
    ("vllm", {"method": "draft_model", "model": None}, "needs 'model'"),
    ("vllm", {"method": "eagle4"}, "unknown method"),
    ("vllm", {"tensor_parallel_size": 2}, "draft_tensor_parallel_size"),
    (
        "vllm",
        {"method": "ngram", "model": None, "prompt_lookup_min": 5, "prompt_lookup_max": 2},
        "prompt_lookup_min",
    ),
    ("vllm", {"num_speculative_tokens_per_batch_size": []}, "non-empty"),
    ("vllm", {"num_speculative_tokens_per_batch_size": [[2, 4, 3]]}, "must start at 1"),
    ("vllm", {"num_speculative_tokens_per_batch_size": [[1, 4, 3], [4, 8, 1]]}, "overlap"),
    ("vllm", {"num_speculative_tokens_per_batch_size": [[1, 4, 3], [9, 5, 1]]}, "lo <= hi"),
    ("vllm", {"num_speculative_tokens_per_batch_size": [[1, 4, -1]]}, "k < 0"),
    ("vllm", {"num_speculative_tokens_per_batch_size": [[1, 4, 9]]}, "silently clamp"),
    ("vllm", {"num_speculative_tokens_per_batch_size": [[1, 4]]}, "\\[lo, hi, k\\]"),
    ("sglang", {"--speculative-num-draft-tokens": 3}, "num-steps \\+ 1"),
    ("sglang", {"--speculative-draft-model-path": None}, "needs --speculative-draft-model-path"),
    ("sglang", {"--speculative-algorithm": "MEDUSA"}, "unknown speculative algorithm"),
    ("sglang", {"--speculative-num-steps": 0}, ">= 1"),
    ("sglang", {"--speculative-disable-by-batch-size": 4}, "unknown flag"),
    ("sglang", {"--speculative-algorithm": "NGRAM", "--speculative-draft-model-path": None}, "overridden"),
    ("tgi", {"--speculate": -2}, "non-negative"),
    ("tgi", {"--speculative-model": "/m/d"}, "unknown flag"),
    ("hf", {"num_assistant_tokens": 0}, "num_assistant_tokens"),
    ("hf", {"num_assistant_tokens_schedule": "adaptive"}, "num_assistant_tokens_schedule"),
    ("hf", {"assistant_confidence_threshold": 1.5}, "assistant_confidence_threshold"),
    ("hf", {"assistant_model": "/m/d"}, "assistant_model"),
    ("llamacpp", {"--draft-max": 16}, "removed"),
    ("llamacpp", {"--draft-min": 1}, "removed"),
    ("llamacpp", {"--spec-type": "draft-magic"}, "unknown --spec-type"),
    ("llamacpp", {"--spec-draft-n-min": 5}, "exceeds"),
    ("llamacpp", {"--spec-draft-p-min": 1.5}, "p-min"),
    ("llamacpp", {"-md": None}, "needs -md"),
]

BAD_TRTLLM = [
    ({"max_draft_len": 0}, "max_draft_len > 0"),
    ({"speculative_model": None}, "needs speculative_model"),
    ({"decoding_type": "DraftTarget"}, "decoding_type"),
    ({"draft_len_schedule": {1: 2, 8: 1}}, "smallest key"),
    ({"draft_len_schedule": {1: 3, 8: 4}}, "exceeds max_draft_len"),
    ({"draft_len_schedule": {0: 3}}, ">= 1"),
    ({"draft_len_schedule": {1: 3, 8: -1}}, ">= 0"),
    ({"max_concurrency": 8}, "mutually exclusive"),
    ({"acceptance_length_threshold": 0.5}, "unknown Draft_Target key"),
]


@pytest.mark.parametrize("fmt", sorted(GOOD))
def test_validators_accept_a_good_config(fmt: str) -> None:
    VALIDATORS[fmt](GOOD[fmt])


@pytest.mark.parametrize("fmt, change, message", BAD)
def test_validators_reject_a_bad_config(fmt: str, change: dict, message: str) -> None:
    config = {**GOOD[fmt], **change}
    with pytest.raises(ProfileError, match=message):
        VALIDATORS[fmt](config)


@pytest.mark.parametrize("change, message", BAD_TRTLLM)
def test_trtllm_validator_rejects_a_bad_speculative_config(change: dict, message: str) -> None:
    config = {**GOOD["trtllm"]["speculative_config"], **change}
    with pytest.raises(ProfileError, match=message):
        VALIDATORS["trtllm"]({"speculative_config": config})


def test_trtllm_validator_rejects_unknown_root_options() -> None:
    with pytest.raises(ProfileError, match="unexpected option"):
        VALIDATORS["trtllm"]({**GOOD["trtllm"], "max_batch_size": 8})
