"""Atomic file output: a reader never sees a half-written file, and a failure leaves none behind."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["atomic_path", "write_text_atomic"]


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block succeeds.

    The temporary file sits in the destination folder so that the final ``os.replace`` is atomic
    (same file system). On any exception, including KeyboardInterrupt, it is removed and the
    previous content of ``path``, if any, is untouched.
    """
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_atomic(path: str | os.PathLike[str], writer: Callable[[Path], None]) -> None:
    """Call ``writer(tmp_path)`` and rename the result onto ``path`` atomically."""
    with atomic_path(path) as tmp:
        writer(tmp)
