"""Launch every aten operator a program dispatches on a :class:`SimulatedGpu` (needs torch).

:class:`SimGpuFeed` is the workload recorder (:class:`~opdvfs.runtime.recorder.WorkloadRecorder`)
with its rows sent to the simulated GPU as launches instead of kept: the same FLOPs, bytes and
counting as ``opdvfs capture``, so the executor's operator indices and the device's agree. The
aten name runs as the simulator's operator of that kind
(:data:`opdvfs.sim.physics.ATEN_TYPES`: a matmul on the matrix units, a layer norm as a
reduction ...); views and allocations start no kernel.

Enter it *before* an executor (lower on the dispatch-mode stack): the executor then sees each
operator first and issues its switch, and the device places the operator after, at the clock
that switch leaves in effect.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

from opdvfs.runtime.recorder import WorkloadRecorder, message_peer
from opdvfs.sim.gpu import SimulatedGpu

__all__ = ["SimGpuFeed"]

#: aten operators that start no kernel on a GPU besides views (allocations, metadata).
_NO_KERNEL = frozenset(
    {
        "aten::empty",
        "aten::empty_strided",
        "aten::empty_like",
        "aten::new_empty",
        "aten::new_empty_strided",
        "aten::lift_fresh",
        "aten::resize_",
        "aten::set_",
        "aten::_local_scalar_dense",
    }
)


class _Launcher(list[dict[str, Any]]):
    """Where the recorder appends each operator's row: a launch on the device, nothing kept."""

    def __init__(self, feed: SimGpuFeed) -> None:
        super().__init__()
        self._feed = feed

    def append(self, row: dict[str, Any]) -> None:
        """Launch ``row`` on the device."""
        self._feed.launch(row)


#: Seconds a receive, already done, looks for its sender's time before it stops modelling waits.
_SENT_WAIT_S = 5.0


class _Messages:
    """The simulated GPUs of a job's ranks wait for each other at point-to-point messages.

    Each rank's simulated GPU keeps its own virtual time. A send posts its sender's time (the
    end of the operators before it) through the process group's key-value store, and the
    matching receive (the k-th from that sender: gloo and NCCL match in order per pair) lets
    the receiver's device idle until then before the receive runs, as a pipeline stage waits
    for its neighbour. Off a process group (or in a group of one) nothing is exchanged. The
    peers are the job's ranks (:func:`~opdvfs.runtime.recorder.message_peer`); a message whose
    group torch cannot map finds no time within :data:`_SENT_WAIT_S` of its receive (which is
    done by then), and waits are no longer modelled in that process (nothing hangs).
    """

    def __init__(self, gpu: SimulatedGpu) -> None:
        self.gpu = gpu
        self._sent: dict[int, int] = {}  # messages sent to each peer
        self._received: dict[int, int] = {}  # messages received from each peer
        self._store: Any = None
        self._off = False  # a receive found no sender's time: waits are not modelled

    def _job(self) -> tuple[Any, int] | None:
        import torch.distributed as dist

        if self._off or not (
            dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        ):
            return None
        if self._store is None:
            from torch.distributed.distributed_c10d import _get_default_store

            self._store = dist.PrefixStore("opdvfs-sim-messages/", _get_default_store())
        return self._store, dist.get_rank()

    def sent(self, peer: int) -> None:
        """Before a send to ``peer`` runs: post the sender's time (its operators before it)."""
        job = self._job()
        if job is None:
            return
        store, rank = job
        store.set(_message_key(self._sent, peer, rank, peer), repr(self.gpu.now_s()))

    def received(self, peer: int) -> None:
        """Once a receive from ``peer`` is done, before it runs on the device: idle until sent."""
        job = self._job()
        if job is None:
            return
        import torch.distributed as dist

        store, rank = job
        key = _message_key(self._received, peer, peer, rank)
        try:
            store.wait([key], timedelta(seconds=_SENT_WAIT_S))  # (posted before the send)
        except dist.DistStoreError:
            self._off = True
            return
        sent_s = float(bytes(store.get(key)).decode())
        store.delete_key(key)
        self.gpu.idle_until(sent_s)


def _message_key(counts: dict[int, int], peer: int, sender: int, receiver: int) -> str:
    """Return the store key of the next message from ``sender`` to ``receiver``, and count it.

    ``counts``: this rank's messages so far per ``peer`` (the pair's other rank); the k-th
    message of a pair is matched to the k-th at the other end (gloo and NCCL keep that order).
    """
    k = counts.get(peer, 0)
    counts[peer] = k + 1
    return f"{sender}-{receiver}/{k}"


class SimGpuFeed(WorkloadRecorder):
    """A dispatch mode that launches every aten operator on ``gpu``; iterations end there too.

    Parameters
    ----------
    gpu
        The simulated GPU the program runs on.
    optimizer_steps
        As :class:`~opdvfs.runtime.recorder.IterationCounter`: iterations end at optimizer steps
        (or only at :meth:`mark_iteration`, for ``--iteration-at``).
    """

    def __init__(self, gpu: SimulatedGpu, *, optimizer_steps: bool = True) -> None:
        super().__init__(optimizer_steps=optimizer_steps)
        self.gpu = gpu
        self._current = _Launcher(self)
        self._views: set[str] = set()
        self._local = threading.local()
        self._messages = _Messages(gpu)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func._schema.name
        self._local.kernel = not (func.is_view or name in _NO_KERNEL)
        self._local.receive = None
        if name == "c10d::send":
            self._messages.sent(message_peer(name, args))
        elif name == "c10d::recv_":
            # waited for once it is done, before its launch
            self._local.receive = message_peer(name, args)
        return super().__torch_dispatch__(func, types, args, kwargs)

    def launch(self, row: dict[str, Any]) -> None:
        """Launch the recorder's ``row`` for the operator being dispatched."""
        peer = getattr(self._local, "receive", None)
        if peer is not None:
            self._local.receive = None
            self._messages.received(peer)
        self.gpu.launch(row, kernel=getattr(self._local, "kernel", True))

    def end_iteration(self, n_ops: int) -> None:
        """End the device's iteration (its time and energy counter are recorded)."""
        self.gpu.mark_iteration()
