r"""Eager vs compiled vs CUDA-graph decode on a GPU, against the HBM roofline (issue: a GPU path
that measures the hardware, not Python).

For each model (the demo pair, and a ~1B Llama-shaped target with a ~100M draft built here with
random weights, no downloads) and each way of running ``Transformer.decode``:

- ``eager``:    plain torch;
- ``compiled``: ``compile_decode()`` (torch.compile, inductor, dynamic shapes);
- ``graphs``:   ``compile_decode("reduce-overhead")``: inductor's CUDA graphs where it can capture
                them (it skips capture when an input it mutates is not static; the times show it);

one cached forward of B rows x k new tokens after ``--context`` tokens is timed (CUDA events,
median of ``--repeats``). The roofline of a forward is weight bytes / measured device copy
bandwidth (autotune.device.ceilings): the time a decode takes when it only streams its weights.
``fraction`` = roofline / measured (goal: AR decode at B=1 >= 0.70 with graphs). T(B, k) / T(B, 1)
is the verify cost of k tokens in decodes: flat (~1) where the device is memory-bound.

Prints one table per model and writes benchmarks/results/gpu/gpu_compiled.json (``--out-dir``).

Example:
    python -m benchmarks.gpu.compiled                                    # on a CUDA host, ~3-5 min
    python -m benchmarks.gpu.compiled --device cpu --models demo --modes eager,compiled \
        --batch-sizes 1 --ks 1,5
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from autotune.cli.text import columns
from autotune.device.ceilings import measure_copy_bandwidth
from autotune.device.hardware import fingerprint
from benchmarks._common import stamp
from engine.config import ModelConfig
from engine.loader import load_model, parse_dtype, resolve_device
from engine.model import Transformer

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "engine" / "demo" / "pair"
# ~1.1B and ~0.1B Llama shapes (TinyLlama-like target, a small draft with the same vocabulary).
SYNTHETIC = {
    "llama-1b": dict(
        vocab_size=32000,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=4096,
    ),
    "draft-100m": dict(
        vocab_size=32000,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=6,
        num_attention_heads=12,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=4096,
    ),
}


def synthetic(name: str, dtype: torch.dtype, device: torch.device) -> Transformer:
    """A random-weight model of the named shape, built directly on ``device`` in ``dtype``."""
    with torch.device(device):
        model = Transformer(ModelConfig(**SYNTHETIC[name])).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    return model.fuse().eval().requires_grad_(False)


def weight_bytes(model: Transformer) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def time_forward(
    model: Transformer, batch: int, k: int, context: int, repeats: int, device: torch.device
) -> float:
    """Median seconds of one cached decode of (batch, k) tokens after ``context`` tokens."""
    cache = model.new_cache(batch, context + k + 1)
    vocab = model.config.vocab_size
    with torch.inference_mode():
        model(
            torch.randint(0, vocab, (batch, context), device=device),
            cache=cache,
            start=torch.zeros(batch, dtype=torch.long, device=device),
            kv_len=context,
        )
    tokens = torch.randint(0, vocab, (batch, k), device=device)
    start = torch.full((batch,), context, dtype=torch.long, device=device)
    for _ in range(3):
        model.decode(tokens, cache, start, context + k)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            model.decode(tokens, cache, start, context + k)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            model.decode(tokens, cache, start, context + k)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def models(name: str, dtype: torch.dtype, device: torch.device) -> dict[str, Callable[[], Transformer]]:
    """Builders of the ``demo`` pair (its checkpoints, fused) or the synthetic ``llama-1b`` pair."""
    if name == "demo":
        return {
            "demo-target": lambda: load_model(DEMO / "target", dtype, str(device)).fuse(),
            "demo-draft": lambda: load_model(DEMO / "draft", dtype, str(device)).fuse(),
        }
    return {
        "llama-1b": lambda: synthetic("llama-1b", dtype, device),
        "draft-100m": lambda: synthetic("draft-100m", dtype, device),
    }


def time_mode(
    label: str,
    build: Callable[[], Transformer],
    mode: str,
    roofline: float,
    batch_sizes: list[int],
    ks: list[int],
    args: argparse.Namespace,
    device: torch.device,
) -> list[dict]:
    """One model in one mode (eager, compiled or CUDA graphs): a forward of k tokens per batch size,
    against the roofline and the one-token forward of the same batch size."""
    results = []
    model = build()
    compile_s = None
    if mode != "eager":
        compile_s = model.compile_decode("reduce-overhead" if mode == "graphs" else None)
    for b in batch_sizes:
        t1 = None
        for k in ks:
            t = time_forward(model, b, k, args.context, args.repeats, device)
            t1 = t if k == 1 else t1
            results.append(
                {
                    "model": label,
                    "mode": mode,
                    "batch_size": b,
                    "k": k,
                    "ms": t * 1e3,
                    "roofline_ms": roofline * 1e3,
                    "fraction_of_roofline": roofline / t,
                    "t_over_t1": t / t1 if t1 else None,
                    "compile_s": compile_s,
                }
            )
    print(f"  {label} {mode}: done" + (f" (compile {compile_s:.1f} s)" if compile_s else ""), flush=True)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--models", default="demo,llama-1b", help="demo and/or llama-1b (with its 100M draft)")
    ap.add_argument("--modes", default="eager,compiled,graphs")
    ap.add_argument("--batch-sizes", default="1,8,32")
    ap.add_argument("--ks", default="1,5,9", help="tokens per forward (1 = decode, 1+gamma = verify)")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results" / "gpu")
    args = ap.parse_args()
    device, dtype = resolve_device(args.device), parse_dtype(args.dtype)
    batch_sizes = [int(x) for x in args.batch_sizes.split(",")]
    ks = [int(x) for x in args.ks.split(",")]
    modes = args.modes.split(",")
    buffer = 1 << 30 if device.type == "cuda" else 1 << 28  # 1 GiB (256 MiB on a CPU): far past any cache
    bandwidth = measure_copy_bandwidth(device, buffer, warmup=3, repeats=10)["median_bytes_per_s"]
    print(
        f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}), "
        f"{args.dtype}, "
        f"measured copy bandwidth {bandwidth / 1e9:.0f} GB/s"
    )

    results = []
    for group in args.models.split(","):
        for label, build in models(group, dtype, device).items():
            roofline = weight_bytes(build()) / bandwidth
            for mode in modes:
                results += time_mode(label, build, mode, roofline, batch_sizes, ks, args, device)
    rows = [
        (r["model"], r["mode"], r["batch_size"], r["k"], r["ms"], r["roofline_ms"])
        + (r["fraction_of_roofline"], r["t_over_t1"])
        for r in results
    ]
    print(columns(["model", "mode", "B", "k", "ms", "roofline ms", "fraction", "T(B,k)/T(B,1)"], rows))
    ar = [r for r in results if r["k"] == 1 and r["batch_size"] == 1 and r["mode"] == "graphs"]
    for r in ar:
        print(
            f"{r['model']}: AR decode at B=1 with graphs = {r['fraction_of_roofline']:.2f} "
            "of the HBM roofline (goal >= 0.70)"
        )
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / "gpu_compiled.json"
    out.write_text(
        json.dumps(
            {
                **stamp(fingerprint(str(device), args.dtype)["label"]),
                "device": str(device),
                "dtype": args.dtype,
                "copy_bandwidth_bytes_per_s": bandwidth,
                "torch": torch.__version__,
                "results": results,
            },
            indent=1,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
