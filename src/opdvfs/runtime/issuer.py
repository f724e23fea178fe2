"""The worker thread that issues clock switches off the dispatch path (DESIGN §5).

The executor only *marks* a trigger point as its operator is dispatched (``--trigger op``) or as
an iteration starts (``--trigger time``): a CUDA event recorded on the current stream on a GPU
(the device runs later than the host dispatches), an already-set marker on the CPU. This thread
waits for the mark, then ``delay_s`` more (the switch's ``delay_us``, or its planned offset
from the iteration's start), then calls the actuator. Switches are issued in
order; :meth:`SwitchIssuer.cancel` drops the pending ones and waits out a call in progress, so
that nothing is set after the clock is restored.

Both executors read the time and wait through a :class:`Clock`: the system's monotonic clock
(:data:`SYSTEM_CLOCK`), or one a test moves by hand so that a switch lands exactly when due
whatever else the machine runs.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from opdvfs.runtime.actuators.base import Actuator
from opdvfs.runtime.clock import SYSTEM_CLOCK, Clock

__all__ = ["SYSTEM_CLOCK", "Clock", "Marker", "PendingSwitch", "SwitchIssuer", "immediate_marker"]


class Marker(Protocol):
    """Something that completes when the trigger op runs (``torch.cuda.Event`` has this)."""

    def synchronize(self) -> None:
        """Block until the marked point has been reached."""


class _Now:
    def synchronize(self) -> None:
        return None


def immediate_marker() -> Marker:
    """Return a marker that has already fired (the CPU: an op runs as it is dispatched)."""
    return _Now()


@dataclass(frozen=True)
class PendingSwitch:
    """One switch to issue: after ``marker`` fires and ``delay_s`` passes, set ``freq_mhz``.

    ``offset_s`` is where the switch belongs on the plan's time line (after its trigger op, or
    after the iteration's start for a switch issued by time); the actuator is told it plus how
    late the call actually went out. ``then`` runs after a successful call (on the worker).
    """

    marker: Marker
    delay_s: float
    freq_mhz: float
    iteration: int
    op_index: int | None
    generation: int
    submitted_s: float  # the issuer's clock at the trigger op's dispatch
    cancelled: threading.Event
    offset_s: float
    then: Callable[[], None] | None = None
    #: True once the switch is too late to matter (checked just before it is issued): on a
    #: GPU, the device has reached the next iteration's anchor while the host ran ahead
    stale: Callable[[], bool] | None = None


class SwitchIssuer:
    """Issue switches on a daemon thread, in order, each after its marker and its delay.

    Both trigger modes use it: the operator-counting executor submits a switch at its trigger
    op (marker: that op), the time-anchored one submits an iteration's switches at its anchor
    (one marker, each switch with its planned offset as the delay). ``on_error`` receives an
    actuator failure (the thread keeps running; the executor decides). ``clock`` gives the time
    the delays count on (default :data:`SYSTEM_CLOCK`).
    """

    def __init__(
        self,
        actuator: Actuator,
        *,
        on_error: Callable[[BaseException], None] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.actuator = actuator
        self.on_error = on_error
        self.clock = clock
        self._queue: queue.Queue[PendingSwitch | None] = queue.Queue()
        self._generation = 0
        self._calling = threading.Lock()  # held while the actuator is being called
        self._stop = threading.Event()
        # one event per generation, set when it is cancelled: a switch waiting out its delay
        # wakes at once, whenever the cancel came (no window between checking and waiting)
        self._cancelled = threading.Event()
        self._halted = False
        self._fired: tuple[Marker | None, float] = (None, 0.0)
        self._thread = threading.Thread(target=self._work, name="opdvfs-switch", daemon=True)
        self._thread.start()

    def submit(
        self,
        marker: Marker,
        delay_s: float,
        freq_mhz: float,
        iteration: int,
        op_index: int | None,
        *,
        offset_s: float | None = None,
        then: Callable[[], None] | None = None,
        stale: Callable[[], bool] | None = None,
    ) -> None:
        """Queue a switch (returns at once).

        Parameters
        ----------
        marker
            Fires when the point the delay counts from is reached (trigger op, anchor).
        delay_s
            Seconds after the marker fires to issue the switch.
        freq_mhz, iteration, op_index
            The clock to set, and where in the program it belongs (for the actuator's record).
        offset_s
            Its place on the plan's time line (default: ``delay_s``).
        then
            Called on the worker thread after the actuator call succeeded.
        stale
            Asked just before the call: True drops the switch (it would land too late).
        """
        item = PendingSwitch(
            marker,
            delay_s,
            freq_mhz,
            iteration,
            op_index,
            self._generation,
            self.clock.now(),
            self._cancelled,
            delay_s if offset_s is None else offset_s,
            then,
            stale,
        )
        self._queue.put(item)

    def cancel(self) -> None:
        """Drop every pending switch and wait for a call in progress to finish."""
        self._generation += 1
        cancelled, self._cancelled = self._cancelled, threading.Event()
        cancelled.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
            self._queue.task_done()
        with self._calling:  # a call that started before the cancel has ended
            pass

    def halt(self) -> None:
        """Issue nothing more, ever (the clock is being restored; safe in a signal handler).

        It takes no lock: a switch being issued right now sees the flag when its call returns
        and resets the clock itself, so nothing set here outlives the restore.
        """
        self._halted = True
        self._generation += 1
        self._cancelled.set()

    def idle(self) -> bool:
        """Whether every switch submitted so far has been issued or dropped (none is waiting)."""
        return self._queue.unfinished_tasks == 0

    def is_alive(self) -> bool:
        """Whether the worker thread still runs (False once :meth:`close` has returned)."""
        return self._thread.is_alive()

    def close(self) -> None:
        """Cancel what is pending and stop the thread."""
        self.cancel()
        self._stop.set()
        self._queue.put(None)
        self._thread.join(timeout=5.0)

    def _fired_at(self, item: PendingSwitch) -> float:
        """When ``item``'s marker fired (on the issuer's clock), waiting for it if need be."""
        last, fired = self._fired
        if item.marker is last:  # the time-anchored executor's switches share one anchor
            return fired
        waited = self.clock.now()
        item.marker.synchronize()
        done = self.clock.now()
        # now if we had to wait for it; else it fired while earlier switches were being issued:
        # on a GPU, when the device clock says (the previous marker's time plus the time
        # between the two timing events: the host dispatched it well before the device got
        # there), elsewhere its dispatch, the earliest it can have fired
        fired = done if done - waited > 1e-4 else self._device_time(last, fired, item)
        self._fired = (item.marker, fired)
        return fired

    @staticmethod
    def _device_time(last: Marker | None, last_fired: float, item: PendingSwitch) -> float:
        """When ``item``'s marker fired, from the previous one's time if both are timed events."""
        elapsed = getattr(last, "elapsed_time", None)
        if elapsed is None:
            return item.submitted_s
        try:  # CUDA events made with enable_timing=True; others raise
            return last_fired + float(elapsed(item.marker)) / 1e3
        except Exception:
            return item.submitted_s

    def _work(self) -> None:
        while not self._stop.is_set():
            item = self._queue.get()
            try:
                if item is None:  # close()
                    return
                self._handle(item)
            finally:
                self._queue.task_done()

    def _handle(self, item: PendingSwitch) -> None:
        """Wait for ``item``'s moment, then issue it unless it was cancelled or went stale."""
        if item.generation != self._generation:
            return
        due = self._fired_at(item) + item.delay_s
        left = due - self.clock.now()
        if left > 0 and self.clock.wait(item.cancelled, left):
            return  # cancelled while waiting
        with self._calling:
            if item.generation != self._generation or self._stop.is_set() or self._halted:
                return
            if item.stale is not None and item.stale():
                return
            self._issue(item, late_s=max(self.clock.now() - due, 0.0))
            if self._halted:  # the restore raced this call: undo what it set
                self.actuator.reset()

    def _issue(self, item: PendingSwitch, *, late_s: float) -> None:
        try:
            self.actuator.at(item.iteration, item.op_index, item.offset_s + late_s)
            self.actuator.set_freq_mhz(item.freq_mhz)
        except Exception as exc:  # reported to the executor; never kills the thread
            if self.on_error is not None:
                self.on_error(exc)
            return
        if item.then is not None:
            item.then()
