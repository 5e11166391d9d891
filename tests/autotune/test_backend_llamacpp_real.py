"""The real llama.cpp: the demo pair converted to GGUF, a 2-trial study through llama-server, greedy parity.

Needs ``bash tools/install_llamacpp.sh`` (``.ci/run`` runs it). Without it the tests are skipped with
the reason, unless AUTOTUNE_REQUIRE_LLAMACPP=1 (CI sets it once the build succeeded), which makes a
missing llama-server a failure: these tests never pass without having run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml

from autotune import context
from autotune.backends import llamacpp
from autotune.backends.http_backend import spec_counts
from autotune.backends.openai_load import run_http_load
from autotune.config import LlamacppConfig, load_config
from autotune.errors import ConfigError
from autotune.jobs.tune import run_tune
from autotune.knobs import Knobs
from engine.demo import DEMO_DRAFT, DEMO_EAGLE3, DEMO_PROMPTS, DEMO_TARGET
from engine.generate import generate
from engine.speculative import Request, SpecConfig

try:
    llamacpp.server_binary(LlamacppConfig())
except ConfigError as exc:
    reason = f"llama-server is not built ({exc}); the real-llama.cpp tests cannot run"
    if os.environ.get("AUTOTUNE_REQUIRE_LLAMACPP") == "1":
        raise RuntimeError(reason + ", and AUTOTUNE_REQUIRE_LLAMACPP=1") from None
    pytest.skip(reason, allow_module_level=True)


def _config(tmp_path: Path, **extra) -> Path:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(DEMO_PROMPTS.read_text().splitlines()[:4]) + "\n")
    raw = {
        "models": {
            "target": str(DEMO_TARGET),
            "draft": str(DEMO_DRAFT),
            "device": "cpu",
            "dtype": "float32",
            "compile": False,
        },
        "workload": {"prompts": str(prompts), "max_new_tokens": 16, "concurrency": [1, 2], "num_requests": 2},
        "search": {
            "drafter": ["model"],
            "gamma": {"low": 0, "high": 4},
            "max_batch_size": [2],
            "gamma_cap": "off",
        },
        "budget": {"seed": 0, "remeasure_top": 1},
        "storage": {"url": f"sqlite:///{tmp_path / 'autotune.db'}"},
        "export": {"formats": ["llamacpp", "yaml"], "dir": str(tmp_path / "exports")},
        "profile": {"gamma_max": 4},
        "backend": {"name": "llamacpp", "n_trials": 2},
        **extra,
    }
    (tmp_path / "tune.yaml").write_text(yaml.safe_dump(raw))
    return tmp_path / "tune.yaml"


def _servers() -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if "llama-server" in line and "--port" in line]


def test_two_trial_study_in_real_llama_servers(tmp_path: Path) -> None:
    cfg = load_config(_config(tmp_path))
    profile = run_tune(cfg, say=print)
    assert profile["backend"]["name"] == "llamacpp" and profile["backend"]["version"]
    assert profile["backend"]["gguf"]["prompts_tokenized_identically"] == 4
    assert profile["study"]["n_trials"] == 2 and profile["study"]["failed_trials"] == 0
    for lv in profile["metrics"]["per_level"].values():
        assert lv["tokens_per_second"] > 0
    assert not _servers(), "a llama-server outlived autotune tune"
    script = (tmp_path / "exports" / "llamacpp-args.sh").read_text()
    assert ".gguf" in script and "-np 2" in script  # runnable: GGUF paths, the tuned slots


@pytest.mark.parametrize("drafter", ["model", "eagle3"])
def test_llama_server_speculative_greedy_output_equals_the_engines(tmp_path: Path, drafter: str) -> None:
    """llama-server's speculative greedy output, with the demo draft model (draft-simple) or the demo
    EAGLE-3 head (draft-eagle3, its GGUF converted against the target), equals the engine's."""
    extra = {}
    if drafter == "eagle3":
        models = {
            "target": str(DEMO_TARGET),
            "eagle3": str(DEMO_EAGLE3),
            "device": "cpu",
            "dtype": "float32",
            "compile": False,
        }
        search = {
            "drafter": ["eagle3"],
            "gamma": {"low": 0, "high": 4},
            "max_batch_size": [2],
            "gamma_cap": "off",
        }
        extra = {"models": models, "search": search}
    cfg = load_config(_config(tmp_path, **extra))
    ctx = context.build(cfg)
    backend = llamacpp.LlamacppBackend(ctx)
    requests = ctx.requests[:4]
    command = backend.command(Knobs(drafter, 3, 0.0, max_batch_size=2))
    assert (
        command[command.index("--spec-type") + 1]
        == {"model": "draft-simple", "eagle3": "draft-eagle3"}[drafter]
    )
    try:
        server = backend.server_for(command)
        before = spec_counts(server.get("/metrics"), "llamacpp")
        run = run_http_load(backend.endpoint(server), requests, len(requests), concurrency=2)
        counts = spec_counts(server.get("/metrics"), "llamacpp") - before
        theirs = []
        for r in requests:  # the OpenAI stream carries text only; the native endpoint returns the ids
            body = json.dumps(
                {
                    "prompt": list(r.prompt_ids),
                    "n_predict": r.max_new_tokens,
                    "temperature": 0.0,
                    "return_tokens": True,
                    "cache_prompt": False,
                }
            ).encode()
            req = urllib.request.Request(
                server.base_url + "/completion", body, {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=120) as resp:
                theirs.append(json.loads(resp.read())["tokens"])
    finally:
        backend.close()
        ctx.store.close()
    context.load_engine(ctx)  # the engine's own greedy output, after the server is gone
    ours = generate(
        ctx.pair,
        [Request(r.prompt_ids, r.max_new_tokens, 0.0, id=i) for i, r in enumerate(requests)],
        SpecConfig(gamma=0),
        drafter="none",
        max_batch_size=1,
        seed=0,
    )
    assert [len(r.output_tokens) for r in run.records] == [len(t) for t in ours.tokens]
    assert theirs == [list(t) for t in ours.tokens]
    assert counts.drafts > 0 and counts.accepted > 0  # it speculated, and the drafts were accepted


def _logged_threads(log: str) -> set[int]:
    """The thread counts llama-server logged (``n_threads = N``)."""
    return {int(m) for m in re.findall(r"n_threads = (\d+)", log)}


def _pad256(n: int) -> int:
    return -(-n // 256) * 256


def test_the_exports_script_serves_the_trials_configuration(tmp_path: Path) -> None:
    """The llama.cpp export of a trial's profile, run as written (``sh llamacpp-args.sh``, llama-server on
    PATH; only the address is added), serves what the trial served: slots, context per slot and
    GGUF type from ``/props``, the draft model and the thread count from its log, ``/metrics`` on."""
    from autotune.backends.server import ServerProcess
    from profiles.exporters import export, write_export

    cfg = load_config(_config(tmp_path))
    ctx = context.build(cfg)
    backend = llamacpp.LlamacppBackend(ctx)
    try:
        trial = backend.command(Knobs("model", 3, 0.0, max_batch_size=2))
        profile = {
            "tool_version": "0",
            "created_at": "2026-11-30T00:00:00+00:00",
            "device": ctx.fingerprint,
            "pair": {"target": str(DEMO_TARGET), "draft": str(DEMO_DRAFT)},
            "chosen": {"drafter": "model", "gamma": 3, "confidence_threshold": 0.0, "max_batch_size": 2},
            "schedule": [{"batch_size": 2, "gamma": 3}],
            "deployment": backend.deployment.to_json(),
        }
        exported = export(profile, "llamacpp", str(backend.target_gguf), str(backend.draft_gguf))
        folder = tmp_path / "export"
        folder.mkdir()
        script = write_export(exported, folder)[0]
        assert shlex.split(exported.command)[1:] == trial[1 : trial.index("--host")]  # tuned == exported
        env = {"PATH": f"{backend.binary.parent}:{os.environ['PATH']}"}
        command = ["sh", str(script), "--host", "127.0.0.1", "--port", "{port}", "--no-webui"]
        log = tmp_path / "export-server.log"
        with ServerProcess(command, log, env=env, startup_timeout_s=backend.startup_timeout_s) as server:
            props = json.loads(server.get("/props"))
            metrics = server.get("/metrics")
    finally:
        backend.close()
        ctx.store.close()
    flags = dict(zip(trial[1::2], trial[2::2], strict=False))
    slots, total = int(flags["-np"]), int(flags["-c"])
    assert slots == 2 and total == 2 * ctx.longest_sequence
    # llama.cpp pads -c and each slot's share -c / -np up to multiples of 256 (src/llama-context.cpp)
    per_slot = props["default_generation_settings"]["n_ctx"]
    assert props["total_slots"] == slots and per_slot == _pad256(_pad256(total) // slots)
    assert per_slot >= ctx.longest_sequence  # every slot holds the workload's longest sequence
    assert props["model_path"] == str(backend.target_gguf) and "F32" in props["model_ftype"].upper()
    assert backend.deployment.dtype == "f32"
    text = log.read_text(errors="replace")  # /props shows no speculative setting; the log does
    assert f"loading draft model '{flags['-md']}'" in text and flags["-md"] == str(backend.draft_gguf)
    assert _logged_threads(text) == {int(flags["-t"])} == {backend.deployment.threads}
    assert "llamacpp:" in metrics  # --metrics, as the trials ran
    assert not _servers(), "the export's llama-server outlived its test"


def test_a_llama3_style_bos_tokenizer_passes_the_check_in_llama_server(tmp_path: Path) -> None:
    """The demo target with a Llama-3-style tokenizer.json (a BOS post-processor), converted: the
    GGUF adds the BOS, llama-server's ids equal the engine's for a plain line and a chat line (its
    template writes bos_token, which llama-server drops before adding the BOS again)."""
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    target = tmp_path / "target"
    target.mkdir()
    for file in DEMO_TARGET.iterdir():
        (target / file.name).write_bytes(file.read_bytes())
    tok = Tokenizer.from_file(str(target / "tokenizer.json"))
    bos = tok.token_to_id("<|endoftext|>")
    tok.post_processor = TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)]
    )
    tok.save(str(target / "tokenizer.json"))
    prompts = tmp_path / "mixed.jsonl"
    turns = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "def add(a, b):"}]
    prompts.write_text(json.dumps({"prompt": "def f(x):\n"}) + "\n" + json.dumps({"messages": turns}) + "\n")
    cfg = load_config(_config(tmp_path)).with_overrides(
        {
            "models.target": str(target),
            "models.draft": None,
            "search.drafter": ["none"],
            "workload.prompts": str(prompts),
        }
    )
    ctx = context.build(cfg)
    try:
        assert [r.prompt_ids[:1] for r in ctx.requests] == [[bos], [bos]]
        assert ctx.requests[1].prompt_ids.count(bos) == 1  # the template's bos_token, not added again
        backend = llamacpp.LlamacppBackend(ctx)
        backend.close()
    finally:
        ctx.store.close()
    assert backend.tokens_checked == 2
    assert not _servers()


def test_a_study_over_q4_k_m_gguf_files_exports_a_server_of_those_files(tmp_path: Path) -> None:
    """The demo pair quantized to q4_k_m (converter + llama-quantize), given as models.gguf, on chat
    conversations: autotune tune finishes without any Hugging Face folder (llama-server renders the
    template the converter copied into the file and tokenizes), the profile says the workload is
    chat-formatted, and the export's script, run as written, loads exactly those two files."""
    from autotune.backends import gguf
    from autotune.backends.server import ServerProcess

    lc = LlamacppConfig(quantization="q4_k_m")
    target, draft = (gguf.ensure(folder, lc, "models.target") for folder in (DEMO_TARGET, DEMO_DRAFT))
    f32 = gguf.ensure(DEMO_TARGET, LlamacppConfig(), "models.target")
    chat = tmp_path / "chat.jsonl"
    chat.write_text("\n".join((DEMO_TARGET.parents[1] / "chat.jsonl").read_text().splitlines()[:4]) + "\n")
    assert "q4_k_m" in target.name and target.stat().st_size < f32.stat().st_size / 4
    cfg = load_config(_config(tmp_path)).with_overrides(
        {
            "models.target": None,
            "models.draft": None,
            "models.gguf": {"target": str(target), "draft": str(draft)},
            "workload.prompts": str(chat),
        }
    )
    profile = run_tune(cfg, say=print)
    assert profile["workload"]["format"] == "chat" and profile["workload"]["chat_template_sha256"]
    assert profile["backend"]["gguf"]["as_served"] and profile["backend"]["gguf"]["type"] == "q4_k_m"
    assert profile["backend"]["gguf"]["prompts_tokenized_by_llama_server"] == 4
    assert profile["deployment"]["dtype"] == "q4_k_m" and profile["study"]["failed_trials"] == 0
    assert not _servers(), "a llama-server outlived autotune tune"
    script = tmp_path / "exports" / "llamacpp-args.sh"
    argv = shlex.split(script.read_text().split("\nexec ", 1)[1].replace("\\\n", " "))
    assert argv[argv.index("-m") + 1] == str(target)
    binary = llamacpp.server_binary(cfg.backend.llamacpp)
    env = {"PATH": f"{binary.parent}:{os.environ['PATH']}"}
    command = ["sh", str(script), "--host", "127.0.0.1", "--port", "{port}", "--no-webui"]
    log = tmp_path / "export-server.log"
    with ServerProcess(command, log, env=env, startup_timeout_s=120) as server:
        props = json.loads(server.get("/props"))
    assert props["model_path"] == str(target) and "Q4_K" in props["model_ftype"].upper()
    if profile["chosen"]["drafter"] == "model" and profile["chosen"]["gamma"]:
        assert f"loading draft model '{draft}'" in log.read_text(errors="replace")
    assert not _servers(), "the export's llama-server outlived its test"
