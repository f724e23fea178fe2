"""Capture a real GPU fixture: a torch.profiler trace of a small GPT training step + NVML samples.

For a session that has a GPU (the `device` tool). Read-only on the GPU: it reads NVML (power,
temperature, SM clock, energy counter) and never sets a clock, power limit or any other setting.

    python scripts/capture_gpu_fixture.py --out "$OUT" [--steps 3] [--interval-ms 10]

Writes ``gpt_cuda.pt.trace.json.gz`` (the clock read at start stamped as ``opdvfs_freq_mhz``) and
``nvml_samples.csv`` (``t_s`` on the trace's epoch clock, ``power_w``, ``power_instant_w``,
``temp_c``, ``freq_mhz``, ``energy_j``). Trim and check them in under tests/fixtures/.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import shutil
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--interval-ms", type=float, default=10.0)
    parser.add_argument("--index", type=int, default=0, help="NVML device index")
    args = parser.parse_args()
    try:
        import pynvml
        import torch
    except ImportError as exc:
        print(f"capture: needs torch and nvidia-ml-py ({exc})", file=sys.stderr)
        return 2
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        print(f"capture: NVML unavailable ({exc}); run this on a GPU machine", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("capture: torch sees no CUDA device", file=sys.stderr)
        return 2
    from tiny_gpt import capture_training_trace

    handle = pynvml.nvmlDeviceGetHandleByIndex(args.index)
    rows: list[tuple[float, ...]] = []
    stop = threading.Event()

    def read_instant() -> float:
        try:
            value = pynvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_POWER_INSTANT])[0]
            return value.value.uiVal / 1e3 if value.nvmlReturn == 0 else float("nan")
        except pynvml.NVMLError:
            return float("nan")

    def sample() -> None:
        while not stop.is_set():
            rows.append(
                (
                    time.time_ns() / 1e9,
                    pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3,
                    read_instant(),
                    float(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
                    float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
                    pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1e3,
                )
            )
            stop.wait(args.interval_ms / 1e3)

    args.out.mkdir(parents=True, exist_ok=True)
    clock = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        plain = capture_training_trace(
            args.out / "trace.json", steps=args.steps, freq_mhz=float(clock), device="cuda"
        )
        torch.cuda.synchronize()
    finally:
        stop.set()
        thread.join()
        pynvml.nvmlShutdown()
    with plain.open("rb") as src, gzip.open(args.out / "gpt_cuda.pt.trace.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    plain.unlink()
    with (args.out / "nvml_samples.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["t_s", "power_w", "power_instant_w", "temp_c", "freq_mhz", "energy_j"])
        writer.writerows(rows)
    print(f"capture: {len(rows)} NVML samples, SM clock {clock} MHz, files in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
