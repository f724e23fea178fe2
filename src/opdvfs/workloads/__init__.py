"""Workloads: the ``Workload`` data object (one iteration's op sequence) and the library.

:func:`load_workload` builds a named workload (:data:`BUILDERS`: GPT-3, BERT, ResNet, ViT, ...)
or reads a workload file; capturing one from a running program is
:class:`opdvfs.runtime.recorder.WorkloadRecorder`'s job.

Names load on first use (PEP 562), so importing the package costs nothing until one is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opdvfs._lazy import attach

#: Exported name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    "BUILDERS": "opdvfs.workloads.library",
    "load_workload": "opdvfs.workloads.library",
    "PHASES": "opdvfs.workloads.workload",
    "WORKLOAD_COLUMNS": "opdvfs.workloads.workload",
    "Workload": "opdvfs.workloads.workload",
}

__all__ = ["BUILDERS", "PHASES", "WORKLOAD_COLUMNS", "Workload", "load_workload"]

if TYPE_CHECKING:  # what the lazy names are, for type checkers and IDEs
    from opdvfs.workloads.library import BUILDERS, load_workload
    from opdvfs.workloads.workload import PHASES, WORKLOAD_COLUMNS, Workload

__getattr__, __dir__ = attach(__name__, _EXPORTS)
