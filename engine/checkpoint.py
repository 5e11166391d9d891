"""Read a checkpoint folder's safetensors into one state dict (never pickle).

Sharded checkpoints are read through ``model.safetensors.index.json`` when present, otherwise
every ``*.safetensors`` file in the folder is read. Shared by target and draft models
(engine.loader) and EAGLE-3 heads (engine.eagle3).

The one exception is :func:`convert_pickled`, run once by ``autotune convert-head``: it reads a
``pytorch_model.bin`` with torch's weights-only unpickler (tensors and plain containers, no code)
and writes the same tensors as ``model.safetensors``.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from engine.errors import EngineInputError

PICKLED = "pytorch_model.bin"  # the single-file pickled checkpoint convert_pickled reads


def _checkpoint_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise EngineInputError(f"{index}: not a valid safetensors index ({exc})") from None
        return [folder / name for name in sorted(set(weight_map.values()))]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise EngineInputError(
            f"{folder}: no *.safetensors weights (pickled .bin checkpoints are not loaded)"
        )
    return files


def load_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for path in _checkpoint_files(folder):
        if not path.is_file():
            raise EngineInputError(f"{path}: listed in the index but missing")
        try:
            state.update(load_file(str(path)))
        except (SafetensorError, OSError, ValueError) as exc:
            raise EngineInputError(f"{path}: corrupt safetensors file ({str(exc).splitlines()[0]})") from None
    return state


def convert_pickled(folder: Path, out: Path) -> Path:
    """Write ``folder``'s ``pytorch_model.bin`` as ``out/model.safetensors`` (and copy its config.json
    when ``out`` is another folder); returns the written file. Read with
    ``torch.load(weights_only=True, map_location="cpu")``: a file that needs anything beyond tensors
    and plain containers is refused, never executed.

    Example:
        >>> convert_pickled(Path("EAGLE3-LLaMA3.1-Instruct-8B"), Path("head"))  # doctest: +SKIP
        PosixPath('head/model.safetensors')
    """
    source, config = folder / PICKLED, folder / "config.json"
    if not source.is_file():
        raise EngineInputError(f"{folder}: no {PICKLED} to convert")
    if not config.is_file():
        raise EngineInputError(f"{folder}: no config.json beside {PICKLED}")
    dest = out / "model.safetensors"
    if dest.exists():
        raise EngineInputError(f"{dest}: already exists (remove it, or write elsewhere with --out)")
    try:
        state = torch.load(source, weights_only=True, map_location="cpu")
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError, AttributeError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise EngineInputError(f"{source}: not a weights-only tensor checkpoint ({first})") from None
    tensors = _tensor_table(source, state)
    out.mkdir(parents=True, exist_ok=True)
    partial = out / ".model.safetensors.partial"
    save_file(tensors, str(partial))
    partial.replace(dest)
    if config.resolve() != (out / "config.json").resolve():
        shutil.copyfile(config, out / "config.json")
    return dest


def _tensor_table(source: Path, state: object) -> dict[str, torch.Tensor]:
    """``state`` as a flat name -> tensor table safetensors can write: every value a tensor, each
    with storage of its own (safetensors refuses tensors that share memory)."""
    if not isinstance(state, dict) or not state:
        kind = type(state).__name__
        raise EngineInputError(f"{source}: must hold a non-empty table of named tensors (got {kind})")
    for name, value in state.items():
        if not isinstance(name, str) or not isinstance(value, torch.Tensor):
            raise EngineInputError(
                f"{source}: entry {name!r} is a {type(value).__name__}, not a tensor (a flat table expected)"
            )
    return {name: value.detach().clone().contiguous() for name, value in state.items()}
