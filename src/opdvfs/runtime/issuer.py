"""The worker thread that issues clock switches off the dispatch path (DESIGN §5).

The executor only *marks* a trigger point as its operator is dispatched: a CUDA event recorded
on the current stream on a GPU (the op runs later than the host dispatches it), an already-set
marker on the CPU. This thread waits for the mark, then ``delay_s`` more (the switch's
``delay_us``: what is left of its latency lead), then calls the actuator. Switches are issued in
order; :meth:`SwitchIssuer.cancel` drops the pending ones and waits out a call in progress, so
that nothing is set after the clock is restored.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from opdvfs.runtime.actuators.base import Actuator

__all__ = ["Marker", "PendingSwitch", "SwitchIssuer", "immediate_marker"]


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
    """One switch to issue: after ``marker`` fires and ``delay_s`` passes, set ``freq_mhz``."""

    marker: Marker
    delay_s: float
    freq_mhz: float
    iteration: int
    op_index: int
    generation: int
    submitted_s: float  # time.monotonic() at the trigger op's dispatch


class SwitchIssuer:
    """Issue switches on a daemon thread, in order, each after its marker and its delay.

    ``on_error`` receives an actuator failure (the thread keeps running; the executor decides).
    """

    def __init__(
        self, actuator: Actuator, *, on_error: Callable[[BaseException], None] | None = None
    ) -> None:
        self.actuator = actuator
        self.on_error = on_error
        self._queue: queue.Queue[PendingSwitch | None] = queue.Queue()
        self._generation = 0
        self._calling = threading.Lock()  # held while the actuator is being called
        self._stop = threading.Event()
        self._cancelled = threading.Event()
        self._halted = False
        self._thread = threading.Thread(target=self._work, name="opdvfs-switch", daemon=True)
        self._thread.start()

    def submit(
        self, marker: Marker, delay_s: float, freq_mhz: float, iteration: int, op_index: int
    ) -> None:
        """Queue a switch (returns at once)."""
        item = PendingSwitch(
            marker, delay_s, freq_mhz, iteration, op_index, self._generation, time.monotonic()
        )
        self._queue.put(item)

    def cancel(self) -> None:
        """Drop every pending switch and wait for a call in progress to finish."""
        self._generation += 1
        self._cancelled.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        with self._calling:  # a call that started before the cancel has ended
            pass
        self._cancelled.clear()

    def halt(self) -> None:
        """Issue nothing more, ever (the clock is being restored; safe in a signal handler).

        It takes no lock: a switch being issued right now sees the flag when its call returns
        and resets the clock itself, so nothing set here outlives the restore.
        """
        self._halted = True
        self._generation += 1

    def is_alive(self) -> bool:
        """Whether the worker thread still runs (False once :meth:`close` has returned)."""
        return self._thread.is_alive()

    def close(self) -> None:
        """Cancel what is pending and stop the thread."""
        self.cancel()
        self._stop.set()
        self._queue.put(None)
        self._thread.join(timeout=5.0)

    def _work(self) -> None:
        while not self._stop.is_set():
            item = self._queue.get()
            if item is None:
                return
            waited = time.monotonic()
            item.marker.synchronize()
            done = time.monotonic()
            # the delay counts from when the mark fired: now if we had to wait for it, else (it
            # fired while earlier switches were being issued) from its dispatch, the earliest
            fired = done if done - waited > 1e-4 else item.submitted_s
            left = fired + item.delay_s - done
            if left > 0 and self._cancelled.wait(left):
                continue  # cancelled while waiting
            with self._calling:
                if item.generation != self._generation or self._stop.is_set() or self._halted:
                    continue
                self._issue(item)
                if self._halted:  # the restore raced this call: undo what it set
                    self.actuator.reset()

    def _issue(self, item: PendingSwitch) -> None:
        try:
            self.actuator.at(item.iteration, item.op_index)
            self.actuator.set_freq_mhz(item.freq_mhz)
        except Exception as exc:  # reported to the executor; never kills the thread
            if self.on_error is not None:
                self.on_error(exc)
