"""``autotune watch`` holds a server against a profile of the model it serves (autotune.watch.match):
names from /v1/models against a profile's target, the pick over a store, and the CLI against the
fake OpenAI server (tests/autotune/fake_openai_server.py) answering /v1/models as vLLM and
llama-server do."""

from __future__ import annotations

import copy
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from autotune.cli import main
from autotune.errors import ConfigError
from autotune.watch import match
from autotune.watch.match import ServedModel
from profiles.errors import ProfileError
from profiles.hashing import hash_folder
from profiles.schema import Profile
from profiles.store import Store

FAKE = Path(__file__).with_name("fake_openai_server.py")
# a profile the watch can hold a server against: step costs for 1 and 2 rows, K up to 2, acceptance
PROFILE: dict[str, Any] = {
    "tool_version": "0.1.0",
    "created_at": "2026-11-30T01:30:00+00:00",
    "device": {"key": "ab12cd34ef56", "label": "CPU test", "kind": "cpu"},
    "pair": {"target": "/m/target", "draft": "/m/draft", "drafter": "model", "target_hash": "t" * 64},
    "workload": {"hash": "w" * 64, "concurrency": [1, 2]},
    "chosen": {"drafter": "model", "gamma": 2, "confidence_threshold": 0.0, "max_batch_size": 2},
    "schedule": [{"batch_size": 1, "gamma": 2}, {"batch_size": 2, "gamma": 2}],
    "curves": {
        "t_verify": {"1": {"1": 0.02, "2": 0.021, "3": 0.022}, "2": {"1": 0.023, "2": 0.024, "3": 0.025}},
        "t_draft": {"1": 0.0025, "2": 0.0028},
    },
    "acceptance": {"gamma_max": 2, "per_position_acceptance": [0.8, 0.64]},
    "backend": {"name": "vllm"},
}


def profile_of(target: str, backend: str = "vllm", target_hash: str = "t" * 64) -> dict[str, Any]:
    """The watch tests' profile, tuned on ``target`` with ``backend``."""
    data = copy.deepcopy(PROFILE)
    data["pair"] = {**data["pair"], "target": target, "target_hash": target_hash}
    data["backend"] = {"name": backend}
    return data


class FakeStore:
    """Profiles in memory, newest last in ``profiles`` (the store lists newest first)."""

    def __init__(self, *profiles: dict[str, Any]) -> None:
        self.profiles = list(profiles)
        self.loaded: list[int] = []

    def rows(self) -> list[dict[str, Any]]:
        return [
            {
                "id": i + 1,
                "backend": p["backend"]["name"],
                "pair": Path(p["pair"]["target"]).name + " / draft",
            }
            for i, p in reversed(list(enumerate(self.profiles)))
        ]

    def load(self, profile_id: int) -> Profile:
        self.loaded.append(profile_id)
        return Profile.from_json({**self.profiles[profile_id - 1], "id": profile_id})


def no_hash(path: str) -> str:
    raise AssertionError(f"hashed {path}: a name already matched, or nothing here was a folder")


def pick(store: FakeStore, stack: str, served: list[ServedModel] | None, hasher=no_hash) -> match.Pick:
    return match.pick_profile(store.rows(), store.load, stack, served, hasher)


# --- names ----------------------------------------------------------------------------------------


def test_vllm_and_llama_server_names_meet_the_profiles_target() -> None:
    pair = {"target": "/models/Qwen3-8B", "target_hash": "h"}
    vllm = [ServedModel("qwen", "/srv/weights/Qwen3-8B/")]  # --served-model-name qwen
    hub = [ServedModel("Qwen/Qwen3-8B", "Qwen/Qwen3-8B")]
    gguf = [ServedModel("/root/.cache/spec-autotune/llama.cpp/gguf/Qwen3-8B-0a1b2c3d4e5f.gguf")]
    alias = [ServedModel("Qwen3-8B")]  # llama-server --alias
    for served in (vllm, hub, gguf, alias):
        assert match.serves_target(pair, match.served_names(served), set()), served
    for other in ([ServedModel("qwen")], [ServedModel("Qwen3-8B-Base")], [ServedModel("/m/Qwen3-80B.gguf")]):
        assert not match.serves_target(pair, match.served_names(other), set()), other
    snapshot = {"target": "/hf/hub/models--Qwen--Qwen3-8B/snapshots/0123abcd", "target_hash": "h"}
    assert match.serves_target(snapshot, match.served_names(hub), set())
    assert match.serves_target(pair, set(), {"h"}) and not match.serves_target(pair, set(), {"g"})


def test_models_url_and_answers() -> None:
    assert match.models_url("http://h:8000/metrics") == "http://h:8000/v1/models"
    assert match.models_url("http://h:8000/api/metrics/") == "http://h:8000/api/v1/models"
    assert match.parse_models('{"data": [{"id": "a"}, {"id": "b", "root": ""}]}') == [
        ServedModel("a"),
        ServedModel("b"),
    ]
    for bad in ('{"data": []}', '{"object": "list"}', '{"data": [{"root": "x"}]}', "<html>"):
        with pytest.raises(ValueError):
            match.parse_models(bad)


# --- the pick -------------------------------------------------------------------------------------


def test_the_newest_profile_of_the_served_model_on_its_stack_is_picked() -> None:
    store = FakeStore(
        profile_of("/m/target"),  # 1
        profile_of("/m/target", backend="llamacpp"),  # 2
        profile_of("/m/other"),  # 3: the newest of the stack, another model
    )
    chosen = pick(store, "vllm", [ServedModel("/m/target", "/m/target")])
    assert chosen.profile.id == 1 and chosen.why == "the newest of /m/target tuned on vllm"
    on_llama = pick(store, "llamacpp", [ServedModel("/gguf/target-0123456789ab.gguf")])
    assert on_llama.profile.id == 2
    # the model tuned on another stack only: taken, and said so
    other = pick(FakeStore(profile_of("/m/target", backend="engine")), "vllm", [ServedModel("target")])
    assert other.profile.id == 1 and "none was tuned on vllm; this one on engine" in other.why


def test_a_server_of_no_stored_model_is_refused_in_one_line_naming_both() -> None:
    store = FakeStore(profile_of("/m/target"), profile_of("/m/other", backend="llamacpp"))
    with pytest.raises(ConfigError) as caught:
        pick(store, "vllm", [ServedModel("mistral", "/m/Mistral-7B")], hasher=lambda path: "x" * 64)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("the server serves mistral (/m/Mistral-7B)")
    assert "#2 other / draft on llamacpp; #1 target / draft on vllm" in message
    with pytest.raises(ProfileError, match="no profile in the store"):
        pick(FakeStore(), "vllm", [ServedModel("mistral")])


def test_a_renamed_folder_on_this_host_matches_by_its_hash(tmp_path: Path) -> None:
    folder = tmp_path / "renamed"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"weights")
    store = FakeStore(profile_of("/m/target", target_hash=hash_folder(folder)), profile_of("/m/other"))
    chosen = pick(store, "vllm", [ServedModel("served", str(folder))], hasher=hash_folder)
    assert chosen.profile.id == 1


def test_a_server_that_does_not_say_what_it_serves_gets_the_newest_of_its_stack() -> None:
    store = FakeStore(profile_of("/m/target"), profile_of("/m/other", backend="llamacpp"))
    assert pick(store, "vllm", None).why == "the newest tuned on vllm"
    fallback = pick(store, "sglang", None)
    assert fallback.profile.id == 2 and "none was tuned on sglang" in fallback.why
    assert store.loaded == [1, 2]  # nothing else read


def test_a_named_profile_of_another_model_is_warned_about() -> None:
    prof = Profile.from_json({**profile_of("/m/target"), "id": 4})
    assert match.check_profile(prof, [ServedModel("target")], no_hash) is None
    assert match.check_profile(prof, None, no_hash) is None
    warning = match.check_profile(prof, [ServedModel("mistral")], lambda path: "x" * 64)
    assert warning == "warning: profile #4 was tuned on /m/target, the server serves mistral"


# --- the CLI against the fake OpenAI server ------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def fake_openai() -> Iterator[Callable[..., str]]:
    """``start(model, *flags)`` runs the fake server and returns its base URL; each is stopped after."""
    procs: list[subprocess.Popen] = []

    def start(model: str, *flags: str) -> str:
        port = _free_port()
        proc = subprocess.Popen([sys.executable, str(FAKE), "serve", model, "--port", str(port), *flags])
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=1).close()
                return url
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def two_models(tmp_path: Path) -> str:
    """A store with a profile of ``target`` (#1) and a newer one of ``other`` (#2), both on vLLM."""
    url = f"sqlite:///{tmp_path / 'autotune.db'}"
    with Store(url) as store:
        store.save_profile(profile_of("/m/target"))
        store.save_profile(profile_of("/m/other", target_hash="o" * 64))
    return url


def watch_once(url: str, storage: str, *flags: str) -> Any:
    return CliRunner().invoke(
        main, ["watch", "--url", url, "--storage", storage, "--once", "--interval", "0.2", *flags]
    )


def test_watch_holds_a_vllm_server_against_the_profile_of_its_model(fake_openai, two_models) -> None:
    url = fake_openai("/srv/models/target", "--served-model-name", "chat")
    result = watch_once(url, two_models)
    assert result.exit_code == 0, result.output
    assert "against profile #1 (the newest of chat (/srv/models/target) tuned on vllm)" in result.stderr
    named = watch_once(url, two_models, "--profile", "2")
    assert named.exit_code == 0, named.output
    assert (
        "warning: profile #2 was tuned on /m/other, the server serves chat (/srv/models/target)"
        in named.stderr
    )


def test_watch_refuses_a_server_of_a_model_no_profile_is_of(fake_openai, two_models) -> None:
    url = fake_openai("/srv/models/mistral")
    result = watch_once(url, two_models)
    assert result.exit_code == 2, result.output
    err = result.stderr.strip().splitlines()[-1]
    assert err.startswith(
        "error: the server serves /srv/models/mistral, and no stored profile is of that model"
    )
    assert "#2 other / draft on vllm; #1 target / draft on vllm" in err and "Traceback" not in result.output


def test_watch_matches_a_llama_server_serving_the_converted_gguf(fake_openai, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'autotune.db'}"
    with Store(storage) as store:
        store.save_profile(profile_of("/m/target", backend="llamacpp"))
        store.save_profile(profile_of("/m/other", backend="llamacpp", target_hash="o" * 64))
    gguf = "/root/.cache/spec-autotune/llama.cpp/gguf/target-0123456789ab.gguf"
    url = fake_openai(gguf, "--metrics-prefix", "llamacpp")
    result = watch_once(url, storage)
    assert result.exit_code == 0, result.output
    assert f"against profile #1 (the newest of {gguf} tuned on llamacpp)" in result.stderr
