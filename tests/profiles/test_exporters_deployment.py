"""Exports of a profile with a deployment: every stack serves what the trials ran.

The vLLM export's ``vllm-serve.yaml`` is read here the way vLLM reads ``vllm serve --config``;
the real servers read it in tests/autotune/test_backend_vllm_real.py and
tests/autotune/test_backend_llamacpp_real.py.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest
import yaml

from profiles.deployment import Deployment
from profiles.errors import ProfileError
from profiles.exporters import VALIDATORS, export, write_export
from profiles.exporters import vllm as vllm_export
from profiles.profile import export_inputs
from profiles.schema import Profile

VLLM_GPU = Deployment(
    "vllm",
    "bfloat16",
    tensor_parallel_size=4,
    max_model_len=2048,
    gpu_memory_utilization=0.85,
    extra_args=("--no-enable-prefix-caching",),
    env=(("VLLM_ATTENTION_BACKEND", "FLASH_ATTN"),),
)
LLAMACPP = Deployment(
    "llamacpp",
    "f32",
    context_size=300,
    threads=6,
    gpu_layers=99,
    draft_gpu_layers=99,
    extra_args=("--metrics", "--no-cache-prompt"),
)


DEPLOYMENT_FLAGS = {
    "sglang": ("--tp-size", "--dtype", "--context-length"),
    "tgi": ("--num-shard", "--dtype", "--max-input-tokens", "--max-total-tokens"),
}


def _with(profile: dict, deployment: Deployment) -> dict:
    return {**profile, "deployment": deployment.to_json()}


def _vllm_reads(config_text: str, command: str) -> tuple[dict[str, str], list[str]]:
    """The environment and the argv after ``vllm serve`` that vLLM assembles from ``command`` and its
    ``--config`` file: each key as ``--key``; ``true`` a bare switch, a list its items, a mapping its
    JSON, anything else ``str(value)``; the file's flags before the command line's
    (``FlexibleArgumentParser._pull_args_from_config`` and ``load_config_file``,
    vllm/utils/argparse_utils.py at vllm-project/vllm@00da11e37d1f)."""
    words = shlex.split(command)
    env = dict(w.split("=", 1) for w in words[: words.index("vllm")])
    argv = words[words.index("vllm") + 2 :]
    assert argv[:2] == ["--config", vllm_export.CONFIG_FILENAME]
    from_file: list[str] = []
    for key, value in yaml.safe_load(config_text).items():
        if value is True:
            from_file.append(f"--{key}")
        elif isinstance(value, list):
            from_file += [f"--{key}", *(str(v) for v in value)]
        elif isinstance(value, dict):
            from_file += [f"--{key}", json.dumps(value)]
        else:
            from_file += [f"--{key}", str(value)]
    return env, from_file + argv[2:]


@pytest.mark.parametrize(
    "extra",
    [
        ("--no-enable-prefix-caching",),
        ("--no-enable-prefix-caching", "--seed", "-1", "--max-num-batched-tokens", "4096"),
        ("--enforce-eager", "-O0", "--seed", "3"),  # a short option: it and what follows stay on the line
        ("--max-num-seqs", "2", "--kv-transfer-config={}"),  # a repeat; --flag=value
        ("--api-key", "true", "--served-model-name", "a", "b"),  # a str that YAML would read as bool; a list
    ],
)
def test_vllm_serve_yaml_reads_back_as_the_trials_arguments(profile: dict, extra: tuple[str, ...]) -> None:
    deployment = Deployment(**{**VLLM_GPU.__dict__, "extra_args": extra})
    exported = export(_with(profile, deployment), "vllm")
    inputs = export_inputs(Profile.from_json(_with(profile, deployment)))
    ((name, text),) = exported.extra_files
    ready = json.loads(exported.sidecar)["config_command"]
    env, argv = _vllm_reads(text, ready)
    assert name == "vllm-serve.yaml" and env == {"VLLM_ATTENTION_BACKEND": "FLASH_ATTN"}
    assert argv == ["--model", inputs.target, *vllm_export.serve_args(inputs)[2:]]
    assert f"# Usage: {ready}\n" in text  # the header holds the ready command


def test_vllm_serve_yaml_holds_every_deployment_flag(profile: dict) -> None:
    exported = export(_with(profile, VLLM_GPU), "vllm")
    config = yaml.safe_load(exported.extra_files[0][1])
    assert config == {
        "model": "/srv/models/llama-target",
        "dtype": "bfloat16",
        "tensor-parallel-size": 4,
        "max-model-len": 2048,
        "gpu-memory-utilization": 0.85,
        "speculative-config": json.loads(exported.text),
        "max-num-seqs": 8,
        "no-enable-prefix-caching": True,
    }
    assert json.loads(exported.sidecar)["config_command"] == (
        "VLLM_ATTENTION_BACKEND=FLASH_ATTN vllm serve --config vllm-serve.yaml"
    )
    assert any(n.startswith("--max-num-seqs 8 is the tuned max_batch_size") for n in exported.notes)
    off = export(_with({**profile, "chosen": {**profile["chosen"], "drafter": "none"}}, VLLM_GPU), "vllm")
    assert "speculative-config" not in yaml.safe_load(off.extra_files[0][1])  # speculation off: no key


def test_vllm_export_writes_the_yaml_next_to_the_file(profile: dict, tmp_path) -> None:
    written = write_export(export(_with(profile, VLLM_GPU), "vllm"), tmp_path / "out" / "spec.json")
    assert [p.name for p in written] == ["spec.json", "vllm-serve.yaml", "spec.json.meta.json"]
    assert yaml.safe_load(written[1].read_text())["tensor-parallel-size"] == 4


def test_llamacpp_script_holds_the_deployment(profile: dict) -> None:
    exported = export(_with(profile, LLAMACPP), "llamacpp", target_model="/g/t.gguf", draft_model="/g/d.gguf")
    argv = shlex.split(exported.command)
    flags = dict(zip(argv[1::2], argv[2::2], strict=False))
    assert flags["-np"] == "8" and flags["-c"] == str(8 * 300)  # every slot holds the longest sequence
    assert flags["-t"] == "6" and flags["-ngl"] == "99" and flags["-ngld"] == "99"
    assert argv[-2:] == ["--metrics", "--no-cache-prompt"]  # the trials' own flags, last, in order
    assert any("-c 2400 = -np x 300" in n for n in exported.notes)
    assert any("f32 GGUF weights with -t 6 threads" in n for n in exported.notes)
    script = exported.text.replace("\\\n", " ")
    assert shlex.split(script, comments=True)[1:-1] == argv  # the script execs the command


@pytest.mark.parametrize(
    ("deployment", "sglang", "tgi", "trtllm"),
    [
        (
            VLLM_GPU,
            {"--tp-size": "4", "--dtype": "bfloat16", "--context-length": "2048"},
            {
                "--num-shard": "4",
                "--dtype": "bfloat16",
                "--max-input-tokens": "2047",
                "--max-total-tokens": "2048",
            },
            {"tensor_parallel_size": 4, "dtype": "bfloat16", "max_seq_len": 2048},
        ),
        (
            LLAMACPP,  # f32 GGUF: float32 where the stack takes it (not TGI), the context per slot
            {"--dtype": "float32", "--context-length": "300"},
            {"--num-shard": "1", "--max-input-tokens": "299", "--max-total-tokens": "300"},
            {"dtype": "float32", "max_seq_len": 300},
        ),
        (
            Deployment("llamacpp", "q4_k_m", context_size=300),  # a quantized GGUF: no dtype anywhere
            {"--context-length": "300"},
            {"--num-shard": "1", "--max-input-tokens": "299", "--max-total-tokens": "300"},
            {"max_seq_len": 300},
        ),
    ],
)
def test_other_stacks_carry_tensor_parallel_size_dtype_and_length(
    profile: dict, deployment: Deployment, sglang: dict, tgi: dict, trtllm: dict[str, Any]
) -> None:
    prof = _with(profile, deployment)
    for fmt, program_len, want in (("sglang", 3, sglang), ("tgi", 1, tgi)):
        exported = export(prof, fmt)
        argv = shlex.split(exported.command)
        flags = dict(zip(argv[program_len::2], argv[program_len + 1 :: 2], strict=True))
        names = DEPLOYMENT_FLAGS[fmt]
        assert {k: v for k, v in flags.items() if k in names} == want, fmt
        assert list(flags)[1 : 1 + len(want)] == list(want)  # right after the model, in this order
        assert exported.notes[0].startswith("As the trials ran in")
    options = yaml.safe_load(export(prof, "trtllm").text)
    assert {k: v for k, v in options.items() if k != "speculative_config"} == trtllm
    assert options["speculative_config"]["max_draft_len"] == 5
    dropped = "dtype" not in trtllm
    assert any("Not carried" in n for n in export(prof, "trtllm").notes) == dropped


def test_tgi_says_when_the_dtype_is_not_carried(profile: dict) -> None:
    float32 = Deployment("vllm", "float32", max_model_len=512)
    exported = export(_with(profile, float32), "tgi")
    assert "--dtype" not in exported.command
    assert "Not carried: dtype float32 (TGI's --dtype takes float16 or bfloat16)." in exported.notes[0]


def test_speculation_off_still_carries_the_deployment(make_profile) -> None:
    prof = _with(make_profile(drafter="none"), VLLM_GPU)
    assert "--tp-size 4" in export(prof, "sglang").command
    trt = export(prof, "trtllm")
    assert not trt.speculation and yaml.safe_load(trt.text) == {
        "tensor_parallel_size": 4,
        "dtype": "bfloat16",
        "max_seq_len": 2048,
    }


@pytest.mark.parametrize(
    ("fmt", "args", "message"),
    [
        ("sglang", {"--model-path": "/m", "--tp-size": 0}, "--tp-size must be an integer >= 1"),
        ("sglang", {"--model-path": "/m", "--dtype": "f32"}, "--dtype must be one of"),
        ("tgi", {"--model-id": "/m", "--dtype": "float32"}, "--dtype must be float16 or bfloat16"),
        (
            "tgi",
            {"--model-id": "/m", "--max-input-tokens": 512, "--max-total-tokens": 512},
            "--max-input-tokens \\(512\\) must be < --max-total-tokens",
        ),
        ("trtllm", {"dtype": "q4_k_m"}, "dtype must be one of"),
        ("trtllm", {"max_seq_len": 0}, "max_seq_len must be an integer >= 1"),
        ("llamacpp", {"-m": "t.gguf", "-c": 0}, "-c must be an integer >= 1"),
        ("llamacpp", {"-m": "t.gguf", "-ngl": -1}, "-ngl must be an integer >= 0"),
    ],
)
def test_validators_refuse_bad_deployment_values(fmt: str, args: dict, message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        VALIDATORS[fmt](args)
