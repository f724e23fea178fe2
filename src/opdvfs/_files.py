"""Atomic file output: a reader never sees a half-written file, and a failure leaves none behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Self

from opdvfs.exceptions import InputFormatError, OpdvfsError, OutputPathError

__all__ = [
    "JsonFile",
    "atomic_path",
    "check_format",
    "check_output_file",
    "check_output_folder",
    "file_kind",
    "read_json",
    "write_atomic",
    "write_text_atomic",
]


#: The files opdvfs writes, by their format tag (JSON ``"format"``, Parquet metadata key): what
#: each is and which command takes it, so a misplaced one is named rather than misparsed.
FILE_KINDS: dict[str, tuple[str, str]] = {
    "opdvfs.schedule": ("an opdvfs schedule", "opdvfs simulate and opdvfs run take it"),
    "opdvfs.pipeline-schedule": ("an opdvfs pipeline schedule", "opdvfs run takes it"),
    "opdvfs.models": ("an opdvfs MODELS file from opdvfs fit", "opdvfs plan takes it"),
    "opdvfs.profile-samples": (
        "the sensor samples of an opdvfs profile",
        "give the profile file beside it (the one without .samples)",
    ),
    "opdvfs.workload": (
        "an opdvfs workload",
        "opdvfs profile --workload and opdvfs simulate --workload take it",
    ),
}
#: Untagged opdvfs JSON files, by keys only they have.
_UNTAGGED_KINDS = (
    ({"suite", "sections", "goals"}, ("a report's results.json", "opdvfs report takes its folder")),
    ({"iteration_time_s", "chip_energy_j"}, ("an opdvfs run result", "opdvfs simulate wrote it")),
)


def file_kind(doc: Any) -> tuple[str, str] | None:
    """Return (what it is, which command takes it) for a file opdvfs wrote, or None.

    Parameters
    ----------
    doc
        A parsed JSON document, or for Parquet the set of its metadata keys (decoded).
    """
    if isinstance(doc, dict) and isinstance(doc.get("format"), str):
        return FILE_KINDS.get(doc["format"])
    if isinstance(doc, set):
        return next((FILE_KINDS[key] for key in FILE_KINDS if key in doc), None)
    if isinstance(doc, dict):
        return next((kind for keys, kind in _UNTAGGED_KINDS if keys <= doc.keys()), None)
    return None


def check_format(
    doc: Any,
    expected: str,
    source: str,
    *,
    what: str,
    error: type[InputFormatError] = InputFormatError,
) -> None:
    """Raise unless ``doc`` is a JSON object whose ``"format"`` is ``expected``.

    A file opdvfs wrote for another command is named as such (``s.json: an opdvfs schedule, not
    a MODELS file; opdvfs simulate and opdvfs run take it``), anything else gets the tag that was
    expected.

    Parameters
    ----------
    doc
        The parsed document.
    expected
        Its format tag, e.g. ``"opdvfs.models"``.
    source
        The file, for the message.
    what
        What the caller reads, for the message (``"a MODELS file"``).
    error
        The error class to raise.
    """
    if isinstance(doc, dict) and doc.get("format") == expected:
        return
    kind = file_kind(doc)
    if kind is not None:
        raise error(f"{source}: {kind[0]}, not {what}; {kind[1]}")
    raise error(f'{source}: expected {what} ("format": "{expected}")')


def check_output_file(path: str | os.PathLike[str]) -> None:
    """Raise unless ``path`` can become a file: it is not a folder and no parent is a file.

    Raises
    ------
    OutputPathError
        If ``path`` is an existing folder, or one of its parents is an existing file.
    """
    dest = Path(path)
    if dest.is_dir():
        raise OutputPathError(f"{dest}: is a directory; expected a file name to write")
    _check_parents(dest)


def check_output_folder(path: str | os.PathLike[str]) -> None:
    """Raise unless ``path`` is a folder or can become one (reports write several files there).

    Raises
    ------
    OutputPathError
        If ``path`` is an existing file, or one of its parents is.
    """
    dest = Path(path)
    if dest.exists() and not dest.is_dir():
        raise OutputPathError(f"{dest}: is a file; expected a folder for the report (new or not)")
    _check_parents(dest)


def check_writable_folder(path: str | os.PathLike[str]) -> Path:
    """Return ``path`` made absolute, after checking that files can be written there now.

    Nothing is left behind: the folder, or the nearest parent that exists, must take a file
    (one is created there and removed at once). Checked before a long job, so a read-only
    folder is an error at the start rather than after the job has trained.

    Raises
    ------
    OutputPathError
        If ``path`` is a file, a parent is a file, or the folder (or its nearest existing
        parent) cannot be written to.
    """
    dest = Path(path).absolute()
    check_output_folder(dest)
    existing = next((p for p in (dest, *dest.parents) if p.exists()), None)
    if existing is None:
        return dest
    try:  # a real probe: permissions, a read-only file system, ACLs, all as the write sees them
        fd, probe = tempfile.mkstemp(prefix=".opdvfs-probe.", dir=existing)
    except OSError as exc:
        where = "" if existing == dest else f" ({existing}: {exc.strerror or exc})"
        reason = "" if where else f" ({exc.strerror or exc})"
        raise OutputPathError(f"{dest}: cannot write there{where}{reason}") from None
    os.close(fd)
    os.unlink(probe)
    return dest


#: The signals whose default action would end a process between a temporary file and its rename.
_ENDING_SIGNALS = ("SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGQUIT")


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """Within the block, a signal whose default would kill the process raises ``SystemExit``.

    ``SystemExit(128 + signum)``, as the default would report it, but raised: the temporary
    files of :func:`atomic_path` are removed on the way out instead of left behind. Only
    signals at their default action are taken (a program's own handler stays); outside the
    main thread, nothing changes.
    """
    taken: dict[int, Any] = {}

    def exit_now(signum: int, frame: Any) -> None:
        for sig, handler in taken.items():  # a second signal while unwinding: the default
            signal.signal(sig, handler)
        raise SystemExit(128 + signum)

    if threading.current_thread() is threading.main_thread():
        for name in _ENDING_SIGNALS:
            sig = getattr(signal, name, None)
            if sig is not None and signal.getsignal(sig) == signal.SIG_DFL:
                taken[sig] = signal.signal(sig, exit_now)
    try:
        yield
    finally:
        for sig, handler in taken.items():
            if signal.getsignal(sig) == exit_now:
                signal.signal(sig, handler)


def _check_parents(dest: Path) -> None:
    for parent in dest.parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputPathError(f"{dest}: {parent} is a file, not a folder")
            return


def _cannot_write(dest: Path, exc: OSError) -> OutputPathError:
    return OutputPathError(f"{dest}: cannot write ({exc.strerror or exc})")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block succeeds.

    The temporary file sits in the destination folder so that the final ``os.replace`` is atomic
    (same file system). On any exception, including KeyboardInterrupt and a signal that would
    end the process (:func:`signals_raise`), it is removed and the previous content of
    ``path``, if any, is untouched.

    Raises
    ------
    OutputPathError
        If ``path`` is a folder, a parent is a file, or the file system refuses the write (an
        ``OSError`` inside the block, e.g. a full disk, becomes this one-line error).
    """
    dest = Path(path)
    check_output_file(dest)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    except OSError as exc:
        raise _cannot_write(dest, exc) from None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        with signals_raise():  # a SIGTERM now unwinds through here: the temporary file goes
            yield tmp
            # mkstemp makes the file private (0600); give it the mode a plain open() would have
            os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, dest)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OpdvfsError):
            raise
        raise _cannot_write(dest, exc) from None
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
    except IsADirectoryError:
        raise error(f"{src}: is a directory; expected a JSON file") from None
    except OSError as exc:
        raise error(f"{src}: cannot read ({exc.strerror})") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise error(f"{src}: not valid JSON ({exc})") from None


#: A list at least this long is stored as an array of the npz file, a shorter one in its header.
_NPZ_MIN_ITEMS = 64
#: The npz entry that holds the JSON header (the document with its long lists taken out).
_NPZ_HEADER = "header.json"
_ZIP_MAGIC = b"PK\x03\x04"
#: Items of an array compressed on trial to decide whether the whole of it is worth compressing.
_NPZ_SAMPLE_ITEMS = 8192


def _as_array(value: list[Any]) -> Any:
    """Return ``value`` as a plain (non-object) numpy array, or None if it is not one."""
    import numpy as np

    try:
        array = np.asarray(value)
        if array.dtype == object:  # None for NaN (JSON has no NaN), or ragged
            array = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        return None
    return array if array.dtype != object else None


def _split_arrays(doc: Any, arrays: dict[str, Any]) -> Any:
    """Return ``doc`` with each long list replaced by ``{"$array": name}``, filling ``arrays``.

    A numpy array (from ``to_dict(arrays=True)``) is stored as it is, without a detour through
    Python lists; one shorter than :data:`_NPZ_MIN_ITEMS` goes into the header as a list, as
    ``to_dict()`` would have written it (NaN as null).
    """
    import numpy as np

    if isinstance(doc, dict):
        return {k: _split_arrays(v, arrays) for k, v in doc.items()}
    if isinstance(doc, np.ndarray):
        if len(doc) < _NPZ_MIN_ITEMS or doc.ndim == 0:
            return _json_list(doc)
        array = _as_array(doc.tolist()) if doc.dtype == object else doc
        if array is None:
            return _json_list(doc)
        name = f"a{len(arrays)}"
        arrays[name] = array
        return {"$array": name}
    if isinstance(doc, list) and len(doc) >= _NPZ_MIN_ITEMS:
        array = _as_array(doc)
        if array is not None:
            name = f"a{len(arrays)}"
            arrays[name] = array
            return {"$array": name}
    return doc


def _json_list(array: Any) -> Any:
    """Return ``array`` as (nested) lists, NaN and infinities of a float array as None."""
    import numpy as np

    if array.dtype.kind != "f":
        return array.tolist()
    out = array.astype(object)
    out[~np.isfinite(array)] = None
    return out.tolist()


def _join_arrays(doc: Any, arrays: Any) -> Any:
    """Inverse of :func:`_split_arrays`: the arrays come back as numpy arrays, not lists.

    ``from_dict`` turns what it reads with ``np.asarray``, which takes either; a million
    operators' parameters so skip a round trip through Python objects.
    """
    if isinstance(doc, dict):
        if set(doc) == {"$array"}:
            return arrays[doc["$array"]]
        return {k: _join_arrays(v, arrays) for k, v in doc.items()}
    return doc


class JsonFile:
    """``write``/``read`` for objects that define ``to_dict`` and ``from_dict(doc, source=)``.

    A path ending in ``.npz`` is written columnar: a numpy ``.npz`` archive whose
    ``header.json`` entry is the document with every long list (per-operator parameters, names)
    taken out as an array of its own, so a million operators are a few binary arrays rather
    than a 200 MB JSON text. Any other path is JSON. ``read`` tells the two apart by content.
    """

    def to_dict(self, *, arrays: bool = False) -> dict[str, Any]:  # pragma: no cover
        """Return the object as a JSON-ready dict.

        With ``arrays`` the per-item values may stay numpy arrays (NaN as NaN): the form
        :meth:`write` stores columnar, not JSON-ready.
        """
        raise NotImplementedError

    @classmethod
    def from_dict(cls, doc: Any, *, source: str = "<dict>") -> Self:  # pragma: no cover
        """Rebuild the object from :meth:`to_dict` output."""
        raise NotImplementedError

    def write(self, path: str | os.PathLike[str]) -> None:
        """Write the object atomically: columnar ``.npz`` for such a path, else JSON."""
        if Path(path).suffix.lower() != ".npz":
            write_text_atomic(path, json.dumps(self.to_dict()) + "\n")
            return
        import numpy as np

        arrays: dict[str, Any] = {}
        header = _split_arrays(self.to_dict(arrays=True), arrays)
        entries = {**arrays, _NPZ_HEADER: np.asarray(json.dumps(header))}
        with atomic_path(path) as tmp:
            _write_npz(tmp, entries)

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> Self:
        """Read an object written by :meth:`write`.

        Raises
        ------
        InputFormatError
            If the file is missing or not JSON, or ``from_dict`` rejects it. A malformed document
            that ``from_dict`` does not check field by field (a list where a number belongs)
            still ends here, as one line naming the file, rather than as a traceback.
        """
        doc = _read_npz(Path(path)) if _is_zip(Path(path)) else read_json(path)
        try:
            return cls.from_dict(doc, source=str(path))
        except OpdvfsError:
            raise
        except (KeyError, IndexError, TypeError, ValueError, OverflowError) as exc:
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise InputFormatError(
                f"{path}: not a valid {cls.__name__} file ({type(exc).__name__}: {why})"
            ) from None


def _write_npz(path: Path, entries: dict[str, Any]) -> None:
    """Write ``entries`` as a ``.npz`` archive that ``np.load`` reads like any other.

    Each entry is compressed (zlib's fastest level) only if a sample of it shrinks: names,
    ids and repeated parameters shrink several-fold, fitted floats hardly at all (5%), so
    those are stored as they are rather than spending a second per million operators on them.
    """
    import io
    import zipfile

    import numpy as np

    with zipfile.ZipFile(
        path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1, allowZip64=True
    ) as archive:
        for name, value in entries.items():
            array = np.asanyarray(value)
            sample = array.reshape(-1)[:_NPZ_SAMPLE_ITEMS]
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, sample, allow_pickle=False)
            raw = buffer.getvalue()
            shrinks = len(zlib.compress(raw, 1)) < 0.8 * len(raw)
            entry: str | zipfile.ZipInfo = f"{name}.npy"  # by name: the archive's deflate
            if not shrinks:
                entry = zipfile.ZipInfo(f"{name}.npy")
                entry.compress_type = zipfile.ZIP_STORED
            with archive.open(entry, "w", force_zip64=True) as out:
                np.lib.format.write_array(out, array, allow_pickle=False)


def _is_zip(path: Path) -> bool:
    try:
        with open(path, "rb") as src:
            return src.read(4) == _ZIP_MAGIC
    except OSError:
        return False  # read_json names the problem


def _read_npz(path: Path) -> Any:
    """Return the document of a columnar file written by :meth:`JsonFile.write`."""
    import zipfile  # a truncated or foreign archive

    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as npz:
            header = json.loads(str(npz[_NPZ_HEADER]))
            return _join_arrays(header, npz)
    except (KeyError, ValueError, OSError, zipfile.BadZipFile) as exc:
        raise InputFormatError(f"{path}: not a valid opdvfs .npz file ({exc})") from None
