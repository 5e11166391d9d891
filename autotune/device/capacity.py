"""What fits where, and in which dtype, read from files before anything loads.

A checkpoint's size comes from its safetensors headers (the 8-byte length and the JSON table of
tensors at the start of each file: dtype, shape, byte offsets), never from its data, so a 70B is
sized in milliseconds. The KV cache of the workload's longest sequence times the batch comes from
config.json. Free memory is the device's own answer: ``MemAvailable`` on a CPU host,
``torch.cuda.mem_get_info`` per GPU. :func:`check_fits` refuses a plan that cannot fit with one line
(:class:`~autotune.errors.ConfigError`, exit 2) naming the sizes and the knob to change.

The dtype rule (``models.dtype: auto``, :func:`resolve_dtype`): the checkpoint's ``torch_dtype``
where the device computes in it (bf16 on a GPU that has it, else fp16; bf16 on a CPU with bf16
instructions), float32 on a CPU without them.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import ConfigError

GIB = 1 << 30

SAFETENSORS_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}
FLOAT_TYPES = frozenset({"F64", "F32", "F16", "BF16"})  # cast to the run's dtype when loaded
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
HEADER_LIMIT = 100 << 20  # a safetensors header larger than this is not a header
ENGINE_HEADROOM = 1.25  # the engine's activations, fused copies and allocator slack over weights + KV


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if n < 100 * GIB else f"{n / GIB:.0f} GiB"


@dataclass(frozen=True)
class Tensors:
    """One safetensors file's table: float parameters (cast when loaded) and other bytes (kept)."""

    float_params: int
    other_bytes: int
    stored_bytes: int
    dtypes: frozenset[str]


def read_header(path: Path) -> Tensors:
    """The tensor table of one safetensors file, checked against the file's size (no data read).

    Example:
        >>> import tempfile, json, struct
        >>> f = Path(tempfile.mkdtemp()) / "m.safetensors"
        >>> h = json.dumps({"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]}}).encode()
        >>> _ = f.write_bytes(struct.pack("<Q", len(h)) + h + bytes(12))
        >>> read_header(f).float_params
        6
    """
    try:
        with path.open("rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise ConfigError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
            (length,) = struct.unpack("<Q", head)
            if length > HEADER_LIMIT:
                raise ConfigError(f"{path}: not a safetensors file (header length {length} bytes)")
            table = json.loads(fh.read(length))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: unreadable safetensors header ({exc})") from None
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: safetensors header is not a table of tensors")
    float_params = other = end = 0
    dtypes = set()
    for name, info in table.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (lo, hi) = info["dtype"], info["shape"], info["data_offsets"]
            numel = 1
            for d in shape:
                numel *= int(d)
            size = SAFETENSORS_BYTES[dtype]
        except (KeyError, TypeError, ValueError):
            raise ConfigError(
                f"{path}: tensor {name!r} has no valid dtype/shape/data_offsets in its header"
            ) from None
        if hi - lo != numel * size:
            raise ConfigError(f"{path}: tensor {name!r} declares {numel} x {dtype} but {hi - lo} bytes")
        dtypes.add(dtype)
        end = max(end, hi)
        if dtype in FLOAT_TYPES:
            float_params += numel
        else:
            other += hi - lo
    return Tensors(float_params, other, end, frozenset(dtypes))


@dataclass(frozen=True)
class Checkpoint:
    """A model folder as files describe it: config.json, tokenizer presence and tensor sizes."""

    folder: Path
    config: Mapping[str, Any]
    float_params: int
    other_bytes: int
    stored_bytes: int
    file_bytes: int
    stored_dtypes: frozenset[str]

    @property
    def torch_dtype(self) -> str | None:
        """The checkpoint's declared dtype (config.json ``torch_dtype`` or ``dtype``), canonical name."""
        raw = self.config.get("torch_dtype") or self.config.get("dtype")
        name = str(raw).removeprefix("torch.") if raw else None
        return {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "half": "float16"}.get(
            name or "", name
        )

    def weights_bytes(self, dtype: str) -> int:
        """Bytes the weights take loaded in ``dtype`` (float tensors cast, the rest as stored)."""
        return self.float_params * DTYPE_BYTES[dtype] + self.other_bytes

    def kv_bytes_per_token(self, dtype: str) -> int:
        """K and V of one token over every layer (grouped-query heads counted once)."""
        c = self.config
        layers = int(c.get("num_hidden_layers", 0))
        heads = int(c.get("num_attention_heads", 0) or 1)
        kv_heads = int(c.get("num_key_value_heads") or heads)
        head_dim = int(c.get("head_dim") or int(c.get("hidden_size", 0)) // heads)
        return 2 * layers * kv_heads * head_dim * DTYPE_BYTES[dtype]


def read_checkpoint(folder: Path) -> Checkpoint:
    """config.json and every safetensors header of ``folder`` (sharded through the index when present).

    A header that declares more bytes than its file holds is refused here: the load would fail
    half-way, or the sizes would be wrong.
    """
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{folder}: no readable config.json ({exc.__class__.__name__})") from None
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigError(f"{index}: not a valid safetensors index ({exc})") from None
        files = [folder / n for n in names]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        hint = (
            f"; `autotune convert-head {folder}` writes them"
            if (folder / "pytorch_model.bin").is_file()
            else ""
        )
        raise ConfigError(
            f"{folder}: no *.safetensors weights (pickled .bin checkpoints are not loaded){hint}"
        )
    params = other = stored = on_disk = 0
    dtypes: set[str] = set()
    for f in files:
        if not f.is_file():
            raise ConfigError(f"{f}: listed in the index but missing")
        t = read_header(f)
        size = f.stat().st_size
        with f.open("rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
        if 8 + length + t.stored_bytes > size:
            raise ConfigError(
                f"{f}: its header declares {_gib(t.stored_bytes)} of tensors but the file holds "
                f"{_gib(size - 8 - length)} (truncated or not a checkpoint)"
            )
        params, other, stored, on_disk = (
            params + t.float_params,
            other + t.other_bytes,
            stored + t.stored_bytes,
            on_disk + size,
        )
        dtypes |= t.dtypes
    return Checkpoint(folder, config, params, other, stored, on_disk, frozenset(dtypes))


def cpu_has_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes in bfloat16 natively (avx512_bf16 or AMX bf16; ARM's bf16 flag)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = set(cpuinfo.split())
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def resolve_dtype(
    requested: str, checkpoint_dtype: str | None, device: str, cuda_bf16: Callable[[], bool] | None = None
) -> tuple[str, str]:
    """``models.dtype`` as the run uses it, and why (for the log and the profile).

    Example:
        >>> resolve_dtype("auto", "bfloat16", "cpu", None)[0] in ("bfloat16", "float32")
        True
        >>> resolve_dtype("auto", "bfloat16", "cuda:0", lambda: False)
        ('float16', 'auto: checkpoint bfloat16, this GPU has no bfloat16: float16')
        >>> resolve_dtype("float16", "bfloat16", "cpu")
        ('float16', 'models.dtype: float16')
    """
    if requested != "auto":
        return requested, f"models.dtype: {requested}"
    declared = checkpoint_dtype if checkpoint_dtype in DTYPE_BYTES else "float32"
    if device.startswith("cuda"):
        if declared == "bfloat16":
            has_bf16 = cuda_bf16() if cuda_bf16 is not None else _torch_cuda_bf16()
            if not has_bf16:
                return "float16", "auto: checkpoint bfloat16, this GPU has no bfloat16: float16"
        return declared, f"auto: the checkpoint's {declared}"
    if declared == "float32":
        return "float32", "auto: the checkpoint's float32"
    if cpu_has_bf16():
        return (
            "bfloat16" if declared == "bfloat16" else "float32",
            f"auto: checkpoint {declared}, CPU with bf16",
        )
    return "float32", f"auto: checkpoint {declared}, this CPU has no bf16 instructions: float32"


def _torch_cuda_bf16() -> bool:
    import torch

    return bool(torch.cuda.is_bf16_supported())


def free_bytes(device: str) -> int | None:
    """Memory free on ``device`` now: ``MemAvailable`` for cpu, ``torch.cuda.mem_get_info`` for cuda[:N]."""
    if device.startswith("cuda"):
        import torch

        index = int(device.split(":")[1]) if ":" in device else 0
        free, _total = torch.cuda.mem_get_info(index)
        return int(free)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@dataclass(frozen=True)
class Need:
    """One thing that must fit: what it is and its bytes."""

    what: str
    bytes: int


def check_fits(needs: Sequence[Need], free: int | None, where: str, knob: str) -> str:
    """Refuse (ConfigError, one line) when ``needs`` exceed ``free``; else the line that says they fit.

    Example:
        >>> check_fits([Need("target", 3 * GIB)], 2 * GIB, "cpu", "models.dtype")
        Traceback (most recent call last):
        ...
        autotune.errors.ConfigError: does not fit on cpu: target 3.00 GiB = 3.00 GiB, free 2.00 GiB (change models.dtype)
    """
    total = sum(n.bytes for n in needs)
    parts = " + ".join(f"{n.what} {_gib(n.bytes)}" for n in needs)
    if free is None:
        return f"memory: {parts} = {_gib(total)} on {where} (free memory unknown: not checked)"
    if total > free:
        raise ConfigError(
            f"does not fit on {where}: {parts} = {_gib(total)}, free {_gib(free)} (change {knob})"
        )
    return f"memory: {parts} = {_gib(total)} of {_gib(free)} free on {where}"
