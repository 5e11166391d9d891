"""Hugging Face folder -> GGUF file for llama.cpp, converted once and cached by content hash.

The conversion runs llama.cpp's own ``convert_hf_to_gguf.py`` (from the source that
``tools/install_llamacpp.sh`` unpacks into ``<home>/llama.cpp``) with the converter python
``<home>/venv/bin/python``, through :mod:`autotune.backends.gguf_convert` (which maps an
unrecognised BPE pre-tokenizer to ``backend.llamacpp.pre_tokenizer``). Files land in
``<home>/gguf/<folder name>-<hash>.gguf``; the hash covers the folder's weights, config and
tokenizer files (:data:`TOKENIZER_FILES`) and the pre-tokenizer mapping, so an edited model,
tokenizer or mapping converts again. A failed conversion leaves
no file behind and raises a one-line ConfigError naming the folder. An EAGLE-3 head converts
against its target (:func:`ensure_head`).
"""

from __future__ import annotations

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
"""The GGUF file type every conversion writes (``--outtype``): the engine's and the other backends'
dtype on CPU, and the ``dtype`` a llama.cpp profile's deployment records."""


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
    key = hash_json(parts)[:12]
    return Path(lc.home).expanduser() / "gguf" / f"{Path(folder).name}-{key}.gguf"


def ensure(folder: Path, lc: LlamacppConfig, where: str) -> Path:
    """The cached GGUF file of ``folder``, converting it first when needed."""
    out = gguf_path(folder, lc)
    return out if out.is_file() else _convert(folder, out, lc, where, [])


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
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    log = out.with_name(f"{out.name}.log")
    command = [str(python), str(CONVERT), str(source), str(folder), str(tmp)]
    if lc.pre_tokenizer:
        command.append(lc.pre_tokenizer)
    command += ["--outtype", OUTTYPE]
    try:
        with open(log, "wb") as fh:
            code = subprocess.run(
                command + extra, stdout=fh, stderr=subprocess.STDOUT, timeout=1800
            ).returncode
        if code != 0 or not tmp.is_file():
            raise ConfigError(
                f"{where}: llama.cpp's converter failed on {shown or folder}: {log_tail(log, 4, 600)}"
            )
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out
