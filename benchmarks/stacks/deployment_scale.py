"""A model of deployment scale through ``autotune tune --backend vllm``: time, memory, what it chose.

1. Writes a checkpoint with Llama-3.2-1B's layer shapes (16 layers, hidden 2048, MLP 8192, 32 heads,
   8 KV heads, random weights in bf16 by transformers' ``save_pretrained``; the demo tokenizer, so
   the vocabulary is 4096 and the model about 0.98B parameters) and a 2-layer draft of the same
   family, unless they exist in ``--models``. ``--target-layers N`` keeps the shapes with N layers
   (the quick run: 4, about 0.26B parameters, so a server starts and a trial runs in its budget).
2. Runs ``autotune tune --backend vllm --budget <M>`` on them as a user would (a subprocess), sampling
   every second the resident memory of the autotune process and of its server processes: the
   tool must stay small while the servers hold the model (it never loads the target itself).
3. Runs the refusals: a checkpoint whose safetensors header declares 500 GiB (more than the file
   holds and than the host has) must be refused in seconds, one line, exit 2, nothing written.

Prints a table and writes ``<out-dir>/deployment_scale.json``. Usage::

    python -m benchmarks.stacks.deployment_scale [--budget 25] [--target-layers 16] \
[--models ~/.cache/spec-autotune/scale-models]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

from autotune.cli.text import columns
from autotune.device.hardware import fingerprint
from benchmarks._common import claim_dir, portable, stamp
from engine.demo import DEMO_PROMPTS, DEMO_TARGET

ROOT = Path(__file__).resolve().parents[2]

LLAMA_1B = {
    "num_hidden_layers": 16,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
}
GIB = 1 << 30


def write_llama(folder: Path, layers: int) -> Path:
    """A random Llama of 1B layer shapes (``layers`` of them) in bf16, with the demo tokenizer."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab = json.loads((DEMO_TARGET / "config.json").read_text())["vocab_size"]
    config = LlamaConfig(
        **{**LLAMA_1B, "num_hidden_layers": layers},
        vocab_size=vocab,
        max_position_embeddings=2048,
        rope_theta=500000.0,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(layers)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    shutil.copy(DEMO_TARGET / "tokenizer.json", folder / "tokenizer.json")
    return folder


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


class Sampler(threading.Thread):
    """Samples the tool's and its servers' resident memory every ``interval`` seconds."""

    def __init__(self, pid: int, interval: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.tool_peak = self.tool_peak_with_servers = self.servers_peak = 0
        self.seconds_with_servers = 0.0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            tool = rss_bytes(self.pid)
            servers = sum(rss_bytes(p) for p in descendants(self.pid))
            self.tool_peak = max(self.tool_peak, tool)
            if servers > 512 << 20:  # a vLLM server is up (its processes hold the model)
                self.tool_peak_with_servers = max(self.tool_peak_with_servers, tool)
                self.servers_peak = max(self.servers_peak, servers)
                self.seconds_with_servers += self.interval
            self.done.wait(self.interval)


def tune_yaml(folder: Path, target: Path, draft: Path, args: argparse.Namespace) -> Path:
    raw = yaml.safe_load((ROOT / "tune.yaml").read_text())
    raw["models"].update(target=str(target), draft=str(draft), dtype="auto", compile=False)
    raw["workload"].update(
        prompts=str(DEMO_PROMPTS),
        concurrency=args.concurrency,
        num_requests=args.requests,
        min_batches=1,
        max_new_tokens=args.max_new_tokens,
    )
    raw["search"].update(gamma={"low": 0, "high": 6}, max_batch_size=[max(args.concurrency)])
    raw["profile"]["gamma_max"] = 6
    raw["storage"]["url"] = f"sqlite:///{folder / 'autotune.db'}"
    raw["export"].update(dir=str(folder / "exports"), formats=["vllm", "yaml"])
    path = folder / "tune.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def run_tune(config: Path, budget: float, log: Path) -> dict:
    cmd = [
        "autotune",
        "tune",
        "--config",
        str(config),
        "--backend",
        "vllm",
        "--budget",
        f"{budget:g}m",
        "--json",
    ]
    t0 = time.monotonic()
    with log.open("w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        sampler = Sampler(proc.pid)
        sampler.start()
        out, _ = proc.communicate()
        sampler.done.set()
        sampler.join()
    wall = time.monotonic() - t0
    profile = json.loads(out) if proc.returncode == 0 and out.strip() else {}
    return {
        "command": " ".join(cmd),
        "exit_code": proc.returncode,
        "wall_s": round(wall, 1),
        "budget_min": budget,
        "tool_peak_rss_gib": round(sampler.tool_peak / GIB, 3),
        "tool_peak_rss_with_servers_gib": round(sampler.tool_peak_with_servers / GIB, 3),
        "servers_peak_rss_gib": round(sampler.servers_peak / GIB, 2),
        "seconds_with_servers": sampler.seconds_with_servers,
        "profile": profile,
        "log_tail": log.read_text().splitlines()[-40:],
    }


def refusal(folder: Path) -> dict:
    """A target whose header declares 500 GiB: refused before anything loads."""
    target = folder / "lies-500g"
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(DEMO_TARGET / "config.json", target / "config.json")
    shutil.copy(DEMO_TARGET / "tokenizer.json", target / "tokenizer.json")
    n = 500 * GIB
    header = json.dumps({"w": {"dtype": "F32", "shape": [n // 4], "data_offsets": [0, n]}}).encode()
    (target / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(64))
    raw = yaml.safe_load((ROOT / "tune.yaml").read_text())
    raw["models"].update(target=str(target), draft="demo")
    raw["storage"]["url"] = f"sqlite:///{folder / 'refusal.db'}"
    raw["export"]["dir"] = str(folder / "refusal-exports")
    config = folder / "refusal.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    t0 = time.monotonic()
    proc = subprocess.run(
        ["autotune", "tune", "--config", str(config), "--backend", "vllm"], capture_output=True, text=True
    )
    return {
        "exit_code": proc.returncode,
        "seconds": round(time.monotonic() - t0, 2),
        "stderr_lines": proc.stderr.strip().splitlines(),
        "written": sorted(
            p.name for p in folder.iterdir() if p.name.startswith("refusal") and p.suffix != ".yaml"
        ),
    }


def summary(run: dict) -> list[list[object]]:
    p = run["profile"]
    chosen = p.get("chosen", {})
    metrics = p.get("metrics", {})
    per_level = metrics.get("per_level_speedup", {})
    return [
        ["exit code", run["exit_code"]],
        ["wall time", f"{run['wall_s'] / 60:.1f} min of a {run['budget_min']:g} min budget"],
        ["server starts", len(p.get("backend", {}).get("startup_s", []))],
        ["tool peak RSS (whole run)", f"{run['tool_peak_rss_gib']:.2f} GiB"],
        ["tool peak RSS while servers hold the model", f"{run['tool_peak_rss_with_servers_gib']:.2f} GiB"],
        ["servers' peak RSS", f"{run['servers_peak_rss_gib']:.1f} GiB"],
        ["dtype", p.get("deployment", {}).get("dtype")],
        ["choice", f"{chosen.get('drafter')} K={chosen.get('gamma')}" if chosen else "-"],
        [
            "x no speculation per level",
            ", ".join(
                f"{b}: {v.get('value', v) if isinstance(v, dict) else v:.2f}x" for b, v in per_level.items()
            )
            if per_level
            else "-",
        ],
        ["budget cuts", "; ".join(p.get("study", {}).get("run_budget", {}).get("cuts", [])) or "none"],
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=25.0, help="budget.minutes of the tune")
    ap.add_argument(
        "--target-layers", type=int, default=16, help="layers of the 1B-shaped target (default 16: 0.98B)"
    )
    ap.add_argument("--models", type=Path, default=Path("~/.cache/spec-autotune/scale-models").expanduser())
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4])
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--out-dir", type=Path, default=claim_dir("deployment_scale"))
    ap.add_argument("--skip-tune", action="store_true", help="run the refusals only")
    args = ap.parse_args()
    if args.target_layers <= 2:
        ap.error(f"--target-layers must be more than the draft's 2 (got {args.target_layers})")
    t0 = time.monotonic()
    work = args.models / "run"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    results: dict = {"refusal": refusal(work)}
    print(columns(["refusal", "value"], [[k, v] for k, v in results["refusal"].items()]))
    if not args.skip_tune:
        layers = args.target_layers
        target = write_llama(
            args.models / ("llama-1b-shape" + ("" if layers == 16 else f"-{layers}layer")), layers
        )
        draft = write_llama(args.models / "llama-1b-shape-2layer", 2)
        results["sizes_gib"] = {
            d.name: round(sum(f.stat().st_size for f in d.glob("*.safetensors")) / GIB, 2)
            for d in (target, draft)
        }
        results["tune"] = run_tune(tune_yaml(work, target, draft, args), args.budget, work / "tune.log")
        results["target_layers"] = layers
        title = "1B-class tune" if layers == 16 else f"1B-shaped, {layers} layers: tune"
        print(columns([f"{title} (vLLM-CPU)", "value"], summary(results["tune"])))
    results["fingerprint"] = fingerprint("cpu", "float32")
    results["command"] = " ".join(sys.argv)
    results.update(stamp(results["fingerprint"]["label"]), wall_s=round(time.monotonic() - t0, 1))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / "deployment_scale.json"
    out.write_text(portable(json.dumps(results, indent=1, default=str)) + "\n")
    print(f"wrote {out}")
    os._exit(0)


if __name__ == "__main__":
    main()
