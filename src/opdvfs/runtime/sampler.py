"""Power-sensor samples while a program runs: NVML read on a background thread (read-only).

:class:`NvmlSampler` reads board power, GPU temperature, SM clock and the total-energy counter
every ``interval_ms`` on the ``time.time()`` clock, the clock a torch.profiler trace's
``baseTimeNanoseconds`` is on, so the samples line up with the trace's operators (``wall_s``).
It never sets anything. NVML is opened and its errors translated by
:mod:`opdvfs.runtime.actuators.nvml`, the one wrapper of pynvml.
"""

from __future__ import annotations

import contextlib
import threading
import time
from types import TracebackType
from typing import Self

import pandas as pd

from opdvfs.exceptions import ActuatorError
from opdvfs.runtime.actuators.nvml import NvmlDevice, nvml_errors
from opdvfs.runtime.gpu_select import GpuChoice

__all__ = ["NvmlSampler"]


class NvmlSampler:
    """Sample one GPU through NVML until the ``with`` block ends; :attr:`samples` then holds them.

    Parameters
    ----------
    index, gpu
        The GPU, as :class:`~opdvfs.runtime.actuators.nvml.NvmlDevice`; default this process's
        own (:func:`~opdvfs.runtime.actuators.nvml.current_gpu`), the one its actuator drives.
    interval_ms
        Time between reads; NVML's own power average is over 100 ms to 1 s, so 10-50 ms
        resolves its steps without flooding the driver.

    Raises
    ------
    DeviceNotFoundError
        Without nvidia-ml-py, without a driver, or when no GPU has that index.
    """

    def __init__(
        self,
        *,
        index: int | None = None,
        gpu: GpuChoice | None = None,
        interval_ms: float = 20.0,
    ) -> None:
        self._device = NvmlDevice(index=index, gpu=gpu)
        self.interval_s = interval_ms / 1e3
        self._rows: list[tuple[float, float, float, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="opdvfs-nvml", daemon=True)

    def read_freq_mhz(self) -> float:
        """Return the current SM clock (MHz)."""
        nv = self._device.lib
        with nvml_errors("read the SM clock"):
            return float(nv.nvmlDeviceGetClockInfo(self._device.handle, nv.NVML_CLOCK_SM))

    def _read(self) -> tuple[float, float, float, float, float]:
        nv, h = self._device.lib, self._device.handle
        with nvml_errors("read a power sample"):
            return (
                time.time(),
                nv.nvmlDeviceGetPowerUsage(h) / 1e3,  # mW -> W
                float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
                float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                nv.nvmlDeviceGetTotalEnergyConsumption(h) / 1e3,  # mJ -> J
            )

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(ActuatorError):  # a failed read: skip the sample
                self._rows.append(self._read())
            self._stop.wait(self.interval_s)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
        self._device.close()

    @property
    def samples(self) -> pd.DataFrame:
        """Return the samples: ``t_s`` (Unix), ``power_w``, ``temp_c``, ``freq_mhz``, ``energy_j``.

        Units as in a Profile's samples (W, degC, MHz, J).
        """
        return pd.DataFrame(
            self._rows, columns=["t_s", "power_w", "temp_c", "freq_mhz", "energy_j"]
        )
