"""Where the executors read the time and wait for it: the system's clock, or a test's.

The operator-boundary and time-anchored executors (their iteration ends, their anchors) and the
switch worker that issues their switches all read one :class:`Clock`; a test hands them one it
moves by hand (``tests/conftest.py::ManualClock``), so it can assert exact times on a busy
machine.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

__all__ = ["SYSTEM_CLOCK", "Clock"]


class Clock(Protocol):
    """Where the executors read the time and wait for it (seconds on a monotonic time line)."""

    def now(self) -> float:
        """Return the time (s); only differences mean anything."""

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        """Block until ``event`` is set or ``timeout_s`` has passed; return whether it is set."""


class _SystemClock:
    """``time.perf_counter`` (Linux: ``CLOCK_MONOTONIC``, as ``time.monotonic``)."""

    def now(self) -> float:
        return time.perf_counter()

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        return event.wait(timeout_s)


#: The real clock, which both executors use unless they are given another.
SYSTEM_CLOCK: Clock = _SystemClock()
