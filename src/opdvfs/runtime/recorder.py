"""Count a program's iterations and record its operators at their boundaries (needs torch).

:class:`IterationCounter` ends an iteration at each optimizer step (PyTorch's global optimizer
step hook) or at :meth:`~IterationCounter.mark_iteration` (``--iteration-at``).
:class:`WorkloadRecorder` is a ``TorchDispatchMode`` that records each iteration's aten operators
with their shapes, FLOPs and bytes (``opdvfs capture``). Nothing here touches an actuator: the
executors (:mod:`~opdvfs.runtime.applier`, :mod:`~opdvfs.runtime.dispatch`), the clock sweep and
the simulated GPU's feed (:mod:`~opdvfs.runtime.simgpu_feed`, which launches the recorded rows on
the device instead of keeping them) build on them, so the simulated GPU's actuator can enter its
feed without depending on the executors.
"""

from __future__ import annotations

import threading
from typing import Any

import pandas as pd
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from opdvfs.exceptions import CaptureError
from opdvfs.runtime.clock import SYSTEM_CLOCK, Clock
from opdvfs.schedule import op_signature
from opdvfs.workloads.workload import Workload

__all__ = ["IterationCounter", "WorkloadRecorder", "compile_in_use", "message_peer"]


class IterationCounter:
    """Count iterations: each ends at an optimizer step or at :meth:`mark_iteration`.

    ``optimizer_steps=False`` leaves the optimizer steps alone: iterations then end only at
    :meth:`mark_iteration` (``--iteration-at``: inference, custom loops). Cooperative: a
    subclass that is also a ``TorchDispatchMode`` enters and leaves the mode through it.
    ``clock`` times the iterations (default the system's; a test passes one it moves by hand).
    """

    def __init__(self, *, optimizer_steps: bool = True, clock: Clock = SYSTEM_CLOCK) -> None:
        super().__init__()
        self.optimizer_steps = optimizer_steps
        self.clock = clock
        self.iteration = 0
        self.op_index = 0
        self._lock = threading.Lock()
        self._hook: Any = None
        #: ``clock.now()`` at the end of each iteration (the optimizer step, host side);
        #: ``time.perf_counter()`` on the system clock.
        self.iteration_ends_s: list[float] = []

    def __enter__(self) -> Any:
        if self.optimizer_steps:
            self._hook = register_optimizer_step_post_hook(lambda *_: self.mark_iteration())
        enter = getattr(super(), "__enter__", None)
        return self if enter is None else enter()

    def __exit__(self, *exc: object) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        leave = getattr(super(), "__exit__", None)
        if leave is not None:
            leave(*exc)

    def mark_iteration(self) -> None:
        """End the current iteration (at each optimizer step, or each ``--iteration-at`` call)."""
        with self._lock:
            self.iteration_ends_s.append(self.clock.now())
            self.end_iteration(self.op_index)
            self.iteration += 1
            self.op_index = 0

    def end_iteration(self, n_ops: int) -> None:
        """Handle the end of an iteration of ``n_ops`` operators (subclasses override)."""


_COMM = ("c10d", "all_reduce", "allreduce", "all_gather", "reduce_scatter", "broadcast")
#: Namespaces of the operators counted: aten compute and the collectives. Others (profiler::
#: record_function markers, which straddle the optimizer step hook) are not operators of the
#: sequence and would shift it between the first and later iterations.
_COUNTED = ("aten::", "c10d::", "_c10d_functional::")


#: Point-to-point operators: ``(tensors, process group, peer's rank in the group, tag)``.
_P2P = frozenset({"c10d::send", "c10d::recv_"})


def message_peer(name: str, args: Any) -> int:
    """Return the other rank of a ``c10d::send`` / ``c10d::recv_`` (-1 for other operators).

    The operator carries the peer's rank in its process group; the job's (global) rank is
    returned, so messages in a sub-group (a pipeline group beside data-parallel ones) name the
    rank a planner and the other end know. A group torch cannot map keeps the group's rank.
    """
    if name not in _P2P:
        return -1
    peer = int(args[2])
    try:
        import torch.distributed as dist

        group = torch._C._distributed_c10d.ProcessGroup.unbox(args[1])
        return int(dist.get_global_rank(group, peer))
    except Exception:  # not a registered group (a bare ProcessGroup): its own numbering
        return peer


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, list | tuple):
        return sum(_nbytes(v) for v in value)
    return 0


def _shapes(value: Any) -> list[Any]:
    if isinstance(value, torch.Tensor):
        return [list(value.shape)]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _shapes(v)]
    return []


def compile_in_use() -> bool:
    """Whether this process has compiled anything with ``torch.compile`` so far."""
    from torch._dynamo.utils import counters

    return counters["frames"]["total"] > 0


class _OpMode(TorchDispatchMode):
    """A dispatch mode that notices ``torch.compile``: compiled code runs eagerly under it.

    While the mode is active ``torch.compile`` is wrapped to count its calls; a model compiled
    before the mode was entered is seen through Dynamo's frame counters.
    """

    def __init__(self) -> None:
        super().__init__()
        #: ``torch.compile`` calls (or compiled frames before the mode) seen; 0: none.
        self.compile_seen = 0
        self._compile: Any = None

    def __enter__(self) -> Any:
        self.compile_seen = int(compile_in_use())
        original = self._compile = torch.compile

        def compile(*args: Any, **kwargs: Any) -> Any:
            self.compile_seen += 1
            return original(*args, **kwargs)

        torch.compile = compile
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        if self._compile is not None:
            torch.compile = self._compile
            self._compile = None
        super().__exit__(*exc)


class _IterationMode(IterationCounter, _OpMode):
    """Counts aten ops; iterations end at optimizer steps or :meth:`mark_iteration`."""


class WorkloadRecorder(_IterationMode):
    """Record each iteration's aten operator sequence with shapes, FLOPs and bytes.

    After the run, :meth:`workload` returns the last complete iteration as a ``Workload`` (the
    first is usually a warm-up with one-off allocations).
    """

    def __init__(self, *, optimizer_steps: bool = True) -> None:
        super().__init__(optimizer_steps=optimizer_steps)
        self._current: list[dict[str, Any]] = []
        self.iterations: list[list[dict[str, Any]]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func._schema.name
        if not name.startswith(_COUNTED):
            return out
        packet = func._overloadpacket
        flops = 0
        if packet in flop_registry:
            try:
                flops = int(flop_registry[packet](*args, **kwargs, out_val=out))
            except Exception:  # a FLOP formula that rejects these arguments counts 0
                flops = 0
        with self._lock:
            self._current.append(
                {
                    "name": name,
                    "type": name.split("::")[-1],
                    "stream": "comm" if any(c in name for c in _COMM) else "compute",
                    "flops": float(flops),
                    "bytes_loaded": float(_nbytes(args) + _nbytes(list(kwargs.values()))),
                    "bytes_stored": float(_nbytes(out)),
                    "shapes": str(_shapes(args)),
                    "peer": message_peer(name, args),
                }
            )
            self.op_index += 1
        return out

    def end_iteration(self, n_ops: int) -> None:
        """Keep the finished iteration's operators."""
        self.iterations.append(self._current)
        self._current = []

    def workload(self, name: str = "captured") -> Workload:
        """Return the last complete iteration as a Workload.

        Raises
        ------
        CaptureError
            If no iteration was completed (no optimizer step and no :meth:`mark_iteration`).
        """
        if not self.iterations:
            how = "no optimizer step was seen" if self.optimizer_steps else "no iteration marked"
            raise CaptureError(f"no complete iteration recorded ({how})")
        ops = pd.DataFrame(self.iterations[-1])
        meta = {
            "source": "opdvfs capture",
            "iterations_seen": len(self.iterations),
            "op_signature": op_signature(ops["name"]),
        }
        return Workload(ops, name=name, meta=meta)
