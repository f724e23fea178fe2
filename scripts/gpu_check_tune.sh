#!/usr/bin/env bash
# `opdvfs tune` and a compiled model on a lent GPU (the `device` tool), read-only:
#   run(command="bash scripts/gpu_check_tune.sh", carry=[".whl"], timeout_s=480)
# It never sets a clock, power limit or any other setting: the actuator is dry-run, which on a
# machine with NVML only reads it (clocks, power, energy counter, temperature) and logs the calls
# it would make. So every "clock" of the sweep is the clock the GPU chose, the plan has nothing
# real to save, and the A/B blocks are a null contrast: their intervals should hold 0, and their
# width is the resolution of tune's measurement on real hardware.
# Writes under $OUT: summary.txt (the lines that matter) and results.tar.gz (tune.json, report.md,
# calls logs, stderr of each step).
# REHEARSE=1 runs it here on the CPU (sim:a100-like instead of dry-run: no NVML here).
set -uo pipefail
REHEARSE=${REHEARSE:-0}
OUT=${OUT:-$(mktemp -d)}
W=$(mktemp -d)
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export OPDVFS_CACHE_DIR="$W/cache"
PY=${PYTHON:-python3}
log() { echo "gpu_check_tune: $*" | tee -a "$OUT/summary.txt"; }
ACT=(--actuator dry-run)
STEPS=${STEPS:-400}
if [ "$REHEARSE" = 1 ]; then
  ACT=(--actuator sim:a100-like --work-scale 1e6)
  STEPS=${STEPS:-200}
fi
if [ -d .whl ] && [ "$REHEARSE" != 1 ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
log "$(date -u +%FT%TZ) $($PY --version 2>&1); actuator ${ACT[*]}; $STEPS steps"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,temperature.gpu \
  --format=csv 2>&1 | tee -a "$OUT/summary.txt"

# step NAME TIMEOUT_S CMD...: run one step, keep its output, print its last lines
step() {
  local name=$1 limit=$2
  shift 2
  log "== $name: $*"
  local t0=$SECONDS
  timeout "$limit" "$@" >"$W/$name.log" 2>&1
  local rc=$?
  log "   rc=$rc in $((SECONDS - t0)) s"
  grep -E "^(round|applied|tuned|measured|started|wrote|opdvfs|gpu_train_gpt|Traceback|[A-Za-z]+Error)" \
    "$W/$name.log" | tail -14 | cut -c1-400 | tee -a "$OUT/summary.txt"
}

T=scripts/gpu_train_gpt.py
step tune_eager 170 $PY -m opdvfs tune --target 0.02 "${ACT[@]}" --out "$W/tune_eager" \
  --log "$W/tune_eager.calls.jsonl" -- $PY $T "$STEPS"
[ -f "$W/tune_eager/tune.json" ] && $PY benchmarks/tune_dry_run_check.py "$W/tune_eager" \
  "$W/tune_eager.calls.jsonl" 2>&1 | cut -c1-300 | tee -a "$OUT/summary.txt"
step tune_cached 90 $PY -m opdvfs tune --target 0.02 "${ACT[@]}" --out "$W/tune_cached" \
  --log "$W/tune_cached.calls.jsonl" -- $PY $T 80
step tune_compiled 150 $PY -m opdvfs tune --target 0.02 "${ACT[@]}" --no-cache \
  --out "$W/tune_compiled" --log "$W/tune_compiled.calls.jsonl" -- $PY $T 450 --compile default
[ -f "$W/tune_compiled/tune.json" ] && $PY benchmarks/tune_dry_run_check.py "$W/tune_compiled" \
  "$W/tune_compiled.calls.jsonl" 2>&1 | cut -c1-300 | tee -a "$OUT/summary.txt"
if [ -f "$W/tune_eager/schedule.json" ]; then
  RUN_ACT=("${ACT[@]}")
  [ "$REHEARSE" = 1 ] || RUN_ACT=(--actuator dry-run)
  step run_compiled_time 150 $PY -m opdvfs run "$W/tune_eager/schedule.json" "${RUN_ACT[@]}" \
    --trigger time --log "$W/run_compiled.calls.jsonl" -- $PY $T 150 --compile default
fi
$PY - "$W" <<'PY' 2>&1 | tee -a "$OUT/summary.txt"
import json, sys
from pathlib import Path
w = Path(sys.argv[1])
for name in ("tune_eager", "tune_cached", "tune_compiled"):
    doc = w / name / "tune.json"
    if not doc.exists():
        print(name, "no tune.json")
        continue
    d = json.loads(doc.read_text())
    keep = {k: d.get(k) for k in ("actuator", "device", "error", "cache_hit", "profiling_iterations",
                               "planning_iterations", "overhead_fraction", "measured_slowdown",
                               "measured_saving") if k in d}
    print(name, json.dumps(keep)[:600])
    for r in d.get("rounds", [])[:4]:
        print("  round", json.dumps(r)[:500])
for calls in sorted(w.glob("*.calls.jsonl")):
    rows = [json.loads(x) for x in calls.read_text().splitlines() if x.strip()]
    kinds = [r["kind"] for r in rows]
    sets = [r for r in rows if r["kind"] == "set"]
    print(calls.name, "calls", len(rows), "sets", len(sets), "restores", kinds.count("restore"),
          "last", kinds[-1] if kinds else None,
          "set iterations", sorted({r["iteration"] for r in sets if r["iteration"] is not None})[:12])
PY
if [ "$REHEARSE" != 1 ]; then
  step tests_on_gpu 100 $PY -m pytest -q -x -n 8 -p no:cacheprovider tests/test_actuators.py \
    tests/test_contracts.py
  tail -5 "$W/tests_on_gpu.log" | tee -a "$OUT/summary.txt"
fi
tar -czf "$OUT/results.tar.gz" -C "$W" --exclude cache . 2>/dev/null
ls -la "$OUT"
log "done"
