"""Device files with the GPU's real clocks (issue 31 item 4): NVML, or a list.

``opdvfs characterise --clocks`` and ``opdvfs device`` write the clocks the GPU offers, not only
the profiled ones, so that ``plan --device`` has clocks for its models to fill.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from opdvfs.cli import app
from opdvfs.devices.clocks import parse_clock_grid
from opdvfs.devices.spec import DeviceSpec
from opdvfs.exceptions import ValidationError
from opdvfs.plan import auto_clocks, plan_profile
from opdvfs.profile import Profile
from opdvfs.schedule import Schedule

from conftest import NVML_CLOCKS_MHZ

runner = CliRunner()


def test_clock_lists_parse_ranges_and_values():
    assert parse_clock_grid("210:1410:15") == tuple(np.arange(210.0, 1411.0, 15.0))
    assert parse_clock_grid("1410, 1005,1395,1410") == (1005.0, 1395.0, 1410.0)
    assert parse_clock_grid("210:240:15,1000,1000.5:1001.5:0.5") == (
        210.0,
        225.0,
        240.0,
        1000.0,
        1000.5,
        1001.0,
        1001.5,
    )
    assert parse_clock_grid("100:120:15") == (100.0, 115.0)  # STOP off the step: not included
    for bad in ("", "abc", "-5", "nan", "1410:210:15", "1:2", "1:10:0", "1:100000:0.001"):
        with pytest.raises(ValidationError) as err:
            parse_clock_grid(bad)
        assert err.value.field == "clocks"


def test_device_from_nvml_lists_the_gpus_clocks(fake_nvml, tmp_path):
    out = tmp_path / "gpu.json"
    res = runner.invoke(app, ["device", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    # the graphics clocks at the highest memory clock (the fake offers 1593 and 1215)
    fake_nvml.nvmlDeviceGetSupportedGraphicsClocks.assert_called_once_with("handle0", 1593)
    fake_nvml.nvmlDeviceSetGpuLockedClocks.assert_not_called()  # reading never sets
    device = DeviceSpec.read(out)
    assert device.freqs_mhz == tuple(sorted(float(f) for f in NVML_CLOCKS_MHZ))
    assert device.name == "NVIDIA A100-SXM4-80GB" and device.vendor == "nvidia"
    assert json.loads(res.stdout)["clocks"] == len(NVML_CLOCKS_MHZ)


def test_device_from_a_list_lists_the_same_clocks(fake_nvml, tmp_path):
    listed = tmp_path / "listed.json"
    text = ",".join(str(f) for f in NVML_CLOCKS_MHZ)
    res = runner.invoke(app, ["device", "--clocks", text, "--name", "gpu", "--out", str(listed)])
    assert res.exit_code == 0, res.output
    fake_nvml.nvmlInit.assert_not_called()  # a list never asks NVML
    assert DeviceSpec.read(listed).freqs_mhz == tuple(sorted(float(f) for f in NVML_CLOCKS_MHZ))
    ranged = tmp_path / "ranged.json"
    args = ["device", "--clocks", "210:1410:15", "--name", "gpu", "--out", str(ranged)]
    res = runner.invoke(app, [*args, "--switch-latency-ms", "15"])
    assert res.exit_code == 0, res.output
    device = DeviceSpec.read(ranged)
    assert len(device.freqs_mhz) == 81 and device.switch_latency_ms == 15.0
    assert (device.min_freq_mhz, device.max_freq_mhz) == (210.0, 1410.0)


def test_device_without_a_gpu_says_to_list_the_clocks(fake_nvml, tmp_path):
    import pynvml

    fake_nvml.nvmlInit.side_effect = pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    out = tmp_path / "gpu.json"
    res = runner.invoke(app, ["device", "--out", str(out)])
    assert res.exit_code == 2
    assert res.stderr.count("\n") == 1 and "--clocks" in res.stderr, res.stderr
    assert not out.exists()


def power_kernels(path) -> Profile:
    """Forty kernels with board power at the five ``auto`` clocks of 210:1410:15 (written)."""
    freqs = np.array(auto_clocks(np.arange(210.0, 1411.0, 15.0))[::-1])
    rng = np.random.default_rng(7)
    volt = 0.7 + 0.3 * np.maximum(freqs - 1000.0, 0.0) / 410.0
    u, a = rng.uniform(40, 120, 40), rng.uniform(20, 120, 40)
    time_us, bound = rng.uniform(50, 500, 40), rng.uniform(0.2, 1.0, 40)  # share bound by f
    power = u[:, None] + a[:, None] * freqs[None, :] / 1e3 * volt[None, :] ** 2
    op = np.repeat(np.arange(40), len(freqs))
    profile = Profile(
        pd.DataFrame(
            {
                "iteration": 0,
                "op": op,
                "name": [f"k{i}" for i in op],
                "freq_mhz": np.tile(freqs, 40),
                "time_us": (
                    time_us[:, None] * (bound[:, None] * 1410.0 / freqs + 1 - bound[:, None])
                ).ravel(),
                "chip_power_w": power.ravel(),
            }
        )
    )
    profile.write(path)
    return profile


def test_characterise_writes_the_listed_or_nvml_clocks(fake_nvml, tmp_path):
    path = str(tmp_path / "bench.parquet")
    profile = power_kernels(path)
    out = tmp_path / "d.json"
    res = runner.invoke(app, ["characterise", path, "--clocks", "210:1410:15", "--out", str(out)])
    assert res.exit_code == 0, res.output
    device = DeviceSpec.read(out)
    assert device.freqs_mhz == tuple(np.arange(210.0, 1411.0, 15.0))
    assert device.voltage is not None and device.idle is not None
    # NVML's list lacks most profiled clocks: refused, naming --clocks, nothing written
    nvml_out = tmp_path / "nvml.json"
    res = runner.invoke(app, ["characterise", path, "--clocks", "nvml", "--out", str(nvml_out)])
    assert res.exit_code == 2 and res.stderr.startswith("opdvfs: error: --clocks:"), res.output
    assert not nvml_out.exists()
    fake_nvml.nvmlDeviceGetSupportedGraphicsClocks.return_value = [
        int(f) for f in np.arange(1410, 209, -15)
    ]
    res = runner.invoke(app, ["characterise", path, "--clocks", "nvml", "--out", str(nvml_out)])
    assert res.exit_code == 0, res.output
    assert DeviceSpec.read(nvml_out).freqs_mhz == device.freqs_mhz
    # without --clocks, as before: the profiled clocks
    res = runner.invoke(app, ["characterise", path, "--out", str(tmp_path / "old.json")])
    assert res.exit_code == 0, res.output
    assert DeviceSpec.read(tmp_path / "old.json").freqs_mhz == tuple(profile.freqs_mhz)


def test_plan_with_the_device_file_fills_the_unprofiled_clocks(tmp_path):
    path = str(tmp_path / "bench.parquet")
    profile = power_kernels(path)
    spec_path = tmp_path / "d.json"
    args = ["device", "--clocks", "210:1410:15", "--name", "gpu", "--out", str(spec_path)]
    assert runner.invoke(app, [*args, "--switch-latency-ms", "0"]).exit_code == 0
    spec = DeviceSpec.read(spec_path)
    result = plan_profile(profile, 0.05, spec=spec, interval_ms=0.0, switch_latency_ms=0.0)
    assert result.fitted.models is not None  # the models fill what was not profiled
    np.testing.assert_array_equal(result.fitted.inputs.freqs_mhz, spec.freqs_mhz)
    profiled = set(profile.freqs_mhz.tolist())
    planned = set(result.schedule.freq_per_op_mhz().tolist())
    assert planned - profiled, planned  # an unprofiled clock is used
    # the same through the command line
    out = tmp_path / "s.json"
    plan = ["plan", path, "--device", str(spec_path), "--target", "0.05", "--interval-ms", "0"]
    res = runner.invoke(app, [*plan, "--out", str(out)])
    assert res.exit_code == 0, res.output
    clocks = set(Schedule.read(out).freq_per_op_mhz().tolist())
    assert clocks - profiled, clocks
    # without the device file, only the profiled clocks
    res = runner.invoke(
        app, ["plan", path, "--target", "0.05", "--interval-ms", "0", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert set(Schedule.read(out).freq_per_op_mhz().tolist()) <= profiled
