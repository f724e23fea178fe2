"""The simulated accelerator (the embedded default of every command)."""

from opdvfs.sim.params import TwinParams
from opdvfs.sim.twin import SimRun, SimulatedDevice

__all__ = ["SimRun", "SimulatedDevice", "TwinParams"]
