"""A record of a clock left set: written when a guarded clock is first locked, removed on restore.

A process killed with SIGKILL (or whose reset the driver refused) cannot restore its GPU's
clock. :class:`~opdvfs.runtime.actuators.ClockGuard` therefore writes one small JSON file per
GPU when it first locks a clock (the actuator's kind, the GPU, the clock, the process) and
removes it once the clock is given back. The next guarded start on that GPU finds a record
whose process is gone, resets the clock and says so (:func:`repair`); ``opdvfs restore`` does
the same by hand (:func:`records`).

The files live next to the tuning cache, in ``$OPDVFS_CACHE_DIR/clocks`` (default
``~/.cache/opdvfs/tune/clocks``), one per host and GPU (a home folder may be shared by nodes).
A GPU is named by :func:`gpu_identity`, the one place that says which GPU an actuator drives.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Protocol

from opdvfs._files import write_text_atomic

__all__ = [
    "CACHE_ENV",
    "default_cache_dir",
    "gpu_identity",
    "read_record",
    "record_path",
    "records",
    "repair",
    "state_dir",
]

#: Environment variable naming the cache folder (default ``~/.cache/opdvfs/tune``).
CACHE_ENV = "OPDVFS_CACHE_DIR"

#: Actuator kinds whose clock outlives the process (a real GPU's); the others keep no record.
REAL_KINDS = ("nvml", "zeusd")


class Actuator(Protocol):
    """What this module asks of an actuator (:class:`~opdvfs.runtime.actuators.Actuator`)."""

    @property
    def kind(self) -> str:
        """Its kind (``"nvml"``)."""

    def give_back(self) -> None:
        """Give the clock back to the driver, whoever set it."""


def default_cache_dir() -> Path:
    """Return the cache folder: ``$OPDVFS_CACHE_DIR``, else ``~/.cache/opdvfs/tune`` (absolute)."""
    env = os.environ.get(CACHE_ENV)
    return (Path(env) if env else Path.home() / ".cache" / "opdvfs" / "tune").absolute()


def state_dir() -> Path:
    """Return the folder of the records of clocks left set (``clocks`` in the cache folder)."""
    return default_cache_dir() / "clocks"


def gpu_identity(actuator: Actuator) -> str | None:
    """Return the name of the GPU ``actuator`` drives (``"gpu0"``), or None: no real clock.

    Today the NVML index (what :class:`~opdvfs.runtime.actuators.NvmlActuator` and
    :class:`~opdvfs.runtime.actuators.ZeusdActuator` are opened by); the one function to change
    for a UUID.
    """
    if actuator.kind not in REAL_KINDS:
        return None
    device = getattr(actuator, "device", None)
    try:
        index = int(device.lib.nvmlDeviceGetIndex(device.handle))  # type: ignore[union-attr]
    except Exception:  # no index to read: the record names the actuator's own
        index = int(getattr(actuator, "gpu_id", 0) or 0)
    return f"gpu{index}"


def record_path(gpu: str, host: str | None = None) -> Path:
    """Return the record file of ``gpu`` on ``host`` (default this host; one per GPU)."""
    return state_dir() / f"{host or socket.gethostname()}-{gpu}.json"


def write_record(actuator: Actuator, gpu: str, freq_mhz: float) -> Path | None:
    """Record that this process locked ``gpu`` at ``freq_mhz`` (MHz); None if it could not.

    A failed write never stops the job: the clock is still restored on every path this
    process lives through; only a later repair needs the file.
    """
    path = record_path(gpu)
    doc = {
        "kind": actuator.kind,
        "gpu": gpu,
        "host": socket.gethostname(),
        "freq_mhz": float(freq_mhz),
        "pid": os.getpid(),
        "time_s": time.time(),
    }
    try:
        write_text_atomic(path, json.dumps(doc))
    except Exception:
        return None
    return path


def read_record(path: Path) -> dict[str, Any] | None:
    """Return the record in ``path``, or None (absent or unreadable)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not {"kind", "gpu", "pid"} <= doc.keys():
        return None
    return doc


def records() -> list[tuple[Path, dict[str, Any]]]:
    """Return this host's records of clocks left set, by file name."""
    found = []
    for path in sorted(state_dir().glob(f"{socket.gethostname()}-*.json")):
        doc = read_record(path)
        if doc is not None:
            found.append((path, doc))
    return found


def process_alive(pid: int) -> bool:
    """Return whether a process ``pid`` runs on this host (another than this one counts)."""
    if pid == os.getpid():
        return False  # an earlier run in this process: its guard is gone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def describe(doc: dict[str, Any]) -> str:
    """Return ``"locked at 1005 MHz by pid 123 (2026-12-05 17:00 UTC)"`` for a record."""
    when = ""
    if isinstance(doc.get("time_s"), int | float):
        when = time.strftime(" (%Y-%m-%d %H:%M UTC)", time.gmtime(float(doc["time_s"])))
    freq = doc.get("freq_mhz")
    at = f" at {float(freq):g} MHz" if isinstance(freq, int | float) else ""
    return f"locked{at} by pid {doc['pid']}{when}"


def repair(actuator: Actuator) -> str | None:
    """Reset the clock an earlier, dead process left set on ``actuator``'s GPU; say what was done.

    Returns
    -------
    str or None
        One line for stderr, or None: no record for this GPU, or its process still runs (its
        own guard will restore), or the actuator has no real clock.

    Raises
    ------
    ActuatorError
        If the reset is refused (the record stays).
    """
    gpu = gpu_identity(actuator)
    if gpu is None:
        return None
    path = record_path(gpu)
    doc = read_record(path)
    if doc is None or process_alive(int(doc["pid"])):
        return None
    actuator.give_back()  # (this actuator did not set it: reset() would leave it)
    with contextlib.suppress(OSError):
        path.unlink()
    return f"{gpu}'s clock was left {describe(doc)}, which has ended: restored"
