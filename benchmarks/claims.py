"""The claims of docs/results/ and the steps that rerun them (``python -m benchmarks``).

One :class:`Step` per script run: its group (``engine``: the engine on this host; ``tuner``: what
``autotune tune`` decides and how long it takes; ``stacks``: inside vLLM and llama-server;
``watch``: ``autotune watch`` against live servers), the arguments its results page cites
(``full``) and a smaller run of the same question (``quick``: fewer prompts, rounds or trials),
and the results page that states the claim. benchmarks/README.md is this table for readers.
"""

from __future__ import annotations

from dataclasses import dataclass

GROUPS = ("engine", "tuner", "stacks", "watch")


@dataclass(frozen=True)
class Step:
    group: str
    name: str  # its console goes to benchmarks/results/<name>.txt
    script: str  # under benchmarks/
    page: str  # under docs/results/
    full: tuple[str, ...] = ()
    quick: tuple[str, ...] = ()
    console: bool = True  # False: the script writes its own .txt


CLAIMS: tuple[Step, ...] = (
    Step("engine", "demo_pair_quality", "demo_pair_quality.py", "engine-cpu.md", (), ("--num-prompts", "24")),
    Step("engine", "vs_transformers", "vs_transformers.py", "engine-cpu.md", (), ("--num-prompts", "4")),
    Step(
        "engine",
        "engine_speedup",
        "engine_speedup.py",
        "engine-cpu.md",
        ("--gammas", "2,4,6,8"),
        ("--gammas", "2,4", "--batch-sizes", "1,4", "--num-prompts", "4"),
    ),
    Step("engine", "load_sweep", "load_sweep.py", "engine-cpu.md", (), ("--num-prompts", "4")),
    Step(
        "engine",
        "costmodel_accuracy",
        "costmodel_accuracy.py",
        "engine-cpu.md",
        (),
        ("--gammas", "0,4", "--batch-sizes", "1,4", "--num-prompts", "4"),
    ),
    Step(
        "engine",
        "trees",
        "trees.py",
        "engine-cpu.md",
        ("--num-prompts", "6", "--max-new-tokens", "40", "--repeats", "3", "--threads", "1"),
        ("--num-prompts", "2", "--max-new-tokens", "24", "--repeats", "1", "--threads", "1"),
    ),
    Step("engine", "draft_after_verify", "draft_after_verify.py", "engine-cpu.md", (), ("--repeats", "2")),
    Step("tuner", "tuner_vs_grid", "tuner_vs_grid.py", "engine-cpu.md", (), ("--fraction", "0.1")),
    Step("tuner", "acceptance_tail", "acceptance_tail.py", "engine-cpu.md"),
    Step(
        "tuner",
        "noise_robustness",
        "noise_robustness.py",
        "busy-host.md",
        ("--k", "3", "--trials", "8"),
        ("--k", "1", "--trials", "4"),
    ),
    Step(
        "tuner",
        "budget",
        "budget.py",
        "budget.md",
        ("--runs", "engine:20,vllm:15"),
        ("--runs", "engine:8,vllm:6"),
    ),
    Step("stacks", "transfer_vllm", "transfer_vllm.py", "vllm.md", (), ("--repeats", "1")),
    Step("stacks", "schedule_vllm", "schedule_vllm.py", "vllm.md", (), ("--repeats", "1", "--grid", "3")),
    Step("stacks", "stack_cost_vllm", "stack_cost.py", "vllm.md", (), ("--repeats", "1")),
    Step("stacks", "vllm_plugin", "vllm_plugin.py", "vllm-plugin.md", (), ("--repeats", "1"), console=False),
    Step("stacks", "transfer_llamacpp", "transfer_llamacpp.py", "llamacpp.md", (), ("--repeats", "1")),
    Step(
        "stacks",
        "schedule_llamacpp",
        "schedule_llamacpp.py",
        "llamacpp.md",
        (),
        ("--repeats", "1", "--grid", "3"),
    ),
    Step("stacks", "quantized_llamacpp", "quantized_llamacpp.py", "llamacpp.md", (), ("--rounds", "1")),
    Step("stacks", "chat_workload", "chat_workload.py", "chat.md", (), ("--repeats", "1"), console=False),
    Step("stacks", "drafters", "drafters.py", "drafters.md", ("--vllm",), ("--rounds", "1")),
    Step(
        "stacks",
        "deployment_scale",
        "deployment_scale.py",
        "deployment-scale.md",
        ("--budget", "25"),
        ("--budget", "10"),
    ),
    Step(
        "watch",
        "watch_drift_vllm",
        "watch_drift.py",
        "watch-drift.md",
        ("--stack", "vllm"),
        ("--stack", "vllm", "--steady-min", "2", "--switch-min", "1"),
    ),
    Step(
        "watch",
        "watch_drift_llamacpp",
        "watch_drift.py",
        "watch-drift.md",
        ("--stack", "llamacpp"),
        ("--stack", "llamacpp", "--steady-min", "2", "--switch-min", "1"),
    ),
)
