"""What an accelerator exposes: ``DeviceSpec`` (clocks, V-f curve, switch latency, sensors).

Simulated presets of it live with the simulator, in :mod:`opdvfs.sim.presets`.
"""

from opdvfs.devices.spec import DeviceSpec, IdlePower, VoltageCurve

__all__ = ["DeviceSpec", "IdlePower", "VoltageCurve"]
