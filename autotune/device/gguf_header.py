"""A GGUF file as its header describes it: the model's shape and the file's size, without loading a weight.

``models.gguf`` pairs (llama.cpp files used as they are) have no config.json or safetensors; the
memory check (:func:`autotune.device.capacity.check_fits`) and the context length read this
instead. :func:`read_gguf` returns the same :class:`~autotune.device.capacity.Checkpoint` a
Hugging Face folder gives, its config keys named as config.json names them, and its weights the
file's bytes at any dtype (a GGUF is loaded as it is stored). The layout is llama.cpp's
``gguf-py/gguf/constants.py``: magic ``GGUF``, version, tensor and key-value counts, then typed
key-value pairs (little-endian).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

from autotune.device.capacity import Checkpoint
from autotune.errors import ConfigError

MAGIC = b"GGUF"
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
FILE_TYPES = {0: "f32", 1: "f16", 7: "q8_0", 15: "q4_k_m", 32: "bf16"}
"""``general.file_type`` -> the name ``backend.llamacpp.quantization`` uses (llama.cpp's
``llama_ftype``; others are shown as ``ftype N``)."""

_CONFIG_KEYS = {
    "block_count": "num_hidden_layers",
    "embedding_length": "hidden_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "context_length": "max_position_embeddings",
}


class _Reader:
    def __init__(self, fh: BinaryIO, where: str) -> None:
        self.fh, self.where = fh, where

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        data = self.fh.read(size)
        if len(data) != size:
            raise ConfigError(f"{self.where}: the GGUF header ends early (a truncated file?)")
        return struct.unpack(fmt, data)[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        data = self.fh.read(n)
        if len(data) != n:
            raise ConfigError(f"{self.where}: the GGUF header ends early (a truncated file?)")
        return data.decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        """A scalar or string; an array as its element count (what the header is read for)."""
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            inner, count = self.unpack("<I"), self.unpack("<Q")
            if inner == _STRING:
                for _ in range(count):
                    self.fh.seek(self.unpack("<Q"), 1)
            elif inner in _SCALARS:
                self.fh.seek(count * struct.calcsize(_SCALARS[inner]), 1)
            else:
                raise ConfigError(f"{self.where}: GGUF array of type {inner} is not readable here")
            return count
        raise ConfigError(f"{self.where}: unknown GGUF value type {kind} (not a GGUF file llama.cpp writes?)")


def read_metadata(path: Path, where: str) -> dict[str, Any]:
    """Every key-value pair of the header (arrays as their length); ConfigError naming ``where``
    and the file when it is no GGUF file."""
    at = f"{where}: {path}"
    with open(path, "rb") as fh:
        if fh.read(4) != MAGIC:
            raise ConfigError(f"{at} is not a GGUF file (no GGUF magic at its start)")
        reader = _Reader(fh, at)
        version = reader.unpack("<I")
        if version < 2:
            raise ConfigError(f"{at}: GGUF version {version} is too old (llama.cpp writes 3)")
        reader.unpack("<Q")  # tensor count
        n_kv = reader.unpack("<Q")
        out: dict[str, Any] = {}
        for _ in range(n_kv):
            key = reader.string()
            out[key] = reader.value(reader.unpack("<I"))
    return out


def file_type(meta: dict[str, Any]) -> str:
    """The weights' type as ``backend.llamacpp.quantization`` names it (``general.file_type``)."""
    code = meta.get("general.file_type")
    return FILE_TYPES.get(code, f"ftype {code}") if code is not None else "unknown"


def read_gguf(path: Path, where: str) -> Checkpoint:
    """``path`` as a :class:`Checkpoint`: the architecture's keys as config.json names them
    (``vocab_size`` the token count), weights the file's bytes."""
    meta = read_metadata(path, where)
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise ConfigError(f"{where}: {path} has no general.architecture (not a model GGUF?)")
    config: dict[str, Any] = {"model_type": arch, "vocab_size": meta.get("tokenizer.ggml.tokens")}
    for key, name in _CONFIG_KEYS.items():
        if f"{arch}.{key}" in meta:
            config[name] = meta[f"{arch}.{key}"]
    size = path.stat().st_size
    return Checkpoint(path, config, 0, size, size, size, frozenset({file_type(meta)}))
