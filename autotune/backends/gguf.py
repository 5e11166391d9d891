"""Hugging Face folder -> GGUF file for llama.cpp, converted once and cached by content hash.

The conversion runs llama.cpp's own ``convert_hf_to_gguf.py`` (from the source that
``tools/install_llamacpp.sh`` unpacks into ``<home>/llama.cpp``) with the converter python
``<home>/venv/bin/python``, through :mod:`autotune.backends.gguf_convert` (which maps an
unrecognised BPE pre-tokenizer to ``backend.llamacpp.pre_tokenizer``). Files land in
``<home>/gguf/<folder name>-<hash>.gguf``; the hash covers the folder's files and the
pre-tokenizer mapping, so an edited model or mapping converts again. A failed conversion leaves
no file behind and raises a one-line ConfigError naming the folder.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from autotune.backends.server import log_tail
from autotune.config import LlamacppConfig
from autotune.errors import ConfigError
from profiles.hashing import hash_folder, hash_json

CONVERT = Path(__file__).with_name("gguf_convert.py")


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


def gguf_path(folder: Path, lc: LlamacppConfig) -> Path:
    """Where the GGUF file of ``folder`` is cached."""
    key = hash_json({"folder": hash_folder(folder), "pre_tokenizer": lc.pre_tokenizer})[:12]
    return Path(lc.home).expanduser() / "gguf" / f"{Path(folder).name}-{key}.gguf"


def ensure(folder: Path, lc: LlamacppConfig, where: str) -> Path:
    """The cached GGUF file of ``folder``, converting it first when needed."""
    out = gguf_path(folder, lc)
    if out.is_file():
        return out
    python, source = converter(lc)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    log = out.with_name(f"{out.name}.log")
    command = [str(python), str(CONVERT), str(source), str(folder), str(tmp)]
    if lc.pre_tokenizer:
        command.append(lc.pre_tokenizer)
    try:
        with open(log, "wb") as fh:
            code = subprocess.run(command, stdout=fh, stderr=subprocess.STDOUT, timeout=1800).returncode
        if code != 0 or not tmp.is_file():
            raise ConfigError(f"{where}: llama.cpp's converter failed on {folder}: {log_tail(log, 4, 600)}")
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out
