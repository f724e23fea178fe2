"""The simulated accelerator (the embedded default of every command) and its device presets.

:class:`SimulatedDevice` runs a captured workload under a schedule (the twin);
:class:`SimulatedGpu` is the same device driven online, operator by operator, by a program the
runtime feeds to it (``--actuator sim:PRESET``).

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
    "SimulatedGpu": "opdvfs.sim.gpu",
}

__all__ = [
    "PRESETS",
    "Preset",
    "SimRun",
    "SimulatedDevice",
    "SimulatedGpu",
    "TwinParams",
    "get_preset",
    "preset_spec",
]

if TYPE_CHECKING:  # what the lazy names are, for type checkers and IDEs
    from opdvfs.sim.gpu import SimulatedGpu
    from opdvfs.sim.params import TwinParams
    from opdvfs.sim.presets import PRESETS, Preset, get_preset, preset_spec
    from opdvfs.sim.twin import SimRun, SimulatedDevice

__getattr__, __dir__ = attach(__name__, _EXPORTS)
