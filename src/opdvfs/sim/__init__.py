"""The simulated accelerator (the embedded default of every command) and its device presets.

Names load on first use (PEP 562), so importing the package costs nothing until one is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opdvfs._lazy import attach

#: Exported name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    "TwinParams": "opdvfs.sim.params",
    "PRESETS": "opdvfs.sim.presets",
    "Preset": "opdvfs.sim.presets",
    "get_preset": "opdvfs.sim.presets",
    "preset_spec": "opdvfs.sim.presets",
    "SimRun": "opdvfs.sim.twin",
    "SimulatedDevice": "opdvfs.sim.twin",
}

__all__ = [
    "PRESETS",
    "Preset",
    "SimRun",
    "SimulatedDevice",
    "TwinParams",
    "get_preset",
    "preset_spec",
]

if TYPE_CHECKING:  # what the lazy names are, for type checkers and IDEs
    from opdvfs.sim.params import TwinParams
    from opdvfs.sim.presets import PRESETS, Preset, get_preset, preset_spec
    from opdvfs.sim.twin import SimRun, SimulatedDevice

__getattr__, __dir__ = attach(__name__, _EXPORTS)
