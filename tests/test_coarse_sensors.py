"""Coarse power sensors and degenerate model inputs, through the CLI (issue #14).

A GPU-like preset reads power only from 100 ms-1 s sensor windows: ``opdvfs profile`` picks
enough iterations for them by default, a profile too short for its sensor is refused with the
iterations it needs, and every degenerate input to the models is one error line and exit 2,
with no output file left behind.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from opdvfs import Profile
from opdvfs.cli import app
from opdvfs.exceptions import ValidationError
from opdvfs.experiments.bench import prepare
from opdvfs.models import ModelBundle
from opdvfs.models.attribution import MIN_WINDOWS, SENSOR_WINDOWS, sensor_iterations
from opdvfs.sim import PRESETS, SimulatedDevice
from opdvfs.workloads.workload import Workload
from user_workload import write_mini_workload

runner = CliRunner()
GPU_PRESETS = [name for name in PRESETS if PRESETS[name].spec.power_sample_period_ms > 1.0]


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def one_error_line(res) -> str:
    """The one stderr line of a refused command (exit 2, no traceback)."""
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("opdvfs: error: "), res.stderr
    assert "Traceback" not in res.output
    return lines[0]


@pytest.fixture(scope="module")
def mini(tmp_path_factory) -> Path:
    """A user's own small workload file: 24 ops, ~0.04-0.26 s per iteration at the top clock."""
    return write_mini_workload(tmp_path_factory.mktemp("work") / "w.json")


# ------------------------------------------------------------------ the rule
def test_the_rule_spans_the_sensor_windows():
    # a100-like: 100 ms windows every 100 ms; 40 complete windows take 4.0 s
    assert sensor_iterations(0.01762, period_ms=100, window_ms=100) == math.ceil(4.0 / 0.01762)
    # h100-like: 1 s windows read every 100 ms: 1 s + 39 x 100 ms
    assert sensor_iterations(0.1, period_ms=100, window_ms=1000) == 49
    # a long iteration needs one; Ascend-like 1 ms windows need 40 ms
    assert sensor_iterations(13.4, period_ms=100, window_ms=100) == 1
    assert sensor_iterations(0.0194, period_ms=1, window_ms=1) == 3
    with pytest.raises(ValidationError, match="positive number of seconds"):
        sensor_iterations(0.0, period_ms=100, window_ms=100)


def test_bench_prepare_profiles_by_the_same_rule(mini):
    bench = prepare(Workload.read(mini), "a100-like", iterations=1)
    expected = sensor_iterations(bench.baseline.iteration_time_s, **bench.device.sensor_ms)
    assert bench.profile.n_iterations == expected > 1
    assert bench.models.device == bench.device.spec


# ------------------------------------------------------------------ the user's flow
@pytest.mark.parametrize("device", list(PRESETS))
def test_profile_fit_validate_with_default_flags_on_every_preset(device, mini, tmp_path):
    profile, models = tmp_path / "p.parquet", tmp_path / "m.json"
    res = invoke(
        "profile", "--device", device, "--workload", mini, "--freqs", "min,mid,max",
        "--out", profile,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    sim = SimulatedDevice.from_preset(device)
    top = sim.spec.max_freq_mhz
    expected = sensor_iterations(
        sim.run(Workload.read(mini), freq_mhz=top)[0].iteration_time_s, **sim.sensor_ms
    )
    # says how many iterations and why
    assert f"profiled {expected} iteration(s) per clock" in res.stderr
    assert f"the attribution needs {SENSOR_WINDOWS}" in res.stderr
    windows = int(re.search(r"give (\d+) complete windows", res.stderr).group(1))
    assert windows >= SENSOR_WINDOWS
    assert Profile.read(profile).n_iterations == expected
    res = invoke("fit", profile, "--out", models)
    assert res.exit_code == 0, res.output
    bundle = ModelBundle.read(models)
    assert bundle.power is not None and bundle.device == sim.spec
    assert np.isfinite(bundle.power.alpha_).all() and np.isfinite(bundle.perf.coef_).all()
    res = invoke("validate", "power", profile, "--train-freqs", "min,max", "--json")
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert payload["n_points"] == 24 and np.isfinite(payload["mape_pct"])


@pytest.fixture(scope="module")
def one_iteration(mini, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("short") / "p.parquet"
    res = invoke(
        "profile", "--device", "a100-like", "--workload", mini, "--freqs", "min,mid,max",
        "--iterations", 1, "--out", path,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    return path


@pytest.mark.parametrize(
    "command",
    [
        ["fit", "{p}", "--out", "{out}"],
        ["plan", "{p}", "--target", "0.05", "--out", "{out}"],
        ["validate", "power", "{p}", "--train-freqs", "min,max"],
    ],
    ids=["fit", "plan", "validate-power"],
)
def test_a_profile_too_short_for_its_sensor_says_how_many_iterations(
    command, one_iteration, mini, tmp_path
):
    out = tmp_path / "out.json"
    line = one_error_line(invoke(*(a.format(p=one_iteration, out=out) for a in command)))
    sim = SimulatedDevice.from_preset("a100-like")
    top = sim.run(Workload.read(mini), freq_mhz=sim.spec.max_freq_mhz)[0].iteration_time_s
    needed = sensor_iterations(top, **sim.sensor_ms)
    assert "too short for its power sensor" in line and f"fewer than the {MIN_WINDOWS}" in line
    # the fastest clock's iterations in the profile itself set the count (noise moves it by 1)
    assert re_int(line, r"profile at least (\d+) iterations") in (needed - 1, needed, needed + 1)
    assert not out.exists()


def re_int(text: str, pattern: str) -> int:
    match = re.search(pattern, text)
    assert match, text
    return int(match.group(1))


# ------------------------------------------------------------------ degenerate inputs
def _ops(times_us: float | None = None, drop_op_at: float | None = None) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    work_us = rng.uniform(50, 500, 6)
    rows = [
        {"iteration": 0, "op": op, "name": f"op{op}", "freq_mhz": f,
         "time_us": work_us[op] * 1800.0 / f, "chip_power_w": 100.0 + f / 20}
        for f in (1000.0, 1400.0, 1800.0)
        for op in range(6)
    ]  # fmt: skip
    ops = pd.DataFrame(rows)
    if times_us is not None:
        ops["time_us"] = times_us
    if drop_op_at is not None:
        ops = ops[~((ops["op"] == 2) & (ops["freq_mhz"] == drop_op_at))]
    return ops


PROFILES = {
    "ok": _ops(),
    "all-zero-times": _ops(times_us=0.0),
    "op-missing-at-a-clock": _ops(drop_op_at=1000.0),
}
COMMANDS = {
    "fit": ["fit", "{p}", "--out", "{out}"],
    # over the preset's 9 clocks, 6 not profiled: the models are fitted
    "plan": ["plan", "{p}", "--device", "ascend-910b-like", "--target", "0.05", "--out", "{out}"],
    "validate-perf": ["validate", "perf", "{p}"],
    "validate-power": ["validate", "power", "{p}"],
}
#: (profile, extra arguments, what the error line says)
BAD = {
    "all-zero-times": ("all-zero-times", [], "operator 0 (op0) has a time <= 0 us at 1000 MHz"),
    "op-missing": ("op-missing-at-a-clock", [], "operator 2 (op2) has no time at 1000 MHz"),
    "duplicate-clocks": ("ok", ["--train-freqs", "1000,1000"], "1000 MHz is given twice"),
}


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("command", COMMANDS)
def test_degenerate_input_exits_2_with_one_line_and_no_file(command, bad, tmp_path):
    profile, extra, reason = BAD[bad]
    path, out = tmp_path / "p.parquet", tmp_path / "out.json"
    Profile(PROFILES[profile]).write(path)
    args = [a.format(p=path, out=out) for a in COMMANDS[command]]
    if command.startswith("validate") and not extra:
        extra = ["--train-freqs", "1000,1800"]
    line = one_error_line(invoke(*args, *extra))
    assert reason in line
    assert not out.exists()


@pytest.mark.parametrize("window", ["-5", "0"])
def test_a_non_positive_window_is_refused(window, tmp_path):
    path = tmp_path / "p.parquet"
    Profile(PROFILES["ok"]).write(path)
    res = invoke("validate", "power", path, "--train-freqs", "1000,1800", "--window-ms", window)
    assert "expected a positive number of milliseconds" in one_error_line(res)


def test_the_good_profile_passes_every_command(tmp_path):
    """The degenerate cases above fail for their reason, not for the profile they start from."""
    path = tmp_path / "p.parquet"
    Profile(PROFILES["ok"]).write(path)
    for command in COMMANDS.values():
        args = [a.format(p=path, out=tmp_path / "out.json") for a in command]
        extra = ["--train-freqs", "1000,1800"] if command[0] == "validate" else []
        res = invoke(*args, *extra)
        assert res.exit_code == 0, res.output
