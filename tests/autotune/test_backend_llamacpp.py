"""The llama.cpp backend without llama.cpp: flags, GGUF cache, tokenizer check, a trial against a fake server.

The fake llama-server is ``fake_openai_server.py`` behind a shell script at ``<home>/bin/llama-server``
(counters under the ``llamacpp:`` prefix, ``/tokenize`` from the pair's tokenizer.json); GGUF files
are pre-placed in the cache so no converter runs. The real llama-server runs in
test_backend_llamacpp_real.py.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import pytest
import yaml

from autotune import context
from autotune.backends import gguf, llamacpp
from autotune.backends.llamacpp import LlamacppBackend
from autotune.config import load_config
from autotune.errors import ConfigError
from autotune.knobs import Knobs
from autotune.records import LEVEL_KEYS, PER_POSITION
from profiles.exporters import export
from profiles.profile import export_inputs
from profiles.schema import Profile

FAKE = Path(__file__).with_name("fake_openai_server.py")


def make_home(tmp_path: Path, tokenizer: Path, *fake_args: str) -> Path:
    home = tmp_path / "llamacpp"
    (home / "bin").mkdir(parents=True)
    script = home / "bin" / "llama-server"
    script.write_text(
        '#!/bin/sh\nif [ "$1" = "--version" ]; then echo "version: 9999 (fake)"; exit 0; fi\n'
        f"exec {shlex.quote(sys.executable)} {shlex.quote(str(FAKE))} serve m --metrics-prefix llamacpp "
        f'--tokenizer {shlex.quote(str(tokenizer))} {" ".join(fake_args)} "$@"\n'
    )
    script.chmod(0o755)
    return home


def make_cfg(tmp_path: Path, tiny_pair_dirs, home: Path, **search):
    target, draft = tiny_pair_dirs
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["def f(x):\n", "class A:\n"]))
    raw = {
        "models": {
            "target": str(target),
            "draft": str(draft),
            "device": "cpu",
            "dtype": "float32",
            "compile": False,
        },
        "workload": {"prompts": str(prompts), "concurrency": [1, 2], "num_requests": 2, "max_new_tokens": 6},
        "search": {"drafter": ["model"], "max_batch_size": [2], **search},
        "backend": {"name": "llamacpp", "llamacpp": {"home": str(home), "threads": 1}},
    }
    (tmp_path / "tune.yaml").write_text(yaml.safe_dump(raw))
    cfg = load_config(tmp_path / "tune.yaml")
    for folder in (
        cfg.models.target,
        cfg.models.draft,
    ):  # pre-converted: the cache is used, no converter needed
        path = gguf.gguf_path(folder, cfg.backend.llamacpp)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"GGUF")
    return cfg


def test_trial_flags_are_the_llamacpp_exporters_flags(tmp_path, tiny_pair_dirs) -> None:
    cfg = make_cfg(tmp_path, tiny_pair_dirs, make_home(tmp_path, tiny_pair_dirs[0] / "tokenizer.json"))
    cfg = cfg.with_overrides({"backend.llamacpp.gpu_layers": 99})
    from autotune.backends.http_backend import trial_inputs

    deployment = llamacpp.deployment(cfg, 300)
    for params in (
        {"drafter": "model", "gamma": 3, "confidence_threshold": 0.25, "max_batch_size": 2},
        {"drafter": "none", "gamma": 0, "max_batch_size": 4},
    ):
        knobs = Knobs.from_params(params)
        inputs = trial_inputs(
            cfg, {"label": "CPU", "key": "k"}, knobs, "/g/t.gguf", "/g/d.gguf", deployment=deployment
        )
        cmd = llamacpp.server_command(Path("/bin/llama-server"), inputs)
        profile = {
            "tool_version": "0",
            "created_at": "2026-11-30T00:00:00+00:00",
            "device": {"label": "CPU", "key": "k"},
            "pair": {"target": "/hf/t", "draft": "/hf/d"},
            "chosen": params,
            "schedule": [{"batch_size": params["max_batch_size"], "gamma": params["gamma"]}],
            "deployment": deployment.to_json(),
        }
        exported = export(profile, "llamacpp", target_model="/g/t.gguf", draft_model="/g/d.gguf")
        tuned = cmd[: cmd.index("--host")]
        assert ["llama-server", *tuned[1:]] == shlex.split(exported.command)  # tuned == exported
        assert cmd[cmd.index("--host") :] == ["--host", "127.0.0.1", "--port", "{port}", "--no-webui"]
        flags = dict(zip(tuned[1::2], tuned[2::2], strict=False))
        slots = params["max_batch_size"]
        assert flags["-np"] == str(slots) and flags["-c"] == str(slots * 300)  # each slot holds 300
        assert flags["-t"] == "1" and flags["-ngl"] == "99" and "-ngld" not in flags
        assert tuned[-2:] == ["--metrics", "--no-cache-prompt"] and flags["-m"] == "/g/t.gguf"
        if params["gamma"]:
            assert flags["--spec-draft-n-max"] == "3" and flags["--spec-draft-p-min"] == "0.25"
            assert flags["-md"] == "/g/d.gguf"
        else:
            assert not any(part.startswith("--spec") for part in cmd)
    assert deployment.dtype == gguf.OUTTYPE == "f32" and deployment.context_size == 300


def test_threads_default_to_the_hosts_physical_cores(tmp_path, tiny_pair_dirs) -> None:
    cfg = make_cfg(tmp_path, tiny_pair_dirs, tmp_path / "home")
    cfg = cfg.with_overrides({"backend.llamacpp.threads": None})
    assert llamacpp.deployment(cfg, 100).threads == llamacpp.physical_cores() >= 1
    smt = "".join(f"processor: {i}\nphysical id: 0\ncore id: {i % 2}\n\n" for i in range(4))
    assert llamacpp.physical_cores(smt) == 2  # 4 logical processors, 2 cores with 2 SMT threads each
    assert llamacpp.physical_cores("processor: 0\n") == os.cpu_count()  # no core ids: the CPU count


def test_an_engine_profile_serves_with_this_studys_deployment(tmp_path, tiny_pair_dirs) -> None:
    """A profile without a deployment (tuned on the engine) is launched with the study's flags."""
    cfg = make_cfg(tmp_path, tiny_pair_dirs, make_home(tmp_path, tiny_pair_dirs[0] / "tokenizer.json"))
    ctx = context.build(cfg)
    backend = LlamacppBackend(ctx)
    try:
        profile = {
            "tool_version": "0",
            "created_at": "2026-11-30T00:00:00+00:00",
            "device": {"label": "CPU", "key": "k"},
            "pair": {"target": "/hf/t", "draft": "/hf/d"},
            "chosen": {"drafter": "model", "gamma": 2, "max_batch_size": 2},
            "schedule": [{"batch_size": 2, "gamma": 2}],
        }
        inputs = export_inputs(Profile.from_json(profile), str(backend.target_gguf), str(backend.draft_gguf))
        assert backend.profile_command(inputs) == backend.command(Knobs("model", 2, 0.0, max_batch_size=2))
        assert backend.describe()["threads"] == 1
    finally:
        backend.close()
        ctx.store.close()


def test_a_trial_against_the_fake_llama_server(tmp_path, tiny_pair_dirs) -> None:
    home = make_home(tmp_path, tiny_pair_dirs[0] / "tokenizer.json")
    cfg = make_cfg(tmp_path, tiny_pair_dirs, home)
    ctx = context.build(cfg)
    backend = LlamacppBackend(ctx)
    try:
        assert backend.tokens_checked == 2 and backend.version == "9999 (fake)"
        result = backend.run(Knobs("model", 2, 0.1, "constant", 2), 0).to_json()
    finally:
        backend.close()
        ctx.store.close()
    assert set(result["per_level"]) == {1, 2} and set(result["per_level"][2]) == {*LEVEL_KEYS, PER_POSITION}
    assert result["per_level"][1]["acceptance_rate"] == pytest.approx(0.5)  # llamacpp:spec_decode_* counters
    assert backend.describe()["gguf"]["prompts_tokenized_identically"] == 2


def test_a_tokenizer_llama_cpp_reads_differently_is_refused(tmp_path, tiny_pair_dirs) -> None:
    home = make_home(tmp_path, tiny_pair_dirs[0] / "tokenizer.json", "--bad-tokenize")
    cfg = make_cfg(tmp_path, tiny_pair_dirs, home)
    ctx = context.build(cfg)
    try:
        with pytest.raises(ConfigError, match=r"models.target: llama.cpp tokenizes .*p.jsonl:1 differently"):
            LlamacppBackend(ctx)
    finally:
        ctx.store.close()


def test_a_failed_conversion_is_one_line_and_leaves_no_file(tmp_path, tiny_pair_dirs) -> None:
    home = make_home(tmp_path, tiny_pair_dirs[0] / "tokenizer.json")
    cfg = make_cfg(tmp_path, tiny_pair_dirs, home)
    (home / "venv" / "bin").mkdir(parents=True)
    (home / "venv" / "bin" / "python").symlink_to(sys.executable)
    (home / "llama.cpp").mkdir()
    (home / "llama.cpp" / "convert_hf_to_gguf.py").write_text(
        "raise SystemExit('unsupported architecture X')\n"
    )
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"0")
    with pytest.raises(ConfigError, match=r"^models.target: llama.cpp's converter failed on .*model: "):
        gguf.ensure(folder, cfg.backend.llamacpp, "models.target")
    assert not gguf.gguf_path(folder, cfg.backend.llamacpp).exists()
    assert not list(gguf.gguf_path(folder, cfg.backend.llamacpp).parent.glob(".*.tmp"))


def test_missing_llama_server_is_a_one_line_config_error(tmp_path, tiny_pair_dirs) -> None:
    cfg = make_cfg(tmp_path, tiny_pair_dirs, tmp_path / "nowhere")
    ctx = context.build(cfg)
    try:
        with pytest.raises(
            ConfigError, match=r"backend.llamacpp.home: no llama-server at .*nowhere/bin/llama-server"
        ):
            LlamacppBackend(ctx)
    finally:
        ctx.store.close()


LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n'"
    " + m['content'] + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


def llama3_pair(tmp_path: Path, tiny_pair_dirs) -> tuple[Path, Path]:
    """The tiny pair with a Llama-3-style tokenizer: a BOS post-processor and a template that
    writes ``bos_token`` itself."""
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    out = []
    for folder in tiny_pair_dirs:
        copy = tmp_path / "llama3" / folder.name
        copy.mkdir(parents=True)
        for file in folder.iterdir():
            (copy / file.name).write_bytes(file.read_bytes())
        tok = Tokenizer.from_file(str(copy / "tokenizer.json"))
        bos = tok.token_to_id("<|endoftext|>")
        tok.post_processor = TemplateProcessing(
            single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)]
        )
        tok.save(str(copy / "tokenizer.json"))
        config = {
            "bos_token": "<|endoftext|>",
            "eos_token": "<|endoftext|>",
            "chat_template": LLAMA3_TEMPLATE,
        }
        (copy / "tokenizer_config.json").write_text(json.dumps(config))
        out.append(copy)
    return out[0], out[1]


def chat_prompts(tmp_path: Path) -> Path:
    path = tmp_path / "chat.jsonl"
    turns = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "def f(x):"}]
    path.write_text(json.dumps({"prompt": "class A:\n"}) + "\n" + json.dumps({"messages": turns}) + "\n")
    return path


def test_a_bos_post_processor_passes_the_tokenization_check(tmp_path, tiny_pair_dirs) -> None:
    """tokenizer.json adds a BOS and so does llama-server's completion tokenizing: equal ids, plain
    and chat lines (the template's own bos_token dropped by /apply-template, added back by /tokenize)."""
    pair = llama3_pair(tmp_path, tiny_pair_dirs)
    cfg = make_cfg(tmp_path, pair, make_home(tmp_path, pair[0] / "tokenizer.json"))
    cfg = cfg.with_overrides({"workload.prompts": str(chat_prompts(tmp_path))})
    ctx = context.build(cfg)
    try:
        assert all(r.prompt_ids[0] == ctx.files.tokenizer.token_to_id("<|endoftext|>") for r in ctx.requests)
        assert [r.prompt_ids.count(r.prompt_ids[0]) for r in ctx.requests] == [1, 1]  # one BOS each
        backend = LlamacppBackend(ctx)
        backend.close()
        assert backend.tokens_checked == 2
    finally:
        ctx.store.close()


def test_a_gguf_without_the_bos_is_refused_naming_the_bos(tmp_path, tiny_pair_dirs) -> None:
    pair = llama3_pair(tmp_path, tiny_pair_dirs)
    cfg = make_cfg(tmp_path, pair, make_home(tmp_path, pair[0] / "tokenizer.json", "--no-bos"))
    ctx = context.build(cfg)
    try:
        with pytest.raises(ConfigError, match=r"p.jsonl:1 differently .*only a leading BOS differs") as err:
            LlamacppBackend(ctx)
        assert "\n" not in str(err.value)
    finally:
        ctx.store.close()
