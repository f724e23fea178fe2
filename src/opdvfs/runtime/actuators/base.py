"""The actuator interface: four methods between the executor and a device's clock control.

Implementations: :mod:`~opdvfs.runtime.actuators.nvml` (NVIDIA, nvidia-ml-py),
:mod:`~opdvfs.runtime.actuators.dry_run` (records what would be set), and the simulator's twin.
:class:`ClockGuard` makes sure a clock set through an actuator is restored on normal exit, on an
exception, at interpreter exit and on SIGINT/SIGTERM.
"""

from __future__ import annotations

import atexit
import signal
import threading
import warnings
from abc import ABC, abstractmethod
from collections.abc import Sequence
from types import FrameType, TracebackType
from typing import Any, Self

__all__ = ["Actuator", "ClockGuard"]


class Actuator(ABC):
    """Read and set one device's core clock."""

    @abstractmethod
    def supported_freqs_mhz(self) -> Sequence[float]:
        """Clocks the device accepts, ascending (MHz)."""

    @abstractmethod
    def set_freq_mhz(self, freq_mhz: float) -> None:
        """Lock the core clock at ``freq_mhz`` (an element of :meth:`supported_freqs_mhz`)."""

    @abstractmethod
    def reset(self) -> None:
        """Give the clock back to the driver's default management."""

    @abstractmethod
    def read_power_w(self) -> float:
        """Return the current power draw (W) as the device reports it."""


class ClockGuard:
    """Restore an actuator's clock however the guarded block ends.

    ``with ClockGuard(actuator): ...`` resets the clock when the block exits (normally or by an
    exception), at interpreter exit (``atexit``) and on SIGINT/SIGTERM (then re-raises the
    signal's default behaviour: KeyboardInterrupt, or exit status 128 + 15). Previous signal
    handlers are put back on exit. Reset happens once, whichever path comes first.
    """

    def __init__(self, actuator: Actuator) -> None:
        self.actuator = actuator
        self._done = threading.Lock()
        self._restored = False
        self._previous: dict[int, Any] = {}

    def restore(self) -> None:
        """Reset the clock now (idempotent); a failing reset is reported, not raised."""
        with self._done:
            if self._restored:
                return
            self._restored = True
        try:
            self.actuator.reset()
        except Exception as exc:  # restoring must never mask the original error
            warnings.warn(f"opdvfs: could not restore the clock: {exc}", stacklevel=2)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.restore()
        previous = self._previous.get(signum)
        signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    def __enter__(self) -> Self:
        atexit.register(self.restore)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.restore()
        atexit.unregister(self.restore)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
