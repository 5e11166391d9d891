"""Read a checkpoint folder's safetensors into one state dict (never pickle).

Sharded checkpoints are read through ``model.safetensors.index.json`` when present, otherwise
every ``*.safetensors`` file in the folder is read. Shared by target and draft models
(engine.loader) and EAGLE-3 heads (engine.eagle3).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from engine.errors import EngineInputError


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
