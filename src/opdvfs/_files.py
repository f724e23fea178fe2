"""Atomic file output: a reader never sees a half-written file, and a failure leaves none behind."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Self

from opdvfs.exceptions import InputFormatError

__all__ = ["JsonFile", "atomic_path", "read_json", "write_atomic", "write_text_atomic"]


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
        # mkstemp makes the file private (0600); give it the mode a plain open() would have
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_atomic(path: str | os.PathLike[str], writer: Callable[[Path], None]) -> None:
    """Call ``writer(tmp_path)`` and rename the result onto ``path`` atomically."""
    with atomic_path(path) as tmp:
        writer(tmp)


def read_json(
    path: str | os.PathLike[str], error: type[InputFormatError] = InputFormatError
) -> Any:
    """Parse a JSON file; a missing, unreadable or malformed file raises ``error`` (one line)."""
    src = Path(path)
    try:
        return json.loads(src.read_bytes())
    except FileNotFoundError:
        raise error(f"{src}: no such file") from None
    except OSError as exc:
        raise error(f"{src}: cannot read ({exc.strerror})") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise error(f"{src}: not valid JSON ({exc})") from None


class JsonFile:
    """``write``/``read`` for objects that define ``to_dict`` and ``from_dict(doc, source=)``."""

    def to_dict(self) -> dict[str, Any]:  # pragma: no cover - defined by subclasses
        """Return the object as a JSON-ready dict."""
        raise NotImplementedError

    @classmethod
    def from_dict(cls, doc: Any, *, source: str = "<dict>") -> Self:  # pragma: no cover
        """Rebuild the object from :meth:`to_dict` output."""
        raise NotImplementedError

    def write(self, path: str | os.PathLike[str]) -> None:
        """Write the object as JSON, atomically."""
        write_text_atomic(path, json.dumps(self.to_dict()) + "\n")

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> Self:
        """Read an object written by :meth:`write`."""
        return cls.from_dict(read_json(path), source=str(path))
