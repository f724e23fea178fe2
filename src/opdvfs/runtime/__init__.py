"""Running schedules on a device: actuators, the clock guard, and the operator-boundary executor.

A run builds an actuator (:func:`make_actuator`, or one of the actuator classes), guards its
clock (:class:`ClockGuard`), and applies a schedule under a :class:`ScheduleExecutor`, or first
records the program's operators with a :class:`WorkloadRecorder`::

    from opdvfs.runtime import ClockGuard, ScheduleExecutor, make_actuator

    with make_actuator("dry-run", schedule=plan) as act, ClockGuard(act):
        with ScheduleExecutor(plan, act):
            train()

Names load on first use (PEP 562): importing :mod:`opdvfs.runtime` does not import torch (an
optional extra), only the executor and the recorder do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opdvfs._lazy import attach

#: Exported name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    "Actuator": "opdvfs.runtime.actuators",
    "AscendActuator": "opdvfs.runtime.actuators",
    "ClockGuard": "opdvfs.runtime.actuators",
    "DryRunActuator": "opdvfs.runtime.actuators",
    "NvmlActuator": "opdvfs.runtime.actuators",
    "TwinActuator": "opdvfs.runtime.actuators",
    "make_actuator": "opdvfs.runtime.actuators",
    "ScheduleExecutor": "opdvfs.runtime.dispatch",
    "WorkloadRecorder": "opdvfs.runtime.recorder",
    "RunResult": "opdvfs.result",
    "StageRecord": "opdvfs.result",
}

__all__ = [
    "Actuator",
    "AscendActuator",
    "ClockGuard",
    "DryRunActuator",
    "NvmlActuator",
    "RunResult",
    "ScheduleExecutor",
    "StageRecord",
    "TwinActuator",
    "WorkloadRecorder",
    "make_actuator",
]

if TYPE_CHECKING:  # what the lazy names are, for type checkers and IDEs
    from opdvfs.result import RunResult, StageRecord
    from opdvfs.runtime.actuators import (
        Actuator,
        AscendActuator,
        ClockGuard,
        DryRunActuator,
        NvmlActuator,
        TwinActuator,
        make_actuator,
    )
    from opdvfs.runtime.dispatch import ScheduleExecutor
    from opdvfs.runtime.recorder import WorkloadRecorder


__getattr__, __dir__ = attach(__name__, _EXPORTS)
