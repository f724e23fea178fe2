"""The actuator interface: what the executor, the issuer and the CLI call on a device's clock.

An :class:`Actuator` declares every method its callers use, so none probes for a type or an
attribute. Four are abstract (the clocks it accepts, set, reset, read power); the others have
defaults a device overrides when it can do more:

* :meth:`~Actuator.at` (where in the program the next call happens; ignored by default),
  :meth:`~Actuator.read_energy_j` (``None``: no energy counter), :meth:`~Actuator.close` and the
  context manager (release the device's library; nothing to release by default);
* what it is and what it has, as read-only queries (in the manner of Zeus's
  ``zeus/device/gpu/common.py``, where an optional capability is a query):

  - :attr:`~Actuator.kind` -- the name :func:`~opdvfs.runtime.actuators.make_actuator` builds it
    by (``"nvml"``, ``"zeusd"``, ``"ascend"``, ``"dry-run"``, ``"twin"``, ``"sim:a100-like"``);
  - :attr:`~Actuator.current_mhz` -- the clock it last locked (MHz), or ``None``: the driver's;
  - :attr:`~Actuator.meter` -- a read-only :class:`Meter` of the device the program runs on
    (power W, energy J, temperature deg C, name), or ``None``: nothing measured through it;
  - :attr:`~Actuator.timeline` -- the simulated GPU whose virtual clock the program runs on
    (``sim:PRESET``), or ``None``: the program runs on wall time;
  - :attr:`~Actuator.preset` -- the device preset it simulates (``sim:PRESET``, ``twin``), or
    ``None``: a real device, or a recorder that simulates nothing;
  - :attr:`~Actuator.twin` -- the simulated device the issued switches are replayed on
    (:meth:`~Actuator.replay`; the ``twin`` actuator), or ``None``;

* what only a simulated device does, a no-op elsewhere: :meth:`~Actuator.mark_iteration` (end an
  iteration on a device that counts its own), :meth:`~Actuator.cancel_pending` (drop the clock
  requests waiting on its timeline); and :meth:`~Actuator.replay`, which an actuator without a
  :attr:`~Actuator.twin` refuses.

Implementations, one module per kind beside this one: :mod:`~opdvfs.runtime.actuators.nvml`
(NVIDIA, nvidia-ml-py, as root), :mod:`~opdvfs.runtime.actuators.zeusd` (the same GPU without
root: clock writes through Zeus's daemon), :mod:`~opdvfs.runtime.actuators.ascend` (Ascend NPUs:
logs requests, reads through DCMI), :mod:`~opdvfs.runtime.actuators.dry_run` (records what would
be set, optionally measuring the GPU it runs on), :mod:`~opdvfs.runtime.actuators.twin` (records,
then replays the issued switches on the simulator) and :mod:`~opdvfs.runtime.actuators.sim_gpu`
(a simulated GPU, :class:`~opdvfs.sim.gpu.SimulatedGpu`, that the program's operators run on).
:class:`ClockGuard` makes sure a clock set through an actuator is restored on normal exit, on an
exception, at interpreter exit and on every signal that ends a job (:data:`GUARDED_SIGNALS`),
and hands each signal on to the program's own handler.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import sys
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self

from opdvfs.exceptions import ClockNotRestoredError, NotSupportedError, UnsupportedClockError

if TYPE_CHECKING:
    from opdvfs.result import RunResult
    from opdvfs.sim.gpu import SimulatedGpu
    from opdvfs.sim.twin import SimulatedDevice
    from opdvfs.workloads.workload import Workload

__all__ = ["GUARDED_SIGNALS", "Actuator", "ClockGuard", "Meter"]


class Meter(Protocol):
    """A device's read-only sensors (an :class:`~opdvfs.runtime.actuators.nvml.NvmlReader`).

    What :attr:`Actuator.meter` returns: it reads, and never sets anything.
    """

    def read_power_w(self) -> float:
        """Return the power draw (W)."""

    def read_energy_j(self) -> float:
        """Return the energy counter (J, from an arbitrary origin)."""

    def read_temperature_c(self) -> float:
        """Return the die temperature (deg C)."""

    def name(self) -> str:
        """Return the device's product name (e.g. ``"NVIDIA H200"``)."""

    def close(self) -> None:
        """Release the sensors."""


class Actuator(ABC):
    """Read and set one device's core clock.

    Units: clocks in MHz, power in W, energy in J. Use it as a context manager to release the
    device's library on exit (:meth:`close`); restoring the clock is :class:`ClockGuard`'s job.
    """

    @abstractmethod
    def supported_freqs_mhz(self) -> Sequence[float]:
        """Return the clocks the device accepts (MHz), ascending."""

    @abstractmethod
    def set_freq_mhz(self, freq_mhz: float) -> None:
        """Lock the core clock at ``freq_mhz`` (MHz).

        The device is reached only when the clock changes: setting the clock it is already
        locked at does nothing.

        Raises
        ------
        UnsupportedClockError
            If ``freq_mhz`` is not one of :meth:`supported_freqs_mhz`.
        """

    @abstractmethod
    def reset(self) -> None:
        """Give the clock back to the driver's default management (safe to call repeatedly)."""

    @abstractmethod
    def read_power_w(self) -> float:
        """Return the current power draw (W) as the device reports it."""

    def check_freq_mhz(self, freq_mhz: float) -> float:
        """Return ``freq_mhz`` (MHz) as a float if the device accepts it.

        Raises
        ------
        UnsupportedClockError
            If it is not one of :meth:`supported_freqs_mhz` (the message gives their range).
        """
        freqs = self.supported_freqs_mhz()
        if freq_mhz not in freqs:
            accepted = f"{min(freqs):g}-{max(freqs):g} MHz, {len(freqs)} steps" if freqs else "none"
            raise UnsupportedClockError(
                f"{freq_mhz:g} MHz is not a supported clock of this device ({accepted})",
                field="freq_mhz",
            )
        return float(freq_mhz)

    def at(
        self, iteration: int | None, op_index: int | None, offset_s: float | None = None
    ) -> None:
        """Tell the actuator where in the program its next call happens.

        Recording actuators (dry run, Ascend, twin) store it with each call; the default
        ignores it.

        Parameters
        ----------
        iteration
            Training iteration (0-based; optimizer steps counted), or None outside any.
        op_index
            Position of the trigger operator in that iteration (0-based), or None: a switch
            issued by time (``--trigger time``), counted from the iteration's start.
        offset_s
            Seconds after that operator started (or after the iteration started, for
            ``op_index`` None) that the call is issued, on the plan's time line; None: at once.
        """
        return None

    def read_energy_j(self) -> float | None:
        """Return the device's energy counter (J, from an arbitrary origin), or None without one.

        The executor reads it at each iteration end; differences are the energy used between.
        """
        return None

    def close(self) -> None:
        """Release what the actuator holds (a vendor library, a log file); the clock is untouched.

        Safe to call more than once. The default holds nothing.
        """
        return None

    # ------------------------------------------------------------------- what it is and has
    @property
    def kind(self) -> str:
        """The name :func:`~opdvfs.runtime.actuators.make_actuator` builds it by.

        ``"nvml"``, ``"zeusd"``, ``"ascend"``, ``"dry-run"``, ``"twin"`` or ``"sim:PRESET"``
        (``"sim:a100-like"``); an actuator defined elsewhere: its class's name.
        """
        return type(self).__name__

    @property
    def current_mhz(self) -> float | None:
        """The clock it last locked (MHz), or None: the driver manages the clock.

        None before the first :meth:`set_freq_mhz` and after :meth:`reset`. What was asked of
        the device, not a reading: a switch takes the device's latency to land. The default
        keeps no record (None).
        """
        return None

    @property
    def meter(self) -> Meter | None:
        """Read-only sensors of the device the program runs on, or None: none to read through.

        The NVML reader of ``nvml`` and ``zeusd``, and of a dry run measuring the GPU it runs
        on: power (W), the energy counter (J), the die temperature (deg C) and the device's
        name, never a write. None by default (a simulated GPU's instruments are its
        :attr:`timeline`'s).
        """
        return None

    @property
    def timeline(self) -> SimulatedGpu | None:
        """The simulated GPU whose virtual clock the program runs on, or None: wall time.

        ``sim:PRESET``: the program's operators run on that device, and its times, energy,
        sensors and switch latency are the device's own (virtual s, J, deg C), which only the
        operators advance, so switches go on its timeline and nothing waits in host time.
        """
        return None

    @property
    def preset(self) -> str | None:
        """The device preset it simulates (``sim:PRESET``'s GPU, the twin's device), or None.

        A schedule planned for another preset does not run on it. None: a real device, or a
        recorder that simulates nothing (whose clocks may still be a preset's).
        """
        return None

    @property
    def twin(self) -> SimulatedDevice | None:
        """The simulated device the issued switches replay on (:meth:`replay`), or None.

        The ``twin`` actuator's: it also times a plan for ``--trigger time``. The program does
        not run on it (its time is the host's: :attr:`timeline` is None).
        """
        return None

    def mark_iteration(self) -> None:
        """End an iteration on the device, where the device counts its own (a simulated GPU).

        ``--iteration-at`` calls it at each iteration's end; optimizer steps end a simulated
        GPU's iterations by themselves. Nothing by default.
        """
        return None

    def give_back(self) -> None:
        """Give the clock back to the driver even if this actuator did not set it.

        The repair of a clock an earlier, dead process left set (``opdvfs restore``); where
        :meth:`reset` touches only a clock this actuator set, this one always does. The same as
        :meth:`reset` unless a subclass tells the two apart.
        """
        self.reset()

    def cancel_pending(self) -> None:
        """Drop the clock requests waiting on the device's timeline for a later time.

        As a switch worker's cancel (the executor's, on a real device): nothing queued lands
        after it; a request already issued still does, and :attr:`current_mhz` becomes the
        clock the device settles at. Only a simulated GPU holds requests: nothing by default.
        """
        return None

    def replay(
        self, workload: Workload, *, iteration: int | None = None, iterations: int = 2
    ) -> tuple[RunResult, RunResult]:
        """Run the switches issued in ``iteration`` and the top clock on :attr:`twin`.

        Parameters
        ----------
        workload
            The captured workload the program runs (its operators, as the twin simulates them).
        iteration
            The iteration whose switches are replayed; default the last with any.
        iterations
            Iterations each run simulates.

        Returns
        -------
        tuple of RunResult
            ``(issued, top clock)``.

        Raises
        ------
        NotSupportedError
            Without a :attr:`twin` (every actuator but ``twin``).
        """
        raise NotSupportedError(f"the {self.kind} actuator has no twin to replay its switches on")

    def __enter__(self) -> Self:
        """Return the actuator; the ``with`` block's end closes it."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the actuator (:meth:`close`); an exception in the block propagates."""
        self.close()


#: The signals a guard catches: each ends a job (or warns it of its end: SLURM's
#: ``--signal=USR1@N``) with the clock still set if nobody restores it. SIGHUP: a dropped ssh
#: session; SIGQUIT: Ctrl-\\.
GUARDED_SIGNALS: tuple[int, ...] = tuple(
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGQUIT")
    if hasattr(signal, name)
)


class ClockGuard:
    """Restore an actuator's clock however the guarded block ends, and after every signal.

    ``with ClockGuard(actuator): ...`` resets the clock when the block exits (normally or by an
    exception), at interpreter exit (``atexit``) and on each of :data:`GUARDED_SIGNALS`
    (SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2, SIGQUIT; one the process ignores, as under
    ``nohup``, stays ignored). A reset happens only when a clock may be set: any
    :meth:`~Actuator.set_freq_mhz` after a restore re-arms the guard, so a program that catches
    a signal and trains on (while a sweep sets more clocks) is restored again at its end.

    **A signal is the program's.** The guard restores the clock first, then hands the signal
    to whatever the program installed: a handler installed before the guard is called (a
    checkpoint-and-exit handler runs to its end: nothing cuts it short); one installed after
    it replaces the guard's own, and the watcher thread below still restores the clock before
    it runs. Without a handler of the program's, the signal's default action is taken as an
    exception, so ``finally`` blocks and ``atexit`` run: ``KeyboardInterrupt`` for SIGINT,
    ``SystemExit(128 + signum)`` for the others.

    Python runs a signal's handler only between bytecodes of the main thread, so a main thread
    blocked in a native call (a collective waiting for a dead rank, a CUDA synchronise) would
    never run it, and a launcher's SIGKILL would find the clock still set. So the C-level
    handler's wakeup byte (:func:`signal.set_wakeup_fd`) also wakes a watcher thread, which
    restores the clock at once. Only while the guard's own handler is the one installed, and
    the signal's default action would end the process, does the watcher end it (status
    128 + signum) when the main thread has not taken the signal within :attr:`exit_grace_s`.

    **A refused reset is an error**: one line on stderr (``opdvfs: error: ...``), the guard
    stays armed (every later path tries again), the block's end raises
    :class:`~opdvfs.exceptions.ClockNotRestoredError` unless the block raised its own (which
    wins), and the record of the clock left set stays for the next start to repair. That
    record (:mod:`~opdvfs.runtime.actuators.left_set`) is written when a real GPU's clock is
    first locked and removed by each restore; entering a guard repairs a record a dead
    process left for the same GPU, and says so on stderr.

    Parameters
    ----------
    actuator
        The actuator whose clock is guarded.
    before_restore
        Called first on every path (e.g. :meth:`ScheduleExecutor.halt`), so no switch is issued
        after the restore; it must not block.
    """

    #: Seconds the main thread has to take a signal before the watcher ends the process.
    exit_grace_s: float = 1.0
    #: Seconds a restore waits for one under way in another thread (the watcher's) to finish.
    restore_wait_s: float = 10.0

    def __init__(
        self, actuator: Actuator, *, before_restore: Callable[[], None] | None = None
    ) -> None:
        self.actuator = actuator
        self.before_restore = before_restore
        self._lock = threading.RLock()  # re-entered by a signal handler interrupting a restore
        self._armed = False
        #: Completed restores (resets that succeeded).
        self.restores = 0
        #: The last refused reset, or None (cleared by a restore that succeeds).
        self.error: Exception | None = None
        #: The guarded signals received while entered, in order.
        self.signals: list[int] = []
        self._reported = False
        self._previous: dict[int, Any] = {}
        self._handler = self._on_signal  # one bound method: compared with what is installed
        self._handled = threading.Event()
        self._wakeup: tuple[socket.socket, socket.socket] | None = None
        self._old_wakeup_fd = -1
        self._watcher: threading.Thread | None = None
        self._gpu: str | None = None
        self._record: Any = None
        self._wrapper: Callable[[float], None] | None = None
        self._unwrapped: Any = None

    @property
    def restored(self) -> bool:
        """Whether the clock has been restored and not set again since."""
        return self.restores > 0 and not self._armed

    def restore(self) -> bool:
        """Reset the clock now if one may be set since the last restore; return whether it is.

        Safe in a signal handler and from any thread: a restore under way in another thread
        finishes first (at most :attr:`restore_wait_s`); a failing reset is reported on stderr
        (once per arming), kept in :attr:`error` and leaves the guard armed, never raised.
        """
        return self._restore(report=True)

    def _restore(self, *, report: bool) -> bool:
        if not self._armed:
            return self.error is None
        if not self._lock.acquire(timeout=self.restore_wait_s):
            return False
        try:
            if not self._armed:
                return self.error is None
            self._armed = False
            try:
                if self.before_restore is not None:
                    self.before_restore()
                self.actuator.reset()
            except Exception as exc:  # restoring must never mask the program's own error
                self._armed = True
                self.error = exc
                if report:
                    self._report_failure()
                return False
            self.restores += 1
            self.error = None
            self._reported = False
            self._drop_record()
            return True
        finally:
            self._lock.release()

    def failure_message(self) -> str:
        """One line: the clock that could not be restored and what to do (empty if none)."""
        if self.error is None:
            return ""
        what = f"{self._gpu}'s clock" if self._gpu else "the clock"
        hint = "; it stays locked: run `opdvfs restore` as root" if self._gpu else ""
        return f"could not restore {what}: {self.error}{hint}"

    def _report_failure(self) -> None:
        if self._reported:
            return
        self._reported = True
        with contextlib.suppress(Exception):
            sys.stderr.write(f"opdvfs: error: {self.failure_message()}\n")
            sys.stderr.flush()

    # ------------------------------------------------------------------- the record on disk
    def _arm(self, freq_mhz: float) -> None:
        self._armed = True
        if self._gpu is not None and self._record is None:
            from opdvfs.runtime.actuators.left_set import write_record

            self._record = write_record(self.actuator, self._gpu, freq_mhz) or False

    def _drop_record(self) -> None:
        if not self._record:
            self._record = None
            return
        from opdvfs.runtime.actuators.left_set import read_record

        path, self._record = self._record, None
        doc = read_record(path)
        if doc is not None and doc.get("pid") == os.getpid():  # not another run's, since
            with contextlib.suppress(OSError):
                path.unlink()

    def _repair(self) -> None:
        from opdvfs.runtime.actuators.left_set import gpu_identity, repair

        self._gpu = gpu_identity(self.actuator)
        if self._gpu is None:
            return
        try:
            line = repair(self.actuator)
        except Exception as exc:
            line = f"error: {self._gpu}'s clock was left locked by an earlier run, and: {exc}"
        if line:
            with contextlib.suppress(Exception):
                sys.stderr.write(f"opdvfs: {line}\n")
                sys.stderr.flush()

    def _wrap(self) -> None:
        """Re-arm on every clock set through the actuator (its ``set_freq_mhz``, wrapped)."""
        inner = self.actuator.set_freq_mhz
        guard = self

        def set_freq_mhz(freq_mhz: float) -> None:
            guard._arm(freq_mhz)  # before the write: a clock half-set is restored too
            inner(freq_mhz)

        self._unwrapped = self.actuator.__dict__.get("set_freq_mhz")
        try:
            setattr(self.actuator, "set_freq_mhz", set_freq_mhz)  # noqa: B010
        except AttributeError:  # an actuator that takes no attribute: set once, restored once
            return
        self._wrapper = set_freq_mhz

    def _unwrap(self) -> None:
        if self._wrapper is None or self.actuator.__dict__.get("set_freq_mhz") is not self._wrapper:
            return
        if self._unwrapped is None:
            del self.actuator.__dict__["set_freq_mhz"]
        else:
            self.actuator.__dict__["set_freq_mhz"] = self._unwrapped
        self._wrapper = None

    # ------------------------------------------------------------------------- the signals
    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._handled.set()
        if self._wakeup is None:  # else the watcher counts it (it sees every delivery)
            self.signals.append(signum)
        self.restore()  # first, before anything that can block
        previous = self._previous.get(signum, signal.SIG_DFL)
        if callable(previous):  # the program's own handler (or Python's for SIGINT): its turn
            previous(signum, frame)
            return
        signal.signal(signum, signal.SIG_DFL)  # a second signal while unwinding: the default
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    def _watch(self, reader: socket.socket) -> None:
        while True:
            try:
                data = reader.recv(64)
            except OSError:
                return
            if not data:  # the guard's exit closed the other end
                return
            if self._old_wakeup_fd != -1:  # whoever set a wakeup fd before still gets its bytes
                with contextlib.suppress(OSError):
                    os.write(self._old_wakeup_fd, data)
            for signum in data:
                if signum not in self._previous:
                    continue
                self.signals.append(signum)
                self.restore()
                if (
                    signum != signal.SIGINT
                    and self._previous.get(signum) == signal.SIG_DFL
                    and signal.getsignal(signum) == self._handler
                    and not self._handled.wait(self.exit_grace_s)
                ):
                    os._exit(128 + signum)  # the main thread is stuck in native code

    def _start_watcher(self) -> None:
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        try:
            self._old_wakeup_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        except ValueError:  # not the main thread of the main interpreter
            reader.close()
            writer.close()
            return
        self._wakeup = (reader, writer)
        self._watcher = threading.Thread(
            target=self._watch, args=(reader,), name="opdvfs-clock-guard", daemon=True
        )
        self._watcher.start()

    def _stop_watcher(self) -> None:
        if self._wakeup is None:
            return
        reader, writer = self._wakeup
        self._wakeup = None
        with contextlib.suppress(ValueError):
            signal.set_wakeup_fd(self._old_wakeup_fd)
        writer.close()
        if self._watcher is not None:
            self._watcher.join(timeout=1.0)
        reader.close()

    def __enter__(self) -> Self:
        """Repair a clock a dead run left on this GPU, arm, and catch the guarded signals."""
        self._repair()
        self._armed = True
        self._wrap()
        atexit.register(self.restore)
        if threading.current_thread() is threading.main_thread():
            for sig in GUARDED_SIGNALS:
                current = signal.getsignal(sig)
                if current is None or current == signal.SIG_IGN:
                    continue  # installed outside Python, or ignored (nohup): left as it is
                self._previous[sig] = signal.signal(sig, self._handler)
            self._start_watcher()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Restore, give the signals back (those still the guard's) and stop re-arming.

        Raises
        ------
        ClockNotRestoredError
            If the reset was refused and the block raised nothing of its own.
        """
        ok = self._restore(report=exc_type is not None)
        atexit.unregister(self.restore)
        for sig, handler in self._previous.items():
            if signal.getsignal(sig) == self._handler:  # one the program installed stays
                signal.signal(sig, handler)
        self._previous.clear()
        self._stop_watcher()
        self._unwrap()
        if not ok and exc_type is None:
            self._reported = True
            raise ClockNotRestoredError(self.failure_message())
