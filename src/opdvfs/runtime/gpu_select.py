"""Which GPU a process drives and measures: its CUDA device, matched to NVML by UUID.

Under ``torchrun --nproc-per-node 8`` every rank runs on its own GPU, the one its CUDA work runs
on (``torch.cuda.set_device(LOCAL_RANK)``). CUDA numbers only the GPUs ``CUDA_VISIBLE_DEVICES``
shows it, in that variable's order; NVML numbers every GPU of the node in PCI order. So the CUDA
device is mapped through ``CUDA_VISIBLE_DEVICES`` (NVML indices, ``GPU-`` UUIDs or their unique
prefixes, ``MIG-`` UUIDs) to a UUID, and the UUID to NVML's index: :func:`select_gpu`, a pure
function of the environment, the CUDA device and NVML's list of GPUs, so it is tested without a
GPU. :func:`opdvfs.runtime.actuators.nvml.current_gpu` feeds it this process's values.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from opdvfs.exceptions import ActuatorError, DeviceNotFoundError, ValidationError

__all__ = ["GpuChoice", "GpuClaim", "select_gpu"]

#: The prefix of a MIG instance's UUID (``MIG-<uuid>``; older drivers: ``MIG-GPU-<uuid>/gi/ci``).
MIG_PREFIX = "MIG-"


@dataclass(frozen=True)
class GpuChoice:
    """The GPU a process drives and measures.

    Attributes
    ----------
    index
        Its NVML index (as ``nvidia-smi -i`` and zeusd number GPUs); None for a MIG instance,
        which NVML opens by its UUID only.
    uuid
        Its UUID: ``GPU-...``, or ``MIG-...`` for a MIG instance.
    reason
        How it was chosen, for the line that says which GPU each rank drives.
    """

    index: int | None
    uuid: str
    reason: str

    @property
    def mig(self) -> bool:
        """Whether it is a MIG instance (whose clock NVML cannot lock)."""
        return self.uuid.startswith(MIG_PREFIX)

    @property
    def label(self) -> str:
        """``GPU 2 (GPU-8f3c...)`` or ``MIG instance MIG-...``, for messages."""
        if self.index is None:
            return f"MIG instance {self.uuid}"
        return f"GPU {self.index} ({self.uuid})"


def _ordinal(env: Mapping[str, str], cuda_device: int | None) -> tuple[int, str]:
    """Return this process's CUDA device number and where it came from."""
    if cuda_device is not None:
        return cuda_device, f"CUDA device {cuda_device}"
    text = env.get("LOCAL_RANK")
    if text is None or not text.strip():
        return 0, "CUDA device 0"
    try:
        local = int(text)
    except ValueError:
        local = -1
    if local < 0:
        raise ValidationError(
            f"LOCAL_RANK={text!r}: expected a rank >= 0 (torchrun sets it)", field="LOCAL_RANK"
        )
    return local, f"CUDA device {local} (LOCAL_RANK={local})"


def _find(token: str, gpus: Sequence[tuple[int, str]]) -> tuple[int | None, str] | None:
    """Return the (NVML index, UUID) a device name means, or None: it names no GPU."""
    token = token.strip()
    if token.startswith(MIG_PREFIX):
        return None, token
    if token.isdigit():
        index = int(token)
        return next(((i, u) for i, u in gpus if i == index), None)
    if token.upper().startswith("GPU-"):  # CUDA takes a unique prefix of the UUID too
        want = token.lower()
        found = [(i, u) for i, u in gpus if u.lower().startswith(want)]
        return found[0] if len(found) == 1 else None
    return None


def _visible(
    env: Mapping[str, str], gpus: Sequence[tuple[int, str]]
) -> list[tuple[int | None, str]]:
    """Return the GPUs CUDA sees, in CUDA's order (CUDA stops at the first name it cannot use)."""
    text = env.get("CUDA_VISIBLE_DEVICES")
    if text is None:
        return list(gpus)
    out: list[tuple[int | None, str]] = []
    for token in text.split(","):
        found = _find(token, gpus) if token.strip() else None
        if found is None:
            break
        out.append(found)
    return out


def select_gpu(
    env: Mapping[str, str],
    cuda_device: int | None,
    nvml_gpus: Sequence[tuple[int, str]],
    *,
    cuda_uuid: str | None = None,
    override: str | None = None,
) -> GpuChoice:
    """Return the GPU this process drives: its CUDA device, or the one ``override`` names.

    Parameters
    ----------
    env
        The process's environment: ``CUDA_VISIBLE_DEVICES`` and ``LOCAL_RANK`` are read.
    cuda_device
        The current CUDA device (``torch.cuda.current_device()``, once CUDA is initialised), or
        None: ``LOCAL_RANK`` (torchrun's; the device the script will set), else 0.
    nvml_gpus
        NVML's ``(index, uuid)`` of every GPU of the node.
    cuda_uuid
        The current CUDA device's UUID (``GPU-...``) where torch knows it: it names the GPU
        whatever ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER`` say.
    override
        ``--gpu``: an NVML index, a ``GPU-``/``MIG-`` UUID, or a comma list of them (one per
        local rank: entry ``LOCAL_RANK`` is taken).

    Returns
    -------
    GpuChoice
        Its NVML index and UUID, and how it was chosen.

    Raises
    ------
    DeviceNotFoundError
        When NVML lists no GPU.
    ValidationError
        When ``override`` names no GPU of the node, or the CUDA device is not one of those
        ``CUDA_VISIBLE_DEVICES`` makes visible (the message gives both).
    """
    if not nvml_gpus:
        raise DeviceNotFoundError("NVML lists no GPU on this machine")
    if override is not None:
        items = [t.strip() for t in override.split(",")]
        pick, why = 0, f"--gpu {override}"
        if len(items) > 1:
            pick, _ = _ordinal(env, None)
            if pick >= len(items):
                raise ValidationError(
                    f"--gpu {override}: {len(items)} GPUs for local rank {pick}: give one per "
                    "local rank",
                    field="gpu",
                )
            why = f"--gpu {override}, entry {pick} (LOCAL_RANK={pick})"
        found = _find(items[pick], nvml_gpus)
        if found is None:
            known = ", ".join(f"{i} ({u})" for i, u in nvml_gpus)
            raise ValidationError(
                f"--gpu {items[pick]}: no such GPU; expected an NVML index or UUID of {known}",
                field="gpu",
            )
        return GpuChoice(found[0], found[1], why)
    if cuda_uuid is not None:
        for index, uuid in nvml_gpus:
            if uuid.lower() == cuda_uuid.lower():
                return GpuChoice(index, uuid, f"CUDA device {cuda_device} (UUID {cuda_uuid})")
        if cuda_uuid.startswith(MIG_PREFIX):
            return GpuChoice(None, cuda_uuid, f"CUDA device {cuda_device} (UUID {cuda_uuid})")
    ordinal, why = _ordinal(env, cuda_device)
    visible = _visible(env, nvml_gpus)
    text = env.get("CUDA_VISIBLE_DEVICES")
    if ordinal >= len(visible):
        shown = "every GPU" if text is None else f"CUDA_VISIBLE_DEVICES={text!r}"
        raise ValidationError(
            f"{why}: no such GPU: {shown} makes {len(visible)} visible to CUDA; give each "
            "process its own GPU (--gpu INDEX|UUID overrides)",
            field="CUDA_VISIBLE_DEVICES",
        )
    found_index, uuid = visible[ordinal]
    if text is not None:
        why += f" of CUDA_VISIBLE_DEVICES={text}"
    return GpuChoice(found_index, uuid, why)


#: This process's claims: the lock file of each GPU it claimed, and how many claims hold it.
_CLAIMS: dict[str, tuple[int, int]] = {}
_CLAIMS_LOCK = threading.Lock()


class GpuClaim:
    """A process's claim on one GPU's clock, held until :meth:`release`.

    Locked clocks are the GPU's, not a process's: two processes setting one GPU's clock (two
    ranks given one GPU, two jobs) undo each other's settings, and the first to restore unlocks
    the other's. So an actuator that sets clocks claims its GPU: an exclusive ``flock`` on a
    file named by the GPU's UUID in ``$OPDVFS_LOCK_DIR`` (default ``$TMPDIR/opdvfs-gpu-locks``),
    which the kernel gives back when the process ends however it ends. Claims within one
    process share the lock (counted). Where that folder cannot be made, nothing is claimed.

    Parameters
    ----------
    gpu
        The GPU to claim.

    Raises
    ------
    ActuatorError
        When another process holds the claim; the message names its pid and what to do.
    """

    def __init__(self, gpu: GpuChoice) -> None:
        self.key: str | None = None
        with _CLAIMS_LOCK:
            held = _CLAIMS.get(gpu.uuid)
            if held is not None:
                _CLAIMS[gpu.uuid] = (held[0], held[1] + 1)
                self.key = gpu.uuid
                return
            fd = _lock_file(gpu)
            if fd is not None:
                _CLAIMS[gpu.uuid] = (fd, 1)
                self.key = gpu.uuid

    def release(self) -> None:
        """Give the claim back (safe to call more than once)."""
        with _CLAIMS_LOCK:
            key, self.key = self.key, None
            if key is None or key not in _CLAIMS:
                return
            fd, count = _CLAIMS[key]
            if count > 1:
                _CLAIMS[key] = (fd, count - 1)
                return
            del _CLAIMS[key]
            with contextlib.suppress(OSError):
                os.close(fd)  # closing the file releases its flock


def _lock_file(gpu: GpuChoice) -> int | None:
    """Return the open, flocked claim file of ``gpu``, or None: no folder for it."""
    folder = Path(
        os.environ.get("OPDVFS_LOCK_DIR") or Path(tempfile.gettempdir()) / "opdvfs-gpu-locks"
    )
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # shared by every user of the machine
            folder.chmod(0o1777)
        path = folder / (re.sub(r"[^A-Za-z0-9-]", "_", gpu.uuid) + ".lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise ActuatorError(
            f"{gpu.label} is already driven by another opdvfs process (pid {holder}): two "
            "processes setting one GPU's clock undo each other; give each process its own "
            "GPU (CUDA_VISIBLE_DEVICES, torch.cuda.set_device(LOCAL_RANK), or --gpu)"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd
