#!/usr/bin/env bash
# One short, read-only check of the CUDA paths on a lent GPU (the `device` tool):
#   run(command="bash scripts/gpu_check.sh", timeout_s=420)
# It never sets a clock, power limit or any other setting: NVML is only read, and the executor
# runs with the dry-run actuator. Writes under $OUT (at most 8 files come back):
#   fixture/gpt_cuda.pt.trace.json.gz, fixture/nvml_samples.csv  (the test fixture to trim)
#   captured.json, measured.parquet, calls.jsonl, summary.txt
# REHEARSE=1 runs steps 2-3 on the CPU (no fixture, --freq-mhz given) to check the script here.
set -uo pipefail
REHEARSE=${REHEARSE:-0}
OUT=${OUT:-$(mktemp -d)}
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
log() { echo "gpu_check: $*" | tee -a "$OUT/summary.txt"; }
PY=${PYTHON:-python3}

log "$(date -u +%FT%TZ) $(uname -m); $($PY --version 2>&1)"
nvidia-smi --query-gpu=name,uuid,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv \
  2>&1 | tee -a "$OUT/summary.txt"
if [ "$REHEARSE" = 1 ]; then
  log "rehearsal on the CPU"
elif ! $PY - <<'PY' 2>&1 | tee -a "$OUT/summary.txt"; then
import importlib.util
import sys

needed = ("torch", "pynvml", "numpy", "scipy", "pandas", "pyarrow", "pydantic", "typer", "rich",
          "matplotlib")
missing = [m for m in needed if importlib.util.find_spec(m) is None]
print("missing:", missing or "nothing")
if "torch" not in missing:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
    if not torch.cuda.is_available():
        missing.append("a CUDA device visible to torch")
sys.exit(1 if missing else 0)
PY
  log "stop: the machine lacks a CUDA torch or a dependency (nothing outside it can be reached)"
  exit 2
fi

DEV=cuda
CLOCK=()
if [ "$REHEARSE" = 1 ]; then
  DEV=cpu
  CLOCK=(--freq-mhz 1000)
else
  log "1. fixture: torch.profiler trace of a tiny GPT step + NVML samples"
  $PY scripts/capture_gpu_fixture.py --out "$OUT/fixture" --steps 3 --interval-ms 10 2>&1 \
    | tail -3 | tee -a "$OUT/summary.txt"
fi

TRAIN=$(mktemp --suffix=.py)
cat > "$TRAIN" <<PY
DEV = "$DEV"
PY
cat >> "$TRAIN" <<'PY'
import sys, torch
from tiny_gpt import TinyGPT
steps = int(sys.argv[1])
torch.manual_seed(0)
model = TinyGPT(dim=256, heads=4, layers=4, seq=128, vocab=512).to(DEV)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.randint(0, 512, (steps, 8, 129), device=DEV)
for i in range(steps):
    logits = model(data[i, :, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 512), data[i, :, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
if DEV == "cuda":
    torch.cuda.synchronize()
PY

log "2. capture --profile (on CUDA: kernels + NVML samples into a Profile)"
$PY -m opdvfs capture --out "$OUT/captured.json" --profile "$OUT/measured.parquet" "${CLOCK[@]}" -- \
  python "$TRAIN" 6 2>&1 | tail -4 | tee -a "$OUT/summary.txt"
$PY -m opdvfs info "$OUT/measured.parquet" --json 2>&1 | head -c 600 | tee -a "$OUT/summary.txt"; echo

log "3. run under a 3-stage schedule, dry-run actuator (CUDA-event marks, worker thread)"
$PY - "$OUT/captured.json" "$OUT/schedule.json" <<'PY' 2>&1 | tee -a "$OUT/summary.txt"
import sys
from opdvfs import Schedule
from opdvfs.workloads.workload import Workload
n = len(Workload.read(sys.argv[1]))
doc = Schedule.from_stage_freqs([0, n // 3, 2 * n // 3], [1980.0, 1005.0, 1980.0], n_ops=n,
                                target=0.1, solver="gpu-check", device="h100-like").model_dump()
doc["switches"][1]["delay_us"] = 200.0
Schedule.model_validate(doc).write(sys.argv[2])
print("schedule over", n, "ops")
PY
$PY -m opdvfs run "$OUT/schedule.json" --actuator dry-run --device h100-like \
  --log "$OUT/calls.jsonl" --workload "$OUT/captured.json" -- python "$TRAIN" 6 2>&1 | tail -3 \
  | tee -a "$OUT/summary.txt"
$PY - "$OUT/calls.jsonl" <<'PY' 2>&1 | tee -a "$OUT/summary.txt"
import json, sys
calls = [json.loads(x) for x in open(sys.argv[1]) if x.strip()]
sets: dict[int, list] = {}
for c in calls:
    if c["kind"] == "set" and c["iteration"] is not None:
        sets.setdefault(c["iteration"], []).append((c["op_index"], c["freq_mhz"]))
print("calls", len(calls), "last", calls[-1]["kind"] if calls else None, "sets by iteration", sets)
PY
rm -f "$OUT/schedule.json" "$TRAIN"
log "done"
