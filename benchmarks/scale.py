"""Scaling to a million operators: CPU seconds and peak memory of every stage, and start-up.

Synthetic workloads repeat the gpt3 workload's operators to 18k / 100k / 1M. Each stage runs in
its own Python process (``os.wait4`` gives that process's CPU time and peak RSS): profile at
three clocks on the simulated ascend-910b-like, fit both models, plan (2%), simulate the plan
for one iteration, import the profile's rows as a generic CSV and as a PyTorch Chrome trace
(one cpu_op and one kernel per operator). The growth exponent is the log-log slope of CPU time
(and of RSS) between neighbouring sizes. Then the start-up of every command (``--version``,
``--help`` and each command's ``--help``).

    .venv/bin/python benchmarks/scale.py [--sizes 18000,100000,1000000] [--no-startup]
        [--stages import-trace,...]

``--stages`` measures only the named stages (``-`` for a space); the earlier stages they read the
files of run first, unmeasured.

``--cli`` measures the command-line paths instead, each as its own ``opdvfs`` process, at 3 clocks
(median of ``--repeats`` runs): ``opdvfs profile`` of the tiled workload (a Parquet workload
file), ``opdvfs fit`` to a columnar ``models.npz``, ``opdvfs plan PROFILE``, and ``opdvfs import``
of the profile's rows as a generic CSV with the 4 required columns and with all 16::

    .venv/bin/python benchmarks/scale.py --cli [--sizes 100000,1000000] [--repeats 3]
        [--stages profile,fit,plan,import-4,import-16]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the parent process imports nothing of opdvfs: its own RSS stays small
    from opdvfs.workloads.workload import Workload

STAGES = ("profile", "fit", "plan", "simulate", "import csv", "import trace")
COMMANDS = (
    "import",
    "info",
    "formats",
    "schema",
    "demo",
    "evaluate",
    "report",
    "fit",
    "plan",
    "capture",
    "run",
    "profile",
    "simulate",
    "devices",
    "workloads",
)
_CLOCKS_MHZ = (1000.0, 1400.0, 1800.0)
# the earlier stages whose files a stage reads
_NEEDS = {
    "profile": (),
    "fit": ("profile",),
    "plan": ("profile", "fit"),
    "simulate": ("profile", "fit", "plan"),
    "import csv": ("profile",),
    "import trace": ("profile",),
}


def _workload(n_ops: int) -> Workload:
    """Return the gpt3 workload's operators repeated to ``n_ops``."""
    import pandas as pd

    from opdvfs.workloads import BUILDERS
    from opdvfs.workloads.workload import Workload

    ops = BUILDERS["gpt3"]().ops
    reps = -(-n_ops // len(ops))
    tiled = pd.concat([ops] * reps, ignore_index=True).iloc[:n_ops]
    return Workload(tiled, name=f"gpt3x{n_ops}")


def child(stage: str, n_ops: int, folder: Path) -> None:
    """Run one stage on the files of the earlier ones in ``folder`` (a child process)."""
    from opdvfs.sim import SimulatedDevice

    dev = SimulatedDevice.from_preset("ascend-910b-like")
    if stage == "profile":
        dev.profile(_workload(n_ops), list(_CLOCKS_MHZ)).write(folder / "profile.parquet")
    elif stage == "fit":
        from opdvfs.models.bundle import ModelBundle
        from opdvfs.models.perf import PerfModel
        from opdvfs.models.power import PowerModel
        from opdvfs.profile import Profile

        profile = Profile.read(folder / "profile.parquet")
        models = ModelBundle(
            PerfModel().fit(profile), PowerModel().fit(profile, device=dev.spec), device=dev.spec
        )
        (folder / "models.pkl").write_bytes(pickle.dumps(models))
    elif stage == "plan":
        from opdvfs.plan import PlanInputs, plan_schedule

        models = pickle.loads((folder / "models.pkl").read_bytes())
        inputs = PlanInputs.from_workload(_workload(n_ops), dev.spec.freqs_mhz, device="ascend")
        schedule = plan_schedule(models, inputs, target=0.02)
        (folder / "schedule.json").write_text(schedule.model_dump_json())
    elif stage == "simulate":
        from opdvfs.schedule import Schedule

        schedule = Schedule.model_validate_json((folder / "schedule.json").read_text())
        dev.run(_workload(n_ops), schedule, iterations=1)
    elif stage == "inputs":
        _inputs(folder)
    elif stage == "import csv":
        from opdvfs.io import read_profile

        read_profile(folder / "ops.csv", format="csv")
    elif stage == "import trace":
        from opdvfs.io import read_profile

        read_profile(folder / "trace.json", format="torch-trace", freqs_mhz=[1800.0])


def _inputs(folder: Path) -> None:
    """Write the import stages' files from the profile: a long CSV and a Chrome trace."""
    from opdvfs.profile import Profile

    rows = Profile.read(folder / "profile.parquet").ops
    rows[["op", "name", "freq_mhz", "time_us"]].to_csv(folder / "ops.csv", index=False)
    top = rows[(rows["freq_mhz"] == rows["freq_mhz"].max()) & (rows["iteration"] == 0)]
    events, ts = [], 0.0
    for i, (name, dur) in enumerate(zip(top["name"], top["time_us"], strict=True)):
        host = {"External id": i}
        events.append(dict(ph="X", cat="cpu_op", name=f"aten::{name}", pid=1, tid=1, ts=ts,
                           dur=dur + 2.0, args=host))  # fmt: skip
        events.append(dict(ph="X", cat="kernel", name=name, pid=0, tid=7, ts=ts + 1.0, dur=dur,
                           args={"External id": i, "stream": 7}))  # fmt: skip
        ts += dur + 3.0
    (folder / "trace.json").write_text(json.dumps({"traceEvents": events}))


CLI_STAGES = ("profile", "fit", "plan", "import 4", "import 16")
_CSV4 = ["op", "name", "freq_mhz", "time_us"]


def _cli_inputs(what: str, n_ops: int, folder: Path) -> None:
    """Write a CLI stage's input: the workload file, or a CSV of the profile's rows."""
    if what == "workload":
        _workload(n_ops).write(folder / "workload.parquet")
        return
    from opdvfs.profile import Profile

    rows = Profile.read(folder / "profile.parquet").ops
    columns = _CSV4 if what == "csv4" else list(rows.columns)
    rows[columns].to_csv(folder / f"{what}.csv", index=False)


def _cli_argv(stage: str, folder: Path) -> list[str]:
    """Return the ``opdvfs`` command line of one CLI stage, on the files in ``folder``."""
    opdvfs = [sys.executable, "-m", "opdvfs"]
    f = str(folder)
    clocks = ",".join(f"{c:g}" for c in _CLOCKS_MHZ)
    return {
        "profile": [*opdvfs, "profile", "-d", "ascend-910b-like", "-w", f"{f}/workload.parquet",
                    "--freqs", clocks, "-n", "1", "-o", f"{f}/profile.parquet"],
        "fit": [*opdvfs, "fit", f"{f}/profile.parquet", "-o", f"{f}/models.npz"],
        "plan": [*opdvfs, "plan", f"{f}/profile.parquet", "--target", "0.02",
                 "-o", f"{f}/schedule.json"],
        "import 4": [*opdvfs, "import", f"{f}/csv4.csv", "-f", "csv", "-o", f"{f}/i4.parquet"],
        "import 16": [*opdvfs, "import", f"{f}/csv16.csv", "-f", "csv", "-o", f"{f}/i16.parquet"],
    }[stage]  # fmt: skip


def cli_main(sizes: list[int], stages: list[str], repeats: int) -> None:
    """Measure each CLI stage ``repeats`` times per size; print medians and growth exponents."""
    cpu: dict[str, list[float]] = {s: [] for s in stages}
    rss: dict[str, list[float]] = {s: [] for s in stages}
    me = [sys.executable, __file__, "--child"]
    for n_ops in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            measure([*me, "cli-workload", str(n_ops), tmp])
            measure(_cli_argv("profile", folder))  # the profile the later stages read
            if any(s in stages for s in ("fit", "plan")):
                measure(_cli_argv("fit", folder))
            for what in ("csv4", "csv16"):
                if f"import {what[3:]}" in stages:
                    measure([*me, f"cli-{what}", str(n_ops), tmp])
            for stage in stages:
                runs = sorted(measure(_cli_argv(stage, folder)) for _ in range(repeats))
                seconds = sorted(r[0] for r in runs)[repeats // 2]
                mib = sorted(r[1] for r in runs)[repeats // 2]
                cpu[stage].append(seconds)
                rss[stage].append(mib)
                every = " ".join(f"{r[0]:.2f}" for r in runs)
                print(f"  {n_ops:>8d} ops  {stage:10s} {seconds:7.2f} s {mib:7.0f} MiB  ({every})",
                      flush=True)  # fmt: skip
    print(f"\nCLI, median of {repeats}: command, ops, CPU s, peak MiB, growth exponent (CPU; RSS)")
    for stage in stages:
        for i, n_ops in enumerate(sizes):
            growth = ""
            if i:
                g_cpu = slope(sizes[i - 1 : i + 1], cpu[stage][i - 1 : i + 1])[0]
                g_rss = slope(sizes[i - 1 : i + 1], rss[stage][i - 1 : i + 1])[0]
                growth = f"{g_cpu:.2f}; {g_rss:.2f}"
            print(f"  opdvfs {stage:10s} {n_ops:>9,d} {cpu[stage][i]:7.2f} {rss[stage][i]:7.0f}"
                  f"  {growth}")  # fmt: skip


def measure(argv: list[str]) -> tuple[float, float]:
    """CPU seconds (user + system) and peak RSS (MiB) of one child process."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        assert proc.stderr is not None
        raise RuntimeError(f"{argv}: {proc.stderr.read().decode()[-2000:]}")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def slope(x: list[float], y: list[float]) -> list[float]:
    """Log-log slope of ``y`` against ``x`` between neighbours (1: linear growth)."""
    return [math.log(y[i + 1] / y[i]) / math.log(x[i + 1] / x[i]) for i in range(len(x) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="18000,100000,1000000")
    parser.add_argument("--no-startup", action="store_true")
    parser.add_argument("--stages", default=",".join(STAGES), help="e.g. import-trace,fit")
    parser.add_argument("--cli", action="store_true", help="measure the opdvfs commands")
    parser.add_argument("--repeats", type=int, default=3, help="runs per CLI stage (median)")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.child[0].startswith("cli-"):
            _cli_inputs(args.child[0][4:], int(args.child[1]), Path(args.child[2]))
        else:
            child(args.child[0], int(args.child[1]), Path(args.child[2]))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.cli:
        names = [s.strip().replace("-", " ") for s in args.stages.split(",") if s.strip()]
        names = list(CLI_STAGES) if args.stages == ",".join(STAGES) else names
        if unknown := sorted(set(names) - set(CLI_STAGES)):
            parser.error(f"unknown CLI stage(s) {unknown}; choose from {', '.join(CLI_STAGES)}")
        cli_main(sizes, [s for s in CLI_STAGES if s in names], args.repeats)
        return
    chosen = [s.strip().replace("-", " ") for s in args.stages.split(",") if s.strip()]
    if unknown := sorted(set(chosen) - set(STAGES)):
        parser.error(f"unknown stage(s) {unknown}; choose from {', '.join(STAGES)}")
    measured = [s for s in STAGES if s in chosen]
    run = [s for s in STAGES if s in measured or any(s in _NEEDS[m] for m in measured)]
    cpu: dict[str, list[float]] = {s: [] for s in measured}
    rss: dict[str, list[float]] = {s: [] for s in measured}
    for n_ops in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            inputs_written = False
            for stage in run:
                if stage.startswith("import") and not inputs_written:
                    # in a child too: a fork inherits its parent's peak RSS, so the parent stays
                    # small for every measurement
                    measure([sys.executable, __file__, "--child", "inputs", str(n_ops), tmp])
                    inputs_written = True
                argv = [sys.executable, __file__, "--child", stage, str(n_ops), tmp]
                seconds, mib = measure(argv)
                if stage not in measured:
                    continue
                cpu[stage].append(seconds)
                rss[stage].append(mib)
                print(f"  {n_ops:>8d} ops  {stage:13s} {seconds:7.2f} s {mib:7.0f} MiB", flush=True)
    header = "".join(f"{n:>17,d}" for n in sizes)
    print(f"\nCPU s / peak RSS MiB per stage (3 clocks){header}   growth (CPU; RSS)")
    for stage in measured:
        cells = "".join(
            f"{c:8.2f} s {m:5.0f} M" for c, m in zip(cpu[stage], rss[stage], strict=True)
        )
        growth = ", ".join(f"{g:.2f}" for g in slope(sizes, cpu[stage])) if len(sizes) > 1 else ""
        growth_rss = ", ".join(f"{g:.2f}" for g in slope(sizes, rss[stage]))
        print(f"{stage:42s}{cells}   {growth}; {growth_rss}")
    if args.no_startup:
        return
    opdvfs = [sys.executable, "-m", "opdvfs"]
    print("\nstart-up: CPU s, peak RSS MiB")
    base = measure([sys.executable, "-c", "pass"])
    print(f"  {'python -c pass':28s} {base[0]:5.2f} s {base[1]:5.0f} MiB")
    for extra in (["--version"], ["--help"], *[[c, "--help"] for c in COMMANDS]):
        seconds, mib = measure(opdvfs + extra)
        print(f"  {'opdvfs ' + ' '.join(extra):28s} {seconds:5.2f} s {mib:5.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
