"""The clock guard on real processes: the program's own signal handlers and checkpoints survive,
every ending signal and every later clock is guarded, a refused restore is an error that the
next start repairs (#33).

Each test runs a small script in a subprocess and sends it real signals. The scripts use the
dry-run actuator (its log records every set and restore) or, for a reset the driver refuses,
a fake ``pynvml`` (``fixtures/fake_nvml``) whose locked clock outlives the process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import FIXTURES, read_log

pytestmark = [
    pytest.mark.slow,  # subprocesses
    pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="POSIX signals"),
]

SRC = str(Path(__file__).resolve().parents[1] / "src")
PRELUDE = """
import json, os, signal, sys, time
from opdvfs.runtime.actuators import ClockGuard, DryRunActuator
act = DryRunActuator([1000.0, 1800.0], log={log!r})
"""


def _start(code: str, env: dict[str, str] | None = None, **fmt: str) -> subprocess.Popen:
    script = textwrap.dedent(PRELUDE) + textwrap.dedent(code)
    return subprocess.Popen(
        [sys.executable, "-c", script.format(**fmt)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": SRC, **(env or {})},
    )


def _ready(proc: subprocess.Popen) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line == "ready", (line, proc.stderr.read() if proc.stderr else "")


def _finish(proc: subprocess.Popen, timeout_s: float = 60) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout_s)
    finally:
        proc.kill()
    return proc.returncode, err


def _signalled(code: str, sig: int = signal.SIGTERM, **fmt: str) -> tuple[int, str]:
    """Start the script, send it ``sig`` once it is ready; return its status and stderr."""
    proc = _start(code, **fmt)
    _ready(proc)
    proc.send_signal(sig)
    return _finish(proc)


def _kinds(log: Path) -> list[str]:
    return [c["kind"] for c in read_log(log)]


# ------------------------------------------------------------------ the program's handlers
def test_a_handler_installed_after_the_guard_writes_its_whole_checkpoint(tmp_path):
    """The SLURM/Kubernetes pattern: catch SIGTERM, save for 3 s (past the guard's 1 s grace),
    exit with the script's own status. Nothing cuts it short; the clock is restored first."""
    log, ckpt = tmp_path / "calls.jsonl", tmp_path / "ckpt.txt"
    status, err = _signalled(
        """
        def checkpoint(signum, frame):
            with open({ckpt!r}, "w") as f:
                for i in range(30):
                    f.write("%d\\n" % i); f.flush(); time.sleep(0.1)
            sys.exit(7)
        with ClockGuard(act):
            act.set_freq_mhz(1000.0)
            signal.signal(signal.SIGTERM, checkpoint)
            print("ready", flush=True)
            while True:
                time.sleep(0.05)
        """,
        log=str(log),
        ckpt=str(ckpt),
    )
    assert status == 7, err
    assert ckpt.read_text().split() == [str(i) for i in range(30)]  # whole
    assert _kinds(log) == ["run", "set", "restore"]


def test_a_handler_installed_before_the_guard_runs_after_the_restore(tmp_path):
    """A handler the script had before opdvfs is called (it was not, #33), after the restore:
    the handler itself reads the log and finds the restore there."""
    log, ckpt = tmp_path / "calls.jsonl", tmp_path / "ckpt.json"
    status, err = _signalled(
        """
        def checkpoint(signum, frame):
            kinds = [json.loads(line)["kind"] for line in open({log!r})]
            time.sleep(2)  # longer than the guard's grace
            with open({ckpt!r}, "w") as f:
                json.dump({{"signal": signum, "log": kinds}}, f)
            sys.exit(5)
        signal.signal(signal.SIGTERM, checkpoint)
        with ClockGuard(act):
            act.set_freq_mhz(1000.0)
            print("ready", flush=True)
            while True:
                time.sleep(0.05)
        """,
        log=str(log),
        ckpt=str(ckpt),
    )
    assert status == 5, err
    saved = json.loads(ckpt.read_text())
    assert saved == {"signal": signal.SIGTERM, "log": ["run", "set", "restore"]}
    assert _kinds(log) == ["run", "set", "restore"]  # exactly one restore


def test_a_script_that_catches_the_signal_and_trains_on_is_restored_again(tmp_path):
    """Clocks set after the signal's restore re-arm the guard: the run ends restored."""
    log = tmp_path / "calls.jsonl"
    status, err = _signalled(
        """
        caught = []
        signal.signal(signal.SIGUSR1, lambda s, f: caught.append(s))
        with ClockGuard(act) as guard:
            act.set_freq_mhz(1000.0)
            print("ready", flush=True)
            while not caught:
                time.sleep(0.05)
            assert guard.restored
            act.set_freq_mhz(1800.0)  # the sweep goes on after the warning
            act.set_freq_mhz(1000.0)
            assert not guard.restored
        print("restores", guard.restores, file=sys.stderr)
        """,
        signal.SIGUSR1,
        log=str(log),
    )
    assert status == 0, err
    assert "restores 2" in err
    calls = [(c["kind"], c.get("freq_mhz")) for c in read_log(log)]
    assert calls[1:] == [
        ("set", 1000.0),
        ("restore", None),
        ("set", 1800.0),
        ("set", 1000.0),
        ("restore", None),
    ]


@pytest.mark.parametrize("name", ["SIGHUP", "SIGUSR1", "SIGUSR2", "SIGQUIT"])
def test_every_ending_signal_restores_then_ends_as_its_default(tmp_path, name):
    log, sig = tmp_path / "calls.jsonl", getattr(signal, name)
    status, err = _signalled(
        """
        with ClockGuard(act):
            act.set_freq_mhz(1000.0)
            print("ready", flush=True)
            time.sleep(60)
        """,
        sig,
        log=str(log),
    )
    assert status == 128 + sig, err
    assert _kinds(log) == ["run", "set", "restore"]


def test_an_ignored_signal_stays_ignored(tmp_path):
    """Under nohup SIGHUP is ignored: the guard leaves it so, and the run goes on."""
    log = tmp_path / "calls.jsonl"
    proc = _start(
        """
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        with ClockGuard(act):
            act.set_freq_mhz(1000.0)
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.2)
            act.set_freq_mhz(1800.0)
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        """,
        log=str(log),
    )
    status, err = _finish(proc)
    assert status == 0, err
    assert _kinds(log) == ["run", "set", "set", "restore"]


def test_the_watchdog_ends_a_stuck_main_thread_only_under_the_guards_own_handler(tmp_path):
    """Main thread blocked in native code with a handler of the script's installed after the
    guard: the watcher restores and does not kill (the handler runs when the thread returns)."""
    log = tmp_path / "calls.jsonl"
    status, err = _signalled(
        """
        with ClockGuard(act):
            act.set_freq_mhz(1000.0)
            signal.signal(signal.SIGTERM, lambda s, f: sys.exit(9))
            signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGTERM}})
            print("ready", flush=True)
            time.sleep(3)  # "native": the main thread cannot take the signal for 3 s
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGTERM}})
            time.sleep(30)
        """,
        log=str(log),
    )
    assert status == 9, err  # the script's handler, after the block: not 143 at 1 s
    assert _kinds(log) == ["run", "set", "restore"]


# --------------------------------------------------------- a refused reset, and its repair
def _nvml_env(tmp_path: Path, refuse: bool) -> dict[str, str]:
    state = tmp_path / "nvml.json"
    doc = json.loads(state.read_text()) if state.exists() else {"locked_mhz": None}
    doc["refuse_reset"] = refuse
    state.write_text(json.dumps(doc))
    return {
        "FAKE_NVML_STATE": str(state),
        "PYTHONPATH": os.pathsep.join([str(FIXTURES / "fake_nvml"), SRC]),
    }


def _locked(tmp_path: Path) -> float | None:
    return json.loads((tmp_path / "nvml.json").read_text())["locked_mhz"]


NVML_RUN = """
from opdvfs.runtime.actuators import NvmlActuator
with NvmlActuator() as gpu, ClockGuard(gpu):
    gpu.set_freq_mhz(1005.0)
    print("ready", flush=True)
    {then}
"""


def test_a_refused_reset_is_an_error_and_the_next_start_repairs_it(tmp_path):
    records = Path(os.environ["OPDVFS_CACHE_DIR"]) / "clocks"
    proc = _start(NVML_RUN, _nvml_env(tmp_path, refuse=True), log="", then="pass")
    status, err = _finish(proc)
    assert status != 0
    assert "ClockNotRestoredError: could not restore gpu0's clock" in err
    assert "opdvfs restore" in err
    assert _locked(tmp_path) == 1005
    (record,) = records.glob("*-gpu0.json")
    assert json.loads(record.read_text())["freq_mhz"] == 1005.0

    # the driver allows it again: the next guarded start on gpu0 restores and says so
    env = _nvml_env(tmp_path, refuse=False)
    proc = _start(NVML_RUN, env, log="", then="assert False, 'stop here'")
    status, err = _finish(proc)
    assert "gpu0's clock was left locked at 1005 MHz by pid" in err and "restored" in err
    assert "stop here" in err  # the script's own exception, after its own set and restore
    assert _locked(tmp_path) is None and not list(records.glob("*.json"))
    calls = read_log(tmp_path / "nvml.json.calls")
    assert [c["kind"] for c in calls] == ["set", "refused", "reset", "set", "reset"]


def test_a_refused_reset_at_a_signal_is_one_line_and_a_non_zero_exit(tmp_path):
    proc = _start(NVML_RUN, _nvml_env(tmp_path, refuse=True), log="", then="time.sleep(60)")
    _ready(proc)
    proc.send_signal(signal.SIGTERM)
    status, err = _finish(proc)
    assert status == 128 + signal.SIGTERM
    lines = [line for line in err.splitlines() if "could not restore" in line]
    assert len(lines) == 1 and lines[0].startswith("opdvfs: error: could not restore gpu0")


def test_opdvfs_restore_repairs_a_clock_a_killed_run_left(tmp_path):
    env = _nvml_env(tmp_path, refuse=False)
    proc = _start(NVML_RUN, env, log="", then="time.sleep(60)")
    _ready(proc)
    proc.kill()  # SIGKILL: nothing in the process can restore
    proc.wait(timeout=30)
    assert _locked(tmp_path) == 1005

    def restore() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "opdvfs", "restore"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **env},
            check=False,
        )

    done = restore()
    assert done.returncode == 0, done.stderr
    assert "gpu0: locked at 1005 MHz by pid" in done.stdout and "restored" in done.stdout
    assert _locked(tmp_path) is None
    again = restore()
    assert again.returncode == 0 and "no clock left set" in again.stdout


# ------------------------------------------------------------------------- whole files
def test_a_signal_while_files_are_written_leaves_no_temporary_file(tmp_path):
    proc = _start(
        """
        from opdvfs._files import atomic_path
        with atomic_path({dest!r}) as tmp:  # no guard, no handler: SIGTERM's default
            tmp.write_text("half")
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
        """,
        log="",
        dest=str(tmp_path / "out" / "tune.json"),
    )
    status, err = _finish(proc)
    assert status == 128 + signal.SIGTERM, err
    assert list((tmp_path / "out").iterdir()) == []
