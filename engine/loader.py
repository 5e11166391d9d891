"""Load a local Hugging Face style model folder: config.json + *.safetensors + tokenizer.json.

Safetensors only (never pickle), no hub, no remote code. Sharded checkpoints are read through
``model.safetensors.index.json`` when present, otherwise every ``*.safetensors`` file in the
folder is read.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tokenizers import Tokenizer

from engine.checkpoint import load_state_dict
from engine.config import ModelConfig, rope_inv_freq
from engine.errors import EngineInputError
from engine.model import Transformer

if TYPE_CHECKING:
    from engine.eagle3 import Eagle3Head

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """``"bf16"`` / ``"bfloat16"`` / ``torch.bfloat16`` -> ``torch.bfloat16``."""
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise EngineInputError(f"dtype: unknown value {name!r} (choose from float32, bfloat16, float16)")
    return DTYPES[name]


def resolve_device(name: str) -> torch.device:
    """``"auto"`` picks cuda when present; ``"cuda"`` without a GPU (or ``cuda:N`` past the last) is a
    user error.

    Example:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", name):
        raise EngineInputError(f"device: unknown value {name!r} (choose from auto, cpu, cuda, cuda:N)")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise EngineInputError(f"device: {name!r} requested but torch sees no CUDA device")
    dev = torch.device(name)
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise EngineInputError(
            f"device: {name!r} requested but torch sees {torch.cuda.device_count()} CUDA device(s)"
        )
    return dev


def load_model(folder: str | Path, dtype: str | torch.dtype = "float32", device: str = "cpu") -> Transformer:
    """Build a :class:`Transformer` from a model folder, weights cast to ``dtype`` on ``device``.

    On a CPU this also turns on flush-to-zero for subnormal floats (``torch.set_flush_denormal``,
    process-wide): subnormal activations, which sampled (T > 0) decoding produces, slow x86
    arithmetic (docs/decisions.md#flush-denormal). Values below 1.2e-38 become 0; greedy and
    sampled outputs keep their guarantees.

    Example:
        >>> model = load_model("engine/demo/pair/target", dtype="float32")  # doctest: +SKIP
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise EngineInputError(f"{folder}: model folder not found")
    cfg = ModelConfig.from_folder(folder)
    state = load_state_dict(folder)
    with torch.device("meta"):
        model = Transformer(cfg)
    expected = {k for k in model.state_dict() if not (cfg.tie_word_embeddings and k == "lm_head.weight")}
    state = {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = expected - state.keys(), state.keys() - expected
    if missing or unexpected:
        what = f"missing {sorted(missing)[:3]}" if missing else f"unexpected {sorted(unexpected)[:3]}"
        raise EngineInputError(f"{folder}: weights do not match config.json ({what})")
    torch_dtype, dev = parse_dtype(dtype), resolve_device(device)
    for name, tensor in state.items():
        want = model.get_parameter(name).shape
        if tensor.shape != want:
            raise EngineInputError(
                f"{folder}: tensor {name} has shape {tuple(tensor.shape)}, config implies {tuple(want)}"
            )
    model.load_state_dict({k: v.to(dtype=torch_dtype) for k, v in state.items()}, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.inv_freq = rope_inv_freq(cfg)  # buffers built on "meta" hold no values
    if dev.type == "cpu":
        torch.set_flush_denormal(True)
    return model.to(dev).eval().requires_grad_(False)


def load_tokenizer(folder: str | Path) -> Tokenizer:
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        raise EngineInputError(f"{folder}: no tokenizer.json")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on malformed files
        raise EngineInputError(f"{path}: not a valid tokenizer.json ({str(exc).splitlines()[0]})") from None


@dataclass
class ModelPair:
    """A target, an optional draft model, an optional EAGLE-3 head and the shared tokenizer."""

    target: Transformer
    draft: Transformer | None
    tokenizer: Tokenizer | None
    target_path: Path
    draft_path: Path | None
    compile_s: float | None = None  # seconds spent compiling decode (None: eager)
    eagle3: Eagle3Head | None = None  # the ``eagle3`` drafter's head (engine.eagle3)

    def compile_decode(self, trees: Sequence[Sequence[int]] = ()) -> float:
        """Compile both models' decode/verify forward (:meth:`Transformer.compile_decode`; ``trees``:
        the tree shapes whose forward is warmed too); records and returns the seconds it took."""
        if self.eagle3 is not None:  # the head's aux layers get their hidden-state graph warmed too
            layers = self.eagle3.config.layer_ids
            self.compile_s = self.target.compile_decode(trees=trees, hidden_layers=layers)
        else:
            self.compile_s = self.target.compile_decode(trees=trees)
        if self.draft is not None:
            self.compile_s += self.draft.compile_decode(trees=trees)
        return self.compile_s

    def run_eager(self) -> None:
        """Decode eager again (after a failed or unprofitable compile); the compiled graphs stay cached."""
        for model in (self.target, self.draft):
            if model is not None:
                model.compiled = False
        self.compile_s = None


def load_pair(
    target: str | Path,
    draft: str | Path | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    fuse: bool = True,
    compile: bool = False,
    trees: Sequence[Sequence[int]] = (),
    eagle3: str | Path | None = None,
) -> ModelPair:
    """Load a target (and draft) folder for inference; refuse a draft whose vocabulary differs.
    ``eagle3``: an EAGLE-3 head folder for the ``eagle3`` drafter (engine.eagle3.load_eagle3).

    ``fuse`` (default) merges each layer's q/k/v and gate/up projections into one matmul each
    (:meth:`Transformer.fuse`): same function, fewer kernels. ``compile`` compiles both models'
    decode/verify forward (:meth:`Transformer.compile_decode`) and records the seconds it took;
    ``trees`` (tree shapes the run will draft) warms the token-tree forward too.

    Example:
        >>> pair = load_pair("engine/demo/pair/target", "engine/demo/pair/draft")  # doctest: +SKIP
    """
    tgt = load_model(target, dtype, device)
    drf = load_model(draft, dtype, device) if draft is not None else None
    if fuse:
        tgt.fuse()
        if drf is not None:
            drf.fuse()
    if drf is not None and drf.config.vocab_size != tgt.config.vocab_size:
        raise EngineInputError(
            f"{draft}: draft vocab_size {drf.config.vocab_size} != target vocab_size {tgt.config.vocab_size}"
        )
    tok_path = Path(target) / "tokenizer.json"
    tokenizer = load_tokenizer(target) if tok_path.is_file() else None
    pair = ModelPair(tgt, drf, tokenizer, Path(target), Path(draft) if draft is not None else None)
    if eagle3 is not None:
        from engine.eagle3 import load_eagle3  # engine.eagle3 imports this module

        pair.eagle3 = load_eagle3(eagle3, tgt)
    if compile:
        pair.compile_decode(trees)
    return pair
