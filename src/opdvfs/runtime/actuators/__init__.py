"""Actuators: the small interface to a device's clock, its implementations, and their factory.

:class:`Actuator` declares what every caller may ask (see :mod:`~opdvfs.runtime.actuators.base`:
the clocks, set and reset, power and energy, and what it is and has -- its :attr:`~Actuator.kind`,
:attr:`~Actuator.current_mhz`, :attr:`~Actuator.meter`, :attr:`~Actuator.timeline`,
:attr:`~Actuator.preset`, :attr:`~Actuator.twin`); :func:`make_actuator` builds each kind.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from opdvfs.exceptions import ActuatorError, ValidationError
from opdvfs.runtime.actuators.ascend import AscendActuator
from opdvfs.runtime.actuators.base import Actuator, ClockGuard
from opdvfs.runtime.actuators.dry_run import DryRunActuator
from opdvfs.runtime.actuators.logged import LoggedActuator
from opdvfs.runtime.actuators.nvml import NvmlActuator, NvmlReader, current_gpu
from opdvfs.runtime.actuators.sim_gpu import SIM_PREFIX, SimGpuActuator
from opdvfs.runtime.actuators.twin import TwinActuator
from opdvfs.runtime.actuators.zeusd import ZeusdActuator, ZeusdClient
from opdvfs.schedule import Schedule
from opdvfs.sim.gpu import SimulatedGpu
from opdvfs.sim.presets import PRESETS, preset_spec
from opdvfs.sim.twin import SimulatedDevice

__all__ = [
    "ACTUATORS",
    "Actuator",
    "AscendActuator",
    "ClockGuard",
    "DryRunActuator",
    "LoggedActuator",
    "NvmlActuator",
    "NvmlReader",
    "SimGpuActuator",
    "TwinActuator",
    "ZeusdActuator",
    "make_actuator",
]

#: The kinds :func:`make_actuator` builds, besides ``sim:PRESET`` (a simulated GPU).
ACTUATORS: tuple[str, ...] = ("nvml", "zeusd", "ascend", "dry-run", "twin")

#: The preset whose clocks an Ascend actuator accepts when no other preset is named.
_ASCEND_DEFAULT = "ascend-910b-like"


def make_actuator(
    kind: str,
    *,
    device: str | None = None,
    schedule: Schedule | None = None,
    log: str | os.PathLike[str] | None = None,
    header: Mapping[str, Any] | None = None,
    work_scale: float | None = None,
    optimizer_steps: bool = True,
    gpu: str | None = None,
) -> Actuator:
    """Return the actuator of ``kind`` for ``device``.

    Parameters
    ----------
    kind
        One of :data:`ACTUATORS`: ``"nvml"`` (this process's NVIDIA GPU, as root),
        ``"zeusd"`` (the same GPU without root, through Zeus's daemon at ``ZEUSD_SOCK_PATH``),
        ``"ascend"``
        (an Ascend NPU: requests logged, not applied), ``"dry-run"`` (records what would be
        set; see below) or ``"twin"`` (records, then replays on the simulated preset); or
        ``"sim:PRESET"`` (a simulated GPU of that preset, e.g. ``"sim:a100-like"``: the program's
        operators run on it, :class:`SimGpuActuator`).
    device
        A device preset (:data:`opdvfs.sim.presets.PRESETS`); default: the schedule's device.
        Its clocks are the ones a dry run or Ascend actuator accepts; the twin simulates it.
    schedule
        The schedule to be applied. Without a preset, a dry run accepts the clocks its stages
        use.

        A dry run with neither a preset nor a schedule measures the NVIDIA GPU it runs on,
        read-only, when NVML finds one (this process's, as ``"nvml"``): it accepts that GPU's
        clocks and reads its power, energy counter and temperature through an
        :class:`~opdvfs.runtime.actuators.nvml.NvmlReader` (its ``meter``), which never sets
        anything; its clock calls are only recorded. A preset keeps meaning its clocks (and
        nothing is measured), so every call that worked before is unchanged.
    log
        JSON-lines file of the actuator's calls (``"nvml"`` and ``"zeusd"`` too: a
        :class:`~opdvfs.runtime.actuators.logged.LoggedActuator` records what they set).
    header
        More fields for that log's header line (one per run: the log is appended to).
    work_scale
        For ``"sim:PRESET"``: each launch does that many times its FLOPs and bytes (a model
        sized for the CPU stands in for a bigger one).
    optimizer_steps
        For ``"sim:PRESET"``: whether the simulated GPU's iterations end at optimizer steps
        (False: only at :meth:`~Actuator.mark_iteration`, for ``--iteration-at``); ignored by
        the other kinds, which count no iterations.
    gpu
        For ``"nvml"``, ``"zeusd"`` and a dry run measuring a GPU: ``--gpu INDEX|UUID[,...]``
        (:func:`~opdvfs.runtime.gpu_select.select_gpu`); default this process's own GPU, its
        current CUDA device (after ``torch.cuda.set_device``; else ``LOCAL_RANK``) matched to
        NVML by UUID through ``CUDA_VISIBLE_DEVICES``
        (:func:`~opdvfs.runtime.actuators.nvml.current_gpu`).

    Returns
    -------
    Actuator
        Not yet touching the clock; wrap its use in :class:`ClockGuard`.

    Raises
    ------
    ValidationError
        For an unknown ``kind`` or ``sim:`` preset (the message names them); for ``"twin"``
        without a preset; for ``"dry-run"`` with neither
        a preset nor a schedule nor an NVIDIA GPU to take clocks from.
    DeviceNotFoundError
        For ``"nvml"`` and ``"zeusd"`` without nvidia-ml-py, a driver or a GPU; for ``"zeusd"``
        without the daemon's address.
    """
    if kind.startswith(SIM_PREFIX):
        name = kind.removeprefix(SIM_PREFIX)
        if name not in PRESETS:
            raise ValidationError(
                f"actuator {kind!r}: no such simulated GPU; expected sim: and one of "
                f"{', '.join(PRESETS)}",
                field="actuator",
            )
        sim = (
            SimulatedGpu(name) if work_scale is None else SimulatedGpu(name, work_scale=work_scale)
        )
        return SimGpuActuator(sim, optimizer_steps=optimizer_steps, log=log, header=header)
    if work_scale is not None:
        raise ValidationError(
            f"work_scale scales a simulated GPU's work: actuator {SIM_PREFIX}PRESET, not {kind!r}",
            field="work_scale",
        )
    if kind not in ACTUATORS:
        raise ValidationError(
            f"actuator {kind!r}: expected {', '.join(ACTUATORS[:-1])} or {ACTUATORS[-1]} "
            f"(or {SIM_PREFIX}PRESET, a simulated GPU)",
            field="actuator",
        )
    spec = preset_spec(device or (schedule.device if schedule is not None else None))
    if kind in ("nvml", "zeusd"):
        # (the daemon's address is checked before NVML is opened: a typo is its own line)
        client = ZeusdClient() if kind == "zeusd" else None
        chosen = current_gpu(gpu)
        real: Actuator = (
            NvmlActuator(gpu=chosen) if client is None else ZeusdActuator(gpu=chosen, client=client)
        )
        return real if log is None else LoggedActuator(real, log=log, header=header)
    if kind == "twin":
        if spec is None:
            raise ValidationError(
                f"the twin actuator simulates a preset: give one as the device "
                f"({', '.join(PRESETS)})",
                field="device",
            )
        return TwinActuator(SimulatedDevice.from_preset(spec.name), log=log, header=header)
    if spec is None and kind == "ascend":
        spec = preset_spec(_ASCEND_DEFAULT)
    freqs: Sequence[float]
    if spec is not None:
        freqs = spec.freqs_mhz
    elif schedule is not None:
        freqs = sorted({s.freq_mhz for s in schedule.stages})
    elif kind == "dry-run" and (meter := _nvml_meter(gpu)) is not None:
        freqs = meter.supported_freqs_mhz()
        return DryRunActuator(
            freqs, log=log, header={**(header or {}), "meter": "nvml"}, meter=meter
        )
    else:
        raise ValidationError(
            "a dry run needs the clocks it accepts: give a preset as the device, or a schedule "
            "(or run it where NVML finds an NVIDIA GPU, whose clocks it then takes)",
            field="device",
        )
    if kind == "ascend":
        return AscendActuator(freqs, log=log, header=header)
    return DryRunActuator(freqs, log=log, header=header)


def _nvml_meter(gpu: str | None = None) -> NvmlReader | None:
    """Return a read-only NVML reader of this process's GPU, or None where NVML cannot read one.

    None too where CUDA sees no GPU of the machine (``CUDA_VISIBLE_DEVICES=""``: the program runs
    on the CPU); a ``gpu`` that names none is an error.
    """
    try:
        return NvmlReader(gpu=current_gpu(gpu))
    except ActuatorError:  # no nvidia-ml-py, no driver, no GPU, or its clocks unreadable
        return None
    except ValidationError:
        if gpu is not None:
            raise
        return None
