"""Operator-boundary hooks for PyTorch: apply a schedule as the program dispatches (needs torch).

:class:`ScheduleExecutor` is a ``TorchDispatchMode``, as the workload recorder
(:class:`~opdvfs.runtime.recorder.WorkloadRecorder`, whose operator counting it shares) is. Both
see every aten operator below autograd -- forward and
backward, on every thread autograd uses -- without a change to the user's code. An iteration ends
at each optimizer step (PyTorch's global optimizer step hook) or at :meth:`mark_iteration`.

A ``torch.compile``d model runs *eagerly* under them: Dynamo skips every frame while a
non-infrastructure dispatch mode is active, and a function first called then is never compiled
afterwards. So both see (and count) the model's eager operators; they notice ``torch.compile``
being used and say so (:attr:`~opdvfs.runtime.recorder._OpMode.compile_seen`). ``--trigger time``
(:class:`~opdvfs.runtime.timed.TimedExecutor`) has no dispatch mode and keeps the model compiled.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

from opdvfs.exceptions import ScheduleMismatchError
from opdvfs.runtime.actuators.base import Actuator
from opdvfs.runtime.applier import ScheduleApplier
from opdvfs.runtime.issuer import Marker, immediate_marker
from opdvfs.runtime.recorder import _COUNTED, _OpMode
from opdvfs.schedule import Schedule, Switch
from opdvfs.sim.gpu import SimulatedGpu

__all__ = ["COMPILED_HINT", "ScheduleExecutor"]

#: One line for a compiled model under the operator-counting mode.
COMPILED_HINT = (
    "the script uses torch.compile, and compiled code runs eagerly under --trigger op "
    "(Dynamo does not compile while a dispatch mode is active): use --trigger time to keep "
    "the model compiled"
)


class ScheduleExecutor(ScheduleApplier, _OpMode):
    """Apply a schedule at operator boundaries: issue each switch when its trigger op dispatches.

    At a trigger op the executor marks the point -- a CUDA event on the current stream when CUDA
    is available, an immediate marker on the CPU -- and a worker thread
    (:class:`~opdvfs.runtime.issuer.SwitchIssuer`) waits for it, then the switch's ``delay_us``,
    then calls the actuator. A CPU switch without delay is issued at once, on the dispatching
    thread. Pending switches are dropped on divergence and on exit, before the clock is
    restored. On a simulated GPU (the actuator's
    :attr:`~opdvfs.runtime.actuators.Actuator.timeline`) there is no worker: its timeline is
    virtual, so each switch is requested at once for its trigger op's start plus ``delay_us`` on
    that timeline (:meth:`_trigger_on_timeline`). The op sequence is checked against ``names``
    (the captured workload's, when given) and the schedule's op count. On a mismatch the clock
    goes to the maximum for the rest of that iteration and a warning is raised (once); the next
    iteration starts in step again -- the first iteration of a run often differs (an optimizer
    creating its state) -- but after ``max_diverged`` diverging iterations in a row the schedule
    is abandoned for the run. An iteration that ran no operator the mode could see (a CUDA graph
    replay) says so and suggests ``--trigger time``, as does ``torch.compile``
    (:data:`COMPILED_HINT`, warned once).
    """

    trigger = "op"
    #: The line warned once when the script compiles (a subclass run by another command names
    #: that command's remedy).
    compiled_hint = COMPILED_HINT

    def __init__(
        self,
        schedule: Schedule | None,
        actuator: Actuator,
        *,
        names: Sequence[str] | None = None,
        max_diverged: int = 2,
        optimizer_steps: bool = True,
    ) -> None:
        super().__init__(actuator, max_diverged=max_diverged, optimizer_steps=optimizer_steps)
        self.names = list(names) if names is not None else None
        self._switch_at: dict[int, list[Switch]] = {}
        self._first: list[Switch] = []  # previous-iteration switches: issued at op 0 of iteration 0
        self._cuda = torch.cuda.is_available()
        self._compile_warned = False
        #: The simulated GPU the program runs on (None: wall time): switches go on its timeline.
        self._timeline: SimulatedGpu | None = actuator.timeline
        #: Virtual time (s) the last switch was issued at on the simulated GPU: in order.
        self._issued_s = 0.0
        if schedule is not None:
            self.use_schedule(schedule)

    def use_schedule(self, schedule: Schedule) -> None:
        """Apply ``schedule`` from the next iteration on (``None`` at construction: wait for it).

        Under ``torchrun`` the ranks other than 0 start without one and receive rank 0's once
        the process group exists (:func:`~opdvfs.runtime.distributed.broadcast_schedule`).

        Raises
        ------
        ScheduleMismatchError
            If ``names`` was given and counts other than the schedule's operators.
        """
        if self.names is not None and len(self.names) != schedule.n_ops:
            raise ScheduleMismatchError(
                f"schedule plans {schedule.n_ops} ops, names give {len(self.names)}"
            )
        switch_at: dict[int, list[Switch]] = {}
        for sw in schedule.switches:
            switch_at.setdefault(sw.trigger_op, []).append(sw)
        # at one op, this iteration's switches before those for the next one (its first stages)
        for switches in switch_at.values():
            switches.sort(key=lambda sw: sw.previous_iteration)
        first = [sw for sw in schedule.switches if sw.previous_iteration]
        with self._lock:
            delayed = any(sw.delay_us > 0 for sw in schedule.switches)
            if self._timeline is None and (self._cuda or delayed):
                self._start_issuer()
            self.schedule, self._switch_at, self._first = schedule, switch_at, first
            self._off = self.op_index > 0  # mid-iteration: start at the next one

    def _where(self) -> None:
        self.actuator.at(self.iteration, self.op_index)

    def _trigger(self, switches: list[Switch]) -> None:
        """Issue (or hand to the worker) the switches triggered by the op being dispatched."""
        if self._halted:
            return
        if self._timeline is not None:
            self._trigger_on_timeline(self._timeline, switches)
            return
        if self._issuer is None:  # CPU, no delays: at once, on this thread
            self._where()
            self.actuator.set_freq_mhz(switches[-1].freq_mhz)
            return
        marker: Marker = immediate_marker()
        if self._cuda:
            event = torch.cuda.Event()
            event.record()  # on the current stream: fires when the trigger op is reached
            marker = event
        for sw in switches:
            self._issuer.submit(
                marker, sw.delay_us * 1e-6, sw.freq_mhz, self.iteration, self.op_index
            )

    def _trigger_on_timeline(self, gpu: SimulatedGpu, switches: list[Switch]) -> None:
        """Issue the switches at their trigger op's start plus delay on the simulated GPU.

        The simulated GPU's timeline is virtual and moves as the host dispatches, not with the
        host's clock: a CPU-light script dispatches a ~770 ms (virtual) iteration in a few ms,
        so a worker sleeping ``delay_us`` in host time issued a switch one to four iterations
        late. Each switch is requested now for ``start + delay`` on the device, which holds it
        until then (:meth:`~opdvfs.sim.gpu.SimulatedGpu.request_freq_mhz`), and never
        before the one issued before it (a worker issues them in order).
        """
        start_s = gpu.op_start_s(self.iteration, self.op_index)
        if start_s is None:  # (the trigger op is the next launch: it starts now)
            start_s = gpu.now_s()
        for sw in switches:
            at_s = max(start_s + sw.delay_us * 1e-6, self._issued_s)
            self._issued_s = at_s
            self.actuator.at(self.iteration, self.op_index, at_s - start_s)
            self.actuator.set_freq_mhz(sw.freq_mhz)

    def _fall_back(self, why: str, *, iteration: int | None = None, stacklevel: int = 3) -> None:
        """Fall back as :meth:`ScheduleApplier._fall_back`, on a simulated GPU dropping first.

        The switches still waiting on the simulated GPU's timeline are dropped (as a worker's
        cancel does on a real one). The actuator's last clock becomes the one the device
        settles at, not a dropped one (else a fallback to a clock just dropped would be skipped
        as already set).
        """
        if self._timeline is not None:
            self.actuator.cancel_pending()  # the actuator's clock: where the device settles
            self._issued_s = self._timeline.now_s()
        super()._fall_back(why, iteration=iteration, stacklevel=stacklevel + 1)

    def __exit__(self, *exc: object) -> None:
        """Leave the mode; on a simulated GPU, drop the switches still waiting on its timeline.

        As the worker's close on a real device: nothing the executor scheduled lands after it
        was left (the clock guard restores the clock next).
        """
        if self._timeline is not None:
            self.actuator.cancel_pending()
        super().__exit__(*exc)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not func._schema.name.startswith(_COUNTED):
            return func(*args, **(kwargs or {}))
        with self._lock:
            i = self.op_index
            if self.schedule is not None and not self._off and not self.abandoned:
                name = func._schema.name
                if i >= self.schedule.n_ops:
                    self._fall_back(
                        f"iteration {self.iteration} has more than the "
                        f"{self.schedule.n_ops} ops the schedule plans"
                    )
                elif self.names is not None and self.names[i] != name:
                    self._fall_back(
                        f"op {i} of iteration {self.iteration} is {name}, the "
                        f"schedule expects {self.names[i]}"
                    )
                else:
                    if i == 0 and self.iteration == 0 and self._first:
                        # no previous iteration issued these: set the first stages' clock now
                        now = [sw.model_copy(update={"delay_us": 0.0}) for sw in self._first]
                        self._trigger(now)
                    if i in self._switch_at:
                        self._trigger(self._switch_at[i])
            self.op_index += 1
        return func(*args, **(kwargs or {}))

    def end_iteration(self, n_ops: int) -> None:
        """Check the finished iteration ran the planned number of ops; re-arm for the next."""
        self._read_energy()
        if self.compile_seen and not self._compile_warned:
            self._compile_warned = True
            warnings.warn(f"opdvfs: {self.compiled_hint}", stacklevel=3)
        if self.schedule is None:
            return
        if not self._off and not self.abandoned and n_ops != self.schedule.n_ops:
            unseen = (
                " (none the dispatch mode can see: a compiled graph or CUDA graph replay? "
                "use --trigger time)"
                if n_ops == 0
                else ""
            )
            self._fall_back(
                f"iteration {self.iteration} ran {n_ops} ops{unseen}, the schedule plans "
                f"{self.schedule.n_ops}"
            )
        if self.abandoned:
            self._gave_up = True
        elif not self._off:
            self._streak = 0  # a clean iteration ends a diverging streak
            self.applied_iterations += 1
        self._off = False
