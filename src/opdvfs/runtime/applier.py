"""What both trigger modes share: iterations, the switch worker, fallback and halt (needs torch).

An iteration ends at each optimizer step (PyTorch's global optimizer step hook) or at
:meth:`~opdvfs.runtime.recorder.IterationCounter.mark_iteration` (``--iteration-at``), as
:class:`~opdvfs.runtime.recorder.IterationCounter` counts them. :class:`ScheduleApplier` adds what
applying a schedule needs whatever triggers the switches: the actuator and its
:class:`~opdvfs.runtime.issuer.SwitchIssuer`, the fallback to the maximum clock with one
warning, the per-iteration energy counter, and :meth:`~ScheduleApplier.halt` for the clock
guard. The operator-counting executor (:class:`~opdvfs.runtime.dispatch.ScheduleExecutor`) and
the time-anchored one (:class:`~opdvfs.runtime.timed.TimedExecutor`) are its two subclasses.
"""

from __future__ import annotations

import warnings

from opdvfs._means import iteration_means
from opdvfs.runtime.actuators.base import Actuator
from opdvfs.runtime.clock import SYSTEM_CLOCK, Clock
from opdvfs.runtime.issuer import SwitchIssuer
from opdvfs.runtime.recorder import IterationCounter
from opdvfs.schedule import Schedule

__all__ = ["ScheduleApplier"]


class ScheduleApplier(IterationCounter):
    """Apply a schedule through an actuator; the trigger is the subclass's.

    Parameters
    ----------
    actuator
        Where the switches go.
    max_diverged
        Diverging iterations in a row after which the schedule is abandoned for the run; None:
        never (the time-anchored executor recovers when iteration lengths return).
    optimizer_steps, clock
        As :class:`~opdvfs.runtime.recorder.IterationCounter`; the switch worker waits on the
        same clock.
    """

    #: ``"op"`` or ``"time"``: how the switches are triggered.
    trigger = "op"

    def __init__(
        self,
        actuator: Actuator,
        *,
        max_diverged: int | None = 2,
        optimizer_steps: bool = True,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        super().__init__(optimizer_steps=optimizer_steps, clock=clock)
        self.actuator = actuator
        self.schedule: Schedule | None = None
        self._issuer: SwitchIssuer | None = None
        self.errors: list[BaseException] = []
        #: The actuator's energy counter at each iteration end (J), when it has one (NVML).
        self.iteration_energy_j: list[float] = []
        self.max_diverged = max_diverged
        self.diverged_iterations: list[int] = []
        self._off = False  # not applying for the rest of this iteration
        self._streak = 0
        self._gave_up = False
        self._warned = False
        self._halted = False
        #: Iterations that ended with the schedule applied throughout.
        self.applied_iterations = 0
        #: Why the first diverging iteration diverged (None while none has).
        self.first_divergence: str | None = None

    def use_schedule(self, schedule: Schedule) -> None:
        """Apply ``schedule`` from the next iteration on (subclasses prepare their triggers)."""
        raise NotImplementedError

    def _start_issuer(self) -> SwitchIssuer:
        if self._issuer is None:
            self._issuer = SwitchIssuer(
                self.actuator, on_error=self._issue_failed, clock=self.clock
            )
        return self._issuer

    def per_iteration(self, skip: int = 1) -> dict[str, float | None]:
        """Mean wall time (s) and energy (J, when measured) per iteration after the first ``skip``.

        Times are taken on the host at each optimizer step: with asynchronous CUDA work they
        average out over many iterations, not one.
        """
        return iteration_means(self.iteration_ends_s[skip:], self.iteration_energy_j[skip:])

    @property
    def issuer(self) -> SwitchIssuer | None:
        """The worker thread that issues switches off the program's path (None: not needed)."""
        return self._issuer

    @property
    def diverged(self) -> bool:
        """Whether any iteration failed to match the schedule."""
        return bool(self.diverged_iterations)

    @property
    def abandoned(self) -> bool:
        """Whether the schedule was given up for the rest of the run."""
        if self.max_diverged is None:
            return False
        return self._gave_up or self._streak >= self.max_diverged

    def halt(self) -> None:
        """Stop every switch for good: nothing is set from now on (the clock is being restored).

        Safe in a signal handler: it takes no lock, waits for nothing and joins nothing; a switch
        the worker thread is issuing at this moment is undone by the worker itself.
        """
        self._halted = True
        if self._issuer is not None:
            self._issuer.halt()

    def _issue_failed(self, exc: BaseException) -> None:
        self.errors.append(exc)
        warnings.warn(f"opdvfs: a clock switch failed: {exc}", stacklevel=2)

    def __exit__(self, *exc: object) -> None:
        if self._issuer is not None:
            self._issuer.close()  # nothing may land after this: the clock is restored next
        super().__exit__(*exc)

    def _fall_back(self, why: str, *, iteration: int | None = None, stacklevel: int = 3) -> None:
        """Stop applying for the rest of ``iteration`` (default: this one) at the maximum clock.

        Pending switches are dropped first; the first fallback of the run warns (once).
        """
        if self._issuer is not None:
            self._issuer.cancel()
        self._off = True
        iteration = self.iteration if iteration is None else iteration
        if not self.diverged_iterations or self.diverged_iterations[-1] != iteration:
            self.diverged_iterations.append(iteration)
            self._streak += 1
        if self.first_divergence is None:
            self.first_divergence = why
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"opdvfs: {why}; falling back to the maximum clock", stacklevel=stacklevel
            )
        if not self._halted:
            self.actuator.at(iteration, None if self.trigger == "time" else self.op_index)
            self.actuator.set_freq_mhz(max(self.actuator.supported_freqs_mhz()))

    def _read_energy(self) -> None:
        try:
            energy_j = self.actuator.read_energy_j()
        except Exception:  # a failed read leaves a gap, never breaks the program
            energy_j = float("nan")
        if energy_j is not None:  # None: the device has no energy counter
            self.iteration_energy_j.append(float(energy_j))
