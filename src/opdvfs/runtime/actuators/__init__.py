"""Actuators: the small interface to a device's clock, and its implementations."""

from opdvfs.runtime.actuators.ascend import AscendActuator
from opdvfs.runtime.actuators.base import Actuator, ClockGuard
from opdvfs.runtime.actuators.dry_run import DryRunActuator
from opdvfs.runtime.actuators.nvml import NvmlActuator
from opdvfs.runtime.actuators.twin import TwinActuator

__all__ = [
    "Actuator",
    "AscendActuator",
    "ClockGuard",
    "DryRunActuator",
    "NvmlActuator",
    "TwinActuator",
]
