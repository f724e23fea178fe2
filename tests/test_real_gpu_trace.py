"""Importer, NVML windows and power attribution on a real GPU's measurements (the H200 fixture).

``fixtures/h200_tinygpt.*`` (``fixtures/make_gpu_trace.py``): 48 training steps of a 4-layer GPT
(dim 1024, batch 64 x 512 tokens, AdamW) on an NVIDIA H200, traced by torch.profiler with CUDA
kernels, and NVML read every ~20 ms beside it (power, temperature, SM clock, energy counter). The
board ran at its 700 W limit, so the SM clock wandered between 1725 and 1980 MHz.
"""

import json

import numpy as np
import pandas as pd
import pytest

from opdvfs.io import torch_trace
from opdvfs.io.samples import counter_windows, run_clock_mhz, window_ms
from opdvfs.models.attribution import power_rows
from opdvfs.profile import Profile

from conftest import FIXTURES


@pytest.fixture(scope="module")
def h200():
    fixtures = FIXTURES
    meta = json.loads((fixtures / "h200_tinygpt.meta.json").read_text())
    samples = pd.read_csv(fixtures / "h200_tinygpt.samples.csv")
    clock = run_clock_mhz(samples)
    measured = torch_trace.read(fixtures / "h200_tinygpt.pt.trace.json.gz", freq_mhz=clock)
    return meta, samples, clock, measured


def test_each_training_step_is_one_profile_iteration_of_the_same_kernels(h200):
    meta, _, clock, measured = h200
    ops = measured.ops
    assert ops["iteration"].nunique() == meta["profiled_steps"] == 48
    per_iteration = ops.groupby("iteration")
    assert per_iteration.size().nunique() == 1  # every step launches the same operators
    names = per_iteration["name"].apply(tuple)
    assert names.nunique() == 1
    # the kernels fill the step: their time is what the host measured, less launch gaps
    kernel_s = per_iteration["time_us"].sum().to_numpy() * 1e-6
    step_s = np.asarray(meta["step_s"])
    assert np.all(kernel_s <= step_s) and np.median(kernel_s / step_s) > 0.9
    assert set(ops["freq_mhz"]) == {clock}
    # the matrix units' work (GEMMs and fused attention) holds most of the GPU time
    by_type = ops.groupby("type")["time_us"].sum()
    matrix = by_type[by_type.index.str.contains("mm|attention")].sum()
    assert matrix > 0.6 * by_type.sum()


def test_the_energy_counters_updates_are_the_power_windows(h200):
    meta, samples, clock, _ = h200
    windows = counter_windows(samples)
    # reads every ~20 ms, the counter moves every ~100 ms: a window per update, not per read
    assert 95.0 < window_ms(windows, 20.0) < 105.0
    assert len(windows) < len(samples) / 3
    assert windows["power_w"].between(0.0, meta["power_limit_w"] * 1.05).all()
    # the windows' energy is the counter's: nothing lost or counted twice
    dt = np.diff(windows["t_s"].to_numpy())
    counted = float((windows["power_w"].to_numpy()[1:] * dt).sum())
    first, last = windows["energy_j"].iloc[[0, -1]]
    assert counted == pytest.approx(last - first, rel=1e-6)
    # the run's clock is what the GPU ran at, not its idle clock
    assert samples["freq_mhz"].min() <= clock <= samples["freq_mhz"].max()
    assert clock > 1500.0


def test_attributed_power_is_physical_when_every_window_holds_the_same_mix(h200):
    """Each ~100 ms window holds one whole training step: the class powers are not identifiable.

    The attribution must then fall back towards the mean power (cross-validated ridge) rather
    than trade classes off against each other: a class at 3 kW on a 700 W board is not a fit.
    """
    meta, samples, _, measured = h200
    windows = counter_windows(samples)
    period = window_ms(windows, 20.0)
    profile = Profile(
        measured.ops, windows, meta={**measured.meta, "sensor": {"window_ms": period}}
    )
    rows = power_rows(profile)
    power = rows.groupby("type")["chip_power_w"].first()
    assert power.between(0.0, meta["power_limit_w"] * 1.05).all(), power.sort_values().tail()
    # and the run's energy is kept: time-weighted power = the windows' power while it ran
    busy = windows[windows["t_s"].between(rows["wall_s"].min() + 0.1, rows["wall_s"].max())]
    weighted = float((rows["chip_power_w"] * rows["time_us"]).sum() / rows["time_us"].sum())
    assert weighted == pytest.approx(float(busy["power_w"].mean()), rel=0.05)


def test_import_attaches_a_sensor_log_to_a_trace(tmp_path):
    from typer.testing import CliRunner

    from opdvfs.cli import app

    trace = FIXTURES / "h200_tinygpt.pt.trace.json.gz"
    out = tmp_path / "p.parquet"
    argv = ["import", str(trace), "--samples", str(FIXTURES / "h200_tinygpt.samples.csv")]
    res = CliRunner().invoke(app, [*argv, "--out", str(out)])
    assert res.exit_code == 0, res.output
    profile = Profile.read(out)
    assert profile.freqs_mhz == [1920.0]  # the run's clock, from the samples
    assert 95.0 < profile.meta["sensor"]["window_ms"] < 105.0
    assert profile.samples is not None and 40 <= len(profile.samples) <= 60
    rows = power_rows(profile)  # the attribution reads the attached windows
    assert rows["chip_power_w"].between(0.0, 735.0).all()
    # a log without t_s, or two runs for one log: one line each, nothing written
    bad = tmp_path / "bad.csv"
    bad.write_text("time,power_w\n1,2\n")
    res = CliRunner().invoke(app, ["import", str(trace), "--samples", str(bad), "-o", str(out)])
    assert res.exit_code == 2 and "bad.csv: a samples file needs t_s" in res.stderr
    res = CliRunner().invoke(
        app, ["import", str(trace), str(trace), "--samples", str(bad), "-o", str(out)]
    )
    assert res.exit_code == 2 and "--samples belongs to one run" in res.stderr
