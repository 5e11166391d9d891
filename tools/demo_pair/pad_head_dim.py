"""Reshape a Llama checkpoint to a larger ``head_dim`` without changing the function it computes.

Why: vLLM's CPU attention only takes head_dim in {32, 64, 80, ...}; the demo target has 40.
Usage: ``python -m tools.demo_pair.pad_head_dim SRC DST [--head-dim 64]``.

With old head size d and new head size D >= d (both even), h = d/2, H = D/2:

1. **Zero-padded heads.** Each head's d output rows of ``q_proj``, ``k_proj`` and ``v_proj`` go
   into a D-row head block: old row j -> new row j and old row h+j -> new row H+j (j < h); the
   other D-d rows are zero. ``o_proj`` gets its input columns moved the same way and zero columns
   for the new v dims. Zero q/k dims add nothing to q.k; zero v dims give zero attention outputs,
   which meet zero ``o_proj`` columns.
2. **RoPE.** HF Llama's ``rotate_half`` rotates dim j with dim j + head_dim/2 at frequency
   ``theta^(-2j/head_dim)``. The mapping in 1 keeps each old pair (j, h+j) a pair (j, H+j) of the
   new layout; zero pairs stay zero under any rotation. With ``theta' = theta^(D/d)``,
   ``theta'^(-2j/D) = theta^(-2j/d)`` for every j < h, so every old pair keeps its frequency
   (equal up to float rounding). Rotary stays full (no ``partial_rotary_factor``), which vLLM,
   transformers, llama.cpp and this engine all support.
3. **Attention scale.** Attention divides q.k by sqrt(head_dim). ``q_proj`` (weight and bias) is
   multiplied by sqrt(D/d), so q'.k'/sqrt(D) = sqrt(D/d) q.k/sqrt(D) = q.k/sqrt(d). bf16 would
   round that product, so the q_proj tensors are stored in float32 (loaders cast every tensor to
   the dtype asked for; engine/loader.py does). Every other value is copied bit for bit.

``config.json`` changes only ``head_dim`` and ``rope_theta``; the other files are copied. The
result is deterministic (no randomness) and written to a sibling folder first, then renamed to DST.
Refused: RoPE scaling, partial rotary, safetensors index/shards.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

WEIGHTS = "model.safetensors"


def pad_rows(w: torch.Tensor, heads: int, d: int, new_d: int, dim: int = 0) -> torch.Tensor:
    """``w`` with each of its ``heads`` blocks of ``d`` entries along ``dim`` padded to ``new_d``,
    halves kept in RoPE's rotate_half pairing (old j, h+j -> new j, H+j)."""
    w = w.movedim(dim, 0)
    blocks = w.reshape(heads, 2, d // 2, *w.shape[1:])
    out = w.new_zeros(heads, 2, new_d // 2, *w.shape[1:])
    out[:, :, : d // 2] = blocks
    return out.reshape(heads * new_d, *w.shape[1:]).movedim(0, dim).contiguous()


def pad_state(state: dict[str, torch.Tensor], cfg: dict, new_d: int) -> dict[str, torch.Tensor]:
    """The reshaped tensors (see the module docstring); ``cfg`` is the source ``config.json``."""
    d, nh = cfg["head_dim"], cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads") or nh
    scale = math.sqrt(new_d / d)
    out = {}
    for name, t in state.items():
        if ".self_attn.q_proj." in name:
            t = pad_rows(t.double() * scale, nh, d, new_d).float()
        elif ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
            t = pad_rows(t, nkv, d, new_d)
        elif ".self_attn.o_proj.weight" in name:
            t = pad_rows(t, nh, d, new_d, dim=1)
        out[name] = t
    return out


def pad_config(cfg: dict, new_d: int) -> dict:
    d = cfg["head_dim"]
    theta = float(cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)))
    new = dict(cfg, head_dim=new_d, rope_theta=theta ** (new_d / d))
    if "rope_parameters" in cfg:
        new["rope_parameters"] = dict(cfg["rope_parameters"], rope_theta=new["rope_theta"])
    return new


def check(cfg: dict, src: Path, new_d: int) -> str | None:
    """Why ``src`` cannot be reshaped, or None."""
    d = cfg.get("head_dim")
    rope_type = (cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}).get("rope_type", "default")
    if not (src / WEIGHTS).is_file() or (src / f"{WEIGHTS}.index.json").exists():
        return f"{src}: expected a single {WEIGHTS} (sharded and pickled checkpoints are not handled)"
    if cfg.get("model_type") not in ("llama", "qwen2"):
        return f"model_type {cfg.get('model_type')!r} is not a Llama-family decoder"
    if not isinstance(d, int) or d % 2 or new_d % 2 or new_d < d:
        return f"need an even head_dim in config.json and an even --head-dim >= it (have {d}, {new_d})"
    if (cfg.get("rope_scaling") and rope_type != "default") or cfg.get("partial_rotary_factor", 1.0) != 1.0:
        return "RoPE scaling and partial rotary are not handled"
    return None


def main(argv: list[str] | None = None) -> int:
    doc = __doc__.split("\n\n")[0]
    p = argparse.ArgumentParser(prog="python -m tools.demo_pair.pad_head_dim", description=doc)
    p.add_argument("src", type=Path, help="model folder (config.json, model.safetensors, tokenizer ...)")
    p.add_argument("dst", type=Path, help="output folder (must not exist)")
    p.add_argument("--head-dim", type=int, default=64, help="new head_dim (default 64)")
    args = p.parse_args(argv)
    src, dst = args.src, args.dst
    if dst.exists():
        p.error(f"{dst} exists")
    try:
        cfg = json.loads((src / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        p.error(f"{src}/config.json: {exc}")
    if (why := check(cfg, src, args.head_dim)) is not None:
        p.error(why)
    with safe_open(str(src / WEIGHTS), "pt") as f:
        metadata, state = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    tmp = dst.with_name(f".{dst.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("*.safetensors", "config.json"))
    save_file(pad_state(state, cfg, args.head_dim), str(tmp / WEIGHTS), metadata=metadata)
    shutil.copymode(src / WEIGHTS, tmp / WEIGHTS)
    (tmp / "config.json").write_text(json.dumps(pad_config(cfg, args.head_dim), indent=2) + "\n")
    tmp.rename(dst)
    print(f"{src} (head_dim {cfg['head_dim']}) -> {dst} (head_dim {args.head_dim})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
