"""``opdvfs doctor``: what the machine offers, read-only, with and without NVML."""

import json
import socket

import pytest
from typer.testing import CliRunner

from opdvfs.cli import app
from opdvfs.runtime.doctor import diagnose


@pytest.fixture
def no_zeusd(monkeypatch):
    monkeypatch.delenv("ZEUSD_SOCK_PATH", raising=False)
    monkeypatch.delenv("ZEUSD_HOST_PORT", raising=False)


def test_without_nvml_doctor_says_so_in_one_line_and_exits_0(monkeypatch, no_zeusd):
    from opdvfs.runtime.actuators import nvml

    monkeypatch.setattr(nvml, "pynvml", None)
    res = CliRunner().invoke(app, ["doctor"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    (line,) = [x for x in lines if x.split()[1] == "nvml"]
    assert line.startswith("absent") and "no NVML: nvidia-ml-py is not installed" in line
    assert any(x.startswith("absent zeusd") for x in lines)
    assert any(" simulated " in x and "sim:a100-like" in x for x in lines)


def test_doctor_reads_each_gpu_and_its_clocks_through_nvml_and_sets_nothing(fake_nvml, no_zeusd):
    fake_nvml.nvmlSystemGetDriverVersion.return_value = "550.54.15"
    fake_nvml.nvmlSystemGetNVMLVersion.return_value = "12.550.54.15"
    fake_nvml.nvmlDeviceGetCount.return_value = 2
    fake_nvml.nvmlDeviceGetUUID.return_value = "GPU-1234"
    res = CliRunner().invoke(app, ["doctor", "--json"])
    assert res.exit_code == 0, res.output
    checks = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    assert checks["nvml"]["status"] == "ok" and checks["nvml"]["data"]["driver"] == "550.54.15"
    gpu = checks["gpu1"]
    assert gpu["data"]["name"] == "NVIDIA A100-SXM4-80GB" and gpu["data"]["uuid"] == "GPU-1234"
    low, top, n = gpu["data"]["clocks_mhz"]
    assert (low, top) == (210.0, 1410.0) and n > 2
    assert gpu["data"]["sm_clock_mhz"] == 1410.0 and gpu["data"]["power_w"] == 312.5
    assert "torch" in checks and "permissions" in checks
    fake_nvml.nvmlDeviceSetGpuLockedClocks.assert_not_called()
    fake_nvml.nvmlDeviceResetGpuLockedClocks.assert_not_called()
    # every initialisation given back
    assert fake_nvml.nvmlInit.call_count == fake_nvml.nvmlShutdown.call_count


def test_a_zeusd_socket_is_connected_to_and_a_missing_one_fails(tmp_path, monkeypatch):
    path = tmp_path / "zeusd.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    try:
        monkeypatch.setenv("ZEUSD_SOCK_PATH", str(path))
        (check,) = [c for c in diagnose() if c.name == "zeusd"]
        assert check.status == "ok" and str(path) in check.message
    finally:
        server.close()
    monkeypatch.setenv("ZEUSD_SOCK_PATH", str(tmp_path / "absent.sock"))
    res = CliRunner().invoke(app, ["doctor"])
    assert res.exit_code == 1  # present but broken
    assert any(x.startswith("FAIL   zeusd") for x in res.stdout.splitlines())
