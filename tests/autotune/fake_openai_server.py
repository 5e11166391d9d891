"""A stand-in for an OpenAI-compatible serving stack, for lifecycle and load-driver tests.

Run as ``python fake_openai_server.py serve MODEL --port P [flags]`` (the shape of ``vllm serve``;
unknown flags are ignored). It serves ``/health``, ``/version``, ``/metrics`` (vLLM's
spec-decode counter names), ``/v1/models`` (vLLM's shape: ``id`` the served name, ``root`` the
model path; with ``--metrics-prefix llamacpp`` llama-server's: ``id`` the alias or the path, no
``root``) and streaming ``/v1/completions`` whose token ids are a pure function of the prompt.
Test flags:

--never-ready          /health answers 503 forever
--die-after N          the process exits abruptly after N completions
--spawn-child          fork a sleeping child into the same process group (must die with it)
--pid-file PATH        write "<pid> <child pid>" once serving
--metrics-prefix P     counter prefix (vllm, llamacpp)
--tokenizer FILE       /tokenize answers with this tokenizer.json's ids (llama-server's endpoint)
--bad-tokenize         ... plus one, so they differ from the tokenizer's
--no-bos               /tokenize ignores add_special (a GGUF that adds no BOS where tokenizer.json does);
                       /apply-template renders the tokenizer folder's chat template
--served-model-name N  /v1/models names the model N (vLLM's flag; llama-server's is --alias)
--alias N              the same, llama-server's spelling
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STATE = {"completions": 0, "drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": [0, 0]}
LOCK = threading.Lock()


def apply_template(args: argparse.Namespace, messages: list[dict]) -> str:
    """llama-server's /apply-template: the tokenizer folder's chat template rendered with the
    generation prompt, a leading BOS text dropped where tokenizing adds the BOS (as llama-server does)."""
    import jinja2.sandbox
    from tokenizers import Tokenizer

    folder = os.path.dirname(args.tokenizer)
    with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as fh:
        config = json.load(fh)
    tok = Tokenizer.from_file(args.tokenizer)
    bos = config.get("bos_token") or ""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    text = env.from_string(config["chat_template"]).render(
        messages=messages, add_generation_prompt=True, bos_token=bos, eos_token=config.get("eos_token") or ""
    )
    adds_bos = bool(tok.encode("", add_special_tokens=True).ids) and not args.no_bos
    return text[len(bos) :] if adds_bos and bos and text.startswith(bos) else text


def tokens_for(prompt: list[int], n: int) -> list[int]:
    return [(sum(prompt) + 7 * i) % 97 for i in range(n)]


def models(args: argparse.Namespace) -> dict:
    """The /v1/models answer of the stack the flags imitate."""
    name = args.served_model_name or args.alias or args.model
    if args.metrics_prefix == "llamacpp":
        entry = {"id": name, "object": "model", "created": 0, "owned_by": "llamacpp", "meta": {}}
        return {"models": [{"name": name, "model": name}], "object": "list", "data": [entry]}
    entry = {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "vllm",
        "root": args.model,
        "parent": None,
    }
    return {"object": "list", "data": [entry]}


class Handler(BaseHTTPRequestHandler):
    args: argparse.Namespace

    def log_message(self, *a) -> None:  # quiet
        pass

    def _send(self, code: int, body: str, ctype: str = "application/json") -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(503 if self.args.never_ready else 200, "{}")
        elif self.path == "/version":
            self._send(200, json.dumps({"version": "0.0.0-fake"}))
        elif self.path == "/v1/models":
            self._send(200, json.dumps(models(self.args)))
        elif self.path == "/metrics":
            p = self.args.metrics_prefix
            with LOCK:
                lines = [
                    f'{p}:spec_decode_num_drafts_total{{engine="0"}} {STATE["drafts"]}',
                    f'{p}:spec_decode_num_draft_tokens_total{{engine="0"}} {STATE["draft_tokens"]}',
                    f'{p}:spec_decode_num_accepted_tokens_total{{engine="0"}} {STATE["accepted"]}',
                ]
                lines += [
                    f'{p}:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="{i}"}} {v}'
                    for i, v in enumerate(STATE["per_pos"])
                ]
            self._send(200, "# HELP fake\n" + "\n".join(lines) + "\n", "text/plain")
        else:
            self._send(404, "{}")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":
            from tokenizers import Tokenizer

            add_special = body.get("add_special", False) and not self.args.no_bos
            tok = Tokenizer.from_file(self.args.tokenizer)
            ids = tok.encode(body["content"], add_special_tokens=add_special).ids
            self._send(200, json.dumps({"tokens": [i + int(self.args.bad_tokenize) for i in ids]}))
            return
        if self.path == "/apply-template":
            self._send(200, json.dumps({"prompt": apply_template(self.args, body["messages"])}))
            return
        with LOCK:
            STATE["completions"] += 1
            if self.args.die_after is not None and STATE["completions"] > self.args.die_after:
                os._exit(3)
        ids = tokens_for(body["prompt"], int(body["max_tokens"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for start in range(0, len(ids), 2):  # two tokens per step, like speculation with one accepted
            chunk = ids[start : start + 2]
            event = {
                "choices": [
                    {
                        "index": 0,
                        "text": "x" * len(chunk),
                        "token_ids": chunk,
                        "finish_reason": "length" if start + 2 >= len(ids) else None,
                    }
                ]
            }
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            with LOCK:
                STATE["drafts"] += 1
                STATE["draft_tokens"] += 2
                STATE["accepted"] += 1
                STATE["per_pos"][0] += 1
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(ids)}
        self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("verb")
    parser.add_argument("model")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--never-ready", action="store_true")
    parser.add_argument("--die-after", type=int, default=None)
    parser.add_argument("--spawn-child", action="store_true")
    parser.add_argument("--pid-file", default=None)
    parser.add_argument("--metrics-prefix", default="vllm")
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--bad-tokenize", action="store_true")
    parser.add_argument("--no-bos", action="store_true")
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--alias", default=None)
    args, _ = parser.parse_known_args(argv)
    Handler.args = args
    child = None
    if args.spawn_child:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    if args.pid_file:
        with open(args.pid_file, "w") as fh:
            fh.write(f"{os.getpid()} {child.pid if child else ''}")
    server.serve_forever()


if __name__ == "__main__":
    main()
