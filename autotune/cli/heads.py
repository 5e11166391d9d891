"""``autotune convert-head``: a head shipped as ``pytorch_model.bin`` written as safetensors.

The engine, the tuner and the exporters read safetensors only; the conversion is the one place a
pickle is opened, with torch's weights-only unpickler (engine.checkpoint.convert_pickled).
"""

from __future__ import annotations

from pathlib import Path

import click
from safetensors import safe_open

from engine.checkpoint import PICKLED, convert_pickled


@click.command("convert-head")
@click.argument("folder", type=click.Path(path_type=Path, file_okay=False))
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Folder to write model.safetensors and a copy of config.json to (default: FOLDER itself).",
)
def convert_head(folder: Path, out: Path | None) -> None:
    """Convert an EAGLE-3 head's pytorch_model.bin in FOLDER to model.safetensors.

    \b
    The file is read with torch.load(weights_only=True): tensors only, nothing executed.
    Then point models.eagle3 at the folder written (docs/eagle3.md, "Formats read").
    """
    dest = convert_pickled(folder, out or folder)
    with safe_open(str(dest), "pt") as f:
        count = len(list(f.keys()))
    click.echo(f"wrote {dest} ({count} tensors from {folder / PICKLED})")
