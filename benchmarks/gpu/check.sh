#!/usr/bin/env bash
# GPU host check (one NVIDIA GPU, torch with CUDA, no internet), each step under its own timeout:
#
#   0. environment: missing Python packages from ./wheels (pip --no-index) if that folder exists,
#      then `pip install -e . --no-deps`; nvidia-smi and torch's view of the GPU;
#   1. the output contract on the GPU (benchmarks/gpu/equivalence.py: greedy speculative ==
#      greedy autoregressive on the demo pair, fp32 and bf16, gamma 4, B = 1 and 8). The engine
#      tests build their models on the CPU and take no device, so this check stands in for them;
#   2. `autotune profile --json` with a copy of the bundled tune.yaml set to $DEVICE and $DTYPE
#      (concurrency levels $PROFILE_CONCURRENCY, so the profile classifies B up to 32), then a
#      short table: GPU label, theoretical and measured bandwidth, matmul TFLOP/s, ridge, knee n*,
#      per-batch label and best gamma;
#   3. benchmarks/engine/load_sweep.py --device $DEVICE --dtype $DTYPE;
#   4. benchmarks/gpu/compiled.py: eager vs compiled vs CUDA-graph decode for the demo pair and a
#      ~1B Llama-shaped random target with a ~100M draft, against the HBM roofline;
#   5. benchmarks/engine/trees.py (eager engine, greedy, B = 1 and 8): chains vs static vs dynamic (EAGLE-2)
#      token trees where verify width is nearly free, and the min-of-k verify cost per width;
#   6. the identity of the lent GPU with the real NVML: the fingerprint (GPU count, tensor parallel
#      size, MIG slice or whole GPU, interconnect, key; the key of "the GPU the run uses" equals
#      the default one's), a run on every GPU torch sees at that tensor parallel size, and the
#      busy check on the used GPU only (identity.json, identity.txt). It fails when NVML is there
#      but matches no GPU, when the two keys differ, or when the busy check reads no GPU.
#
#   7. memory and dtype before anything loads (autotune.device.capacity) on the GPU: dtype auto for a
#      bf16 checkpoint, the GPU's free memory from torch against nvidia-smi's, the demo pair's sizes
#      from its headers against what loading it allocates, and a 70B-shaped pair (sizes from a
#      config, no weights) refused on one GPU and fitted per GPU at tensor parallel 4 (capacity.json).
#
# STEPS (default "1 2 3 4 5 6 7") picks steps, so one device call can stay under its time limit.
#
# Everything goes to benchmarks/results/gpu/ (gpu_check.log holds the whole console) and is
# copied to $OUT/gpu when $OUT is set. A failing step is logged and the next one still runs; the
# exit code is 1 when any step failed. Step timeouts (120 + 200 + 150 + 240 + 150 + 60 + 90 s): ~17
# minutes at most for all seven; e.g. STEPS="1 2 6 7" fits a 10-minute call.
#
# Usage: bash benchmarks/gpu/check.sh
# Environment (all optional): PYTHON (python3), DTYPE (bfloat16), DEVICE (cuda), WHEELS (./wheels),
#   TARGET / DRAFT / PROMPTS (the demo pair and prompts), PROFILE_CONCURRENCY (1,8,32),
#   BENCH_FLAGS (extra flags for both benchmark scripts, e.g. "--num-prompts 4"), SWEEP_FLAGS (extra
#   flags for load_sweep.py only, e.g. "--concurrency 1,8"), INSTALL (1; 0 skips the pip steps).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
PY="${PYTHON:-$(command -v python3 || command -v python)}"
DTYPE="${DTYPE:-bfloat16}"
DEVICE="${DEVICE:-cuda}"
WHEELS="${WHEELS:-$ROOT/wheels}"
TARGET="${TARGET:-$ROOT/engine/demo/pair/target}"
DRAFT="${DRAFT:-$ROOT/engine/demo/pair/draft}"
PROMPTS="${PROMPTS:-$ROOT/engine/demo/prompts.jsonl}"
PROFILE_CONCURRENCY="${PROFILE_CONCURRENCY:-1,8,32}"
INSTALL="${INSTALL:-1}"
STEPS=" ${STEPS:-1 2 3 4 5 6 7} "
want() { [[ "$STEPS" == *" $1 "* ]]; }
read -r -a EXTRA <<< "${BENCH_FLAGS:-}"
read -r -a SWEEP <<< "${SWEEP_FLAGS:-}"
RES="$ROOT/benchmarks/results/gpu"
mkdir -p "$RES"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # imports work even if the editable install fails
export TARGET DRAFT PROMPTS DEVICE DTYPE PROFILE_CONCURRENCY
PAIR_FLAGS=(--target "$TARGET" --draft "$DRAFT" --prompts "$PROMPTS" --device "$DEVICE" --out-dir "$RES")

# Python snippets (read -d '' returns 1 at the end of input; harmless without set -e).
read -r -d '' MISSING_PY <<'EOF'
import importlib.util
need = {"optuna": "optuna", "sqlalchemy": "sqlalchemy", "pynvml": "nvidia-ml-py", "yaml": "pyyaml",
        "click": "click", "safetensors": "safetensors", "tokenizers": "tokenizers", "matplotlib": "matplotlib"}
print(" ".join(pkg for mod, pkg in need.items() if importlib.util.find_spec(mod) is None))
EOF

read -r -d '' TUNE_YAML_PY <<'EOF'
import os
import sys
from pathlib import Path

import yaml

src, dst, res = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
env = os.environ
cfg = yaml.safe_load(src.read_text())
cfg["models"].update(target=env["TARGET"], draft=env["DRAFT"], device=env["DEVICE"], dtype=env["DTYPE"])
cfg["workload"]["prompts"] = env["PROMPTS"]
cfg["workload"]["concurrency"] = [int(c) for c in env["PROFILE_CONCURRENCY"].split(",")]
cfg["search"]["max_batch_size"] = [max(cfg["workload"]["concurrency"])]
cfg["storage"]["url"] = f"sqlite:///{res / 'autotune.db'}"
cfg["export"]["dir"] = str(res / "exports")
dst.write_text(yaml.safe_dump(cfg, sort_keys=False))
EOF

read -r -d '' SUMMARY_PY <<'EOF'
import json
import sys

from autotune.cli.text import columns as table

d = json.load(open(sys.argv[1]))
fp, ce, theo = d["fingerprint"], d["ceilings"], d["fingerprint"].get("theoretical") or {}
scale = lambda v, s: None if v is None else v / s  # noqa: E731
bw, bw_theo = ce["copy_bandwidth"]["median_bytes_per_s"], theo.get("bandwidth_bytes_per_s")
rows = [
    ("GPU", fp["label"]),
    ("bandwidth, theoretical (GB/s)", scale(bw_theo, 1e9)),
    ("bandwidth, measured copy (GB/s)", bw / 1e9),
    ("measured / theoretical bandwidth", bw / bw_theo if bw_theo else None),
    ("matmul, measured (TFLOP/s)", ce["matmul"]["median_flops"] / 1e12),
    ("matmul, datasheet dense bf16 (TFLOP/s)", scale(theo.get("dense_bf16_flops"), 1e12)),
    ("ridge (FLOP/byte)", ce["ridge_flops_per_byte"]),
    ("knee n* (tokens per verify pass)", d["knee_tokens"]),
    (f"acceptance at gamma {d['acceptance']['gamma_max']}", d["acceptance"]["acceptance_rate"]),
]
print(table(["quantity", "value"], rows))
cl = d["classification"]
print()
print(table(["batch", f"verify cost (gamma={cl['gamma_max']}+1 vs 1)", "label", "best gamma", "predicted speedup"],
            [(r["batch_size"], r["verify_cost"], r["label"], r["best_gamma"], r["predicted_speedup"])
             for r in cl["batch_sizes"]]))
EOF

read -r -d '' CAPACITY_PY <<'EOF'
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import torch

from autotune.device.capacity import Checkpoint, Need, check_fits, free_bytes, read_checkpoint, resolve_dtype
from autotune.errors import ConfigError
from engine.loader import load_pair

device, target, draft, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
device = "cuda:0" if device == "cuda" else device
report, failed = {}, []
dtype, why = resolve_dtype("auto", "bfloat16", device)
report["dtype_auto_bf16_checkpoint"] = [dtype, why]
if dtype != "bfloat16":
    failed.append(f"dtype auto gave {dtype} for a bf16 checkpoint on {torch.cuda.get_device_name(0)}")
free = free_bytes(device)
smi = subprocess.run(
    ["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits", "-i", "0"],
    capture_output=True, text=True,
).stdout.strip()
report["free_bytes_torch"], report["free_mib_nvidia_smi"] = free, smi
if smi and free is not None and abs(free / 2**20 - float(smi)) > 1024:
    failed.append(f"torch free {free / 2**20:.0f} MiB vs nvidia-smi {smi} MiB")
ck_t, ck_d = read_checkpoint(target), read_checkpoint(draft)
predicted = ck_t.weights_bytes("bfloat16") + ck_d.weights_bytes("bfloat16")
torch.cuda.synchronize()
before = torch.cuda.memory_allocated(0)
pair = load_pair(target, draft, dtype="bfloat16", device=device, fuse=False)
torch.cuda.synchronize()
loaded = torch.cuda.memory_allocated(0) - before
report["demo_pair_bf16_predicted_bytes"], report["demo_pair_bf16_allocated_bytes"] = predicted, loaded
if abs(loaded - predicted) > 0.05 * predicted + 2**20:
    failed.append(f"demo pair: predicted {predicted} B, allocated {loaded} B")
del pair
torch.cuda.empty_cache()
config = {"num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "hidden_size": 8192}
big = Checkpoint(Path("llama-70b-shape"), config, 70_553_706_496, 0, 0, 0, frozenset({"BF16"}))
small = replace(
    big, folder=Path("llama-1b-draft-shape"), float_params=1_235_814_400,
    config={**config, "num_hidden_layers": 16, "num_attention_heads": 32, "hidden_size": 2048},
)
kv = big.kv_bytes_per_token("bfloat16") * 16 * 8192
needs = [
    Need("target weights (bfloat16)", big.weights_bytes("bfloat16")),
    Need("draft weights (bfloat16)", small.weights_bytes("bfloat16")),
    Need("KV cache (16 x 8192 tokens)", kv),
]
try:
    check_fits(needs, free, device, "backend.vllm.tensor_parallel_size")
    failed.append("a 70B pair fitted on one GPU")
except ConfigError as exc:
    report["70b_one_gpu"] = str(exc)
per_gpu = [Need(n.what + " / 4", n.bytes // 4) for n in needs]
report["70b_tp4_per_gpu"] = check_fits(per_gpu, free, device, "backend.vllm.tensor_parallel_size")
report["failed"] = failed
out.write_text(json.dumps(report, indent=1))
print(json.dumps(report, indent=1))
sys.exit(1 if failed else 0)
EOF

read -r -d '' IDENTITY_PY <<'EOF'
import json
import os
import sys

import torch

from autotune.device import hardware, hostnoise

device, dtype, out = sys.argv[1], sys.argv[2], sys.argv[3]
fp = hardware.fingerprint(device, dtype)
first = fp["gpus"][0]["ordinal"] if fp["gpus"] else None
same = hardware.fingerprint(device, dtype, gpus=[first])["key"] if first is not None else fp["key"]
count = torch.cuda.device_count()
every = hardware.fingerprint("cuda:0", dtype, gpu_count=count, tensor_parallel_size=count) if count > 1 else None
used = hardware.nvml_selectors(fp)
noise = hostnoise.measure(gpus=used)
report = {
    "fingerprint": fp,
    "key_of_the_used_gpu": same,
    "every_gpu": every,
    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "nvml_selectors": used,
    "busy_check": {"gpus": noise["gpus"], "busy": noise["busy"], "reasons": noise["reasons"]},
    "unfiltered_gpu_activity": hostnoise.gpu_activity(),
}
with open(out, "w") as fh:
    json.dump(report, fh, indent=2, default=str)
mig = [g["mig"]["uuid"] for g in fp["gpus"] if g["mig"]]
print(f"label {fp['label']}; key {fp['key']}; gpu_count {fp['gpu_count']}; tensor parallel "
      f"{fp['tensor_parallel_size']}; MIG {mig[0] if mig else 'no'}; interconnect {fp['interconnect']}; "
      f"nvml_error {fp['nvml_error']}")
if every is not None:
    print(f"all {count} GPUs at TP {count}: {every['label']}; interconnect {every['interconnect']}; key {every['key']}")
print(f"busy check on {used}: {noise['gpus']} -> {'busy' if noise['busy'] else 'quiet'} {noise['reasons']}")
problems = []
if fp["kind"] == "cuda" and fp["nvml"] is None and "unavailable" not in str(fp["nvml_error"]):
    problems.append(f"NVML matched no GPU: {fp['nvml_error']}")
if same != fp["key"]:
    problems.append(f"the used GPU's key {same} is not the default key {fp['key']}")
if fp["kind"] == "cuda" and fp["nvml"] is not None and not noise["gpus"]:
    problems.append(f"the busy check read no GPU of {used}")
for problem in problems:
    print("FAILED:", problem)
sys.exit(1 if problems else 0)
EOF

FAILED=()
T0=$SECONDS
log() { echo "[gpu_check +$((SECONDS - T0))s] $*"; }
step_failed() { FAILED+=("$1"); log "FAILED: $1"; }
pip_install() {  # pip refuses system interpreters under PEP 668 unless told otherwise
  "$PY" -m pip install -q "$@" || PIP_BREAK_SYSTEM_PACKAGES=1 "$PY" -m pip install -q "$@"
}

main() {
  # ---------------------------------------------------------------- 0. environment
  log "python: $PY ($("$PY" --version 2>&1)); repo: $ROOT; device $DEVICE, dtype $DTYPE"
  local missing
  missing=$("$PY" -c "$MISSING_PY")
  if [ "$INSTALL" = 0 ]; then
    log "INSTALL=0: no pip steps${missing:+ (missing: $missing)}"
  elif [ -n "$missing" ]; then
    if [ -d "$WHEELS" ]; then
      log "installing from $WHEELS: $missing"
      for pkg in $missing; do
        pip_install --no-index --find-links "$WHEELS" "$pkg" || log "warning: could not install $pkg from $WHEELS"
      done
    else
      log "warning: missing packages ($missing) and no wheels folder at $WHEELS"
    fi
  fi
  if [ "$INSTALL" != 0 ]; then
    pip_install -e . --no-deps --no-build-isolation || log "warning: editable install failed; using PYTHONPATH=$ROOT"
  fi
  if [[ "$DEVICE" == cuda* ]]; then
    nvidia-smi > "$RES/nvidia-smi.txt" 2>&1 || log "warning: nvidia-smi failed"
    if ! "$PY" -c "import sys, torch; ok = torch.cuda.is_available(); print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0) if ok else 'sees NO CUDA device'); sys.exit(0 if ok else 1)"; then
      step_failed "torch sees no CUDA device"
      return 1
    fi
  fi

  # ---------------------------------------------------------------- 1. output contract on the device
  if want 1; then
  log "1/6 greedy equivalence (fp32 and bf16, gamma 4, B = 1 and 8)"
  timeout -k 10 200 "$PY" -m benchmarks.gpu.equivalence "${PAIR_FLAGS[@]}" --dtypes float32,bfloat16 \
    --batch-sizes 1,8 --gamma 4 ${EXTRA[@]+"${EXTRA[@]}"} || step_failed "gpu_equivalence (rc $?)"
  fi

  # ---------------------------------------------------------------- 2. profile
  if want 2; then
  log "2/6 autotune profile ($DTYPE, concurrency $PROFILE_CONCURRENCY)"
  "$PY" -c "$TUNE_YAML_PY" "$ROOT/tune.yaml" "$RES/tune.yaml" "$RES" || step_failed "writing tune.yaml"
  if timeout -k 10 200 "$PY" -c 'from autotune.cli import main; main(prog_name="autotune")' \
       profile --config "$RES/tune.yaml" --json > "$RES/profile.json" 2> "$RES/profile.stderr"; then
    "$PY" -c "$SUMMARY_PY" "$RES/profile.json" | tee "$RES/profile_summary.txt" || step_failed "profile summary"
  else
    step_failed "autotune profile (see $RES/profile.stderr)"
    tail -n 5 "$RES/profile.stderr"
  fi
  fi

  # ---------------------------------------------------------------- 3. load sweep
  if want 3; then
  log "3/6 load sweep ($DTYPE)"
  timeout -k 10 150 "$PY" -m benchmarks.engine.load_sweep "${PAIR_FLAGS[@]}" --dtype "$DTYPE" ${EXTRA[@]+"${EXTRA[@]}"} \
    ${SWEEP[@]+"${SWEEP[@]}"} \
    || step_failed "load_sweep (rc $?)"
  fi

  # ---------------------------------------------------------------- 4. compiled decode vs roofline
  if want 4; then
  log "4/6 eager vs compiled vs graphs decode ($DTYPE)"
  timeout -k 10 240 "$PY" -m benchmarks.gpu.compiled --device "$DEVICE" --dtype "$DTYPE" --out-dir "$RES" \
    || step_failed "gpu_compiled (rc $?)"
  fi

  # ---------------------------------------------------------------- 5. token trees where width is cheap
  if want 5; then
  log "5/6 chains vs static vs dynamic trees ($DTYPE, eager engine, greedy, B = 1 and 8)"
  timeout -k 10 150 "$PY" -m benchmarks.engine.trees "${PAIR_FLAGS[@]}" --dtype "$DTYPE" --engine eager --modes greedy \
    --batch-sizes 1,8 --repeats 2 --num-prompts 6 --max-new-tokens 40 --gammas 4,6 --trees "2,1,1,1;2,2,1,1" \
    --dynamic "2x6/10;4x6/24;8x6/48" --hybrid-gammas 4 --cost-repeats 5 ${EXTRA[@]+"${EXTRA[@]}"} \
    || step_failed "trees (rc $?)"
  fi

  # ---------------------------------------------------------------- 6. the device's identity (NVML)
  if want 6; then
  log "6/6 fingerprint and busy check of the used GPU ($DEVICE, NVML)"
  local rc
  timeout -k 10 60 "$PY" -c "$IDENTITY_PY" "$DEVICE" "$DTYPE" "$RES/identity.json" > "$RES/identity.txt" 2>&1
  rc=$?
  cat "$RES/identity.txt"
  [ "$rc" = 0 ] || step_failed "identity (rc $rc)"
  fi

  if want 7; then
  log "7/7 memory and dtype before anything loads ($DEVICE)"
  local rc7
  timeout -k 10 90 "$PY" -c "$CAPACITY_PY" "$DEVICE" "$TARGET" "$DRAFT" "$RES/capacity.json" > "$RES/capacity.txt" 2>&1
  rc7=$?
  cat "$RES/capacity.txt"
  [ "$rc7" = 0 ] || step_failed "capacity (rc $rc7)"
  fi

  log "done in $((SECONDS - T0)) s; results in $RES${OUT:+ and $OUT/gpu}"
  if [ ${#FAILED[@]} -gt 0 ]; then
    log "failed steps: ${FAILED[*]}"
    return 1
  fi
}

main 2>&1 | tee "$RES/gpu_check.log"
rc=${PIPESTATUS[0]}
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT/gpu" && cp -r "$RES/." "$OUT/gpu/"
fi
exit "$rc"
