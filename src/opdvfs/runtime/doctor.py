"""``opdvfs doctor``: what this machine offers opdvfs, checked read-only.

:func:`diagnose` returns one :class:`Check` per concern: the NVIDIA driver and NVML, each GPU
and its clocks, the permission to lock clocks (root for ``nvml``), the Zeus daemon
(``zeusd``: no root), torch and its CUDA, and the simulated GPUs that need none of them. Nothing
is set: no clock is locked, tried or reset (the NVML reads are the read-only ones of
:mod:`~opdvfs.runtime.actuators.nvml`; the daemon is only connected to).
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from opdvfs.exceptions import ActuatorError

__all__ = ["Check", "Status", "diagnose"]

#: ``ok``: usable; ``warn``: usable with a limit (the message says which); ``absent``: not
#: here (the message says what would bring it); ``fail``: present but broken.
Status = Literal["ok", "warn", "absent", "fail"]


@dataclass(frozen=True)
class Check:
    """One concern checked: its status, one line, and the figures behind it."""

    name: str
    status: Status
    message: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Return the check as JSON-able fields."""
        return asdict(self)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("opdvfs")
    except PackageNotFoundError:
        return "unknown (not installed as a package)"


def _nvml() -> list[Check]:
    from opdvfs.runtime.actuators.nvml import nvml_system

    try:
        info = nvml_system()
    except ActuatorError as exc:
        return [
            Check(
                "nvml",
                "absent",
                f"no NVML: {exc}",
            )
        ]
    checks = [
        Check(
            "nvml",
            "ok",
            f"NVIDIA driver {info['driver']}, NVML {info['nvml']}, {len(info['gpus'])} GPU(s)",
            {"driver": info["driver"], "nvml": info["nvml"]},
        )
    ]
    for gpu in info["gpus"]:
        clocks = gpu["clocks_mhz"]
        span = f"{clocks[0]:g}-{clocks[1]:g} MHz ({clocks[2]} clocks)" if clocks else "none"
        energy = "" if gpu["energy_counter"] else "; no energy counter (power samples only)"
        checks.append(
            Check(
                f"gpu{gpu['index']}",
                "ok" if clocks and gpu["energy_counter"] else "warn",
                f"{gpu['name']} ({gpu['uuid']}): SM clocks {span}, now {gpu['sm_clock_mhz']:g} "
                f"MHz, {gpu['power_w']:.1f} W{energy}",
                gpu,
            )
        )
    return checks


def _permissions(nvml_found: bool) -> Check:
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    if root:
        return Check("permissions", "ok", "root: --actuator nvml may lock clocks", {"root": True})
    status: Status = "warn" if nvml_found else "absent"
    return Check(
        "permissions",
        status,
        "not root: --actuator nvml cannot lock clocks (run as root, or use --actuator zeusd "
        "through Zeus's daemon); reading power and energy needs no root",
        {"root": False},
    )


def _zeusd() -> Check:
    from opdvfs.runtime.actuators.zeusd import ZeusdClient

    try:
        client = ZeusdClient()
    except ActuatorError:
        return Check(
            "zeusd",
            "absent",
            "ZEUSD_SOCK_PATH and ZEUSD_HOST_PORT unset: --actuator zeusd has no daemon to ask",
        )
    try:
        client.reachable()
    except ActuatorError as exc:
        return Check("zeusd", "fail", str(exc), {"address": client.address})
    return Check(
        "zeusd",
        "ok",
        f"the daemon at {client.address} answers: --actuator zeusd locks clocks without root",
        {"address": client.address},
    )


def _torch() -> Check:
    try:
        import torch
    except ImportError:
        return Check(
            "torch",
            "absent",
            "torch is not installed: capture, run and tune need it (pip install torch)",
        )
    cuda = torch.version.cuda
    data: dict[str, Any] = {"version": torch.__version__, "cuda": cuda, "devices": []}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        data["cuda_visible_devices"] = visible
    if cuda is None:
        return Check(
            "torch",
            "warn",
            f"torch {torch.__version__}, a CPU build (no CUDA): tune runs on simulated GPUs only",
            data,
        )
    if not torch.cuda.is_available():
        return Check(
            "torch",
            "warn",
            f"torch {torch.__version__} with CUDA {cuda}, but no CUDA device is available",
            data,
        )
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    data["devices"] = names
    return Check(
        "torch",
        "ok",
        f"torch {torch.__version__} with CUDA {cuda}: {len(names)} device(s): {', '.join(names)}",
        data,
    )


def _simulated() -> Check:
    from opdvfs.sim.presets import PRESETS

    names = list(PRESETS)
    return Check(
        "simulated",
        "ok",
        f"simulated GPUs: --actuator sim:{names[0]} (or sim:{', sim:'.join(names[1:])})",
        {"presets": names},
    )


def diagnose() -> list[Check]:
    """Return the machine's checks, read-only (no clock is set or reset).

    In order: opdvfs, NVML and each GPU, permissions, zeusd, torch, the simulated GPUs.
    """
    checks = [
        Check(
            "opdvfs",
            "ok",
            f"opdvfs {_version()} on Python {platform.python_version()} ({sys.platform})",
            {"version": _version(), "python": platform.python_version()},
        )
    ]
    nvml = _nvml()
    checks += nvml
    checks.append(_permissions(nvml[0].status == "ok"))
    checks.append(_zeusd())
    checks.append(_torch())
    checks.append(_simulated())
    return checks
