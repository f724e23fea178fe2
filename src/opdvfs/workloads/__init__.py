"""Workloads: the ``Workload`` data object (one iteration's op sequence) and the library.

:func:`load_workload` builds a named workload (:data:`BUILDERS`: GPT-3, BERT, ResNet, ViT, ...)
or reads a workload file; capturing one from a running program is
:class:`opdvfs.runtime.dispatch.WorkloadRecorder`'s job.
"""

from opdvfs.workloads.library import BUILDERS, load_workload
from opdvfs.workloads.workload import PHASES, WORKLOAD_COLUMNS, Workload

__all__ = ["BUILDERS", "PHASES", "WORKLOAD_COLUMNS", "Workload", "load_workload"]
