"""``models.gguf`` (llama.cpp files used as they are) and ``backend.llamacpp.quantization``, without llama.cpp.

Key validation is one line naming the key and the file; a GGUF header is read for the shape, the
vocabulary and the type; a study over ``models.gguf`` gets its requests from llama-server's
tokenizer (the fake server of test_backend_llamacpp.py) and serves the files as they are. The real
llama-server runs in test_backend_llamacpp_real.py.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import yaml
from tokenizers import Tokenizer

from autotune import context
from autotune.backends import gguf
from autotune.backends.llamacpp import LlamacppBackend
from autotune.config import load_config
from autotune.device.gguf_header import read_gguf
from autotune.errors import ConfigError
from autotune.knobs import Knobs
from tests.autotune.test_backend_llamacpp import make_home


def _s(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def write_gguf(
    path: Path, vocab: int = 300, layers: int = 2, ftype: int = 15, truncate: int = 0, chat_template: str = ""
) -> Path:
    """A GGUF header llama.cpp would write for a tiny llama (no tensors): architecture, shape,
    context length, file type, the token list and, when given, the chat template."""
    u32 = lambda v: struct.pack("<I", v)  # noqa: E731
    kvs = [
        ("general.architecture", 8, _s("llama")),
        ("general.file_type", 4, u32(ftype)),
        ("llama.block_count", 4, u32(layers)),
        ("llama.context_length", 4, u32(512)),
        ("llama.embedding_length", 4, u32(64)),
        ("llama.attention.head_count", 4, u32(4)),
        ("llama.attention.head_count_kv", 4, u32(2)),
        (
            "tokenizer.ggml.tokens",
            9,
            u32(8) + struct.pack("<Q", vocab) + b"".join(_s(f"t{i}") for i in range(vocab)),
        ),
    ]
    if chat_template:
        kvs.append(("tokenizer.chat_template", 8, _s(chat_template)))
    body = b"GGUF" + u32(3) + struct.pack("<QQ", 0, len(kvs))
    body += b"".join(_s(key) + u32(kind) + value for key, kind, value in kvs)
    path.write_bytes(body[: len(body) - truncate] if truncate else body)
    return path


def write_cfg(tmp_path: Path, models: dict, backend: dict | None = None, **search) -> Path:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["def f(x):\n", "class A:\n"]))
    raw = {
        "models": {"device": "cpu", "compile": False, **models},
        "workload": {"prompts": str(prompts), "concurrency": [1, 2], "num_requests": 2, "max_new_tokens": 6},
        "search": {"drafter": ["model"], "max_batch_size": [2], **search},
        "storage": {"url": f"sqlite:///{tmp_path / 'autotune.db'}"},
        "backend": backend if backend is not None else {"name": "llamacpp", "llamacpp": {"threads": 1}},
    }
    (tmp_path / "tune.yaml").write_text(yaml.safe_dump(raw))
    return tmp_path / "tune.yaml"


def test_a_gguf_header_reads_as_a_checkpoint(tmp_path) -> None:
    ckpt = read_gguf(write_gguf(tmp_path / "t.gguf", vocab=300, layers=3), "models.gguf.target")
    assert ckpt.config["vocab_size"] == 300 and ckpt.config["num_hidden_layers"] == 3
    assert ckpt.config["max_position_embeddings"] == 512 and ckpt.stored_dtypes == {"q4_k_m"}
    size = (tmp_path / "t.gguf").stat().st_size
    assert ckpt.weights_bytes("float32") == ckpt.weights_bytes("float16") == size  # loaded as stored
    assert ckpt.kv_bytes_per_token("float16") == 2 * 3 * 2 * 16 * 2  # K+V, layers, kv heads, head dim 64/4


@pytest.mark.parametrize(
    ("models", "backend", "search", "message"),
    [
        ({"gguf": {"target": "missing.gguf"}}, None, {}, r"^models.gguf.target: missing.gguf does not exist"),
        (
            {"gguf": {"target": "t.gguf", "draft": "notes.txt"}},
            None,
            {},
            r"^models.gguf.draft: .*notes.txt is not a GGUF file",
        ),
        ({"gguf": {"target": "t.gguf", "drafts": "d.gguf"}}, None, {}, r"^models.gguf.drafts: unknown key"),
        (
            {"gguf": {"target": "t.gguf", "draft": "d.gguf"}, "target": "demo"},
            None,
            {},
            r"^models.target: not with models.gguf",
        ),
        (
            {"gguf": {"target": "t.gguf"}},
            None,
            {},
            r"^models.gguf.draft: required when search.drafter includes 'model'",
        ),
        (
            {"gguf": {"target": "t.gguf", "draft": "d.gguf"}},
            {"name": "engine"},
            {},
            r"^models.gguf: GGUF files run in llama.cpp only",
        ),
        (
            {"gguf": {"target": "t.gguf", "draft": "d.gguf"}},
            {"name": "vllm"},
            {},
            r"^models.gguf: .*the vllm backend loads",
        ),
        (
            {"gguf": {"target": "t.gguf", "draft": "d.gguf"}},
            {"name": "llamacpp", "llamacpp": {"quantization": "q8_0"}},
            {},
            r"^backend.llamacpp.quantization: converts a Hugging Face pair; models.gguf files are served as they are",
        ),
        (
            {"gguf": {"target": "t.gguf", "draft": "d.gguf"}},
            None,
            {"drafter": ["model", "eagle3"]},
            r"^search.drafter: 'eagle3' needs Hugging Face folders",
        ),
        (
            {"target": "demo", "draft": "demo"},
            {"name": "llamacpp", "llamacpp": {"quantization": "q5_k"}},
            {},
            r"^backend.llamacpp.quantization: must be one of f32, f16, bf16, q8_0, q4_k_m or null \(got 'q5_k'\)",
        ),
    ],
)
def test_bad_gguf_keys_are_one_line_errors(tmp_path, monkeypatch, models, backend, search, message) -> None:
    monkeypatch.chdir(tmp_path)
    write_gguf(tmp_path / "t.gguf")
    write_gguf(tmp_path / "d.gguf")
    (tmp_path / "notes.txt").write_text("not a model\n")
    with pytest.raises(ConfigError, match=message) as err:
        load_config(write_cfg(tmp_path, models, backend, **search))
    assert "\n" not in str(err.value)


def test_a_truncated_header_and_a_foreign_vocabulary_are_refused(tmp_path) -> None:
    write_gguf(tmp_path / "t.gguf", truncate=20)
    write_gguf(tmp_path / "d.gguf", vocab=200)
    cfg = load_config(write_cfg(tmp_path, {"gguf": {"target": "t.gguf", "draft": "d.gguf"}}))
    with pytest.raises(ConfigError, match=r"^models.gguf.target: .*t.gguf: the GGUF header ends early"):
        context.build(cfg)
    write_gguf(tmp_path / "t.gguf", vocab=300)
    with pytest.raises(ConfigError, match=r"^models.gguf.draft: .*d.gguf has 200 tokens, the target 300"):
        context.build(cfg)


def test_a_study_over_gguf_files_serves_them_as_they_are(tmp_path, tiny_pair_dirs) -> None:
    """No tokenizer.json: llama-server tokenizes the prompts; the files are launched as given, their
    own type is the deployment's, and the memory check reads their sizes."""
    tokenizer = tiny_pair_dirs[0] / "tokenizer.json"
    vocab = Tokenizer.from_file(str(tokenizer)).get_vocab_size()
    target, draft = write_gguf(tmp_path / "t.gguf", vocab), write_gguf(tmp_path / "d.gguf", vocab)
    home = make_home(tmp_path, tokenizer)
    backend_cfg = {"name": "llamacpp", "llamacpp": {"home": str(home), "threads": 1}}
    cfg = load_config(write_cfg(tmp_path, {"gguf": {"target": "t.gguf", "draft": "d.gguf"}}, backend_cfg))
    assert cfg.models.target == target and cfg.models.draft == draft
    ctx = context.build(cfg)
    assert ctx.requests == [] and ctx.files.tokenizer is None  # tokenized by the server, not here
    backend = LlamacppBackend(ctx)
    try:
        want = [Tokenizer.from_file(str(tokenizer)).encode(p).ids for p in ["def f(x):\n", "class A:\n"]]
        assert [r.prompt_ids for r in ctx.requests] == want
        command = backend.command(Knobs("model", 3, 0.0, max_batch_size=2))
        assert command[command.index("-m") + 1] == str(target) and command[command.index("-md") + 1] == str(
            draft
        )
        assert (
            backend.deployment.dtype == "q4_k_m" and backend.deployment.context_size == ctx.longest_sequence
        )
        assert "t.gguf + d.gguf + KV cache (2 x" in backend.memory
        assert backend.server_need().bytes >= target.stat().st_size + draft.stat().st_size
        result = backend.run(Knobs("model", 2, 0.1, "constant", 2), 0).to_json()
        described = backend.describe()["gguf"]
    finally:
        backend.close()
        ctx.store.close()
    assert result["per_level"][1]["tokens_per_second"] > 0
    assert described == {
        "target": str(target),
        "draft": str(draft),
        "type": "q4_k_m",
        "as_served": True,
        "prompts_tokenized_by_llama_server": 2,
    }
    assert gguf.ensure(target, cfg.backend.llamacpp, "models.target") == target  # the export's files too


def test_a_quantized_pair_is_made_from_the_cached_f32_file(tmp_path, tiny_pair_dirs) -> None:
    """quantization q4_k_m: the f32 conversion (pre-placed) goes through llama-quantize once; the file
    is cached under its own key and the deployment records the type."""
    from autotune.backends import llamacpp

    home = make_home(tmp_path, tiny_pair_dirs[0] / "tokenizer.json")
    calls = tmp_path / "calls.txt"
    (home / "bin" / "llama-quantize").write_text(f'#!/bin/sh\necho "$@" >> {calls}\ncp "$1" "$2"\n')
    (home / "bin" / "llama-quantize").chmod(0o755)
    models = {"target": str(tiny_pair_dirs[0]), "draft": str(tiny_pair_dirs[1])}
    backend_cfg = {"name": "llamacpp", "llamacpp": {"home": str(home), "quantization": "q4_k_m"}}
    cfg = load_config(write_cfg(tmp_path, models, backend_cfg))
    lc = cfg.backend.llamacpp
    f32 = gguf.gguf_path(
        cfg.models.target, cfg.with_overrides({"backend.llamacpp.quantization": None}).backend.llamacpp
    )
    f32.parent.mkdir(parents=True, exist_ok=True)
    f32.write_bytes(b"GGUF f32")
    out = gguf.ensure(cfg.models.target, lc, "models.target")
    assert out != f32 and out.name.startswith("target-q4_k_m-") and out.read_bytes() == b"GGUF f32"
    assert gguf.ensure(cfg.models.target, lc, "models.target") == out  # cached: quantized once
    assert calls.read_text().split() == [str(f32), str(out.with_name(f".{out.name}.tmp")), "Q4_K_M"]
    assert llamacpp.deployment(cfg, 100).dtype == "q4_k_m"
    (home / "bin" / "llama-quantize").write_text("#!/bin/sh\necho 'tensor type not supported' >&2\nexit 1\n")
    draft_f32 = gguf.gguf_path(
        cfg.models.draft, cfg.with_overrides({"backend.llamacpp.quantization": None}).backend.llamacpp
    )
    draft_f32.write_bytes(b"GGUF f32")
    with pytest.raises(
        ConfigError, match=r"^models.draft: llama-quantize failed on .*\(q4_k_m\): .*not supported"
    ):
        gguf.ensure(cfg.models.draft, lc, "models.draft")
    assert not gguf.gguf_path(cfg.models.draft, lc).exists()


def test_the_current_profile_of_gguf_files_is_looked_up_by_their_bytes(tmp_path, tiny_pair_dirs) -> None:
    """`autotune profiles show current` / `export current` on a models.gguf config: the store's keys
    are the files' hashes and the host's fingerprint as `autotune tune` computed them, so the profile
    it stored is found (a folder hash of a file was an error)."""
    from autotune.cli.profiles import _resolve
    from tests.test_cli_profiles import sample_profile

    tokenizer = tiny_pair_dirs[0] / "tokenizer.json"
    vocab = Tokenizer.from_file(str(tokenizer)).get_vocab_size()
    write_gguf(tmp_path / "t.gguf", vocab), write_gguf(tmp_path / "d.gguf", vocab)
    backend_cfg = {
        "name": "llamacpp",
        "llamacpp": {"home": str(make_home(tmp_path, tokenizer)), "threads": 1},
    }
    path = write_cfg(tmp_path, {"gguf": {"target": "t.gguf", "draft": "d.gguf"}}, backend_cfg)
    ctx = context.build(load_config(path))
    try:
        with pytest.raises(Exception, match=r"^no profile yet for this host"):
            _resolve(ctx.store, "current", path)
        profile = sample_profile(ctx.fingerprint)
        profile["pair"].update(target_hash=ctx.target_hash, draft_hash=ctx.draft_hash)
        saved = ctx.store.save_profile(profile)
        assert _resolve(ctx.store, "current", path).to_json()["id"] == saved
    finally:
        ctx.store.close()


def test_a_chat_workload_over_gguf_files_is_keyed_by_the_files_template(tmp_path) -> None:
    """A messages workload with models.gguf says `format: chat` and is keyed by the target file's
    tokenizer.chat_template (llama-server applies it); a file without one says llama-server's default."""
    from engine.workload import load_workload

    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    items = load_workload(chat)
    ids = {}
    for template in ("{{ messages[0].content }}", "{{ bos_token }}{{ messages[0].content }}", ""):
        write_gguf(tmp_path / "t.gguf", chat_template=template), write_gguf(tmp_path / "d.gguf")
        cfg = load_config(write_cfg(tmp_path, {"gguf": {"target": "t.gguf", "draft": "d.gguf"}}))
        ids[template] = context.workload_identity(cfg, items)
        assert ids[template]["format"] == "chat"
    assert ids[""]["chat_template"] == "llama-server's default" and "chat_template_sha256" not in ids[""]
    keys = [ids[t]["chat_template_sha256"] for t in list(ids)[:2]]
    assert keys[0] != keys[1]
