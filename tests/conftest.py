from __future__ import annotations

import http.server
import json
import socketserver
import sys
import threading
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import numpy as np
import pandas as pd
import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


def captured_op_count(script: Path, iterations: int = 2) -> int:
    """Operators per iteration of ``python script iterations``, by ``opdvfs capture``."""
    from typer.testing import CliRunner

    from opdvfs.cli import app

    workload = script.with_name(f"{script.stem}.captured.json")
    argv = ["capture", "--out", str(workload), "--", "python", str(script), str(iterations)]
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 0, res.output
    return len(json.loads(workload.read_text())["ops"]["name"])


def make_ops(n_ops: int = 4, freqs=(1000.0, 1800.0), iterations: int = 1, seed: int = 0):
    """A valid long profile table: compute-bound-ish times that fall with the clock."""
    rng = np.random.default_rng(seed)
    work = rng.uniform(50, 500, n_ops)
    rows = []
    for it in range(iterations):
        for f in freqs:
            for op in range(n_ops):
                rows.append(
                    {
                        "iteration": it,
                        "op": op,
                        "name": f"op{op}",
                        "freq_mhz": f,
                        "time_us": work[op] * 1800.0 / f,
                    }
                )
    return pd.DataFrame(rows)


#: SM clocks (MHz) the fake NVML GPU of :func:`fake_nvml` supports, in NVML's (descending) order.
NVML_CLOCKS_MHZ = [1410, 1395, 1380, 1005, 210]


@pytest.fixture
def fake_nvml():
    """pynvml where it is looked up, autospecced: the real module's signatures and errors.

    NVML is wrapped once, in ``opdvfs.runtime.actuators.nvml``: the actuator and the power
    sampler both call it through that module's ``pynvml``.
    """
    pynvml = pytest.importorskip("pynvml")
    from unittest import mock

    from opdvfs.runtime.actuators import nvml as nvml_module

    with mock.patch.object(nvml_module, "pynvml", autospec=True) as fake:
        fake.NVMLError = pynvml.NVMLError  # raised and caught as the real class
        fake.nvmlDeviceGetHandleByIndex.return_value = "handle0"
        fake.nvmlDeviceGetHandleByUUID.return_value = "handle-uuid"
        fake.nvmlDeviceGetName.return_value = "NVIDIA A100-SXM4-80GB"
        fake.nvmlDeviceGetSupportedMemoryClocks.return_value = [1593, 1215]
        fake.nvmlDeviceGetSupportedGraphicsClocks.return_value = NVML_CLOCKS_MHZ
        fake.nvmlDeviceGetPowerUsage.return_value = 312_500  # mW
        fake.nvmlDeviceGetTotalEnergyConsumption.return_value = 123_456_789  # mJ
        fake.nvmlDeviceGetTemperature.return_value = 61  # degC
        fake.nvmlDeviceGetClockInfo.return_value = 1410  # MHz
        yield fake


def read_log(path) -> list[dict]:
    """The records of a dry-run ``--log`` file (JSON lines), in order."""
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def torchrun_opdvfs(nproc: int, *args: str) -> list[str]:
    """The argv of ``torchrun --standalone --nproc-per-node N -m opdvfs ARGS`` on this Python."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--standalone",
        "-m",
        "opdvfs",
        *args,
    ]


@pytest.fixture
def cpu_only(monkeypatch):
    """Run a test's CPU path on a machine with a GPU too (capture then takes no CUDA trace)."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


class FakeZeusd(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """Records every request; answers each with the next queued (status, body), else 200."""

    daemon_threads = True

    def __init__(self, path: str) -> None:
        self.requests: list[tuple[str, str, dict[str, str], str | None]] = []
        self.answers: list[tuple[int, str]] = []
        super().__init__(path, _Handler)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: FakeZeusd

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        auth = self.headers.get("Authorization")
        self.server.requests.append(("POST", url.path, dict(parse_qsl(url.query)), auth))
        status, body = self.server.answers.pop(0) if self.server.answers else (200, "")
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if data:  # the client may be gone once it has read an empty answer
            self.wfile.write(data)

    def address_string(self) -> str:  # a Unix socket has no client address
        return "unix"

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def zeusd(tmp_path, monkeypatch):
    """A fake Zeus daemon on a Unix socket, reached through ``ZEUSD_SOCK_PATH`` (no token)."""
    path = str(tmp_path / "zeusd.sock")
    server = FakeZeusd(path)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    monkeypatch.setenv("ZEUSD_SOCK_PATH", path)
    monkeypatch.delenv("ZEUSD_TOKEN", raising=False)
    yield server
    server.shutdown()
    server.server_close()
