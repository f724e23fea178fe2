"""Lazy package faces (PEP 562): a package exports names that load on first use.

``import opdvfs`` and ``import opdvfs.runtime`` stay cheap (no pandas, scipy, torch) while
``opdvfs.plan_schedule`` or ``opdvfs.runtime.ScheduleExecutor`` still work; the same idea as
scientific Python's ``lazy_loader.attach``, without the dependency.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["attach"]


def attach(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Return a package's ``__getattr__`` and ``__dir__`` for lazily loaded exports.

    Parameters
    ----------
    package
        The package's ``__name__``.
    exports
        Exported name -> the module that defines it.

    Returns
    -------
    getattr_, dir_
        Assign them to the package's ``__getattr__`` and ``__dir__``. A name is imported on
        first access and then cached in the package, so later look-ups are plain attributes.
    """

    def getattr_(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def dir_() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    return getattr_, dir_
