"""A table whose K=0 range is speculation off only with the spec-autotune vLLM plugin.

Checked here: the profile's ``table_decision.needs_plugin`` read back as it was written (and a
profile without it still loads), its validation, the vLLM export's note, the plugin's switch in the
command and the fallback file with its own command, and the TensorRT-LLM export unchanged by it.
"""

from __future__ import annotations

import copy
import json
import shlex
from typing import Any

import pytest
import yaml

from profiles.deployment import Deployment
from profiles.errors import ProfileError
from profiles.exporters import export, write_export
from profiles.exporters.vllm import FALLBACK_FILENAME, validate
from profiles.profile import export_inputs
from profiles.schema import MISSING, PluginNeed, Profile

TABLE = [[1, 5], [2, 4], [4, 2], [8, 0]]  # the sample profile's schedule: off at batch 8
NEED: dict[str, Any] = {
    "plugin": "spec-autotune-vllm-plugin",
    "env": "SPEC_AUTOTUNE_K0_SKIP",
    "vllm_version": "0.32.0",
    "fallback": [[1, 5], [2, 5], [4, 5], [8, 5]],
    "fallback_reason": "the best constant gamma=5, served live beside the table",
}
ENV = (
    ("VLLM_CPU_KVCACHE_SPACE", "2"),
    ("SPEC_AUTOTUNE_K0_SKIP", "1"),
    ("SPEC_AUTOTUNE_K0_HOLD_TOKENS", "16"),
)


def with_need(profile: dict[str, Any], need: dict[str, Any] | None = NEED, env=ENV) -> dict[str, Any]:
    """The sample profile as a vLLM tune with the plugin writes it: the won table, the need, the
    deployment whose environment switches the plugin on."""
    out = copy.deepcopy(profile)
    out["table_decision"] = {"table": TABLE, "served": True, "won": True, "reason": "won"}
    if need is not None:
        out["table_decision"]["needs_plugin"] = copy.deepcopy(need)
    out["deployment"] = Deployment("vllm", "bfloat16", max_model_len=512, env=env).to_json()
    return out


def test_needs_plugin_reads_back_as_written_and_typed(profile) -> None:
    data = with_need(profile)
    typed = Profile.from_json(data)
    need = typed.table_decision.needs_plugin
    assert isinstance(need, PluginNeed)
    assert need.fallback == ((1, 5), (2, 5), (4, 5), (8, 5)) and need.vllm_version == "0.32.0"
    assert typed.to_json() == data
    assert export_inputs(typed).needs_plugin == need


def test_a_profile_without_the_key_loads_and_needs_no_plugin(profile) -> None:
    typed = Profile.from_json(with_need(profile, need=None))
    assert typed.table_decision.needs_plugin is MISSING
    assert export_inputs(typed).needs_plugin is None
    bare = Profile.from_json(profile)  # no table_decision at all
    assert export_inputs(bare).needs_plugin is None


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"fallback": [[1, -1]]}, "table_decision.needs_plugin.fallback"),
        ({"fallback": []}, "table_decision.needs_plugin.fallback"),
        ({"fallback": [[1, 2, 3]]}, "table_decision.needs_plugin.fallback"),
        ({"env": 1}, "table_decision.needs_plugin.env"),
        ({"vllm_version": 32}, "table_decision.needs_plugin.vllm_version"),
    ],
)
def test_a_bad_need_is_refused_naming_its_key(profile, change, key) -> None:
    with pytest.raises(ProfileError, match=key.replace(".", r"\.")):
        Profile.from_json(with_need(profile, need={**NEED, **change}))


def test_a_need_without_its_plugin_is_refused(profile) -> None:
    need = {k: v for k, v in NEED.items() if k != "plugin"}
    with pytest.raises(ProfileError, match=r"missing key 'table_decision\.needs_plugin\.plugin'"):
        Profile.from_json(with_need(profile, need=need))


def test_the_vllm_export_says_the_plugin_is_required_and_writes_the_fallback(profile, tmp_path) -> None:
    exported = export(with_need(profile), "vllm")
    config = json.loads(exported.text)
    assert config["num_speculative_tokens_per_batch_size"][-1] == [5, 8, 0]  # the table, off range kept
    (note,) = [n for n in exported.notes if "k 0 range" in n]
    for said in ("spec-autotune-vllm-plugin", "tuned with vLLM 0.32.0", "pip install autotune/vllm_plugin"):
        assert said in note, note
    assert FALLBACK_FILENAME in note and "(batch sizes 5-8)" in note
    assert f"serves {FALLBACK_FILENAME} instead: gamma 5 at every batch size (the best constant" in note
    assert "only a table measured in vLLM" not in " ".join(exported.notes)  # the no-plugin note is not there
    words = shlex.split(exported.command or "")
    assert {"SPEC_AUTOTUNE_K0_SKIP=1", "SPEC_AUTOTUNE_K0_HOLD_TOKENS=16"} <= set(words[: words.index("vllm")])

    files = dict(exported.extra_files)
    fallback = json.loads(files[FALLBACK_FILENAME])
    assert fallback == {
        "method": "draft_model",
        "model": "/srv/models/llama-draft",
        "num_speculative_tokens": 5,
    }
    validate(fallback)
    sidecar = json.loads(exported.sidecar or "")
    assert sidecar["needs_plugin"] == NEED
    command = shlex.split(sidecar["fallback_command"])
    assert not any(w.startswith("SPEC_AUTOTUNE_K0_") for w in command)  # the switch and the hold rule
    assert "VLLM_CPU_KVCACHE_SPACE=2" in command  # the rest of the deployment's environment stays
    assert json.loads(command[command.index("--speculative-config") + 1]) == fallback

    written = write_export(exported, tmp_path)
    assert (tmp_path / FALLBACK_FILENAME) in written
    assert json.loads((tmp_path / FALLBACK_FILENAME).read_text()) == fallback


def test_a_fallback_of_no_speculation_is_json_null_and_a_command_without_the_flag(profile) -> None:
    need = {**NEED, "fallback": [[1, 0], [2, 0], [4, 0], [8, 0]]}
    exported = export(with_need(profile, need=need), "vllm")
    assert dict(exported.extra_files)[FALLBACK_FILENAME] == "null\n"
    sidecar = json.loads(exported.sidecar or "")
    assert "--speculative-config" not in shlex.split(sidecar["fallback_command"])
    assert any(
        "serves vllm-speculative-config.no-plugin.json instead: no speculation" in n for n in exported.notes
    )


def test_a_fallback_table_of_k_positive_is_exported_as_a_table(profile) -> None:
    need = {**NEED, "fallback": [[1, 5], [2, 4], [4, 2], [8, 1]]}
    exported = export(with_need(profile, need=need), "vllm")
    fallback = json.loads(dict(exported.extra_files)[FALLBACK_FILENAME])
    assert fallback["num_speculative_tokens_per_batch_size"] == [[1, 1, 5], [2, 2, 4], [3, 4, 2], [5, 8, 1]]
    validate(fallback)


def test_without_the_need_the_export_keeps_the_drafter_note_and_no_fallback(profile) -> None:
    exported = export(with_need(profile, need=None, env=ENV[:1]), "vllm")
    assert any("still runs the drafter's forward every step (vLLM" in n for n in exported.notes)
    assert FALLBACK_FILENAME not in dict(exported.extra_files)
    sidecar = json.loads(exported.sidecar or "")
    assert "fallback_command" not in sidecar and "needs_plugin" not in sidecar
    assert "SPEC_AUTOTUNE_K0_SKIP" not in (exported.command or "")


def test_the_command_sets_the_switch_even_where_the_deployment_lacks_it(profile) -> None:
    exported = export(with_need(profile, env=ENV[:1]), "vllm")
    words = shlex.split(exported.command or "")
    assert "SPEC_AUTOTUNE_K0_SKIP=1" in words[: words.index("vllm")]


def test_tensorrt_llm_keeps_its_own_zero_semantics(profile) -> None:
    """TensorRT-LLM's draft_len_schedule 0 is its own (speculation off above the table): the export
    is the same file, sidecar and notes with or without the plugin need."""
    plain, needing = (export(with_need(profile, need=n), "trtllm") for n in (None, NEED))
    assert (plain.text, plain.sidecar, plain.notes) == (needing.text, needing.sidecar, needing.notes)
    assert plain.extra_files == needing.extra_files
    assert "spec-autotune-vllm-plugin" not in plain.text and yaml.safe_load(plain.text)
