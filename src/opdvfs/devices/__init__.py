"""Accelerator descriptions (``DeviceSpec``) and, later, the simulated presets."""

from opdvfs.devices.spec import DeviceSpec, VoltageCurve

__all__ = ["DeviceSpec", "VoltageCurve"]
