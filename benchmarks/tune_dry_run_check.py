r"""Check what ``opdvfs tune --actuator dry-run`` wrote on an NVIDIA GPU, read-only (#21).

On a machine where NVML finds a GPU, a dry run without ``--device`` takes the GPU's clocks and
reads its power, energy counter and temperature through NVML (never setting anything), while
every clock call is only logged. Run the tune first, then this check on its outputs::

    .venv/bin/opdvfs tune --target 0.02 --actuator dry-run --no-cache \
        --out /tmp/tune-gpu --log /tmp/tune-gpu-calls.jsonl \
        -- python examples/train_tiny_gpt.py 400 --device cuda --dim 1024 --batch 2048
    .venv/bin/python benchmarks/tune_dry_run_check.py /tmp/tune-gpu /tmp/tune-gpu-calls.jsonl

It prints one line per check (``ok`` or ``FAILED``) and the run's figures, and exits 1 if a
check failed: the log's header says the GPU was measured (``meter: nvml``) and lists its
clocks; every iteration has an energy from the GPU's counter; the sweep ran (profile written);
each measured round has paired intervals of time and energy; the sets issued by time (no
operator index) fall only in the tuned blocks' and the steady phase's iterations; the log ends
with exactly one restore. A dry run changes no clock, so its measured slowdown and saving are
noise around zero: this checks the loop's mechanics on real measurements, not a saving.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from opdvfs.tuner.ab import applied_iterations


def _top_only(out: Path, header: dict) -> bool:
    """Whether the schedule tune wrote holds only the device's top clock."""
    path = out / "schedule.json"
    if not path.is_file() or not header.get("freqs_mhz"):
        return False
    stages = json.loads(path.read_text())["stages"]
    return {s["freq_mhz"] for s in stages} == {max(header["freqs_mhz"])}


def check(out: Path, log: Path) -> bool:
    """Print the checks of a dry-run tune's outputs; return whether all passed."""
    result = json.loads((out / "tune.json").read_text())
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    header, records = calls[0], calls[1:]
    rows = result["per_iteration"]
    tuned = applied_iterations(rows)
    # (the top clock locked before the program starts has no iteration)
    sets = [c for c in records if c["kind"] == "set" and c["iteration"] is not None]
    by_time = [c for c in sets if c["op_index"] is None]
    outside = sorted({c["iteration"] for c in by_time} - tuned)
    rounds = result["rounds"]
    checks = {
        "the GPU was measured (log header meter: nvml)": header.get("meter") == "nvml",
        "every iteration has the counter's energy": all(it["energy_j"] is not None for it in rows),
        "the sweep ran (profile.parquet written)": (out / "profile.parquet").is_file(),
        "at least one round measured time and energy in pairs": bool(rounds)
        and all(r["slowdown"]["n"] >= 1 and r["saving"] is not None for r in rounds),
        # a plan that keeps the top clock throughout issues none (the clock is already there)
        "sets issued by time (or a plan at the top clock alone)": bool(by_time)
        or _top_only(out, header),
        f"sets by time only in tuned/steady iterations (outside: {outside[:5]})": not outside,
        "the log ends with exactly one restore": records[-1]["kind"] == "restore"
        and sum(c["kind"] == "restore" for c in records) == 1,
    }
    for name, passed in checks.items():
        print(f"{'ok' if passed else 'FAILED'}: {name}")
    print(
        f"clocks: {header.get('freqs_mhz')}; iterations {len(rows)}: profiling "
        f"{result['profiling_iterations']}, planning {result['planning_iterations']}, "
        f"A/B rounds {len(rounds)}, error: {result['error']}"
    )
    for r in rounds:
        saving = r["saving"]["mean"] if r["saving"] else float("nan")
        print(
            f"  round at {r['budget']:.2%}: {r['stages']} stages, slowdown "
            f"{r['slowdown']['mean']:+.2%}, saving {saving:+.2%} over {r['pairs']} pairs"
        )
    return all(checks.values())


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: tune_dry_run_check.py OUT_DIR CALLS_LOG")
    sys.exit(0 if check(Path(sys.argv[1]), Path(sys.argv[2])) else 1)
