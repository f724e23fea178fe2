"""Iterations without an optimizer: each call of a named function or method ends one.

Training iterations end at optimizer steps; inference and custom loops have none. ``--iteration-at
MODULE:QUALNAME`` (the entry-point syntax: ``mymodel:MLP.forward``, ``serve:generate_batch``)
names a function whose every outermost call ends an iteration when it returns. The module is
patched when it is imported (or at once if it already is), so the script needs no change, and put
back afterwards.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import re
import sys
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opdvfs.exceptions import ValidationError

__all__ = ["IterationMarker"]

_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class IterationMarker:
    """Call a callback each time ``MODULE:QUALNAME`` returns from an outermost call.

    Parameters
    ----------
    spec
        ``MODULE:QUALNAME``: a module importable by the program (``mymodel``,
        ``torchvision.models.resnet``) and a function or method in it (``ResNet.forward``).
        Calls nested in a call of the same function (a block calling its own class's forward)
        do not end an iteration.

    Raises
    ------
    ValidationError
        If ``spec`` is not of that form, or names the program's ``__main__``.
    """

    def __init__(self, spec: str) -> None:
        if not _SPEC.match(spec):
            raise ValidationError(
                f"--iteration-at {spec!r}: expected MODULE:FUNCTION or MODULE:CLASS.METHOD "
                "(e.g. mymodel:MLP.forward)",
                field="iteration_at",
            )
        module, _, qualname = spec.partition(":")
        if module == "__main__":
            raise ValidationError(
                f"--iteration-at {spec!r}: name the function in a module the script imports "
                "(a function of the script itself is defined only as it runs)",
                field="iteration_at",
            )
        self.spec, self.module, self.qualname = spec, module, qualname
        #: Outermost calls that have returned.
        self.calls = 0

    @contextmanager
    def calling(self, on_return: Callable[[], None]) -> Iterator[None]:
        """Within the block, call ``on_return()`` after each outermost call of the target.

        Raises
        ------
        ValidationError
            If the module, once imported, has no such function.
        """
        depth = threading.local()
        patched: list[tuple[Any, str, Any]] = []

        def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(function)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                level = getattr(depth, "n", 0)
                depth.n = level + 1
                try:
                    out = function(*args, **kwargs)
                finally:
                    depth.n = level
                if level == 0:
                    self.calls += 1
                    on_return()
                return out

            return wrapper

        def patch(module: types.ModuleType) -> None:
            *path, attr = self.qualname.split(".")
            owner: Any = module
            try:
                for part in path:
                    owner = getattr(owner, part)
                raw = vars(owner)[attr] if isinstance(owner, type) else getattr(owner, attr)
            except (AttributeError, KeyError):
                raise ValidationError(
                    f"--iteration-at {self.spec}: module {self.module} has no {self.qualname}",
                    field="iteration_at",
                ) from None
            if isinstance(raw, staticmethod | classmethod):
                new: Any = type(raw)(wrap(raw.__func__))
            elif callable(raw):
                new = wrap(raw)
            else:
                raise ValidationError(
                    f"--iteration-at {self.spec}: {self.qualname} is not a function",
                    field="iteration_at",
                )
            setattr(owner, attr, new)
            patched.append((owner, attr, raw))

        finder = _PatchOnImport(self.module, patch)
        if self.module in sys.modules:
            patch(sys.modules[self.module])
        else:
            sys.meta_path.insert(0, finder)
        try:
            yield
        finally:
            if finder in sys.meta_path:
                sys.meta_path.remove(finder)
            for owner, attr, raw in reversed(patched):
                setattr(owner, attr, raw)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Find ``name`` with the other finders, and patch the module once it has executed."""

    def __init__(self, name: str, patch: Callable[[types.ModuleType], None]) -> None:
        self.name, self.patch = name, patch

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        """Return the module's spec with a loader that patches it after executing it."""
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                # this spec's loader only: wrap it in a proxy so the shared loader is untouched
                spec.loader = _Loader(spec.loader, self.patch)
                sys.meta_path.remove(self)  # patched once
                return spec
        return None


class _Loader(importlib.abc.Loader):
    """Execute the module with the real loader, then patch it."""

    def __init__(self, inner: Any, patch: Callable[[types.ModuleType], None]) -> None:
        self._inner, self._patch = inner, patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._inner.exec_module(module)
        self._patch(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
