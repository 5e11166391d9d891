"""Chat workloads: the target's template rendered as transformers renders it, and run greedy-exact.

Each template is written into a tokenizer folder built from the tests' tiny BPE tokenizer plus the
special tokens the template prints; the engine's ids must equal transformers'
``apply_chat_template(..., add_generation_prompt=True, tokenize=True)`` on the same files.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer, processors

from autotune.workload.runner import ChatRequest, LoadSpec, Sampling, build_requests, run_load
from engine.chat import ChatTurn, read_chat_template
from engine.errors import EngineInputError
from engine.loader import load_pair
from engine.speculative import SpecConfig
from engine.workload import WorkloadItem, load_workload
from tests.conftest import make_tokenizer
from tests.engine.conftest import naive_greedy

transformers = pytest.importorskip("transformers")

LLAMA3 = (  # Meta-Llama-3-8B-Instruct's template
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
QWEN = (  # Qwen2.5's template without tools: ChatML, a default system prompt when none is given
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "{%- else %}\n"
    "    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if not (message.role == 'system' and loop.first) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)
GEMMA = (  # Gemma's template: no system role, turns must alternate (raise_exception otherwise)
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)

SPECIAL = {
    "llama3": ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
    "qwen": ["<|im_start|>", "<|im_end|>"],
    "gemma": ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"],
}

CONVERSATIONS = [
    [{"role": "user", "content": "def add(a, b):"}],
    [
        {"role": "system", "content": "You write Python."},
        {"role": "user", "content": "for i in range(10):"},
        {"role": "assistant", "content": "    print(i)\n"},
        {"role": "user", "content": "  class Point:  "},
    ],
]


def tokenizer_folder(tmp_path: Path, name: str, config: dict, bos_post_processor: bool = False) -> Path:
    """The tests' BPE tokenizer with ``name``'s special tokens, and a tokenizer_config.json."""
    tok = make_tokenizer()
    tok.add_special_tokens(SPECIAL[name])
    if bos_post_processor:  # Llama-3's: every encode with special tokens starts with the BOS
        bos = SPECIAL[name][0]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, tok.token_to_id(bos))]
        )
    folder = tmp_path / name
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **config}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def transformers_ids(folder: Path, messages: list[dict]) -> list[int]:
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def engine_ids(folder: Path, messages: list[dict]) -> list[int]:
    template = read_chat_template(folder)
    assert template is not None
    return template.encode(
        Tokenizer.from_file(str(folder / "tokenizer.json")), [ChatTurn(**m) for m in messages]
    )


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("chat")
    added_token = {"__type": "AddedToken", "content": "<|begin_of_text|>", "lstrip": False, "rstrip": False}
    return {
        "llama3": tokenizer_folder(
            root,
            "llama3",
            {"chat_template": LLAMA3, "bos_token": added_token, "eos_token": "<|eot_id|>"},
            bos_post_processor=True,
        ),
        "qwen": tokenizer_folder(
            root,
            "qwen",
            {"chat_template": [{"name": "default", "template": QWEN}, {"name": "tool_use", "template": "x"}]},
        ),
        "gemma": tokenizer_folder(
            root, "gemma", {"chat_template": GEMMA, "bos_token": "<bos>", "eos_token": "<eos>"}
        ),
    }


@pytest.mark.parametrize("name", ["llama3", "qwen"])
@pytest.mark.parametrize("conversation", [0, 1])
def test_rendered_ids_equal_transformers_apply_chat_template(folders, name, conversation) -> None:
    messages = CONVERSATIONS[conversation]
    assert engine_ids(folders[name], messages) == transformers_ids(folders[name], messages)


def test_a_template_that_prints_the_bos_gets_exactly_one(folders) -> None:
    """The tokenizer's post-processor would add a second BOS; the template's own is the only one."""
    tok = Tokenizer.from_file(str(folders["llama3"] / "tokenizer.json"))
    bos = tok.token_to_id("<|begin_of_text|>")
    assert tok.encode("x").ids[0] == bos  # the post-processor is there
    ids = engine_ids(folders["llama3"], CONVERSATIONS[0])
    assert ids[0] == bos and ids.count(bos) == 1


def test_qwen_default_system_prompt_appears_only_without_a_system_turn(folders) -> None:
    template = read_chat_template(folders["qwen"])
    assert template is not None
    plain = template.render([ChatTurn(**m) for m in CONVERSATIONS[0]])
    own = template.render([ChatTurn(**m) for m in CONVERSATIONS[1]])
    assert plain.startswith("<|im_start|>system\nYou are Qwen") and plain.endswith("<|im_start|>assistant\n")
    assert "You are Qwen" not in own and own.startswith("<|im_start|>system\nYou write Python.<|im_end|>")


def test_raise_exception_in_the_template_is_a_one_line_error_naming_the_folder(folders) -> None:
    ok = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "x"},
    ]
    assert engine_ids(folders["gemma"], ok) == transformers_ids(folders["gemma"], ok)
    with pytest.raises(Exception, match="System role not supported"):
        transformers_ids(folders["gemma"], CONVERSATIONS[1])
    with pytest.raises(EngineInputError) as err:
        engine_ids(folders["gemma"], CONVERSATIONS[1])
    assert (
        str(err.value)
        == f"{folders['gemma']}: the chat template refused the messages: System role not supported"
    )


def test_chat_template_jinja_beside_the_config_wins(tmp_path) -> None:
    folder = tokenizer_folder(tmp_path, "qwen", {"chat_template": "{{ raise_exception('not this one') }}"})
    (folder / "chat_template.jinja").write_text(QWEN)
    assert engine_ids(folder, CONVERSATIONS[1]) == transformers_ids(folder, CONVERSATIONS[1])


def test_a_folder_without_a_template_has_none(tmp_path) -> None:
    folder = tokenizer_folder(tmp_path, "qwen", {})
    assert read_chat_template(folder) is None
    assert read_chat_template(tmp_path) is None  # no tokenizer_config.json at all


# ------------------------------------------------------------------------------------------
# Requests and the engine


def chat_items(path: Path) -> list[WorkloadItem]:
    lines = [
        {"messages": [{"role": "user", "content": "def add(a, b):"}], "max_new_tokens": 10},
        {"prompt": "for i in range(10):\n"},
        {"messages": CONVERSATIONS[1], "max_new_tokens": 12},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return load_workload(path)


@pytest.fixture(scope="module")
def chat_pair(tiny_pair_dirs, tmp_path_factory) -> tuple[Path, Path]:
    """The tiny pair with a chat template (text role markers: the vocabulary has no room for more)."""
    root = tmp_path_factory.mktemp("chat_pair")
    template = (
        "{{ bos_token }}{% for m in messages %}{{ '# ' + m['role'] + ':\\n' + m['content'] + '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '# assistant:\\n' }}{% endif %}"
    )
    out = []
    for folder in tiny_pair_dirs:
        copy = Path(shutil.copytree(folder, root / folder.name))
        config = {"chat_template": template, "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}
        (copy / "tokenizer_config.json").write_text(json.dumps(config))
        out.append(copy)
    return out[0], out[1]


def test_chat_lines_become_chat_requests_with_the_rendered_ids(chat_pair, tmp_path) -> None:
    items = chat_items(tmp_path / "chat.jsonl")
    tok = Tokenizer.from_file(str(chat_pair[0] / "tokenizer.json"))
    a, b, c = build_requests(items, tok, Sampling(max_new_tokens=8), 512, chat_folder=chat_pair[0])
    assert isinstance(a, ChatRequest) and a.messages == items[0].messages and a.max_new_tokens == 10
    assert a.prompt_ids == tok.encode("<|endoftext|># user:\ndef add(a, b):\n# assistant:\n").ids
    assert not isinstance(b, ChatRequest) and b.prompt_ids == tok.encode("for i in range(10):\n").ids
    assert isinstance(c, ChatRequest) and len(c.messages) == 4 and c.id == 2


def test_a_chat_line_without_a_template_names_the_line_and_the_folder(tiny_pair_dirs, tmp_path) -> None:
    items = chat_items(tmp_path / "chat.jsonl")
    tok = Tokenizer.from_file(str(tiny_pair_dirs[0] / "tokenizer.json"))
    with pytest.raises(EngineInputError) as err:
        build_requests(items, tok, Sampling(), 512, where="chat.jsonl", chat_folder=tiny_pair_dirs[0])
    message = str(err.value)
    assert message.startswith("chat.jsonl:1: messages are rendered with the target's chat template")
    assert f"{tiny_pair_dirs[0]} has none" in message and "\n" not in message
    with pytest.raises(EngineInputError, match="no target folder was given"):
        build_requests(items, tok, Sampling(), 512)


def test_a_messages_workload_is_greedy_exact(chat_pair, tmp_path) -> None:
    """Speculative greedy output on rendered conversations equals the target's naive greedy decode."""
    pair = load_pair(*chat_pair)
    requests = build_requests(
        chat_items(tmp_path / "chat.jsonl"),
        pair.tokenizer,
        Sampling(max_new_tokens=8),
        512,
        chat_folder=chat_pair[0],
    )
    run = run_load(pair, requests, SpecConfig(gamma=3), "model", LoadSpec(max_batch_size=2, num_requests=3))
    eos = set(pair.target.config.eos_token_ids)
    for record in run.records:
        request = requests[record.id]
        want = naive_greedy(pair.target, request.prompt_ids, request.max_new_tokens)
        stop = next((k + 1 for k, t in enumerate(want) if t in eos), len(want))
        assert record.output_tokens == want[:stop]
