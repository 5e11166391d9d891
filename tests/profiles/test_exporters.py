"""Exporters: golden files, round-trip parses, path overrides, atomic writes.

Regenerate the golden files after an intended change with
``SPEC_AUTOTUNE_UPDATE_GOLDEN=1 pytest tests/profiles/test_exporters.py`` and review the diff.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from profiles.errors import ProfileError
from profiles.exporters import FORMATS, VALIDATORS, Exported, export, write_export

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("SPEC_AUTOTUNE_UPDATE_GOLDEN") == "1"


def _shell_argv(text: str) -> list[str]:
    """The argv a generated ``exec ...`` script runs, without "$@"."""
    tokens = shlex.split(text.replace("\\\n", " "), comments=True)
    assert tokens[0] == "exec" and tokens[-1] == "$@"
    return tokens[1:-1]


def _flags(argv: list[str], program_len: int) -> dict[str, str]:
    rest = argv[program_len:]
    return dict(zip(rest[::2], rest[1::2], strict=True))


@pytest.mark.parametrize("fmt", FORMATS)
def test_export_matches_golden_file(fmt: str, profile: dict) -> None:
    exported = export(profile, fmt)
    files = {exported.filename: exported.text, **dict(exported.extra_files)}
    if exported.sidecar is not None:
        files[exported.sidecar_filename] = exported.sidecar
    for name, text in files.items():
        golden = GOLDEN / name
        if UPDATE:
            golden.write_text(text, encoding="utf-8")
        assert text == golden.read_text(encoding="utf-8"), f"{name} differs from its golden file"


def test_every_format_has_its_default_file_name(profile: dict) -> None:
    names = {fmt: export(profile, fmt).filename for fmt in FORMATS}
    assert names == {
        "vllm": "vllm-speculative-config.json",
        "sglang": "sglang-args.sh",
        "trtllm": "trtllm-extra-options.yaml",
        "tgi": "tgi-args.sh",
        "hf": "generation_config.json",
        "llamacpp": "llamacpp-args.sh",
        "yaml": "profile.yaml",
    }


def test_vllm_json_keys_and_types(profile: dict) -> None:
    exported = export(profile, "vllm")
    config = json.loads(exported.text)
    assert config == {
        "method": "draft_model",
        "model": "/srv/models/llama-draft",
        "num_speculative_tokens": 5,
        "num_speculative_tokens_per_batch_size": [[1, 1, 5], [2, 2, 4], [3, 4, 2], [5, 8, 0]],
    }
    assert all(type(v) is int for row in config["num_speculative_tokens_per_batch_size"] for v in row)
    meta = json.loads(exported.sidecar)
    assert meta["device"] == {"label": "NVIDIA H200 141GB", "key": "ab12cd34ef56"}
    assert meta["tool_version"] == "0.1.0" and meta["stack"]["source"].startswith("vllm-project/vllm@")
    command = shlex.split(meta["command"])
    assert command[:4] == ["vllm", "serve", "/srv/models/llama-target", "--speculative-config"]
    assert json.loads(command[4]) == config


def test_vllm_ngram_lets_vllm_fill_the_model(make_profile) -> None:
    config = json.loads(export(make_profile(drafter="ngram"), "vllm").text)
    assert config["method"] == "ngram" and "model" not in config
    assert (config["prompt_lookup_min"], config["prompt_lookup_max"]) == (2, 4)


def test_trtllm_yaml_keys_and_types(profile: dict, make_profile) -> None:
    options = yaml.safe_load(export(profile, "trtllm").text)
    assert options == {
        "speculative_config": {
            "decoding_type": "Draft_Target",
            "max_draft_len": 5,
            "speculative_model": "/srv/models/llama-draft",
            "draft_len_schedule": {1: 5, 2: 4, 4: 2},
        }
    }
    ngram = yaml.safe_load(export(make_profile(drafter="ngram"), "trtllm").text)["speculative_config"]
    assert ngram["decoding_type"] == "NGram" and ngram["max_matching_ngram_size"] == 4
    assert "speculative_model" not in ngram


def test_sglang_flags_for_draft_model_and_ngram(profile: dict, make_profile) -> None:
    flags = _flags(_shell_argv(export(profile, "sglang").text), 3)
    assert flags == {
        "--model-path": "/srv/models/llama-target",
        "--speculative-algorithm": "STANDALONE",
        "--speculative-draft-model-path": "/srv/models/llama-draft",
        "--speculative-num-steps": "4",
        "--speculative-eagle-topk": "1",
        "--speculative-num-draft-tokens": "5",
    }
    ngram = _flags(_shell_argv(export(make_profile(drafter="ngram", gamma=3), "sglang").text), 3)
    assert ngram["--speculative-algorithm"] == "NGRAM" and ngram["--speculative-num-draft-tokens"] == "4"
    assert "--speculative-eagle-topk" not in ngram and "--speculative-draft-model-path" not in ngram


def test_llamacpp_uses_current_flags_only(profile: dict, make_profile) -> None:
    argv = _shell_argv(export(profile, "llamacpp").text)
    flags = _flags(argv, 1)
    assert flags == {
        "-m": "/srv/models/llama-target",
        "--spec-type": "draft-simple",
        "-md": "/srv/models/llama-draft",
        "--spec-draft-n-max": "4",
        "--spec-draft-n-min": "0",
        "--spec-draft-p-min": "0.3",
        "-np": "8",
    }  # the profile's max_batch_size
    ngram = _flags(_shell_argv(export(make_profile(drafter="ngram"), "llamacpp").text), 1)
    assert ngram["--spec-type"] == "ngram-simple" and ngram["--spec-ngram-simple-size-m"] == "4"
    for text in (export(profile, "llamacpp").text, export(make_profile(drafter="ngram"), "llamacpp").text):
        assert not any(token in ("--draft", "--draft-max", "--draft-min") for token in _shell_argv(text))


def test_tgi_speculate_and_draft_model_warning(profile: dict, make_profile) -> None:
    exported = export(profile, "tgi")
    assert _flags(_shell_argv(exported.text), 1) == {
        "--model-id": "/srv/models/llama-target",
        "--speculate": "4",
    }
    assert any("cannot load a separate draft model" in note for note in exported.notes)
    ngram = export(make_profile(drafter="ngram"), "tgi")
    assert not any("draft model" in note for note in ngram.notes)


@pytest.mark.parametrize("fmt", ["sglang", "tgi", "llamacpp", "trtllm", "yaml"])
def test_commented_formats_record_provenance(fmt: str, profile: dict) -> None:
    text = export(profile, fmt).text
    header = [line for line in text.splitlines() if line.startswith("#")]
    joined = "\n".join(header)
    assert "spec-autotune 0.1.0" in joined and "NVIDIA H200 141GB" in joined and "ab12cd34ef56" in joined
    assert "Target stack:" in joined


def test_yaml_export_round_trips_the_whole_profile(profile: dict) -> None:
    assert yaml.safe_load(export(profile, "yaml").text) == profile


def test_overrides_replace_model_paths(profile: dict) -> None:
    target, draft = "/gguf/my target.gguf", "/gguf/draft's.gguf"
    vllm = export(profile, "vllm", target_model=target, draft_model=draft)
    assert json.loads(vllm.text)["model"] == draft
    assert shlex.split(vllm.command)[2] == target
    flags = _flags(_shell_argv(export(profile, "llamacpp", target_model=target, draft_model=draft).text), 1)
    assert (flags["-m"], flags["-md"]) == (target, draft)
    llama_notes = export(profile, "llamacpp", target_model=target, draft_model=draft).notes
    assert not any("GGUF" in note for note in llama_notes)
    dumped = yaml.safe_load(export(profile, "yaml", target_model=target).text)
    assert dumped["pair"]["target"] == target and dumped["pair"]["draft"] == profile["pair"]["draft"]


@pytest.mark.parametrize(
    "fmt, program", [("tgi", "text-generation-launcher"), ("llamacpp", "llama-server"), ("sglang", "python")]
)
def test_generated_script_runs_with_exact_argv(fmt: str, program: str, profile: dict, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / program
    stub.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    stub.chmod(0o755)
    target = "/models/a target's dir"
    script = write_export(export(profile, fmt, target_model=target), tmp_path)[0]
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    out = subprocess.run(
        ["sh", str(script), "--port", "8000"], capture_output=True, text=True, env=env, check=True
    )
    argv = out.stdout.splitlines()
    assert target in argv and argv[-2:] == ["--port", "8000"]
    assert argv == _shell_argv(export(profile, fmt, target_model=target).text)[1:] + ["--port", "8000"]


def test_hf_generation_config_loads_in_transformers(profile: dict, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    target = tmp_path / "target"
    target.mkdir()
    (target / "generation_config.json").write_text(
        json.dumps(
            {
                "bos_token_id": 1,
                "eos_token_id": [2, 7],
                "pad_token_id": 0,
                "max_length": 512,
                "num_assistant_tokens": 20,
                "transformers_version": "4.0.0",
            }
        )
    )
    exported = export(profile, "hf", target_model=str(target))
    out = tmp_path / "export"
    written = write_export(exported, out / "generation_config.json")
    assert [p.name for p in written] == ["generation_config.json", "generation_config.json.meta.json"]
    config = transformers.GenerationConfig.from_pretrained(out)
    assert config.num_assistant_tokens == 4
    assert config.num_assistant_tokens_schedule == "constant"
    assert config.assistant_confidence_threshold == pytest.approx(0.3)
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id, config.max_length) == (
        1,
        [2, 7],
        0,
        512,
    )
    assert "transformers_version" not in json.loads(exported.text)


def test_hf_ngram_uses_prompt_lookup(make_profile, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    write_export(export(make_profile(drafter="ngram", gamma=6), "hf"), tmp_path)
    config = transformers.GenerationConfig.from_pretrained(tmp_path)
    assert (config.prompt_lookup_num_tokens, config.max_matching_ngram_size) == (6, 4)
    assert config.num_assistant_tokens is None


def test_hf_zero_threshold_is_written_so_the_default_does_not_apply(make_profile) -> None:
    config = json.loads(export(make_profile(confidence_threshold=0.0, gamma_schedule="heuristic"), "hf").text)
    assert config["assistant_confidence_threshold"] == 0.0
    assert config["num_assistant_tokens_schedule"] == "heuristic"


@pytest.mark.parametrize("fmt", FORMATS)
def test_speculation_off_for_drafter_none(fmt: str, make_profile) -> None:
    exported = export(make_profile(drafter="none", gamma=0), fmt)
    assert exported.speculation is False
    if fmt != "yaml":
        assert any("Speculation off" in note for note in exported.notes)


@pytest.mark.parametrize(
    "path, key",
    [
        ("device.label", "device.label"),
        ("device.key", "device.key"),
        ("chosen.gamma", "chosen.gamma"),
        ("schedule", "schedule"),
        ("tool_version", "tool_version"),
        ("pair.target", "pair.target"),
    ],
)
def test_missing_profile_key_is_named(path: str, key: str, profile: dict) -> None:
    node = profile
    *parents, last = path.split(".")
    for part in parents:
        node = node[part]
    del node[last]
    with pytest.raises(ProfileError, match=f"missing key '{key}'"):
        export(profile, "vllm")


def test_draft_model_drafter_without_a_draft_path(profile: dict) -> None:
    profile["pair"]["draft"] = None
    with pytest.raises(ProfileError, match="pair.draft"):
        export(profile, "sglang")
    assert json.loads(export(profile, "vllm", draft_model="/m/d").text)["model"] == "/m/d"


def test_bad_values_are_refused(make_profile) -> None:
    with pytest.raises(ProfileError, match="chosen.drafter"):
        export(make_profile(drafter="eagle"), "vllm")
    with pytest.raises(ProfileError, match="schedule\\[0\\].gamma"):
        export(make_profile(schedule=[(1, -1)]), "vllm")
    with pytest.raises(ProfileError, match="twice"):
        export(make_profile(schedule=[(1, 2), (1, 3)]), "vllm")
    with pytest.raises(ProfileError, match="chosen.gamma"):
        export(make_profile(gamma=True), "vllm")
    with pytest.raises(ProfileError, match="unknown export format"):
        export(make_profile(), "onnx")


def test_vllm_refuses_a_draft_with_another_vocabulary(profile: dict, tmp_path: Path) -> None:
    for name, vocab in (("t", 32000), ("d", 32001)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"vocab_size": vocab}))
    with pytest.raises(ProfileError, match="vocab"):
        export(profile, "vllm", target_model=str(tmp_path / "t"), draft_model=str(tmp_path / "d"))


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f in VALIDATORS])
def test_exports_pass_their_own_validator_for_every_drafter(fmt: str, make_profile) -> None:
    for drafter in ("model", "ngram", "none"):
        exported = export(make_profile(drafter=drafter), fmt)
        assert exported.text


# -- atomic writes ----------------------------------------------------------------------------


def test_write_export_writes_main_file_and_sidecar(profile: dict, tmp_path: Path) -> None:
    written = write_export(export(profile, "vllm"), tmp_path)
    assert [p.name for p in written] == [
        "vllm-speculative-config.json",
        "vllm-serve.yaml",
        "vllm-speculative-config.json.meta.json",
    ]
    assert json.loads(written[0].read_text())["num_speculative_tokens"] == 5
    script = write_export(export(profile, "sglang"), tmp_path / "deep" / "launch.sh")[0]
    assert script.name == "launch.sh" and os.access(script, os.X_OK)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep", *sorted(p.name for p in written)]


def test_failed_replace_leaves_no_file_and_no_temp(
    profile: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*_args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(ProfileError, match="No space left"):
        write_export(export(profile, "vllm"), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_failed_temp_write_leaves_no_file_and_keeps_the_old_one(
    profile: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = tmp_path / "tgi-args.sh"
    dest.write_text("old\n")

    def broken_fsync(_fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(ProfileError, match="Input/output error"):
        write_export(export(profile, "tgi"), dest)
    assert [p.name for p in tmp_path.iterdir()] == ["tgi-args.sh"] and dest.read_text() == "old\n"


def test_exported_sidecar_name() -> None:
    assert Exported("vllm", "x.json", "{}", sidecar="{}").sidecar_filename == "x.json.meta.json"
    assert Exported("tgi", "x.sh", "").sidecar_filename is None
