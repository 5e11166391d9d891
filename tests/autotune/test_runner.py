"""``autotune.workload.runner``: workload items to engine requests, one load run, speculative vs autoregressive."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from autotune.workload.runner import LoadSpec, Sampling, build_requests, compare, run_load
from engine.errors import EngineInputError
from engine.loader import load_pair
from engine.speculative import SpecConfig
from engine.workload import WorkloadItem


@pytest.fixture(scope="module")
def pair(tiny_pair_dirs):
    target, draft = tiny_pair_dirs
    return load_pair(target, draft)


@pytest.fixture(scope="module")
def tokenizer(tiny_pair_dirs) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_pair_dirs[0] / "tokenizer.json"))


def test_build_requests_takes_each_lines_sampling_over_the_defaults(tokenizer) -> None:
    items = [
        WorkloadItem("def add(a, b):\n", line=1),
        WorkloadItem("class Point:\n", max_new_tokens=5, temperature=0.7, top_k=3, top_p=0.9, line=2),
    ]
    a, b = build_requests(items, tokenizer, Sampling(max_new_tokens=9), context=512)
    assert a.prompt_ids == tokenizer.encode("def add(a, b):\n").ids and a.max_new_tokens == 9
    assert (a.temperature, a.top_k, a.top_p, a.id) == (0.0, 0, 1.0, 0)
    assert (b.max_new_tokens, b.temperature, b.top_k, b.top_p, b.id) == (5, 0.7, 3, 0.9, 1)


def test_a_prompt_past_the_context_names_its_line_or_keeps_its_end(tokenizer) -> None:
    long = WorkloadItem("for i in range(10):\n    print(i)\n" * 40, line=7)
    ids = tokenizer.encode(long.prompt).ids
    limit = 64
    context = limit + 8 + 20  # the limit is context - max_new_tokens - 20
    with pytest.raises(
        EngineInputError, match=rf"w.jsonl:7: prompt is {len(ids)} tokens, longer than the limit of {limit}"
    ):
        build_requests([long], tokenizer, Sampling(max_new_tokens=8), context, where="w.jsonl")
    (req,) = build_requests([long], tokenizer, Sampling(max_new_tokens=8), context, truncate=True)
    assert req.prompt_ids == ids[-limit:]


def test_a_lines_own_max_new_tokens_counts_against_the_context(tokenizer) -> None:
    """The prompt alone fits; with the line's max_new_tokens it runs past the context."""
    item = WorkloadItem("def f(x):\n    return x\n", max_new_tokens=100, line=3)
    ids = tokenizer.encode(item.prompt).ids
    context = len(ids) + 100 + 20 - 1
    with pytest.raises(EngineInputError, match=rf"w.jsonl:3: prompt is {len(ids)} tokens"):
        build_requests([item], tokenizer, Sampling(max_new_tokens=8), context, where="w.jsonl")
    (req,) = build_requests([item], tokenizer, Sampling(max_new_tokens=8), context, truncate=True)
    assert req.prompt_ids == ids[1:] and req.max_new_tokens == 100
    (req,) = build_requests([item], tokenizer, Sampling(max_new_tokens=8), context + 1)
    assert req.prompt_ids == ids


def test_run_load_serves_every_request_in_closed_loop(pair, tokenizer) -> None:
    items = [WorkloadItem(p, line=i + 1) for i, p in enumerate(["def f(x):\n", "import os\n", "class A:\n"])]
    requests = build_requests(items, tokenizer, Sampling(max_new_tokens=6), 512)
    run = run_load(
        pair, requests, SpecConfig(gamma=2), "model", LoadSpec(max_batch_size=2, num_requests=5), seed=0
    )
    assert len(run.records) == 5 and all(len(r.output_tokens) <= 6 for r in run.records)
    assert run.metrics["generated_tokens"] == sum(len(r.output_tokens) for r in run.records)


def test_compare_greedy_speculation_matches_autoregressive_decoding(pair, tokenizer) -> None:
    items = [WorkloadItem(p, line=i + 1) for i, p in enumerate(["def f(x):\n", "for i in range(3):\n"])]
    requests = build_requests(items, tokenizer, Sampling(max_new_tokens=8), 512)
    out = compare(
        pair, requests, SpecConfig(gamma=3), "model", LoadSpec(max_batch_size=2, num_requests=2), seed=0
    )
    assert out["greedy_match"] is True
    assert out["speedup"] > 0 and "baseline_tokens_per_second" in out and "acceptance_rate" in out
