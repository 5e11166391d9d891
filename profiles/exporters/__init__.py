"""Exporters: turn a stored profile into config files serving stacks read unchanged.

One small module per stack (``vllm``, ``sglang``, ``trtllm``, ``tgi``, ``hf``, ``llamacpp``,
plus ``profile_yaml``); each builds the stack's structure, checks it with its ``validate``
function (the stack's hard rules, docs/stacks/<stack>.md) and renders the text. :func:`export`
reads the profile once (a stored JSON dict becomes a :class:`~profiles.schema.Profile` there),
picks the module; :func:`write_export` puts the result on disk atomically.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from profiles.errors import ProfileError
from profiles.exporters import hf, llamacpp, profile_yaml, sglang, tgi, trtllm, vllm
from profiles.exporters._common import Exported
from profiles.profile import ExportInputs, export_inputs
from profiles.schema import Profile

__all__ = ["FORMATS", "VALIDATORS", "Exported", "export", "write_export"]

FORMATS = ("vllm", "sglang", "trtllm", "tgi", "hf", "llamacpp", "yaml")
_STACK_EXPORTERS: dict[str, Callable[[ExportInputs], Exported]] = {
    "vllm": vllm.export,
    "sglang": sglang.export,
    "trtllm": trtllm.export,
    "tgi": tgi.export,
    "hf": hf.export,
    "llamacpp": llamacpp.export,
}
VALIDATORS: dict[str, Callable[[Any], None]] = {
    "vllm": vllm.validate,
    "sglang": sglang.validate,
    "trtllm": trtllm.validate,
    "tgi": tgi.validate,
    "hf": hf.validate,
    "llamacpp": llamacpp.validate,
}
_EXECUTABLE = (".sh",)
# The formats that write an 'eagle3' (EAGLE-3 head) profile; the others refuse it in one line rather
# than export the head as something it is not. vLLM: method eagle3; SGLang: EAGLE3; TensorRT-LLM:
# decoding_type Eagle3; llama.cpp: --spec-type draft-eagle3 with the head's GGUF (docs/eagle3.md).
# TGI and transformers' assisted generation serve no EAGLE-3 head.
EAGLE3_FORMATS = ("vllm", "sglang", "trtllm", "llamacpp", "yaml")


def export(
    profile: Profile | Mapping[str, Any],
    fmt: str,
    target_model: str | None = None,
    draft_model: str | None = None,
) -> Exported:
    """Export ``profile`` for one serving stack; ``target_model``/``draft_model`` replace the pair's paths.

    ``profile`` is a typed :class:`~profiles.schema.Profile` or its stored JSON (read here with
    :meth:`Profile.from_json <profiles.schema.Profile.from_json>`, which validates it once).
    Raises ProfileError naming the missing profile key, or the stack rule an export would break.

    Example:
        >>> p = {"tool_version": "0.1.0", "created_at": "2026-11-30T01:30:00+00:00",
        ...      "device": {"key": "ab12", "label": "NVIDIA H200"},
        ...      "pair": {"target": "/m/t", "draft": "/m/d"},
        ...      "chosen": {"drafter": "model", "gamma": 4},
        ...      "schedule": [{"batch_size": 1, "gamma": 4}, {"batch_size": 8, "gamma": 0}]}
        >>> print(export(p, "vllm").text, end="")
        {
          "method": "draft_model",
          "model": "/m/d",
          "num_speculative_tokens": 4,
          "num_speculative_tokens_per_batch_size": [[1, 1, 4], [2, 8, 0]]
        }
    """
    if fmt not in FORMATS:
        raise ProfileError(f"unknown export format {fmt!r} (choose from {', '.join(FORMATS)})")
    if not isinstance(profile, Profile):
        if not isinstance(profile, Mapping):
            raise ProfileError(f"profile must be a mapping, got {type(profile).__name__}")
        profile = Profile.from_json(profile)
    inputs = export_inputs(profile, target_model, draft_model)
    if inputs.drafter == "eagle3" and fmt not in EAGLE3_FORMATS:
        raise ProfileError(
            f"{fmt} export: the chosen drafter is 'eagle3' (an EAGLE-3 head), which this exporter does "
            f"not write yet (exported to: {', '.join(EAGLE3_FORMATS)})"
        )
    if fmt == "yaml":
        return profile_yaml.export(profile, inputs, target_model, draft_model)
    return _STACK_EXPORTERS[fmt](inputs)


def _write_temp(dest: Path, text: str, mode: int) -> Path:
    fd, name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def write_export(exported: Exported, path: str | os.PathLike[str]) -> list[Path]:
    """Write an export, its sidecar and extra files atomically; returns the written paths, main file first.

    ``path`` is a file path, or an existing folder (the export's default file name is used);
    missing parent folders are created; extra files keep their names, next to the main file. Each
    file goes to a temporary file in the same folder and is moved into place with ``os.replace``,
    the sidecar first, the main file last;
    on any failure the temporary files are removed, so no partial file is ever left.

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> [p.name for p in write_export(Exported("tgi", "tgi-args.sh", "#!/bin/sh\\n"), folder)]
        ['tgi-args.sh']
    """
    dest = Path(path)
    if dest.is_dir():
        dest = dest / exported.filename
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        mode = 0o755 if dest.name.endswith(_EXECUTABLE) else 0o644
        planned = [(dest.with_name(name), text, 0o644) for name, text in exported.extra_files]
        planned.append((dest, exported.text, mode))
        if exported.sidecar is not None:
            planned.insert(0, (dest.with_name(dest.name + ".meta.json"), exported.sidecar, 0o644))
        temps: list[tuple[Path, Path]] = []
        try:
            for final, text, file_mode in planned:
                temps.append((_write_temp(final, text, file_mode), final))
            while temps:
                tmp, final = temps[0]
                os.replace(tmp, final)
                temps.pop(0)
        finally:
            for tmp, _ in temps:
                tmp.unlink(missing_ok=True)
    except OSError as exc:
        raise ProfileError(f"{dest}: cannot write export ({exc.strerror or exc})") from None
    return [final for final, _, _ in reversed(planned)]
