"""NVIDIA GPUs through NVML (nvidia-ml-py): lock the SM clock with min = max, reset, read power.

NVML errors are translated here, once, into opdvfs errors that say what to do; no caller
imports pynvml. A clock is set only when it changes. Setting clocks needs root (NVML returns
NO_PERMISSION otherwise); reading supported clocks and power does not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opdvfs.exceptions import (
    ActuatorError,
    DeviceNotFoundError,
    NotSupportedError,
    PermissionDeniedError,
)
from opdvfs.runtime.actuators.base import Actuator

try:  # the optional extra: pip install 'opdvfs[nvidia]'
    import pynvml
except ImportError:  # pragma: no cover - exercised where nvidia-ml-py is absent
    pynvml = None

__all__ = ["NvmlActuator"]


def _translate(exc: Exception, action: str) -> ActuatorError:
    """One opdvfs error per NVML error class, with what to do about it."""
    name = type(exc).__name__
    if name == "NVMLError_NoPermission":
        return PermissionDeniedError(
            f"NVML refused to {action}: changing GPU clocks needs root (run under sudo or with "
            "CAP_SYS_ADMIN; reading clocks and power works without)"
        )
    if name == "NVMLError_NotSupported":
        return NotSupportedError(
            f"this GPU or driver cannot {action} (locked clocks need Volta or newer)"
        )
    if name in ("NVMLError_NotFound", "NVMLError_InvalidArgument"):
        return DeviceNotFoundError(f"no such GPU while trying to {action} ({exc})")
    if name in ("NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded"):
        return DeviceNotFoundError(f"no NVIDIA driver: cannot {action} ({exc})")
    return ActuatorError(f"NVML failed to {action}: {exc}")


class NvmlActuator(Actuator):
    """Core (SM) clock control of one NVIDIA GPU.

    Parameters
    ----------
    index
        NVML device index (default 0). NVML's order may differ from CUDA's: prefer ``uuid``.
    uuid
        Device UUID (``GPU-...``), e.g. ``"GPU-" + str(torch.cuda.get_device_properties(i).uuid)``.
    """

    def __init__(self, *, index: int | None = None, uuid: str | None = None) -> None:
        if pynvml is None:
            raise ActuatorError("nvidia-ml-py is not installed: pip install 'opdvfs[nvidia]'")
        self._nvml: Any = pynvml
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as exc:
            raise _translate(exc, "initialise NVML") from None
        try:
            if uuid is not None:
                self._handle = self._nvml.nvmlDeviceGetHandleByUUID(uuid)
            else:
                self._handle = self._nvml.nvmlDeviceGetHandleByIndex(index or 0)
            memory = max(self._nvml.nvmlDeviceGetSupportedMemoryClocks(self._handle))
            clocks = self._nvml.nvmlDeviceGetSupportedGraphicsClocks(self._handle, memory)
        except self._nvml.NVMLError as exc:
            raise _translate(exc, "read the supported clocks") from None
        self._clocks = tuple(sorted(float(c) for c in clocks))
        self._current: float | None = None

    def supported_freqs_mhz(self) -> Sequence[float]:
        """SM clocks NVML supports at the highest memory clock, ascending."""
        return self._clocks

    def set_freq_mhz(self, freq_mhz: float) -> None:
        """Lock the SM clock at ``freq_mhz`` (``nvmlDeviceSetGpuLockedClocks`` min = max)."""
        if freq_mhz == self._current:
            return
        if freq_mhz not in self._clocks:
            raise ValueError(f"{freq_mhz:g} MHz is not a supported clock of this GPU")
        try:
            self._nvml.nvmlDeviceSetGpuLockedClocks(self._handle, int(freq_mhz), int(freq_mhz))
        except self._nvml.NVMLError as exc:
            raise _translate(exc, f"lock the SM clock at {freq_mhz:g} MHz") from None
        self._current = float(freq_mhz)

    def reset(self) -> None:
        """Unlock the SM clock (``nvmlDeviceResetGpuLockedClocks``)."""
        try:
            self._nvml.nvmlDeviceResetGpuLockedClocks(self._handle)
        except self._nvml.NVMLError as exc:
            raise _translate(exc, "reset the SM clock") from None
        self._current = None

    def read_power_w(self) -> float:
        """Board power (W); NVML reports milliwatts (a 1 s average on Ampere and newer)."""
        try:
            return float(self._nvml.nvmlDeviceGetPowerUsage(self._handle)) / 1e3
        except self._nvml.NVMLError as exc:
            raise _translate(exc, "read the power") from None

    def read_energy_j(self) -> float:
        """Energy the GPU has used since the driver loaded (J; NVML's counter is in mJ)."""
        try:
            return float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)) / 1e3
        except self._nvml.NVMLError as exc:
            raise _translate(exc, "read the energy counter") from None

    def close(self) -> None:
        """Shut NVML down (the clock is not touched)."""
        self._nvml.nvmlShutdown()
