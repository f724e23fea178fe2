"""The simulator's offline calibration (paper Fig. 11) and the user's path to it.

``SimulatedDevice.calibration_runs`` is the one cool-down the demo/evaluate pipeline
(``experiments.bench.calibrate``) and ``opdvfs fit --calibrate`` / ``opdvfs validate power
--calibrate`` take: core and chip power beside temperature, and no sample whose sensor window
still covers the load, on every preset. On a GPU preset (board power only) the chip column is
what gives the power model its temperature term (``gamma_from_ == "cooldown"``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from opdvfs.cli import app
from opdvfs.experiments.bench import calibrate
from opdvfs.models import ModelBundle
from opdvfs.models.thermal import leakage_slope
from opdvfs.profile import Profile
from opdvfs.sim import PRESETS, SimulatedDevice
from opdvfs.sim.physics import leakage_scale
from user_workload import write_mini_workload

runner = CliRunner()


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def law_slope(temp_c: np.ndarray, leak_w: np.ndarray) -> float:
    """Least-squares slope (W/C) of the twin's own leakage law at the trace's temperatures."""
    dt = temp_c - temp_c.mean()
    return float(dt @ (leak_w - leak_w.mean())) / float(dt @ dt)


@pytest.fixture(scope="module", params=list(PRESETS))
def calibrated(request):
    sim = SimulatedDevice.from_preset(request.param)
    return sim, sim.calibration_runs()


def test_cool_down_reads_the_twins_leakage_law_on_both_rails(calibrated):
    """Each rail's slope is the twin's own leakage law over the trace's temperatures.

    A sample whose averaging window still covers the load reads load power at a cooling die:
    on h100-like's 1 s window they made the core slope 2.88 W/C/V against the law's ~1.0.
    """
    sim, calibration = calibrated
    cool = calibration.cooldown
    assert cool is not None
    assert {"freq_mhz", "core_power_w", "chip_power_w", "temp_c"} <= set(cool)
    assert (cool["freq_mhz"] == sim.spec.max_freq_mhz).all() and len(cool) > 100
    p, vf = sim.params, sim.spec.voltage
    assert vf is not None
    volt = float(vf.voltage_v(sim.spec.max_freq_mhz))
    temp = cool["temp_c"].to_numpy(dtype=float)
    scale = leakage_scale(temp, p)
    core_law = law_slope(temp, p.leak_a * volt * scale) / volt
    chip_law = law_slope(temp, (p.leak_a * volt + p.uncore_leak_w) * scale) / volt
    # within the sensor's lag (window / 2 against the die's time constant) and quantisation
    assert leakage_slope(cool, "core_power_w", vf) == pytest.approx(core_law, rel=0.12)
    assert leakage_slope(cool, "chip_power_w", vf) == pytest.approx(chip_law, rel=0.12)


def test_no_cool_down_sample_reads_the_load(calibrated):
    """After the load the idle chip is at most as hot as under it: no sample reads load power."""
    sim, calibration = calibrated
    cool = calibration.cooldown
    assert cool is not None
    p, vf = sim.params, sim.spec.voltage
    assert vf is not None
    top = sim.spec.max_freq_mhz
    idle_top = calibration.idle.set_index("freq_mhz").loc[top]
    # idle at the top clock, plus what the twin's leakage law adds on a die as hot as the
    # trace's hottest sample (a window covering the load reads far more: the load's power)
    hot, cool_c = leakage_scale(np.array([cool["temp_c"].max(), idle_top["temp_c"]]), p)
    leak_w = (p.leak_a * float(vf.voltage_v(top)) + p.uncore_leak_w) * (hot - cool_c)
    ceiling = idle_top["chip_power_w"] + 1.2 * leak_w + 6 * p.power_noise_w  # 6 sigma
    assert cool["chip_power_w"].max() < ceiling


def test_bench_calibrate_is_the_simulators_calibration():
    sim = SimulatedDevice.from_preset("h100-like")
    ours, theirs = calibrate(sim), sim.calibration_runs()
    pd.testing.assert_frame_equal(ours.idle, theirs.idle)
    assert ours.cooldown is not None and theirs.cooldown is not None
    pd.testing.assert_frame_equal(ours.cooldown, theirs.cooldown)


# ------------------------------------------------------------------ the user's path
@pytest.fixture(scope="module")
def gpu_profile(tmp_path_factory) -> Path:
    """``opdvfs profile`` of a small workload on h100-like (board power, 1 s sensor windows)."""
    folder = tmp_path_factory.mktemp("gpu")
    write_mini_workload(folder / "w.json")
    res = invoke(
        "profile", "--device", "h100-like", "--workload", folder / "w.json",
        "--freqs", "min,mid,max", "--out", folder / "p.parquet",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    return folder / "p.parquet"


def test_fit_calibrate_gives_a_gpu_profile_the_measured_leakage_slope(gpu_profile, tmp_path):
    plain, calibrated = tmp_path / "plain.json", tmp_path / "cal.json"
    res = invoke("fit", gpu_profile, "--out", plain, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["gamma_from"] == "none"  # board rail: no trace, no term
    # the profile's own device (a preset) is measured; --device names it explicitly too
    for extra in ([], ["--device", "h100-like"]):
        res = invoke("fit", gpu_profile, "--calibrate", "--out", calibrated, "--json", *extra)
        assert res.exit_code == 0, res.output
        payload = json.loads(res.stdout)
        assert payload["power_model"] == "chip" and payload["gamma_from"] == "cooldown"
    power = ModelBundle.read(calibrated).power
    assert power is not None and power.gamma_from_ == "cooldown" and power.use_temperature_
    sim = SimulatedDevice.from_preset("h100-like")
    assert sim.spec.voltage is not None
    expected = leakage_slope(sim.calibration_runs().cooldown, "chip_power_w", sim.spec.voltage)
    assert power.gamma_ == pytest.approx(expected)
    res = invoke("fit", gpu_profile, "--calibrate", "--out", tmp_path / "t.json")
    assert res.exit_code == 0 and "leakage slope from the cool-down" in res.stdout


def test_fit_calibrate_needs_a_simulated_device(gpu_profile, tmp_path):
    profile = Profile.read(gpu_profile)
    elsewhere = tmp_path / "real.parquet"
    meta = {**profile.meta, "device": "my-gpu"}
    Profile(profile.ops, samples=profile.samples, meta=meta).write(elsewhere)
    out = tmp_path / "m.json"
    for args, words in (
        ([elsewhere, "--calibrate"], "--calibrate measures a simulated device; my-gpu is not one"),
        (
            [gpu_profile, "--calibrate", "--characterise", gpu_profile],
            "--calibrate and --characterise both give idle power",
        ),
    ):
        res = invoke("fit", *args, "--out", out)
        assert res.exit_code == 2 and words in res.stderr, res.output
        assert not out.exists()
