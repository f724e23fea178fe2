"""Ascend NPUs: no public API sets the AI Core clock, so requests are logged, not applied.

Huawei documents only *readers* for the 910B's AI Core clock (DCMI
``dcmi_get_device_frequency(card, device, 7, &mhz)``, ``dcmi_get_device_power_info`` in 0.1 W;
``research/ecosystem.md`` §4.2). This actuator records every requested switch like the dry run
(the plan as it would have been applied, op by op), reads the real clock and power through
``libdcmi.so`` when it is there, and warns once that nothing was changed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from opdvfs.exceptions import DeviceNotFoundError
from opdvfs.runtime.actuators.dry_run import DryRunActuator

__all__ = ["AscendActuator", "load_dcmi"]

#: ``enum dcmi_freq_type``: AI Core current frequency.
_AICORE_CURRENT = 7


def load_dcmi() -> Any:
    """Load ``libdcmi.so`` (the NPU driver's management library) and initialise it."""
    path = ctypes.util.find_library("dcmi") or "/usr/local/dcmi/libdcmi.so"
    try:
        lib = ctypes.CDLL(path)
    except OSError as exc:
        raise DeviceNotFoundError(
            "no Ascend driver: libdcmi.so not found (install the NPU driver, or add "
            "/usr/local/dcmi to LD_LIBRARY_PATH)"
        ) from exc
    if lib.dcmi_init() != 0:
        raise DeviceNotFoundError("libdcmi.so is there but dcmi_init() failed")
    return lib


class AscendActuator(DryRunActuator):
    """Log the plan on an Ascend NPU; read its AI Core clock and power through DCMI.

    Parameters
    ----------
    freqs_mhz
        The AI Core clocks plans may use (MHz; :func:`~opdvfs.runtime.actuators.make_actuator`
        gives the ``ascend-910b-like`` preset's when no other preset is named).
    card, device
        DCMI card and device ids.
    log
        JSON-lines file the requests are appended to, as :class:`DryRunActuator` writes them.
    header
        More fields for the log's header line.
    dcmi
        A loaded DCMI library (default: :func:`load_dcmi` on first read).
    """

    def __init__(
        self,
        freqs_mhz: Sequence[float],
        *,
        card: int = 0,
        device: int = 0,
        log: str | os.PathLike[str] | None = None,
        dcmi: Any = None,
        header: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(freqs_mhz, log=log, header=header)
        self.card, self.device = card, device
        self._dcmi = dcmi
        self._warned = False

    @property
    def kind(self) -> str:
        """``"ascend"``."""
        return "ascend"

    def _lib(self) -> Any:
        if self._dcmi is None:
            self._dcmi = load_dcmi()
        return self._dcmi

    def set_freq_mhz(self, freq_mhz: float) -> None:
        """Record the request (MHz); no public setter exists, so the clock is not changed.

        Raises
        ------
        UnsupportedClockError
            If ``freq_mhz`` is not one of the clocks given at construction.
        """
        super().set_freq_mhz(freq_mhz)  # an unsupported clock raises before any warning
        if not self._warned:
            self._warned = True
            warnings.warn(
                "opdvfs: Ascend has no public AI Core clock setter; switches are logged, not "
                "applied",
                stacklevel=2,
            )

    def read_freq_mhz(self) -> float:
        """Return the AI Core clock the device runs at now (MHz; DCMI type 7)."""
        value = ctypes.c_uint(0)
        rc = self._lib().dcmi_get_device_frequency(
            self.card, self.device, _AICORE_CURRENT, ctypes.byref(value)
        )
        if rc != 0:
            raise DeviceNotFoundError(
                f"dcmi_get_device_frequency(card {self.card}, device {self.device}) failed: {rc}"
            )
        return float(value.value)

    def read_power_w(self) -> float:
        """Return the chip power (W; DCMI reports tenths of a watt)."""
        value = ctypes.c_int(0)
        rc = self._lib().dcmi_get_device_power_info(self.card, self.device, ctypes.byref(value))
        if rc != 0:
            raise DeviceNotFoundError(
                f"dcmi_get_device_power_info(card {self.card}, device {self.device}) failed: {rc}"
            )
        return value.value / 10.0
