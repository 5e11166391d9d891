#!/usr/bin/env bash
# Re-measure every figure of benchmarks/results/ on this host (CPU), e.g. after retraining the
# demo pair. Sequential (the runs would disturb each other), ~45 minutes on 2 cores:
#
#   1. demo_pair_quality.py   acceptance / speedup / draft cost at gamma 4, B=1, all held-out prompts
#   2. vs_transformers.py     ours vs transformers' assisted generation
#   3. engine_speedup.py      measured vs predicted speedup per gamma and batch size
#   4. load_sweep.py          speedup by concurrency
#   5. costmodel_accuracy.py  predicted vs measured tokens/s under load
#   6. `autotune tune` on the bundled tune.yaml with a fresh database (timed; profile included),
#      then `autotune profile`, `autotune profiles show current`, `autotune report current` and the
#      exports of the chosen profile (results/demo_report/, results/demo_exports/)
#   7. tuner_vs_grid.py       the study against the exhaustive grid and popular defaults
#   8. draft_after_verify.py  a draft forward inside a step vs in a draft-only loop
#
# Each step's console goes to results/<step>.txt; a failing step is reported and the next runs.
# Usage: bash benchmarks/run_cpu.sh [step ...]   (steps by number, default all)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
AUTOTUNE=("$(dirname "$PY")/autotune")
[ -x "${AUTOTUNE[0]}" ] || AUTOTUNE=(autotune)
RES="$ROOT/benchmarks/results"
mkdir -p "$RES"
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(1 2 3 4 5 6 7 8)
FAILED=0

run() {  # run NAME CMD...: console to results/NAME.txt and to the terminal
  local name="$1"; shift
  echo "== $name: $*"
  local t0=$SECONDS
  if "$@" 2>&1 | tee "$RES/$name.txt"; then
    echo "== $name: ok in $((SECONDS - t0)) s"
  else
    echo "== $name: FAILED after $((SECONDS - t0)) s"; FAILED=1
  fi
}

tune_step() {
  local tmp; tmp="$(mktemp -d)"
  "$PY" - "$ROOT/tune.yaml" "$tmp" <<'EOF'
import sys
from pathlib import Path

import yaml

src, tmp = Path(sys.argv[1]), Path(sys.argv[2])
raw = yaml.safe_load(src.read_text())
for section, key in (("models", "target"), ("models", "draft"), ("workload", "prompts")):
    if raw[section][key] != "demo":  # `demo`: the installed demo pair and prompts, from any folder
        raw[section][key] = str((src.parent / raw[section][key]).resolve())
raw["storage"]["url"] = f"sqlite:///{tmp / 'autotune.db'}"
raw["export"]["dir"] = str(tmp / "exports")
(tmp / "tune.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
EOF
  local cfg="$tmp/tune.yaml"
  local t0=$SECONDS
  run tune_default "${AUTOTUNE[@]}" tune --config "$cfg"
  echo "autotune tune wall time: $((SECONDS - t0)) s (fresh database, profile included)" | tee -a "$RES/tune_default.txt"
  run profile_demo_cpu "${AUTOTUNE[@]}" profile --config "$cfg"
  run profile_show "${AUTOTUNE[@]}" profiles show current --config "$cfg"
  rm -rf "$RES/demo_report" "$RES/demo_exports"
  run report "${AUTOTUNE[@]}" report current --config "$cfg" -o "$RES/demo_report"
  cp -r "$tmp/exports" "$RES/demo_exports" || FAILED=1
  rm -f "$RES/report.txt"
  rm -rf "$tmp"
}

for step in "${STEPS[@]}"; do
  case "$step" in
    1) run demo_pair_quality "$PY" benchmarks/demo_pair_quality.py ;;
    2) run vs_transformers "$PY" benchmarks/vs_transformers.py ;;
    3) run engine_speedup "$PY" benchmarks/engine_speedup.py ;;
    4) run load_sweep "$PY" benchmarks/load_sweep.py ;;
    5) run costmodel_accuracy "$PY" benchmarks/costmodel_accuracy.py ;;
    6) tune_step ;;
    7) run tuner_vs_grid "$PY" benchmarks/tuner_vs_grid.py ;;
    8) run draft_after_verify "$PY" benchmarks/draft_after_verify.py ;;
    *) echo "unknown step $step (1-8)"; FAILED=1 ;;
  esac
done
exit $FAILED
