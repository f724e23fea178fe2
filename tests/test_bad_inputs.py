"""Every command x every kind of bad input meets the CLI contract (DESIGN §6, issue #14 item 8).

A bad input exits with status 2 and prints exactly one line, ``opdvfs: error: ...``, on stderr:
never a traceback, never a new or clobbered output file. Each case names its command, the kind
of bad input and the arguments; ``{in}`` is a folder of inputs built once (tiny simulated
profiles, a schedule, a MODELS file, workloads, broken files), ``{out}`` the test's own folder,
which already holds ``keep.parquet``, ``keep.json`` and ``keep.txt`` (outputs that must keep
their bytes) and an empty folder ``adir``. The commands run in-process through typer's runner;
a few run as ``python -m opdvfs`` to cover the real entry point.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

import opdvfs
from opdvfs.cli import app

runner = CliRunner()


@dataclass(frozen=True)
class Case:
    """One bad invocation: ``command``, the ``kind`` of bad input, and its arguments."""

    command: str
    kind: str
    args: str

    def argv(self, inputs: Path, out: Path) -> list[str]:
        # split before formatting, so folders with spaces stay one argument
        return [word.format(**{"in": inputs, "out": out}) for word in self.args.split()]

    @property
    def id(self) -> str:
        return f"{self.command}: {self.kind}"


SIM = "--device ascend-910b-like --workload vgg19"

CASES = [
    # ------------------------------------------------------------------ import
    Case("import", "missing file", "import {in}/nope.csv --out {out}/p.parquet"),
    Case("import", "directory as input", "import {in}/adir --out {out}/p.parquet"),
    Case("import", "empty file", "import {in}/empty.csv --out {out}/p.parquet"),
    Case("import", "garbage Parquet", "import {in}/garbage.parquet --out {out}/p.parquet"),
    Case("import", "truncated Parquet", "import {in}/trunc.parquet --out {out}/p.parquet"),
    Case("import", "truncated trace JSON", "import {in}/trunc.json --out {out}/p.parquet"),
    Case("import", "binary CSV", "import {in}/binary.csv --out {out}/p.parquet"),
    Case("import", "CSV missing time_us", "import {in}/notime.csv --out {out}/p.parquet"),
    Case("import", "CSV negative time", "import {in}/negative.csv --out {out}/p.parquet"),
    Case("import", "schedule as profile", "import {in}/s.json --out {out}/p.parquet"),
    Case("import", "output is a directory", "import {in}/p.parquet --out {out}/adir"),
    Case("import", "existing output kept", "import {in}/notime.csv --out {out}/keep.parquet"),
    Case("import", "unknown format", "import {in}/p.parquet --format bogus --out {out}/p.parquet"),
    Case("import", "clock list abc", "import {in}/ok.csv --freq-mhz abc --out {out}/p.parquet"),
    Case(
        "import", "clock list 1000,,", "import {in}/ok.csv --freq-mhz 1000,, --out {out}/p.parquet"
    ),
    Case("import", "negative clock", "import {in}/ok.csv --freq-mhz -5 --out {out}/p.parquet"),
    Case("import", "NaN clock", "import {in}/ok.csv --freq-mhz nan --out {out}/p.parquet"),
    Case("import", "missing --out", "import {in}/ok.csv"),
    Case("import", "no input files", "import --out {out}/p.parquet"),
    Case("import", "unknown option", "import {in}/ok.csv --out {out}/p.parquet --bogus"),
    # ------------------------------------------------------------------ info
    Case("info", "missing file", "info {in}/nope.parquet"),
    Case("info", "directory as input", "info {in}/adir"),
    Case("info", "empty file", "info {in}/empty.csv"),
    Case("info", "empty JSON", "info {in}/empty.json"),
    Case("info", "empty Parquet", "info {in}/empty.parquet"),
    Case("info", "truncated JSON", "info {in}/trunc.json"),
    Case("info", "truncated Parquet", "info {in}/trunc.parquet"),
    Case("info", "schedule as profile", "info {in}/s.json"),
    Case("info", "MODELS as profile", "info {in}/m.json"),
    Case("info", "workload JSON as profile", "info {in}/w.json"),
    Case("info", "workload Parquet as profile", "info {in}/w.parquet"),
    Case("info", "results.json as profile", "info {in}/report-bad/results.json"),
    Case("info", "CSV missing time_us", "info {in}/notime.csv"),
    Case("info", "clock list abc", "info {in}/ok.csv --freq-mhz abc"),
    Case("info", "extra argument", "info {in}/p.parquet {in}/p.parquet"),
    # ------------------------------------------------------------------ formats, schema
    Case("formats", "extra argument", "formats extra"),
    Case("formats", "unknown option", "formats --bogus"),
    Case("schema", "unknown choice", "schema bogus"),
    Case("schema", "missing argument", "schema"),
    Case("schema", "extra argument", "schema schedule profile"),
    # ------------------------------------------------------------------ demo, evaluate, report
    Case("demo", "existing output file", "demo --workload vgg19 --out {out}/keep.txt"),
    Case("demo", "output under a file", "demo --workload vgg19 --out {out}/keep.txt/sub"),
    Case("demo", "negative target", "demo --target -0.02 --out {out}/d"),
    Case("demo", "NaN target", "demo --target nan --out {out}/d"),
    Case("demo", "negative seed", "demo --seed -1 --out {out}/d"),
    Case("demo", "unknown workload", "demo --workload nope --out {out}/d"),
    Case("demo", "unknown device", "demo --device nope --out {out}/d"),
    Case("demo", "unknown choice", "demo --objective bogus --out {out}/d"),
    Case("demo", "unknown option", "demo --bogus --out {out}/d"),
    Case("evaluate", "existing output file", "evaluate --out {out}/keep.txt"),
    Case("evaluate", "unknown device", "evaluate --device nope --out {out}/e"),
    Case("evaluate", "unknown choice", "evaluate --suite other --out {out}/e"),
    Case("evaluate", "unknown objective", "evaluate --objective bogus --out {out}/e"),
    Case("evaluate", "missing --out", "evaluate"),
    Case("report", "missing folder", "report {in}/nope"),
    Case("report", "file as folder", "report {in}/s.json"),
    Case("report", "folder without results.json", "report {in}/adir"),
    Case("report", "empty results.json", "report {in}/report-empty"),
    Case("report", "truncated results.json", "report {in}/report-trunc"),
    Case("report", "malformed results.json field", "report {in}/report-bad"),
    Case("report", "schedule as results.json", "report {in}/report-schedule"),
    # ------------------------------------------------------------------ fit
    Case("fit", "missing file", "fit {in}/nope.parquet --out {out}/m.json"),
    Case("fit", "directory as input", "fit {in}/adir --out {out}/m.json"),
    Case("fit", "empty file", "fit {in}/empty.parquet --out {out}/m.json"),
    Case("fit", "truncated Parquet", "fit {in}/trunc.parquet --out {out}/m.json"),
    Case("fit", "schedule as profile", "fit {in}/s.json --out {out}/m.json"),
    Case("fit", "output is a directory", "fit {in}/p.parquet --out {out}/adir"),
    Case("fit", "existing output kept", "fit {in}/trunc.parquet --out {out}/keep.json"),
    Case("fit", "clock list abc", "fit {in}/p.parquet --train-freqs abc --out {out}/m.json"),
    Case("fit", "clock list 1000,,", "fit {in}/p.parquet --train-freqs 1000,, --out {out}/m.json"),
    Case("fit", "unknown form", "fit {in}/p.parquet --form bogus --out {out}/m.json"),
    Case("fit", "unknown power form", "fit {in}/p.parquet --dynamic bogus --out {out}/m.json"),
    Case("fit", "missing --out", "fit {in}/p.parquet"),
    Case("fit", "coarse sensor", "fit {in}/a100.parquet --out {out}/m.json"),
    Case("fit", "all-zero times", "fit {in}/zeros.parquet --out {out}/m.json"),
    Case("fit", "op missing at a clock", "fit {in}/holes.parquet --out {out}/m.json"),
    Case(
        "fit",
        "duplicate clocks",
        "fit {in}/p.parquet --train-freqs 1000,1000 --out {out}/m.json",
    ),
    # ------------------------------------------------------------------ plan
    Case("plan", "missing file", "plan {in}/nope.parquet --target 0.02 --out {out}/s.json"),
    Case("plan", "directory as input", "plan {in}/adir --target 0.02 --out {out}/s.json"),
    Case("plan", "empty MODELS file", "plan {in}/empty.json --target 0.02 --out {out}/s.json"),
    Case("plan", "truncated MODELS", "plan {in}/trunc.json --target 0.02 --out {out}/s.json"),
    Case("plan", "truncated Parquet", "plan {in}/trunc.parquet --target 0.02 --out {out}/s.json"),
    Case("plan", "schedule as MODELS", "plan {in}/s.json --target 0.02 --out {out}/s.json"),
    Case("plan", "workload as profile", "plan {in}/w.parquet --target 0.02 --out {out}/s.json"),
    Case(
        "plan",
        "MODELS arrays disagree",
        "plan {in}/m-short.json --device ascend-910b-like --target 0.02 --out {out}/s.json",
    ),
    Case("plan", "negative target", "plan {in}/p.parquet --target -1 --out {out}/s.json"),
    Case("plan", "NaN target", "plan {in}/p.parquet --target nan --out {out}/s.json"),
    Case("plan", "missing --target", "plan {in}/p.parquet --out {out}/s.json"),
    Case(
        "plan", "unknown solver", "plan {in}/p.parquet --target 0.02 --solver x --out {out}/s.json"
    ),
    Case(
        "plan",
        "unknown dispatch",
        "plan {in}/p.parquet --target 0.02 --dispatch x --out {out}/s.json",
    ),
    Case(
        "plan",
        "NaN interval",
        "plan {in}/p.parquet --target 0.02 --interval-ms nan --out {out}/s.json",
    ),
    Case(
        "plan",
        "negative switch latency",
        "plan {in}/p.parquet --target 0.02 --switch-latency-ms -1 --out {out}/s.json",
    ),
    Case(
        "plan",
        "budget scale above 1",
        "plan {in}/p.parquet --target 0.02 --budget-scale 2 --out {out}/s.json",
    ),
    Case(
        "plan",
        "unknown device",
        "plan {in}/p.parquet --target 0.02 --device nope --out {out}/s.json",
    ),
    Case(
        "plan",
        "unknown workload",
        "plan {in}/p.parquet --target 0.02 --workload nope --out {out}/s.json",
    ),
    Case(
        "plan",
        "clock list abc",
        "plan {in}/p.parquet --target 0.02 --train-freqs abc --out {out}/s.json",
    ),
    Case("plan", "output is a directory", "plan {in}/p.parquet --target 0.02 --out {out}/adir"),
    Case(
        "plan", "existing output kept", "plan {in}/trunc.json --target 0.02 --out {out}/keep.json"
    ),
    Case(
        "plan",
        "frontier is a directory",
        "plan {in}/p.parquet --target 0.02 --out {out}/s.json --frontier {out}/adir",
    ),
    Case(
        "plan",
        "device mismatch (extrapolation)",
        "plan {in}/p.parquet --target 0.02 --device a100-like --out {out}/s.json",
    ),
    Case("plan", "coarse sensor", "plan {in}/a100.parquet --target 0.05 --out {out}/s.json"),
    Case(
        "plan",
        "all-zero times",
        "plan {in}/zeros.parquet --target 0.02 --out {out}/s.json",
    ),
    Case(
        "plan",
        "all-zero measured times (every clock measured: no model fitted)",
        "plan {in}/zeros-measured.parquet --target 0.02 --out {out}/s.json",
    ),
    # ------------------------------------------------------------------ validate perf / power
    Case(
        "validate perf", "missing file", "validate perf {in}/nope.parquet --train-freqs 1000,1800"
    ),
    Case(
        "validate perf", "truncated Parquet", "validate perf {in}/trunc.parquet --train-freqs 1000"
    ),
    Case("validate perf", "schedule as profile", "validate perf {in}/s.json --train-freqs 1000"),
    Case("validate perf", "clock list abc", "validate perf {in}/p.parquet --train-freqs abc"),
    Case("validate perf", "clock list 1000,,", "validate perf {in}/p.parquet --train-freqs 1000,,"),
    Case(
        "validate perf",
        "NaN option",
        "validate perf {in}/p.parquet --train-freqs 1000,1800 --min-us nan",
    ),
    Case(
        "validate perf", "unknown form", "validate perf {in}/p.parquet --train-freqs 1000 --form x"
    ),
    Case("validate perf", "missing --train-freqs", "validate perf {in}/p.parquet"),
    Case("validate", "unknown subcommand", "validate bogus {in}/p.parquet"),
    Case("validate power", "missing file", "validate power {in}/nope.parquet --train-freqs 1000"),
    Case("validate power", "clock list abc", "validate power {in}/p.parquet --train-freqs abc"),
    Case(
        "validate power",
        "unknown device",
        "validate power {in}/p.parquet --train-freqs 1000,1800 --device nope",
    ),
    Case(
        "validate power",
        "calibrate without device",
        "validate power {in}/p.parquet --train-freqs 1000,1800 --calibrate",
    ),
    Case(
        "validate power",
        "negative window",
        "validate power {in}/p.parquet --train-freqs 1000,1800 --window-ms -5",
    ),
    Case(
        "validate power",
        "coarse sensor",
        "validate power {in}/a100.parquet --train-freqs min,max",
    ),
    Case(
        "validate power",
        "throughput form without an idle floor",
        "validate power {in}/p.parquet --train-freqs 1000,1800 --dynamic throughput",
    ),
    Case(
        "validate power",
        "schedule as --device",
        "validate power {in}/p.parquet --train-freqs 1000,1800 --device {in}/s.json",
    ),
    Case(
        "validate perf", "step past the lowest", "validate perf {in}/p.parquet --train-freqs top-3"
    ),
    Case(
        "fit",
        "throughput form without an idle floor",
        "fit {in}/p.parquet --train-freqs 1000,1800 --dynamic throughput --out {out}/m.json",
    ),
    # ------------------------------------------------------------------ characterise
    Case("characterise", "missing file", "characterise {in}/nope.parquet --out {out}/d.json"),
    Case("characterise", "output is a directory", "characterise {in}/p.parquet --out {out}/adir"),
    Case(
        "characterise",
        "existing output kept",
        "characterise {in}/trunc.parquet --out {out}/keep.json",
    ),
    Case(
        "characterise",
        "negative switch latency",
        "characterise {in}/p.parquet --switch-latency-ms -1 --out {out}/d.json",
    ),
    Case(
        "characterise",
        "clock list abc",
        "characterise {in}/p.parquet --clocks abc --out {out}/d.json",
    ),
    Case(
        "characterise",
        "GPU index without NVML",
        "characterise {in}/p.parquet --gpu-index 1 --out {out}/d.json",
    ),
    # ------------------------------------------------------------------ device
    Case("device", "clock list abc", "device --clocks abc --name g --out {out}/d.json"),
    Case("device", "clock list 1000,,", "device --clocks 1000,, --name g --out {out}/d.json"),
    Case("device", "negative clock", "device --clocks -5 --name g --out {out}/d.json"),
    Case("device", "reversed range", "device --clocks 1410:210:15 --name g --out {out}/d.json"),
    Case("device", "zero step", "device --clocks 210:1410:0 --name g --out {out}/d.json"),
    Case("device", "too many clocks", "device --clocks 1:99999:0.001 --name g --out {out}/d.json"),
    Case("device", "list without a name", "device --clocks 210:1410:15 --out {out}/d.json"),
    Case(
        "device",
        "GPU index with a list",
        "device --clocks 210:1410:15 --name g --gpu-index 1 --out {out}/d.json",
    ),
    Case(
        "device",
        "negative switch latency",
        "device --clocks 1000 --name g --switch-latency-ms -1 --out {out}/d.json",
    ),
    Case("device", "output is a directory", "device --clocks 1000 --name g --out {out}/adir"),
    Case("device", "existing output kept", "device --clocks abc --name g --out {out}/keep.json"),
    Case("device", "missing --out", "device --clocks 1000 --name g"),
    Case("device", "unknown option", "device --clocks 1000 --name g --out {out}/d.json --bogus"),
    # ------------------------------------------------------------------ profile
    Case(
        "profile",
        "unknown device",
        "profile --device nope --workload vgg19 --freqs 1000 --out {out}/p.parquet",
    ),
    Case(
        "profile",
        "unknown workload",
        "profile --device ascend-910b-like --workload nope --freqs 1000 --out {out}/p.parquet",
    ),
    Case(
        "profile", "workload file missing", f"profile {SIM}x --freqs 1000 --out {{out}}/p.parquet"
    ),
    Case(
        "profile",
        "schedule as workload",
        "profile -d ascend-910b-like --workload {in}/s.json --freqs 1000 --out {out}/p.parquet",
    ),
    Case(
        "profile",
        "truncated workload",
        "profile -d ascend-910b-like -w {in}/trunc.json --freqs 1000 --out {out}/p.parquet",
    ),
    Case("profile", "clock list abc", f"profile {SIM} --freqs abc --out {{out}}/p.parquet"),
    Case("profile", "clock list 1000,,", f"profile {SIM} --freqs 1000,, --out {{out}}/p.parquet"),
    Case("profile", "zero clock", f"profile {SIM} --freqs 0 --out {{out}}/p.parquet"),
    Case("profile", "unsupported clock", f"profile {SIM} --freqs 5000 --out {{out}}/p.parquet"),
    Case("profile", "zero iterations", f"profile {SIM} --freqs 1000 -n 0 --out {{out}}/p.parquet"),
    Case(
        "profile", "negative seed", f"profile {SIM} --freqs 1000 --seed -1 --out {{out}}/p.parquet"
    ),
    Case("profile", "output is a directory", f"profile {SIM} --freqs 1000 --out {{out}}/adir"),
    Case("profile", "bad --freqs word", f"profile {SIM} --freqs fast --out {{out}}/p.parquet"),
    # ------------------------------------------------------------------ simulate
    Case("simulate", "missing schedule", f"simulate {SIM} {{in}}/nope.json"),
    Case("simulate", "directory as schedule", f"simulate {SIM} {{in}}/adir"),
    Case("simulate", "empty schedule", f"simulate {SIM} {{in}}/empty.json"),
    Case("simulate", "truncated schedule", f"simulate {SIM} {{in}}/trunc.json"),
    Case("simulate", "MODELS as schedule", f"simulate {SIM} {{in}}/m.json"),
    Case("simulate", "profile as schedule", f"simulate {SIM} {{in}}/p.parquet"),
    Case(
        "simulate",
        "schedule for another workload",
        "simulate --device ascend-910b-like --workload bert {in}/s.json",
    ),
    Case(
        "simulate",
        "schedule for another device",
        "simulate --device a100-like --workload vgg19 {in}/s.json",
    ),
    Case("simulate", "unknown device", "simulate --device nope --workload vgg19"),
    Case("simulate", "unknown workload", "simulate --device ascend-910b-like --workload nope"),
    Case("simulate", "clock abc", f"simulate {SIM} --freq-mhz abc"),
    Case("simulate", "schedule and clock", f"simulate {SIM} {{in}}/s.json --freq-mhz 1000"),
    Case("simulate", "zero iterations", f"simulate {SIM} -n 0"),
    Case("simulate", "output is a directory", f"simulate {SIM} --freq-mhz max --out {{out}}/adir"),
    # ------------------------------------------------------------------ devices, workloads
    Case("devices", "extra argument", "devices extra"),
    Case("devices", "unknown option", "devices --bogus"),
    Case("workloads", "extra argument", "workloads extra"),
    Case("workloads", "unknown option", "workloads --bogus"),
    # ------------------------------------------------------------------ capture, run
    Case("capture", "no program", "capture --out {out}/w.json"),
    Case("capture", "missing script", "capture --out {out}/w.json -- python {in}/nope.py"),
    Case("capture", "zero clock", "capture --freq-mhz 0 --out {out}/w.json -- python {in}/noop.py"),
    Case("capture", "missing --out", "capture -- python {in}/noop.py"),
    Case("run", "missing schedule", "run {in}/nope.json -- python {in}/noop.py"),
    Case("run", "truncated schedule", "run {in}/trunc.json -- python {in}/noop.py"),
    Case("run", "MODELS as schedule", "run {in}/m.json -- python {in}/noop.py"),
    Case("run", "unknown actuator", "run {in}/s.json --actuator bogus -- python {in}/noop.py"),
    Case("run", "no program", "run {in}/s.json"),
    Case("run", "missing script", "run {in}/s.json -- python {in}/nope.py"),
    Case(
        "run",
        "unsupported clock for the device",
        "run {in}/s.json --device a100-like -- python {in}/noop.py",
    ),
    Case(
        "run",
        "schedule for another workload",
        "run {in}/s.json --workload bert -- python {in}/noop.py",
    ),
    Case("tune", "no program", "tune --target 0.02 --out {out}/t"),
    Case("tune", "zero target", "tune --target 0 --out {out}/t -- python {in}/noop.py"),
    Case("tune", "negative target", "tune --target -0.1 --out {out}/t -- python {in}/noop.py"),
    Case("tune", "not python", "tune --target 0.02 --out {out}/t -- ls"),
    Case("tune", "target above 1", "tune --target 2 --out {out}/t -- python {in}/noop.py"),
    Case(
        "tune",
        "pairs unbounded",
        "tune --target 0.02 --actuator sim:a100-like --pairs 10000000 --out {out}/t -- python "
        "{in}/noop.py",
    ),
    Case("restore", "actuator without a clock", "restore --gpu 0 --actuator dry-run"),
    Case("doctor", "unknown option", "doctor --bogus"),
    Case("doctor", "extra argument", "doctor gpu0"),
    Case("tune", "out is a file", "tune --target 0.02 --out {out}/keep.txt -- python {in}/noop.py"),
    Case(
        "tune",
        "unknown actuator",
        "tune --target 0.02 --actuator bogus --out {out}/t -- python {in}/noop.py",
    ),
    Case(
        "tune",
        "actuator that cannot measure",
        "tune --target 0.02 --actuator twin --out {out}/t -- python {in}/noop.py",
    ),
    Case(
        "tune",
        "unknown clock list",
        "tune --target 0.02 --clocks fast --actuator sim:a100-like --out {out}/t -- python "
        "{in}/noop.py",
    ),
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build every input once: valid files to misuse and broken ones."""
    root = tmp_path_factory.mktemp("inputs")
    work = opdvfs.load_workload("vgg19")
    work.write(root / "w.json")
    work.write(root / "w.parquet")
    device = opdvfs.SimulatedDevice.from_preset("ascend-910b-like")
    profile = device.profile(work, [1000, 1400, 1800])
    profile.write(root / "p.parquet")
    # a GPU-like sensor averages 100 ms windows: one iteration per clock is too short
    gpu = opdvfs.SimulatedDevice.from_preset("a100-like")
    gpu.profile(work, [210, 810, 1410]).write(root / "a100.parquet")
    ops = profile.ops
    opdvfs.Profile(ops.assign(time_us=0.0), meta=profile.meta).write(root / "zeros.parquet")
    every = device.profile(work, device.spec.freqs_mhz).ops
    opdvfs.Profile(every.assign(time_us=0.0), meta=profile.meta).write(
        root / "zeros-measured.parquet"
    )
    hole = ops.index[(ops["freq_mhz"] == 1400) & (ops["op"] == 5)]
    opdvfs.Profile(ops.drop(index=hole), meta=profile.meta).write(root / "holes.parquet")
    models = opdvfs.ModelBundle(
        opdvfs.PerfModel().fit(profile),
        opdvfs.PowerModel().fit(profile, device=device.spec),
    )
    models.write(root / "m.json")
    short = (root / "m.json").read_text().replace('"op_ids": [0, 1, 2, ', '"op_ids": [', 1)
    (root / "m-short.json").write_text(short)
    inputs_ = opdvfs.PlanInputs.from_workload(work, device.spec.freqs_mhz, device=device.spec.name)
    opdvfs.plan_schedule(models, inputs_, target=0.02).write(root / "s.json")

    (root / "adir").mkdir()
    (root / "empty.csv").write_bytes(b"")
    (root / "empty.json").write_bytes(b"")
    (root / "empty.parquet").write_bytes(b"")
    (root / "garbage.parquet").write_bytes(bytes(range(256)) * 4)
    (root / "trunc.parquet").write_bytes((root / "p.parquet").read_bytes()[:500])
    (root / "trunc.json").write_text('{"format": "opdvfs.schedule", "stages": [')
    (root / "binary.csv").write_bytes(b"\xff\xfe\x00\x01op,name\n")
    (root / "ok.csv").write_text("op,name,time_us\n0,a,5\n")
    (root / "notime.csv").write_text("op,name,freq_mhz\n0,a,1000\n")
    (root / "negative.csv").write_text("op,name,freq_mhz,time_us\n0,a,1000,-1.5\n")
    (root / "noop.py").write_text("pass\n")
    for name, text in {
        "report-empty": "",
        "report-trunc": '{"suite": "demo", "sections": {',
        "report-bad": '{"suite": "demo", "device": "x", "objective": "energy", '
        '"sections": {"plan": [{"label": 3}]}, "goals": []}',
        "report-schedule": (root / "s.json").read_text(),
    }.items():
        (root / name).mkdir()
        (root / name / "results.json").write_text(text)
    return root


def snapshot(*folders: Path) -> dict[Path, bytes | None]:
    """Every file's bytes (None for a folder) under ``folders``, hidden temp files included."""
    return {
        path: None if path.is_dir() else path.read_bytes()
        for folder in folders
        for path in folder.rglob("*")
    }


def assert_contract(code: int, stderr: str, output: str) -> None:
    """Exit 2, exactly one non-empty stderr line ``opdvfs: error: ...``, no traceback."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2, f"exit {code}: {output}"
    assert len(lines) == 1, f"expected one stderr line, got {len(lines)}:\n{stderr}"
    assert lines[0].startswith("opdvfs: error: "), lines[0]
    assert len(lines[0]) > len("opdvfs: error: ") + 10, lines[0]
    assert "Traceback" not in output and "Traceback" not in stderr
    assert "np.float64(" not in lines[0] and "np.int64(" not in lines[0]


def _params() -> list:
    return [pytest.param(case, id=case.id) for case in CASES]


@pytest.fixture
def out(tmp_path: Path, inputs: Path) -> Path:
    """The test's output folder, with outputs that a failed command must leave as they are."""
    (tmp_path / "adir").mkdir()
    (tmp_path / "keep.parquet").write_bytes((inputs / "p.parquet").read_bytes())
    (tmp_path / "keep.json").write_bytes((inputs / "s.json").read_bytes())
    (tmp_path / "keep.txt").write_text("keep me\n")
    return tmp_path


@pytest.mark.parametrize("case", _params())
def test_bad_input(case: Case, inputs: Path, out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(out)  # a default output path would land here, and be caught
    before = snapshot(inputs, out)
    res = runner.invoke(app, case.argv(inputs, out))
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        pytest.fail(f"{type(res.exception).__name__}: {res.exception}")
    assert_contract(res.exit_code, res.stderr, res.output)
    assert snapshot(inputs, out) == before, "an output was written, removed or changed"


def test_table_covers_every_command() -> None:
    """Each command has cases, and each kind of bad input appears for several commands."""
    from typer.main import get_command

    group = get_command(app)
    commands = {
        f"{name} {sub}" if hasattr(cmd, "commands") else name
        for name, cmd in group.commands.items()  # type: ignore[attr-defined]
        for sub in (getattr(cmd, "commands", None) or [""])
    }
    assert commands <= {case.command for case in CASES}
    assert len(CASES) >= 150


@pytest.mark.parametrize(
    "args",
    [
        ["plan", "{in}/p.parquet", "--target", "-1", "--out", "{out}/s.json"],
        ["info", "{in}/s.json"],
    ],
    ids=["typer usage error", "opdvfs error"],
)
def test_entry_point(args: list[str], inputs: Path, out: Path) -> None:
    """``python -m opdvfs`` (what the console script runs) keeps the contract too."""
    argv = [a.format(**{"in": inputs, "out": out}) for a in args]
    before = snapshot(inputs, out)
    env = {**os.environ, "COLUMNS": "80"}
    proc = subprocess.run(
        [sys.executable, "-m", "opdvfs", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert_contract(proc.returncode, proc.stderr, proc.stdout)
    assert snapshot(inputs, out) == before


def test_help_is_unchanged() -> None:
    """Help still prints typer's help (exit 0), and a bare group still shows its help."""
    res = runner.invoke(app, ["plan", "--help"])
    assert res.exit_code == 0
    assert "--target" in res.stdout and "Usage" in res.stdout
    assert "opdvfs: error" not in res.output
    res = runner.invoke(app, ["validate"])
    assert "Usage" in res.output and "perf" in res.output
    assert "opdvfs: error" not in res.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ("plan {in}/s.json --target 0.02 --out {out}/x.json", "an opdvfs schedule, not a MODELS"),
        ("simulate {in}/m.json -d ascend-910b-like -w vgg19", "an opdvfs MODELS file from opdvfs"),
        ("fit {in}/s.json --out {out}/x.json", "an opdvfs schedule, not a profile"),
        ("simulate {in}/w.json -d ascend-910b-like -w vgg19", "an opdvfs workload, not a sched"),
    ],
)
def test_another_opdvfs_file_is_named_with_the_command_that_takes_it(args, says, inputs, out):
    res = runner.invoke(app, [w.format(**{"in": inputs, "out": out}) for w in args.split()])
    assert res.exit_code == 2 and says in res.stderr, res.output
