"""The HTTP load with chat requests: turns to ``/v1/chat/completions``, token ids to ``/v1/completions``.

An in-process server answers both endpoints in vLLM's streaming shapes (a chat stream opens with a
role-only delta, then one chunk per token with ``delta.content`` and, asked with
``return_token_ids``, the chunk's ``token_ids``; the last event carries ``usage``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from autotune.backends.openai_load import Endpoint, completion_body, run_http_load
from autotune.workload.runner import ChatRequest
from engine.chat import ChatTurn
from engine.speculative import Request

OUTPUT = [11, 12, 13]


class Handler(BaseHTTPRequestHandler):
    seen: list[tuple[str, dict]] = []

    def log_message(self, *a) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Handler.seen.append((self.path, body))
        chat = self.path == "/v1/chat/completions"
        ids = body.get("return_token_ids")
        events: list[dict] = (
            [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}] if chat else []
        )
        for t in OUTPUT:
            choice: dict = (
                {"index": 0, "delta": {"content": f"t{t}"}} if chat else {"index": 0, "text": f"t{t}"}
            )
            events.append({"choices": [{**choice, **({"token_ids": [t]} if ids else {})}]})
        events[-1]["choices"][0]["finish_reason"] = "length"
        events.append({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": len(OUTPUT)}})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for event in events:
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture
def server() -> Iterator[str]:
    Handler.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()
    httpd.server_close()


TURNS = (ChatTurn("system", "Be brief."), ChatTurn("user", "def f("))


def test_a_chat_request_sends_its_turns_and_a_plain_one_its_ids(server) -> None:
    endpoint = Endpoint(server, "m", extra_body=(("return_token_ids", True),))
    requests = [ChatRequest([1, 2, 3], 3, messages=TURNS), Request([4, 5], 3)]
    run = run_http_load(endpoint, requests, 4, concurrency=1)
    paths = [path for path, _ in Handler.seen]
    assert paths == ["/v1/chat/completions", "/v1/completions"] * 2
    chat, plain = Handler.seen[0][1], Handler.seen[1][1]
    assert chat["messages"] == [t.as_dict() for t in TURNS] and "prompt" not in chat
    assert plain["prompt"] == [4, 5] and "messages" not in plain
    assert chat["max_tokens"] == 3 and chat["return_token_ids"] is True and chat["stream"] is True
    assert [r.output_tokens for r in run.records] == [OUTPUT] * 4  # the chat stream's token ids are counted
    assert all(r.first_token_s < r.finish_s for r in run.records)


def test_without_token_ids_a_chat_stream_counts_usage_tokens(server) -> None:
    run = run_http_load(Endpoint(server, "m"), [ChatRequest([1], 3, messages=TURNS)], 1, concurrency=1)
    assert run.records[0].output_tokens == [-1] * len(OUTPUT)
    assert run.records[0].first_token_s < run.records[0].finish_s  # the first delta with content


def test_completion_body_keeps_sampling_for_both_kinds() -> None:
    endpoint = Endpoint("http://h:1", "m")
    chat = completion_body(endpoint, ChatRequest([1], 4, 0.7, 5, 0.9, messages=TURNS), seed=3)
    plain = completion_body(endpoint, Request([1], 4, 0.7, 5, 0.9), seed=3)
    shared = ("model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stream_options")
    assert {k: chat[k] for k in shared} == {k: plain[k] for k in shared}
