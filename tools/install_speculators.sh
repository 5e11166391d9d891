#!/usr/bin/env bash
# Install the vLLM project's `speculators` library (PyPI) into its own venv, for the test that writes
# an EAGLE-3 head with the library itself (tests/engine/test_eagle3_speculators_written.py).
# Idempotent: a venv that already imports the library's head-writing path is kept.
# speculators pins transformers <= 5.19 and declares torchvision/torchaudio (CUDA-linked on PyPI,
# they break vLLM's venv), so it shares no venv: it goes in --no-deps, with only the packages its
# head-writing path imports (its config and model classes, the training CLI's layer-config builder,
# the vocabulary mapping). Usage: bash tools/install_speculators.sh [VENV_DIR]
set -euo pipefail
VENV="${1:-${AUTOTUNE_SPECULATORS_VENV:-$HOME/.cache/spec-autotune/speculators-venv}}"
VERSION="${SPECULATORS_VERSION:-0.9.0}"
check() {
    "$VENV/bin/python" -c "
from speculators.models.eagle3 import Eagle3DraftModel
from speculators.train.cli import create_transformer_layer_config
from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution
" >/dev/null 2>&1
}
if [ -x "$VENV/bin/python" ] && check; then
    echo "speculators already installed in $VENV"
    exit 0
fi
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q torch==2.13.0   # the CPU wheel (from local disk here); never the CUDA build
# What `import speculators` and its EAGLE-3 writing path import, within the library's own pins.
"$VENV/bin/pip" install -q transformers==5.19.0 "datasets>=4.0.0,<=5.1.0" "openai>=2.0.0" \
    "hs-connectors==$VERSION" pydantic-settings httpx "loguru>=0.7.2,<=0.7.3"
"$VENV/bin/pip" install -q --no-deps "speculators==$VERSION"
check || { echo "speculators installed in $VENV but its EAGLE-3 writer does not import" >&2; exit 1; }
echo "speculators $VERSION installed in $VENV"
