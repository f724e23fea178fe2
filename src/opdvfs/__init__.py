"""opdvfs: per-operator DVFS for deep-learning training and inference.

The pipeline is ``workload -> profile -> fit -> plan -> execute -> measure``; each arrow is one of
the plain data objects re-exported here, each of which round-trips losslessly through a file.
"""

from opdvfs.devices.spec import DeviceSpec, VoltageCurve
from opdvfs.exceptions import (
    InputFormatError,
    NotFittedError,
    OpdvfsError,
    ProfileFormatError,
    ScheduleFormatError,
    ValidationError,
)
from opdvfs.profile import Profile
from opdvfs.result import RunResult, StageRecord
from opdvfs.schedule import Schedule, Stage, Switch
from opdvfs.workloads.workload import Workload

__version__ = "0.1.0"

__all__ = [
    "DeviceSpec",
    "InputFormatError",
    "NotFittedError",
    "OpdvfsError",
    "Profile",
    "ProfileFormatError",
    "RunResult",
    "Schedule",
    "ScheduleFormatError",
    "Stage",
    "StageRecord",
    "Switch",
    "ValidationError",
    "VoltageCurve",
    "Workload",
    "__version__",
]
