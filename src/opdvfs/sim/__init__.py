"""The simulated accelerator (the embedded default of every command) and its device presets."""

from opdvfs.sim.params import TwinParams
from opdvfs.sim.presets import PRESETS, Preset, get_preset, preset_spec
from opdvfs.sim.twin import SimRun, SimulatedDevice

__all__ = [
    "PRESETS",
    "Preset",
    "SimRun",
    "SimulatedDevice",
    "TwinParams",
    "get_preset",
    "preset_spec",
]
