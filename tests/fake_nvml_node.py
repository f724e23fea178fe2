"""A fake NVML of a multi-GPU node, answering as the real driver does (#32).

:class:`FakeNode` models a node's GPUs: their UUIDs and supported clocks, the locked-clock
state each GPU holds (shared by every process that opens the node: a JSON file under a lock),
the energy counter of each GPU, MIG instances, GPUs that cannot lock clocks, and a process
without root. It answers through an autospecced pynvml (the real module's signatures) and
raises the real ``pynvml.NVMLError`` for each code NVML returns: ``NO_PERMISSION`` for a write
without root, ``NOT_SUPPORTED`` for a lock on a GPU that cannot lock clocks or on a MIG
instance, ``INVALID_ARGUMENT`` for a clock the GPU does not support, ``NOT_FOUND`` for an
unknown UUID. Every call that names a GPU is recorded with the GPU's index and the calling
process's ``RANK``, so a test asserts which GPUs a job touched.

Use ``with node.patched(): ...`` in each process (a rank started by a test installs its own
from the same state file with :meth:`FakeNode.load`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import pynvml

#: An A100's SM clocks (MHz), a few of them, in NVML's (descending) order.
CLOCKS_MHZ = [1410, 1395, 1380, 1005, 210]


def gpu_uuid(index: int) -> str:
    """The UUID the fake gives GPU ``index``."""
    return f"GPU-{index:08x}-aaaa-bbbb-cccc-{index:012x}"


def mig_uuid(index: int, instance: int) -> str:
    """The UUID of MIG instance ``instance`` of GPU ``index``."""
    return f"MIG-{index:08x}-{instance:04x}-bbbb-cccc-{index:012x}"


@dataclass
class FakeGpu:
    """One GPU of the node, as NVML reports it."""

    index: int
    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    clocks_mhz: list[int] = field(default_factory=lambda: list(CLOCKS_MHZ))
    can_lock: bool = True
    migs: list[str] = field(default_factory=list)
    power_mw: int = 250_000


@dataclass(frozen=True)
class Handle:
    """An NVML device handle: a GPU, or one of its MIG instances."""

    index: int
    uuid: str
    mig: bool


class FakeNode:
    """A node of NVIDIA GPUs behind NVML; its clock state is shared through ``state``.

    Parameters
    ----------
    state
        JSON file holding the node: its GPUs, whether the caller is root, each GPU's locked
        clocks and who locked them, and every call made (written on construction).
    gpus
        The GPUs (default 4 A100s); None when loading an existing state.
    root
        Whether writes are allowed (else NVML answers NO_PERMISSION).
    """

    def __init__(self, state: Path, gpus: list[FakeGpu] | None = None, root: bool = True):
        self.path = Path(state)
        if gpus is not None:
            doc = {
                "gpus": [asdict(g) for g in gpus],
                "root": root,
                "locked": {str(g.index): None for g in gpus},
                "holder": {str(g.index): None for g in gpus},
                "calls": [],
            }
            self.path.write_text(json.dumps(doc))
        self.gpus = [FakeGpu(**g) for g in self._read()["gpus"]]
        self._energy_mj = {g.index: 1_000_000_000 * (g.index + 1) for g in self.gpus}

    @classmethod
    def four_gpus(cls, state: Path, **kwargs: Any) -> FakeNode:
        """A node of 4 A100s, GPU ``i`` with UUID :func:`gpu_uuid` (i)."""
        return cls(state, [FakeGpu(i, gpu_uuid(i)) for i in range(4)], **kwargs)

    @classmethod
    def load(cls, state: Path) -> FakeNode:
        """The node a test wrote to ``state`` (in a process the test started)."""
        return cls(state)

    # ------------------------------------------------------------------ shared state
    def _read(self) -> dict[str, Any]:
        return json.loads(self.path.read_text())

    @contextlib.contextmanager
    def _update(self) -> Iterator[dict[str, Any]]:
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            doc = self._read()
            yield doc
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(doc))
            tmp.replace(self.path)

    @property
    def calls(self) -> list[dict[str, Any]]:
        """Every call that named a GPU: ``{"fn", "gpu", "rank", "pid", "args"}``, in order."""
        return self._read()["calls"]

    def locked(self) -> dict[int, list[int] | None]:
        """Each GPU's locked clocks ``[min, max]`` (MHz), or None: the driver's own."""
        return {int(k): v for k, v in self._read()["locked"].items()}

    def holders(self) -> dict[int, str | None]:
        """Who locked each GPU's clocks (``"pid N"``, or the name :meth:`hold` gave)."""
        return {int(k): v for k, v in self._read()["holder"].items()}

    def hold(self, index: int, freq_mhz: int, holder: str) -> None:
        """Another process locks GPU ``index`` at ``freq_mhz`` (as ``nvidia-smi -lgc`` would)."""
        with self._update() as doc:
            doc["locked"][str(index)] = [freq_mhz, freq_mhz]
            doc["holder"][str(index)] = holder

    def writes(self) -> list[tuple[str, int, int | None]]:
        """The write calls made: ``(function, gpu index, rank)``."""
        return [
            (c["fn"], c["gpu"], c["rank"])
            for c in self.calls
            if c["fn"].startswith(("nvmlDeviceSet", "nvmlDeviceReset"))
        ]

    # ------------------------------------------------------------------ NVML's answers
    def _record(self, fn: str, handle: Handle, *args: Any) -> None:
        rank = os.environ.get("RANK")
        with self._update() as doc:
            doc["calls"].append(
                {
                    "fn": fn,
                    "gpu": handle.index,
                    "mig": handle.mig,
                    "rank": None if rank is None else int(rank),
                    "pid": os.getpid(),
                    "args": list(args),
                }
            )

    def _gpu(self, handle: Handle) -> FakeGpu:
        return self.gpus[handle.index]

    def _handle_by_index(self, index: int) -> Handle:
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return Handle(index, self.gpus[index].uuid, False)

    def _handle_by_uuid(self, uuid: str) -> Handle:
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return Handle(gpu.index, uuid, False)
            if uuid in gpu.migs:
                return Handle(gpu.index, uuid, True)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def _read_call(self, fn: str):
        def answer(handle: Handle, *args: Any) -> Any:
            self._record(fn, handle, *args)
            gpu = self._gpu(handle)
            if fn == "nvmlDeviceGetName":
                return gpu.name
            if fn == "nvmlDeviceGetSupportedMemoryClocks":
                return [1593, 1215]
            if fn == "nvmlDeviceGetSupportedGraphicsClocks":
                return list(gpu.clocks_mhz)
            if fn == "nvmlDeviceGetPowerUsage":
                return gpu.power_mw
            if fn == "nvmlDeviceGetTotalEnergyConsumption":
                self._energy_mj[gpu.index] += gpu.power_mw // 10  # 100 ms at that power
                return self._energy_mj[gpu.index]
            if fn == "nvmlDeviceGetTemperature":
                return 50 + gpu.index
            if fn == "nvmlDeviceGetClockInfo":
                locked = self.locked()[gpu.index]
                return locked[1] if locked else max(gpu.clocks_mhz)
            raise AssertionError(fn)

        return answer

    def _check_write(self, handle: Handle) -> None:
        if not self._read()["root"]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        if handle.mig or not self._gpu(handle).can_lock:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _set_locked(self, handle: Handle, lo: int, hi: int) -> None:
        self._record("nvmlDeviceSetGpuLockedClocks", handle, lo, hi)
        self._check_write(handle)
        if lo not in self._gpu(handle).clocks_mhz or hi not in self._gpu(handle).clocks_mhz:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        with self._update() as doc:
            doc["locked"][str(handle.index)] = [lo, hi]
            doc["holder"][str(handle.index)] = f"pid {os.getpid()}"

    def _reset_locked(self, handle: Handle) -> None:
        self._record("nvmlDeviceResetGpuLockedClocks", handle)
        self._check_write(handle)
        with self._update() as doc:
            doc["locked"][str(handle.index)] = None
            doc["holder"][str(handle.index)] = None

    def fake(self) -> Any:
        """An autospecced pynvml answering as this node."""
        fake = mock.create_autospec(pynvml)
        fake.NVMLError = pynvml.NVMLError
        fake.NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
        fake.NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
        fake.nvmlDeviceGetCount.side_effect = lambda: len(self.gpus)
        fake.nvmlDeviceGetHandleByIndex.side_effect = self._handle_by_index
        fake.nvmlDeviceGetHandleByUUID.side_effect = self._handle_by_uuid
        fake.nvmlDeviceGetUUID.side_effect = lambda h: h.uuid
        fake.nvmlDeviceGetIndex.side_effect = lambda h: h.index
        fake.nvmlDeviceIsMigDeviceHandle.side_effect = lambda h: h.mig
        for fn in (
            "nvmlDeviceGetName",
            "nvmlDeviceGetSupportedMemoryClocks",
            "nvmlDeviceGetSupportedGraphicsClocks",
            "nvmlDeviceGetPowerUsage",
            "nvmlDeviceGetTotalEnergyConsumption",
            "nvmlDeviceGetTemperature",
            "nvmlDeviceGetClockInfo",
        ):
            getattr(fake, fn).side_effect = self._read_call(fn)
        fake.nvmlDeviceSetGpuLockedClocks.side_effect = self._set_locked
        fake.nvmlDeviceResetGpuLockedClocks.side_effect = self._reset_locked
        return fake

    @contextlib.contextmanager
    def patched(self) -> Iterator[Any]:
        """Within the block, opdvfs's NVML is this node (where opdvfs looks pynvml up)."""
        from opdvfs.runtime.actuators import nvml as nvml_module

        with mock.patch.object(nvml_module, "pynvml", self.fake()) as fake:
            yield fake
