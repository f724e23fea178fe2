"""The zeusd actuator against a fake Zeus daemon on a Unix socket (zeusd's HTTP API).

The daemon is ``conftest.FakeZeusd``, started by the ``zeusd`` fixture (the actuator contract,
``test_contracts.py``, runs over it too).
"""

import pytest

pytest.importorskip("pynvml")

from opdvfs.exceptions import (
    DeviceNotFoundError,
    NotSupportedError,
    PermissionDeniedError,
    UnsupportedClockError,
)
from opdvfs.runtime.actuators import ClockGuard, ZeusdActuator, make_actuator
from opdvfs.runtime.actuators.zeusd import ZeusdClient


def test_clock_writes_go_to_the_daemon_reads_to_nvml(zeusd, fake_nvml):
    with make_actuator("zeusd") as act:
        assert isinstance(act, ZeusdActuator)
        assert act.supported_freqs_mhz() == (210.0, 1005.0, 1380.0, 1395.0, 1410.0)
        act.set_freq_mhz(1005.0)
        act.set_freq_mhz(1005.0)  # unchanged: the daemon is not asked again
        act.set_freq_mhz(1410.0)
        act.reset()
        assert act.read_power_w() == pytest.approx(312.5)
        with pytest.raises(UnsupportedClockError):
            act.set_freq_mhz(1000.0)
    lock = {"gpu_ids": "0", "block": "true"}
    assert zeusd.requests == [
        ("POST", "/gpu/set_gpu_locked_clocks", lock | _clock(1005), None),
        ("POST", "/gpu/set_gpu_locked_clocks", lock | _clock(1410), None),
        ("POST", "/gpu/reset_gpu_locked_clocks", lock, None),
    ]
    # no clock is ever set by NVML itself: the process has no privilege
    fake_nvml.nvmlDeviceSetGpuLockedClocks.assert_not_called()
    fake_nvml.nvmlDeviceResetGpuLockedClocks.assert_not_called()


def _clock(freq_mhz: int) -> dict[str, str]:
    return {"min_clock_mhz": str(freq_mhz), "max_clock_mhz": str(freq_mhz)}


def test_the_token_is_sent_as_a_bearer(zeusd, fake_nvml, monkeypatch):
    monkeypatch.setenv("ZEUSD_TOKEN", "s3cret")
    with ZeusdActuator(index=2) as act:
        act.set_freq_mhz(1380.0)
    (request,) = zeusd.requests
    assert request[2]["gpu_ids"] == "2"
    assert request[3] == "Bearer s3cret"


@pytest.mark.parametrize(
    ("status", "body", "error", "needle"),
    [
        (403, '{"errors": {"0": "NVML NoPermission"}}', PermissionDeniedError, "GPU 0: NVML"),
        (401, "missing token", PermissionDeniedError, "401: missing token"),
        (400, '{"errors": {"0": "clock 1005 not supported"}}', NotSupportedError, "not supported"),
    ],
)
def test_refusals_are_opdvfs_errors_and_the_clock_stays_unknown(
    zeusd, fake_nvml, status, body, error, needle
):
    act = ZeusdActuator()
    zeusd.answers.append((status, body))
    with pytest.raises(error, match=needle):
        act.set_freq_mhz(1005.0)
    act.set_freq_mhz(1005.0)  # the failed write was not remembered as applied: it is retried
    assert [r[1] for r in zeusd.requests] == ["/gpu/set_gpu_locked_clocks"] * 2
    act.close()


def test_the_guard_restores_through_the_daemon_on_an_exception(zeusd, fake_nvml):
    def train() -> None:
        with ZeusdActuator() as act, ClockGuard(act):
            act.set_freq_mhz(1005.0)
            raise RuntimeError("training crashed")

    with pytest.raises(RuntimeError, match="crashed"):
        train()
    assert [r[1] for r in zeusd.requests][-1] == "/gpu/reset_gpu_locked_clocks"
    assert [r[1] for r in zeusd.requests].count("/gpu/reset_gpu_locked_clocks") == 1


def test_without_a_daemon_one_line_says_both_options(monkeypatch, tmp_path):
    monkeypatch.delenv("ZEUSD_SOCK_PATH", raising=False)
    monkeypatch.delenv("ZEUSD_HOST_PORT", raising=False)
    with pytest.raises(DeviceNotFoundError, match="ZEUSD_SOCK_PATH.*or run as root"):
        ZeusdClient()
    client = ZeusdClient(socket_path=tmp_path / "absent.sock")
    with pytest.raises(DeviceNotFoundError, match="absent.sock cannot be reached"):
        client.post("/gpu/reset_gpu_locked_clocks", gpu_ids=0, block=True)
