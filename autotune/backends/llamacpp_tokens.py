"""llama-server as a tokenizer: the token ids it runs for a workload line, checked or used as they are.

llama-server tokenizes a ``/v1/completions`` prompt with ``add_special`` and ``parse_special`` on
(the GGUF's ``tokenizer.ggml.add_bos_token`` decides the BOS), and a ``/v1/chat/completions``
conversation by rendering its own chat template (dropping a leading BOS text where the GGUF adds
one) and tokenizing that the same way. :func:`server_ids` asks for exactly those ids
(``/apply-template`` then ``/tokenize``), so two uses compare like with like:

- a converted pair (:func:`check`): every line's ids must equal the engine's (tokenizer.json's
  ``encode`` with its post-processor; a chat line rendered with the target's template and encoded
  without added specials, :meth:`engine.chat.ChatTemplate.encode`), else a one-line ConfigError
  that says whether a leading BOS or the pre-tokenizer differs;
- a ``models.gguf`` pair (:func:`requests`): there is no tokenizer.json, so the server's ids are the
  requests' ids.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Sequence

from tokenizers import Tokenizer

from autotune.errors import ConfigError
from autotune.workload.runner import CONTEXT_MARGIN, ChatRequest, Sampling
from engine.chat import ChatTemplate
from engine.speculative import Request
from engine.workload import WorkloadItem, fit_prompt_to_context


def _post(base_url: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(
        base_url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        out: dict = json.loads(resp.read())
    return out


def server_ids(base_url: str, item: WorkloadItem) -> list[int]:
    """The ids llama-server at ``base_url`` runs for ``item`` when its completion endpoints get it as text."""
    text = item.prompt
    if item.messages:
        text = _post(base_url, "/apply-template", {"messages": [m.as_dict() for m in item.messages]})[
            "prompt"
        ]
    ids: list[int] = _post(
        base_url, "/tokenize", {"content": text, "add_special": True, "parse_special": True}
    )["tokens"]
    return ids


def engine_ids(item: WorkloadItem, tokenizer: Tokenizer, template: ChatTemplate | None) -> list[int]:
    """The ids the engine runs for ``item``: the prompt through tokenizer.json (its post-processor
    adds its specials), or the conversation rendered with the target's ``template``."""
    if not item.messages:
        return tokenizer.encode(item.prompt).ids
    assert template is not None  # autotune.workload.runner.chat_template_for refuses a chat line without one
    return template.encode(tokenizer, item.messages)


def mismatch(where: str, ours: Sequence[int], want: Sequence[int], pre_tokenizer: str | None) -> ConfigError:
    """The one-line error for llama-server's ids ``ours`` against the engine's ``want`` on line ``where``."""
    head = f"models.target: llama.cpp tokenizes {where} differently from tokenizer.json (first ids {list(ours[:8])} vs {list(want[:8])})"
    if list(ours[1:]) == list(want) or list(want[1:]) == list(ours):
        return ConfigError(
            f"{head}: only a leading BOS differs; the GGUF's tokenizer.ggml.add_bos_token does not match "
            "tokenizer.json's post-processor (and tokenizer_config.json add_bos_token)"
        )
    return ConfigError(
        f"{head}; backend.llamacpp.pre_tokenizer {pre_tokenizer!r} does not match this tokenizer"
    )


def check(
    base_url: str,
    items: Sequence[WorkloadItem],
    tokenizer: Tokenizer,
    template: ChatTemplate | None,
    prompts: str,
    pre_tokenizer: str | None,
) -> int:
    """Every line's :func:`server_ids` must equal its :func:`engine_ids` (ConfigError naming
    ``prompts:line`` otherwise); returns the lines checked."""
    for item in items:
        ours, want = server_ids(base_url, item), engine_ids(item, tokenizer, template)
        if ours != want:
            raise mismatch(f"{prompts}:{item.line}", ours, want, pre_tokenizer)
    return len(items)


def requests(
    base_url: str,
    items: Sequence[WorkloadItem],
    sampling: Sampling,
    context: int,
    where: str,
    truncate: bool = False,
) -> list[Request]:
    """The workload's requests with llama-server's ids (a ``models.gguf`` pair), each checked
    against the ``context`` per slot as :func:`autotune.workload.runner.build_requests` checks them."""
    out: list[Request] = []
    for i, item in enumerate(items):
        max_new = item.max_new_tokens or sampling.max_new_tokens
        at = f"{where}:{item.line or i + 1}"
        ids = fit_prompt_to_context(
            server_ids(base_url, item), context - max_new - CONTEXT_MARGIN, at, truncate
        )
        args = (
            ids,
            max_new,
            sampling.temperature if item.temperature is None else item.temperature,
            sampling.top_k if item.top_k is None else item.top_k,
            sampling.top_p if item.top_p is None else item.top_p,
        )
        out.append(
            ChatRequest(*args, id=i, messages=item.messages) if item.messages else Request(*args, id=i)
        )
    return out
