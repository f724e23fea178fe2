from __future__ import annotations

import http.server
import json
import os
import socketserver
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import numpy as np
import pandas as pd
import pytest

FIXTURES = Path(__file__).parent / "fixtures"

# One OpenMP thread for torch, here and in every process a test starts (they inherit it), unless
# the caller chose: the tests' models are tiny, and beside other CPU-bound jobs on a 2-core
# machine torch's two threads waited at every operator for one that was not scheduled (a tiny
# GPT step took 38-204 ms against 3.5-5 ms on one thread). Read when torch is first imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# The actuators claim a GPU through a lock file per GPU UUID (opdvfs.runtime.gpu_select.GpuClaim):
# this run's own folder, inherited by the processes it starts, so the fakes' GPUs are not
# claimed across test runs of other checkouts on the same machine.
os.environ.setdefault("OPDVFS_LOCK_DIR", tempfile.mkdtemp(prefix="opdvfs-test-locks-"))


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
        fake.nvmlDeviceGetCount.return_value = 1
        fake.nvmlDeviceGetUUID.return_value = "GPU-00000000-fake-0000-0000-000000000000"
        fake.nvmlDeviceGetIndex.return_value = 0
        fake.nvmlDeviceGetHandleByIndex.return_value = "handle0"
        fake.nvmlDeviceGetHandleByUUID.return_value = "handle0"  # the one GPU's UUID
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


def gpu_like(traced_profile: Callable) -> Callable:
    """Wrap ``runtime.sweep.traced_profile`` so a dry run's traced sweep looks like a GPU's.

    A dry run sets no clock and measures no power: each traced operator is given, as a GPU
    would show, a time that grows below the top clock (1410 MHz) by its compute-bound share and
    a power that falls with the clock (``chip_power_w``), both fixed by its name (crc32), so the
    plans and active profiling's choice do not depend on the host's load.
    """
    import zlib

    from opdvfs.profile import Profile

    def measured(*args: object) -> Profile:
        p = traced_profile(*args)
        f = p.ops["freq_mhz"].to_numpy(dtype=float)
        key = np.array([zlib.crc32(str(n).encode()) for n in p.ops["name"]])
        share = 0.2 + 0.1 * (key % 8)
        time_us = (5.0 + key % 7) * (1 - share + share * 1410.0 / f)
        ops = p.ops.assign(time_us=time_us, chip_power_w=30.0 + 0.1 * f + 4e-5 * f**2)
        return Profile(ops, p.samples, meta=p.meta)

    return measured


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


class ManualClock:
    """A clock that moves only when the test sleeps on it (``opdvfs.runtime.clock.Clock``).

    Give it to an executor (``clock=``) and end each iteration after :meth:`sleep`: the switch
    worker, which waits on this clock, wakes exactly at each deadline, in order, and does all
    it has to do at that moment before time moves on. So the executor sees iterations exactly
    as long as the test says and issues every switch exactly when it is due, whatever else the
    machine runs: tests assert exact times, not tolerances a busy machine cannot give.

    Parameters
    ----------
    settled
        True when the threads that do not wait on this clock have nothing left to do at the
        current time (the executor's issuer: :meth:`SwitchIssuer.idle`); asked, with whether
        a thread is waiting on the clock, before each step.
    start_s
        The time at the start (s).
    """

    #: Real seconds to wait for the other threads to settle before calling it a hang.
    HANG_S = 60.0

    def __init__(self, settled: Callable[[], bool] = lambda: True, start_s: float = 100.0):
        self.t = start_s
        self.settled = settled
        self._cond = threading.Condition()
        self._waiters: dict[int, tuple[float, threading.Event]] = {}

    def now(self) -> float:
        return self.t

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        me = threading.get_ident()
        with self._cond:
            deadline = self.t + max(timeout_s, 0.0)
            self._waiters[me] = (deadline, event)
            try:
                while not event.is_set() and self.t < deadline:
                    self._cond.wait(0.001)  # an event does not notify: look again soon
            finally:
                del self._waiters[me]
            return event.is_set()

    def _blocked(self) -> list[float]:
        """The deadlines of the threads still waiting (their event unset, their time ahead)."""
        return [d for d, e in self._waiters.values() if not e.is_set() and d > self.t]

    def _settle(self) -> None:
        give_up = time.monotonic() + self.HANG_S
        while True:
            with self._cond:
                if self._blocked() or (self.settled() and not self._waiters):
                    return
            if time.monotonic() > give_up:
                raise AssertionError("the threads on the manual clock never settled")
            time.sleep(2e-4)

    def sleep(self, dt_s: float) -> None:
        """Move the time ``dt_s`` on, waking each waiting thread at its deadline on the way."""
        target = self.t + dt_s
        while True:
            self._settle()
            with self._cond:
                due = [d for d in self._blocked() if d <= target]
                self.t = min(due) if due else target
                self._cond.notify_all()
                if not due:
                    return


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Every test's tuning cache and records of clocks left set in a folder of its own.

    (Never the user's ``~/.cache/opdvfs``; a test that names its own cache still does.)
    """
    monkeypatch.setenv("OPDVFS_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(autouse=True)
def _gpu_claims_given_back():
    """Every GPU claim a test takes in this process is given back by its end.

    A claim left held (an NVML actuator never closed) holds its GPU's lock for the rest of the
    run: a later test's claim of that GPU is then counted onto it instead of taking the lock.
    The leak fails the test that made it, and is released so the tests after it are not blamed.
    """
    yield
    gpu_select = sys.modules.get("opdvfs.runtime.gpu_select")
    if gpu_select is None or not gpu_select._CLAIMS:
        return
    with gpu_select._CLAIMS_LOCK:
        leaked = dict(gpu_select._CLAIMS)
        gpu_select._CLAIMS.clear()
    for fd, _ in leaked.values():
        os.close(fd)
    pytest.fail(f"GPU claims left held by this test: {sorted(leaked)}", pytrace=False)
