"""Hugging Face folder -> GGUF file for llama.cpp, converted once and cached by content hash.

The conversion runs llama.cpp's own ``convert_hf_to_gguf.py`` (from the source that
``tools/install_llamacpp.sh`` unpacks into ``<home>/llama.cpp``) with the converter python
``<home>/venv/bin/python``, through :mod:`autotune.backends.gguf_convert` (which maps an
unrecognised BPE pre-tokenizer to ``backend.llamacpp.pre_tokenizer``). Files land in
``<home>/gguf/<folder name>[-<type>]-<hash>.gguf``; the hash covers the folder's weights, config and
tokenizer files (:data:`TOKENIZER_FILES`), the pre-tokenizer mapping and the type, so an edited model,
tokenizer or mapping converts again. The type is ``backend.llamacpp.quantization``: f32 (the
default), f16 and bf16 are written by the converter; q8_0 and q4_k_m by ``<home>/bin/llama-quantize``
from the cached f32 file. A failed conversion or quantization leaves no file behind and raises a
one-line ConfigError naming the folder. An EAGLE-3 head converts against its target
(:func:`ensure_head`). A ``models.gguf`` file is used as it is (:func:`ensure`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from autotune.backends.server import log_tail
from autotune.config import LlamacppConfig
from autotune.errors import ConfigError
from profiles.hashing import hash_folder, hash_json

CONVERT = Path(__file__).with_name("gguf_convert.py")
OUTTYPE = "f32"
"""The GGUF type of a conversion when ``backend.llamacpp.quantization`` is not set: the engine's
and the other backends' dtype on CPU."""
CONVERT_TYPES = ("f32", "f16", "bf16")
"""Types the converter writes itself (``--outtype``); the others are quantized from the f32 file."""


def quantization(lc: LlamacppConfig) -> str:
    """The GGUF type a converted pair is served in: ``backend.llamacpp.quantization`` or :data:`OUTTYPE`
    (the ``dtype`` a llama.cpp profile's deployment records)."""
    return lc.quantization or OUTTYPE


def quantizer(lc: LlamacppConfig) -> Path:
    """``<home>/bin/llama-quantize``, or ConfigError saying how to build it."""
    path = Path(lc.home).expanduser() / "bin" / "llama-quantize"
    if not path.is_file():
        raise ConfigError(
            f"backend.llamacpp.quantization: {quantization(lc)} needs llama-quantize, not at {path}; "
            "run `bash tools/install_llamacpp.sh`"
        )
    return path


def converter(lc: LlamacppConfig) -> tuple[Path, Path]:
    """``(python, llama.cpp source)`` of the converter, or ConfigError saying how to install them."""
    home = Path(lc.home).expanduser()
    python, source = home / "venv" / "bin" / "python", home / "llama.cpp"
    if not python.is_file() or not (source / "convert_hf_to_gguf.py").is_file():
        raise ConfigError(
            f"backend.llamacpp.home: no GGUF converter in {home} (need venv/bin/python and "
            "llama.cpp/convert_hf_to_gguf.py); run `bash tools/install_llamacpp.sh`"
        )
    return python, source


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "tokenizer.model")
"""The files besides the weights that the converter writes into the GGUF (vocabulary, BOS rule,
chat template): part of the cache key, so an edited tokenizer converts again."""


def _tokenizer_hash(folder: Path) -> str:
    digest = hashlib.sha256()
    for name in TOKENIZER_FILES:
        file = Path(folder) / name
        if file.is_file():
            digest.update(name.encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def gguf_path(folder: Path, lc: LlamacppConfig, target: Path | None = None) -> Path:
    """Where the GGUF file of ``folder`` is cached (a head's key covers its target too)."""
    parts = {
        "folder": hash_folder(folder),
        "tokenizer": _tokenizer_hash(folder),
        "pre_tokenizer": lc.pre_tokenizer,
    }
    if target is not None:
        parts["target"] = hash_folder(target)
    qtype = quantization(lc)
    if qtype != OUTTYPE:
        parts["type"] = qtype
    key = hash_json(parts)[:12]
    name = Path(folder).name + ("" if qtype == OUTTYPE else f"-{qtype}")
    return Path(lc.home).expanduser() / "gguf" / f"{name}-{key}.gguf"


def ensure(folder: Path, lc: LlamacppConfig, where: str) -> Path:
    """The GGUF file llama-server loads for ``folder``: a GGUF file (``models.gguf``) as it is; a
    Hugging Face folder's cached file in ``backend.llamacpp.quantization``, converted (and
    quantized from the cached f32 file, :func:`_quantize`) first when needed."""
    if Path(folder).is_file():
        return Path(folder)
    out = gguf_path(folder, lc)
    if out.is_file():
        return out
    if quantization(lc) in CONVERT_TYPES:
        return _convert(folder, out, lc, where, [])
    return _quantize(ensure(folder, _f32(lc), where), out, lc, where)


def _f32(lc: LlamacppConfig) -> LlamacppConfig:
    return dataclasses.replace(lc, quantization=None)


def ensure_head(
    head: Path, target: Path, layer_ids: Sequence[int], n_layers: int, lc: LlamacppConfig
) -> Path:
    """The cached GGUF file of an EAGLE-3 head (``--spec-type draft-eagle3 -md``), converted with
    ``--target-model-dir target``.

    llama.cpp fuses exactly three target layers and captures each one's *input* (``layer_ids`` as
    vLLM and the engine read them, ascending; id ``n_layers``, the last layer's output, is not
    captured there): another head is refused in one line. The converter reads the ids from the
    config's top level only, so it converts a staged copy whose config.json carries them there.
    """
    ids = list(layer_ids)
    if len(ids) != 3 or max(ids) >= n_layers:
        raise ConfigError(
            f"models.eagle3: {head}: llama.cpp's draft-eagle3 fuses exactly 3 target layers below the "
            f"target's {n_layers} (layer inputs; got eagle_aux_hidden_state_layer_ids {ids})"
        )
    out = gguf_path(head, lc, target)
    if out.is_file():
        return out
    if quantization(lc) not in CONVERT_TYPES:
        base = ensure_head(head, target, layer_ids, n_layers, _f32(lc))
        return _quantize(base, out, lc, "models.eagle3")
    with tempfile.TemporaryDirectory(prefix="eagle3-") as tmp:
        stage = Path(tmp) / head.name
        stage.mkdir()
        for file in head.iterdir():
            if file.is_file() and file.name != "config.json":
                (stage / file.name).symlink_to(file.resolve())
        config = json.loads((head / "config.json").read_text())
        (stage / "config.json").write_text(json.dumps({**config, "eagle_aux_hidden_state_layer_ids": ids}))
        return _convert(stage, out, lc, "models.eagle3", ["--target-model-dir", str(target)], shown=head)


def _convert(
    folder: Path, out: Path, lc: LlamacppConfig, where: str, extra: list[str], shown: Path | None = None
) -> Path:
    python, source = converter(lc)
    command = [str(python), str(CONVERT), str(source), str(folder), "{out}"]
    if lc.pre_tokenizer:
        command.append(lc.pre_tokenizer)
    command += ["--outtype", quantization(lc)]
    return _run(command + extra, out, f"{where}: llama.cpp's converter failed on {shown or folder}")


def _quantize(base: Path, out: Path, lc: LlamacppConfig, where: str) -> Path:
    """``llama-quantize BASE OUT TYPE``: the f32 file in ``backend.llamacpp.quantization`` (tensors
    whose rows the type's blocks do not divide take llama-quantize's own fallback type)."""
    command = [str(quantizer(lc)), str(base), "{out}", quantization(lc).upper()]
    return _run(command, out, f"{where}: llama-quantize failed on {base} ({quantization(lc)})")


def _run(command: list[str], out: Path, failed: str) -> Path:
    """Run ``command``, its ``{out}`` argument a temporary file that becomes ``out`` only when the
    command succeeded; a failure is ``failed`` plus the log's tail, one line, and leaves no file."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    log = out.with_name(f"{out.name}.log")
    command = [str(tmp) if part == "{out}" else part for part in command]
    try:
        with open(log, "wb") as fh:
            code = subprocess.run(command, stdout=fh, stderr=subprocess.STDOUT, timeout=1800).returncode
        if code != 0 or not tmp.is_file():
            raise ConfigError(f"{failed}: {log_tail(log, 4, 600)}")
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out
