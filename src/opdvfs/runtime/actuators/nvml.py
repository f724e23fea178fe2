"""NVIDIA GPUs through NVML (nvidia-ml-py): lock the SM clock with min = max, reset, read power.

This module is the one place opdvfs calls pynvml. :class:`NvmlDevice` initialises NVML and
finds the GPU; :func:`nvml_errors` translates NVML's errors, by their ``NVML_ERROR_*`` code,
into opdvfs errors that say what to do, chained to the original. The actuator here and the power
sampler (:mod:`opdvfs.runtime.sampler`) both use them, so no caller imports pynvml. A clock is
set only when it changes. Setting clocks needs root (NVML returns NO_PERMISSION otherwise);
reading supported clocks and power does not.

:class:`NvmlReader` is the read-only half (supported clocks, power, the energy counter, the
die temperature, the GPU's name): it calls no ``nvmlDeviceSet*``/``Reset*`` function at all.
The actuator reads through one, and a dry run
(:class:`~opdvfs.runtime.actuators.DryRunActuator`) takes one as its ``meter`` to measure a
real GPU while it only records the clocks it would set.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opdvfs.exceptions import (
    ActuatorError,
    DeviceNotFoundError,
    NotSupportedError,
    PermissionDeniedError,
)
from opdvfs.runtime.actuators.base import Actuator
from opdvfs.runtime.gpu_select import GpuChoice, GpuClaim, select_gpu

try:  # the optional extra: pip install 'opdvfs[nvidia]'
    import pynvml
except ImportError:  # pragma: no cover - exercised where nvidia-ml-py is absent
    pynvml = None

__all__ = [
    "NvmlActuator",
    "NvmlDevice",
    "NvmlReader",
    "current_gpu",
    "list_gpus",
    "meter_gpu",
    "nvml_clocks",
    "nvml_errors",
]

_NO_DRIVER = (
    "no NVIDIA driver: cannot {action} ({exc}); without a GPU, --actuator sim:a100-like (or "
    "another sim:PRESET) runs the same commands on a simulated GPU"
)
_NO_GPU = "no such GPU while trying to {action} ({exc})"

#: NVML return code -> the opdvfs error and what it says ({action}, {exc} filled in). Built from
#: the real module's constants at import, so a test's fake of pynvml cannot change the codes.
_ADVICE: dict[int, tuple[type[ActuatorError], str]] = (
    {}
    if pynvml is None
    else {
        pynvml.NVML_ERROR_NO_PERMISSION: (
            PermissionDeniedError,
            "NVML refused to {action} (NO_PERMISSION): changing GPU clocks needs root (sudo or "
            "CAP_SYS_ADMIN), or run through Zeus's daemon: start zeusd as root, then "
            "--actuator zeusd with ZEUSD_SOCK_PATH set; reading clocks and power needs neither",
        ),
        pynvml.NVML_ERROR_NOT_SUPPORTED: (
            NotSupportedError,
            "NVML cannot {action} (NOT_SUPPORTED): locked clocks need a whole GPU of Volta or "
            "newer, not a MIG instance nor an older GPU; --actuator dry-run measures it "
            "without setting clocks",
        ),
        pynvml.NVML_ERROR_NOT_FOUND: (DeviceNotFoundError, _NO_GPU),
        pynvml.NVML_ERROR_INVALID_ARGUMENT: (DeviceNotFoundError, _NO_GPU),
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: (DeviceNotFoundError, _NO_DRIVER),
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED: (DeviceNotFoundError, _NO_DRIVER),
    }
)


def _translate(exc: Any, action: str) -> ActuatorError:
    """Return the opdvfs error for NVML error ``exc`` (mapped by its code, ``exc.value``)."""
    kind, message = _ADVICE.get(exc.value, (ActuatorError, "NVML failed to {action}: {exc}"))
    return kind(message.format(action=action, exc=exc))


@contextmanager
def nvml_errors(action: str) -> Iterator[None]:
    """Translate an NVML error raised in the ``with`` block into an opdvfs error.

    Parameters
    ----------
    action
        What the block does, in the infinitive ("read the power"): the message says it failed.

    Raises
    ------
    ActuatorError
        Or its leaves :class:`~opdvfs.exceptions.PermissionDeniedError`,
        :class:`~opdvfs.exceptions.NotSupportedError` and
        :class:`~opdvfs.exceptions.DeviceNotFoundError`, from the NVML error (its cause).
    """
    try:
        yield
    except Exception as exc:
        # without nvidia-ml-py nothing in the block can raise NVML's errors: pass it all on
        if pynvml is not None and isinstance(exc, pynvml.NVMLError):
            raise _translate(exc, action) from exc
        raise


def list_gpus() -> list[tuple[int, str]]:
    """Return NVML's ``(index, uuid)`` of every GPU of this machine, by index.

    Raises
    ------
    DeviceNotFoundError
        Without nvidia-ml-py or a driver.
    """
    with _nvml_session() as nv, nvml_errors("list the GPUs"):
        return [
            (index, _text(nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(index))))
            for index in range(int(nv.nvmlDeviceGetCount()))
        ]


@contextmanager
def _nvml_session() -> Iterator[Any]:
    """Initialise NVML for the block (the library module), shut it down after.

    Raises
    ------
    DeviceNotFoundError
        Without nvidia-ml-py or a driver.
    """
    if pynvml is None:
        raise DeviceNotFoundError("nvidia-ml-py is not installed: pip install 'opdvfs[nvidia]'")
    nv: Any = pynvml
    with nvml_errors("initialise NVML"):
        nv.nvmlInit()
    try:
        yield nv
    finally:
        with nvml_errors("shut NVML down"):
            nv.nvmlShutdown()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)  # bytes: older pynvml


def _cuda_device() -> tuple[int | None, str | None]:
    """Return torch's current CUDA device and its UUID, where this process has initialised CUDA.

    Neither imports torch nor initialises CUDA (a launcher's process must not: the script may
    still set ``CUDA_VISIBLE_DEVICES``); (None, None) before the script has used CUDA.
    """
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None, None
    device = int(torch.cuda.current_device())
    uuid = str(torch.cuda.get_device_properties(device).uuid)
    return device, uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def current_gpu(override: str | None = None) -> GpuChoice:
    """Return the GPU this process drives and measures.

    :func:`~opdvfs.runtime.gpu_select.select_gpu` on this process's values: its current CUDA
    device once CUDA is initialised, else ``LOCAL_RANK`` (the device a torchrun script sets),
    else CUDA device 0; through ``CUDA_VISIBLE_DEVICES`` to NVML by UUID.
    ``override`` (``--gpu INDEX|UUID[,...]``) names it instead.

    Raises
    ------
    DeviceNotFoundError
        Without nvidia-ml-py, a driver or a GPU.
    ValidationError
        When ``override`` or the CUDA device names no GPU of the machine.
    """
    device, uuid = _cuda_device() if override is None else (None, None)
    return select_gpu(os.environ, device, list_gpus(), cuda_uuid=uuid, override=override)


class NvmlDevice:
    """One NVIDIA GPU through NVML: the library initialised once, the device's handle found.

    Parameters
    ----------
    index
        NVML device index. NVML's order may differ from CUDA's: prefer ``uuid``.
    uuid
        Device UUID (``GPU-...``, ``MIG-...``).
    gpu
        The GPU as :func:`current_gpu` chose it. With none of the three: :func:`current_gpu`,
        this process's own GPU.

    Attributes
    ----------
    lib
        The pynvml module; call it inside :func:`nvml_errors`.
    handle
        The device's NVML handle.
    gpu
        Which GPU it is (:class:`~opdvfs.runtime.gpu_select.GpuChoice`), for messages.

    Raises
    ------
    DeviceNotFoundError
        Without nvidia-ml-py, without a driver, or when no GPU has that index or UUID.
    """

    def __init__(
        self, *, index: int | None = None, uuid: str | None = None, gpu: GpuChoice | None = None
    ) -> None:
        if pynvml is None:
            raise DeviceNotFoundError("nvidia-ml-py is not installed: pip install 'opdvfs[nvidia]'")
        if gpu is None and index is None and uuid is None:
            gpu = current_gpu()
        self.lib: Any = pynvml
        with nvml_errors("initialise NVML"):
            self.lib.nvmlInit()
        self._open = True
        try:
            with nvml_errors("find the GPU"):
                if gpu is not None:
                    self.handle: Any = self.lib.nvmlDeviceGetHandleByUUID(gpu.uuid)
                elif uuid is not None:
                    self.handle = self.lib.nvmlDeviceGetHandleByUUID(uuid)
                    found_index = (
                        None
                        if uuid.startswith("MIG-")
                        else int(self.lib.nvmlDeviceGetIndex(self.handle))
                    )
                    gpu = GpuChoice(found_index, uuid, "its UUID")
                else:
                    self.handle = self.lib.nvmlDeviceGetHandleByIndex(index)
                    found = self.lib.nvmlDeviceGetUUID(self.handle)
                    found = found.decode() if isinstance(found, bytes) else str(found)
                    gpu = GpuChoice(index, found, f"NVML index {index}")
        except ActuatorError:
            self.close()  # NVML counts initialisations: give this one back
            raise
        self.gpu: GpuChoice = gpu

    def close(self) -> None:
        """Shut NVML down (once, however often it is called; the clock is not touched)."""
        if self._open:
            self._open = False
            with nvml_errors("shut NVML down"):
                self.lib.nvmlShutdown()


class NvmlReader:
    """Read one NVIDIA GPU through NVML, never writing to it: clocks, power, energy, temperature.

    Reads need no root. Nothing here calls an ``nvmlDeviceSet*`` or ``nvmlDeviceReset*``
    function (a test checks the source), so a dry run measures a real GPU through it safely.

    Parameters
    ----------
    index, uuid, gpu
        The GPU, as :class:`NvmlDevice`; default this process's own (:func:`current_gpu`).

    Attributes
    ----------
    device
        The :class:`NvmlDevice` read.

    Raises
    ------
    DeviceNotFoundError
        Without nvidia-ml-py, without a driver, or when no GPU has that index or UUID.
    """

    def __init__(
        self, *, index: int | None = None, uuid: str | None = None, gpu: GpuChoice | None = None
    ) -> None:
        self.device = NvmlDevice(index=index, uuid=uuid, gpu=gpu)
        nv, handle = self.device.lib, self.device.handle
        try:
            with nvml_errors(f"read the supported clocks of {self.device.gpu.label}"):
                memory = max(nv.nvmlDeviceGetSupportedMemoryClocks(handle))
                clocks = nv.nvmlDeviceGetSupportedGraphicsClocks(handle, memory)
        except ActuatorError:
            self.device.close()
            raise
        self._clocks = tuple(sorted(float(c) for c in clocks))

    @property
    def gpu(self) -> GpuChoice:
        """Which GPU it reads."""
        return self.device.gpu

    def supported_freqs_mhz(self) -> Sequence[float]:
        """Return the SM clocks NVML supports at the highest memory clock (MHz), ascending."""
        return self._clocks

    def name(self) -> str:
        """Return the GPU's product name (``nvmlDeviceGetName``, e.g. ``"NVIDIA H200"``).

        Raises
        ------
        ActuatorError
            If NVML cannot read it.
        """
        with nvml_errors("read the GPU's name"):
            name = self.device.lib.nvmlDeviceGetName(self.device.handle)
        return name.decode() if isinstance(name, bytes) else str(name)  # bytes: older pynvml

    def read_power_w(self) -> float:
        """Return the board power (W); NVML reports mW (a 1 s average on Ampere and newer)."""
        with nvml_errors("read the power"):
            return float(self.device.lib.nvmlDeviceGetPowerUsage(self.device.handle)) / 1e3

    def read_energy_j(self) -> float:
        """Return the energy the GPU has used since the driver loaded (J; NVML counts mJ)."""
        with nvml_errors("read the energy counter"):
            mj = self.device.lib.nvmlDeviceGetTotalEnergyConsumption(self.device.handle)
        return float(mj) / 1e3

    def read_temperature_c(self) -> float:
        """Return the GPU die temperature (deg C)."""
        nv = self.device.lib
        with nvml_errors("read the temperature"):
            return float(nv.nvmlDeviceGetTemperature(self.device.handle, nv.NVML_TEMPERATURE_GPU))

    def close(self) -> None:
        """Shut NVML down (once, however often it is called)."""
        self.device.close()


def nvml_system() -> dict[str, Any]:
    """Return what NVML says of the node, read-only: driver and NVML versions, each GPU.

    Per GPU (NVML's index order): its name, UUID, supported SM clocks (MHz: lowest, top,
    how many), the SM clock now (MHz), power (W), and whether it has an energy counter. For
    ``opdvfs doctor``.

    Raises
    ------
    DeviceNotFoundError
        Without nvidia-ml-py or a driver.
    ActuatorError
        If NVML cannot read the node.
    """
    with _nvml_session() as nv:
        with nvml_errors("read the driver"):
            info: dict[str, Any] = {
                "driver": _text(nv.nvmlSystemGetDriverVersion()),
                "nvml": _text(nv.nvmlSystemGetNVMLVersion()),
                "gpus": [],
            }
            count = int(nv.nvmlDeviceGetCount())
        for index in range(count):
            reader = NvmlReader(index=index)
            try:
                clocks = reader.supported_freqs_mhz()
                lib, handle = reader.device.lib, reader.device.handle
                with nvml_errors("read the GPU"):
                    uuid = _text(lib.nvmlDeviceGetUUID(handle))
                    sm_mhz = float(lib.nvmlDeviceGetClockInfo(handle, lib.NVML_CLOCK_SM))
                try:
                    reader.read_energy_j()
                    energy = True
                except ActuatorError:
                    energy = False
                info["gpus"].append(
                    {
                        "index": index,
                        "name": reader.name(),
                        "uuid": uuid,
                        "clocks_mhz": [min(clocks), max(clocks), len(clocks)] if clocks else [],
                        "sm_clock_mhz": sm_mhz,
                        "power_w": reader.read_power_w(),
                        "energy_counter": energy,
                    }
                )
            finally:
                reader.close()
    return info


def meter_gpu(meter: object) -> GpuChoice | None:
    """Return the GPU an actuator's :attr:`~Actuator.meter` reads, or None: not an NVML reader.

    The sampler and the thermometer read that GPU, the one the actuator drives.
    """
    return meter.gpu if isinstance(meter, NvmlReader) else None


def nvml_clocks(gpu: str | None = None) -> tuple[str, tuple[float, ...]]:
    """Return an NVIDIA GPU's name and its supported SM clocks (MHz, ascending), from NVML.

    ``nvmlDeviceGetSupportedMemoryClocks``, then ``nvmlDeviceGetSupportedGraphicsClocks`` at
    the highest memory clock (:class:`NvmlReader`: read-only, no root needed; the clocks the
    actuator locks), for a device file (``opdvfs device``, ``opdvfs characterise --clocks
    nvml``).

    ``gpu``: ``--gpu INDEX|UUID`` (default this process's own GPU, :func:`current_gpu`).

    Raises
    ------
    ActuatorError
        Or :class:`~opdvfs.exceptions.DeviceNotFoundError` (no nvidia-ml-py, no driver, no such
        GPU), from NVML.
    ValidationError
        When ``gpu`` names no GPU of the machine.
    """
    reader = NvmlReader(gpu=current_gpu(gpu))
    try:
        return reader.name(), tuple(float(f) for f in reader.supported_freqs_mhz())
    finally:
        reader.close()


class NvmlActuator(Actuator):
    """Core (SM) clock control of one NVIDIA GPU.

    It claims its GPU for the process while open (:class:`~opdvfs.runtime.gpu_select.GpuClaim`:
    two processes setting one GPU's clock would undo each other), and its :meth:`reset` unlocks
    the clock only when it locked it: a GPU this process never changed is never touched.

    Parameters
    ----------
    index, uuid, gpu
        The GPU, as :class:`NvmlDevice`; default this process's own (:func:`current_gpu`).

    Attributes
    ----------
    device
        The :class:`NvmlDevice` it sets and reads.

    Raises
    ------
    DeviceNotFoundError
        Without nvidia-ml-py, without a driver, or when no GPU has that index or UUID.
    ActuatorError
        When another process holds the GPU's claim (the message names its pid).
    """

    def __init__(
        self, *, index: int | None = None, uuid: str | None = None, gpu: GpuChoice | None = None
    ) -> None:
        self._meter = NvmlReader(index=index, uuid=uuid, gpu=gpu)
        self.device = self._meter.device
        try:
            self._claim = GpuClaim(self.device.gpu)
        except ActuatorError:
            self._meter.close()
            raise
        self._current: float | None = None
        self._changed = False  # whether this actuator may have locked the clock since its reset

    @property
    def kind(self) -> str:
        """``"nvml"``."""
        return "nvml"

    @property
    def current_mhz(self) -> float | None:
        """The SM clock it last locked (MHz), or None: unlocked (none locked yet, or reset)."""
        return self._current

    @property
    def meter(self) -> NvmlReader:
        """The :class:`NvmlReader` every read goes through (read-only: it sets nothing)."""
        return self._meter

    @property
    def gpu(self) -> GpuChoice:
        """Which GPU it drives."""
        return self.device.gpu

    def supported_freqs_mhz(self) -> Sequence[float]:
        """Return the SM clocks NVML supports at the highest memory clock (MHz), ascending."""
        return self._meter.supported_freqs_mhz()

    def set_freq_mhz(self, freq_mhz: float) -> None:
        """Lock the SM clock at ``freq_mhz`` (MHz; ``nvmlDeviceSetGpuLockedClocks`` min = max).

        Raises
        ------
        UnsupportedClockError
            If ``freq_mhz`` is not one of :meth:`supported_freqs_mhz`.
        PermissionDeniedError
            Without root or CAP_SYS_ADMIN.
        """
        if freq_mhz == self._current:
            return
        freq = self.check_freq_mhz(freq_mhz)
        changed, self._changed = self._changed, True  # before the call: a signal may land in it
        try:
            self._lock(int(freq))
        except ActuatorError:
            self._changed = changed  # NVML refused: the clock is as it was
            raise
        self._current = freq

    def reset(self) -> None:
        """Unlock the SM clock (``nvmlDeviceResetGpuLockedClocks``) if this actuator locked it.

        A GPU whose clock it never locked (or already reset) is not touched.
        """
        if self._changed:
            self._unlock()
            self._changed = False
        self._current = None

    def give_back(self) -> None:
        """Unlock the SM clock whoever locked it (the repair of a clock a dead run left set)."""
        self._unlock()
        self._changed = False
        self._current = None

    def _lock(self, freq_mhz: int) -> None:
        """Lock the SM clock at ``freq_mhz`` (min = max); the one write a subclass reroutes."""
        with nvml_errors(f"lock the SM clock of {self.gpu.label} at {freq_mhz} MHz"):
            self.device.lib.nvmlDeviceSetGpuLockedClocks(self.device.handle, freq_mhz, freq_mhz)

    def _unlock(self) -> None:
        """Unlock the SM clock; the other write a subclass reroutes."""
        with nvml_errors(f"reset the SM clock of {self.gpu.label}"):
            self.device.lib.nvmlDeviceResetGpuLockedClocks(self.device.handle)

    def read_power_w(self) -> float:
        """Return the board power (W) (:meth:`NvmlReader.read_power_w`)."""
        return self._meter.read_power_w()

    def read_energy_j(self) -> float:
        """Return the GPU's energy counter (J) (:meth:`NvmlReader.read_energy_j`)."""
        return self._meter.read_energy_j()

    def read_temperature_c(self) -> float:
        """Return the GPU die temperature (deg C) (:meth:`NvmlReader.read_temperature_c`)."""
        return self._meter.read_temperature_c()

    def close(self) -> None:
        """Shut NVML down and give the GPU's claim back (the clock is not touched); repeatable."""
        self._claim.release()
        self.device.close()
