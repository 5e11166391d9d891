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
    name: str  # the claim: its results go to benchmarks/results/<name>/
    script: str  # the module run as ``python -m <script>``
    page: str  # under docs/results/
    full: tuple[str, ...] = ()
    quick: tuple[str, ...] = ()

    @property
    def path(self) -> str:
        """The script's file, relative to the repository root."""
        return self.script.replace(".", "/") + ".py"

    def command(self, quick: bool = False) -> tuple[str, ...]:
        """The command line that reruns this step (``full`` or ``quick`` arguments)."""
        return ("python", "-m", self.script, *(self.quick if quick else self.full))


CLAIMS: tuple[Step, ...] = (
    Step(
        "engine",
        "demo_pair_quality",
        "benchmarks.engine.demo_pair_quality",
        "engine-cpu.md",
        (),
        ("--num-prompts", "12", "--max-new-tokens", "32"),
    ),
    Step(
        "engine",
        "vs_transformers",
        "benchmarks.engine.vs_transformers",
        "engine-cpu.md",
        (),
        ("--num-prompts", "2", "--max-new-tokens", "32", "--engine", "eager"),
    ),
    Step(
        "engine",
        "engine_speedup",
        "benchmarks.engine.engine_speedup",
        "engine-cpu.md",
        ("--gammas", "2,4,6,8"),
        (
            *("--gammas", "4", "--batch-sizes", "1,4", "--num-prompts", "4", "--max-new-tokens", "24"),
            *("--engine", "eager"),
        ),
    ),
    Step(
        "engine",
        "load_sweep",
        "benchmarks.engine.load_sweep",
        "engine-cpu.md",
        (),
        ("--num-prompts", "4", "--max-new-tokens", "32", "--concurrency", "1,4,16", "--gammas", "0,4"),
    ),
    Step(
        "engine",
        "costmodel_accuracy",
        "benchmarks.engine.costmodel_accuracy",
        "engine-cpu.md",
        (),
        ("--gammas", "0,4", "--batch-sizes", "1,4", "--num-prompts", "4", "--repeats", "3"),
    ),
    Step(
        "engine",
        "trees",
        "benchmarks.engine.trees",
        "engine-cpu.md",
        (
            *("--num-prompts", "6", "--max-new-tokens", "40", "--repeats", "3", "--threads", "1"),
            *("--gammas", "3,4,5,6,7,8", "--trees", "2,1,1,1;2,1,1,1,1;2,1,1,1,1,1;2,2,1,1,1"),
        ),
        (
            *("--num-prompts", "2", "--max-new-tokens", "24", "--repeats", "1", "--threads", "1"),
            *("--batch-sizes", "1", "--gammas", "4,6", "--trees", "2,1,1,1", "--dynamic", "2x5/7"),
            *("--modes", "greedy", "--cost-repeats", "5", "--engine", "eager"),
        ),
    ),
    Step(
        "engine",
        "draft_after_verify",
        "benchmarks.engine.draft_after_verify",
        "engine-cpu.md",
        (),
        ("--repeats", "2"),
    ),
    Step(
        "tuner",
        "tuner_vs_grid",
        "benchmarks.tuner.tuner_vs_grid",
        "engine-cpu.md",
        (),
        ("--config", "benchmarks/configs/quick.yaml", "--fraction", "0.25"),
    ),
    Step(
        "tuner",
        "acceptance_tail",
        "benchmarks.tuner.acceptance_tail",
        "engine-cpu.md",
        ("--at", "94340b3"),
        (),
    ),
    Step(
        "tuner",
        "noise_robustness",
        "benchmarks.tuner.noise_robustness",
        "busy-host.md",
        ("--k", "3", "--trials", "8", "--hog-procs", "1"),
        (
            "--config",
            "benchmarks/configs/quick.yaml",
            "--k",
            "1",
            "--trials",
            "2",
            "--hog-procs",
            "1",
            "--conditions",
            "quiet,busy",
        ),
    ),
    Step(
        "tuner",
        "budget",
        "benchmarks.tuner.budget",
        "budget.md",
        ("--runs", "engine:20,vllm:15"),
        ("--config", "benchmarks/configs/quick.yaml", "--runs", "engine:1,vllm:1.5"),
    ),
    Step(
        "stacks",
        "transfer_vllm",
        "benchmarks.stacks.transfer_vllm",
        "vllm.md",
        (),
        ("--config", "benchmarks/configs/quick.yaml", "--repeats", "1", "--grid", "3"),
    ),
    Step(
        "stacks",
        "schedule_vllm",
        "benchmarks.stacks.schedule_vllm",
        "vllm.md",
        (*("--config", "benchmarks/configs/schedule_sweep.yaml", "--repeats", "4", "--grid", "2,5,7"),),
        ("--config", "benchmarks/configs/quick.yaml", "--repeats", "1", "--grid", "3"),
    ),
    Step(
        "stacks",
        "stack_cost_vllm",
        "benchmarks.stacks.stack_cost",
        "vllm.md",
        ("--config", "tune.yaml", "--grid", "1,2,3,4,5,6,7,8", "--repeats", "1"),
        ("--config", "benchmarks/configs/quick.yaml", "--grid", "2,4", "--repeats", "1"),
    ),
    Step(
        "stacks",
        "vllm_plugin",
        "benchmarks.stacks.vllm_plugin",
        "vllm-plugin.md",
        (
            *("--repeats", "10", "--rounds-per-server", "1", "--trace"),
            *("--constant", "4", "--table", "1-4:4,5-16:0"),
        ),
        ("--config", "benchmarks/configs/quick.yaml", "--repeats", "1", "--levels", "1,4"),
    ),
    Step(
        "stacks",
        "transfer_llamacpp",
        "benchmarks.stacks.transfer_llamacpp",
        "llamacpp.md",
        (),
        ("--config", "benchmarks/configs/quick.yaml", "--repeats", "1", "--n-max", "3"),
    ),
    Step(
        "stacks",
        "schedule_llamacpp",
        "benchmarks.stacks.schedule_llamacpp",
        "llamacpp.md",
        (),
        ("--config", "benchmarks/configs/quick.yaml", "--repeats", "1", "--grid", "3"),
    ),
    Step(
        "stacks",
        "quantized_llamacpp",
        "benchmarks.stacks.quantized_llamacpp",
        "llamacpp.md",
        (),
        (
            *("--config", "benchmarks/configs/quick.yaml", "--rounds", "2", "--quantizations", "f32,q4_k_m"),
            *("--n-max", "3", "--concurrency", "1,4", "--num-requests", "4", "--max-new-tokens", "24"),
        ),
    ),
    Step(
        "stacks",
        "chat_workload",
        "benchmarks.stacks.chat_workload",
        "chat.md",
        (),
        (
            "--config",
            "benchmarks/configs/quick.yaml",
            "--repeats",
            "1",
            "--levels",
            "1,4",
            "--prompts",
            "4",
            "--requests",
            "4",
            "--grid",
            "3",
        ),
    ),
    Step(
        "stacks",
        "drafters",
        "benchmarks.stacks.drafters",
        "drafters.md",
        (
            *("--drafters", "model,eagle3", "--grid", "2,3,4,5", "--concurrency", "1,4", "--rounds", "2"),
            *("--vllm", "--vllm-plan", "model:3,model:4,eagle3:3,eagle3:4,eagle3:5", "--repeats", "3"),
        ),
        (
            *("--drafters", "model,eagle3", "--grid", "3", "--concurrency", "1,4", "--rounds", "1"),
            *("--num-prompts", "4", "--max-new-tokens", "24"),
        ),
    ),
    Step(
        "stacks",
        "deployment_scale",
        "benchmarks.stacks.deployment_scale",
        "deployment-scale.md",
        ("--budget", "25"),
        ("--budget", "3", "--target-layers", "4", "--requests", "2", "--max-new-tokens", "16"),
    ),
    Step(
        "watch",
        "watch_drift_vllm",
        "benchmarks.watch.watch_drift",
        "watch-drift.md",
        ("--stack", "vllm"),
        (
            *("--stack", "vllm", "--config", "benchmarks/configs/quick.yaml", "--phases", "steady,prose"),
            *("--steady-min", "0.5", "--switch-min", "0.5", "--interval", "5", "--windows-to-stale", "2"),
            *("--confirm-rounds", "1", "--tune-if-missing"),
        ),
    ),
    Step(
        "watch",
        "watch_drift_llamacpp",
        "benchmarks.watch.watch_drift",
        "watch-drift.md",
        ("--stack", "llamacpp", "--phases", "steady,prose,sampled,code-again,saturation", "--retune"),
        (
            *("--stack", "llamacpp", "--config", "benchmarks/configs/quick.yaml", "--phases", "steady,prose"),
            *("--steady-min", "0.5", "--switch-min", "0.5", "--interval", "5", "--windows-to-stale", "2"),
            *("--confirm-rounds", "1", "--tune-if-missing"),
        ),
    ),
)
