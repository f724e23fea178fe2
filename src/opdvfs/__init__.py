"""opdvfs: per-operator DVFS for deep-learning training and inference.

The pipeline is ``workload -> profile -> fit -> plan -> execute -> measure``; each arrow is one of
the plain data objects exported here, each of which round-trips losslessly through a file, and
each stage is one verb::

    import opdvfs

    device = opdvfs.SimulatedDevice.from_preset("ascend-910b-like")
    workload = opdvfs.load_workload("bert")
    profile = device.profile(workload, [1000, 1400, 1800])
    models = opdvfs.ModelBundle(
        opdvfs.PerfModel().fit(profile), opdvfs.PowerModel().fit(profile, device=device.spec)
    )
    inputs = opdvfs.PlanInputs.from_workload(workload, device.spec.freqs_mhz)
    schedule = opdvfs.plan_schedule(models, inputs, target=0.02)
    result, _ = device.run(workload, schedule)

Names load on first use (PEP 562), so ``import opdvfs`` stays cheap and torch stays optional:
the executor (:mod:`opdvfs.runtime`) imports it only when it runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opdvfs._lazy import attach

__version__ = "0.1.0"

#: Exported name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    # data contracts
    "DeviceSpec": "opdvfs.devices.spec",
    "VoltageCurve": "opdvfs.devices.spec",
    "Profile": "opdvfs.profile",
    "Workload": "opdvfs.workloads.workload",
    "PowerCalibration": "opdvfs.calibration",
    "Schedule": "opdvfs.schedule",
    "Stage": "opdvfs.schedule",
    "Switch": "opdvfs.schedule",
    "RunResult": "opdvfs.result",
    "StageRecord": "opdvfs.result",
    # errors
    "OpdvfsError": "opdvfs.exceptions",
    "InputFormatError": "opdvfs.exceptions",
    "ProfileFormatError": "opdvfs.exceptions",
    "ScheduleFormatError": "opdvfs.exceptions",
    "ValidationError": "opdvfs.exceptions",
    "NotFittedError": "opdvfs.exceptions",
    "InfeasibleError": "opdvfs.exceptions",
    "UnsupportedClockError": "opdvfs.exceptions",
    "ScheduleMismatchError": "opdvfs.exceptions",
    "ActuatorError": "opdvfs.exceptions",
    # the verbs, stage by stage
    "read_profile": "opdvfs.io",
    "load_workload": "opdvfs.workloads.library",
    "SimulatedDevice": "opdvfs.sim.twin",
    "get_preset": "opdvfs.sim.presets",
    "PerfModel": "opdvfs.models.perf",
    "PowerModel": "opdvfs.models.power",
    "ModelBundle": "opdvfs.models.bundle",
    "PlanInputs": "opdvfs.plan.planner",
    "plan_schedule": "opdvfs.plan.planner",
    "plan_frontier": "opdvfs.plan.planner",
    # the closed loop on a running job (#21): ``with opdvfs.tune(target=0.02): train()``
    "tune": "opdvfs.tuner.context",
    # a block's time and energy, on any device opdvfs reads: ``with opdvfs.measure("nvml")``
    "measure": "opdvfs.runtime.window",
    "Monitor": "opdvfs.runtime.window",
    "Window": "opdvfs.runtime.window",
}

__all__ = [
    "ActuatorError",
    "DeviceSpec",
    "InfeasibleError",
    "InputFormatError",
    "ModelBundle",
    "Monitor",
    "NotFittedError",
    "OpdvfsError",
    "PerfModel",
    "PlanInputs",
    "PowerCalibration",
    "PowerModel",
    "Profile",
    "ProfileFormatError",
    "RunResult",
    "Schedule",
    "ScheduleFormatError",
    "ScheduleMismatchError",
    "SimulatedDevice",
    "Stage",
    "StageRecord",
    "Switch",
    "UnsupportedClockError",
    "ValidationError",
    "VoltageCurve",
    "Window",
    "Workload",
    "__version__",
    "get_preset",
    "load_workload",
    "measure",
    "plan_frontier",
    "plan_schedule",
    "read_profile",
    "tune",
]

if TYPE_CHECKING:  # what the lazy names are, for type checkers and IDEs
    from opdvfs.calibration import PowerCalibration
    from opdvfs.devices.spec import DeviceSpec, VoltageCurve
    from opdvfs.exceptions import (
        ActuatorError,
        InfeasibleError,
        InputFormatError,
        NotFittedError,
        OpdvfsError,
        ProfileFormatError,
        ScheduleFormatError,
        ScheduleMismatchError,
        UnsupportedClockError,
        ValidationError,
    )
    from opdvfs.io import read_profile
    from opdvfs.models.bundle import ModelBundle
    from opdvfs.models.perf import PerfModel
    from opdvfs.models.power import PowerModel
    from opdvfs.plan.planner import PlanInputs, plan_frontier, plan_schedule
    from opdvfs.profile import Profile
    from opdvfs.result import RunResult, StageRecord
    from opdvfs.runtime.window import Monitor, Window, measure
    from opdvfs.schedule import Schedule, Stage, Switch
    from opdvfs.sim.presets import get_preset
    from opdvfs.sim.twin import SimulatedDevice
    from opdvfs.tuner.context import tune
    from opdvfs.workloads.library import load_workload
    from opdvfs.workloads.workload import Workload


__getattr__, __dir__ = attach(__name__, _EXPORTS)
