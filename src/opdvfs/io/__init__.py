"""Importers: every supported measurement file becomes a :class:`~opdvfs.profile.Profile`.

``read_profile(paths, format=None, freqs_mhz=None)`` picks the importer from ``format`` or, when
it is None, from the file: Parquet files written by opdvfs, Chrome traces by suffix, CSV files by
their header. Several files (one per clock, as the profiler writes them) are read one by one and
joined into one profile; the profile then checks that the same op position names the same
operator in every file.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from opdvfs.exceptions import ProfileFormatError, ValidationError
from opdvfs.profile import Profile

if TYPE_CHECKING:
    from opdvfs.io._common import Header

__all__ = ["FORMATS", "Importer", "detect_format", "read_profile"]


@dataclass(frozen=True)
class Importer:
    """One file format: the CSV columns that identify it and how to read it.

    The reading module (``opdvfs.io.<module>``, and with it pandas) loads on first use, so
    listing the formats (``opdvfs formats``, ``--help``) imports none of them.

    Parameters
    ----------
    name
        The format's name (``--format``).
    module
        The submodule that reads it, relative to ``opdvfs.io`` (``".ascend"``; ``""`` for
        ``opdvfs.io`` itself).
    description
        What the format is, for ``opdvfs formats``.
    header_attr
        The module's attribute holding the identifying CSV columns; None for non-CSV formats.
    function
        The module's reading function, ``function(path, *, freq_mhz=None) -> Profile``.
    needs_clock
        Whether the files do not record their clock (``--freq-mhz``).
    """

    name: str
    module: str
    description: str
    header_attr: str | None = None
    needs_clock: bool = False
    function: str = "read"

    def _module(self) -> object:
        return importlib.import_module(f"opdvfs.io{self.module}")

    @property
    def read(self) -> Callable[..., Profile]:
        """The reader: ``read(path, *, freq_mhz=None) -> Profile``."""
        return cast("Callable[..., Profile]", getattr(self._module(), self.function))

    @property
    def header(self) -> Header | None:
        """The CSV columns that identify the format (groups of aliases), or None."""
        if self.header_attr is None:
            return None
        return cast("Header", getattr(self._module(), self.header_attr))


def _read_parquet(path: Path, *, freq_mhz: float | None = None, samples: bool = True) -> Profile:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from opdvfs.io._common import other_opdvfs_file

    try:
        return Profile.read(path, samples=samples)
    except ProfileFormatError as exc:
        # a workload written as Parquet fails as a profile with a column error; name it instead
        try:
            keys = {k.decode(errors="replace") for k in pq.read_schema(path).metadata or {}}
        except (pa.ArrowException, OSError):
            raise exc from None
        raise other_opdvfs_file(path, keys) or exc from None


#: Importers in detection order: more specific CSV headers first, the generic layout last.
FORMATS: dict[str, Importer] = {
    imp.name: imp
    for imp in (
        Importer("parquet", "", "opdvfs profile (Parquet)", function="_read_parquet"),
        Importer(
            "torch-trace",
            ".torch_trace",
            "PyTorch profiler Chrome trace (.json[.gz])",
            needs_clock=True,
        ),
        Importer("perseus", ".perseus", "Perseus stage profile CSV", "HEADER"),
        Importer("nv-dvfs", ".nv_dvfs", "NV-DVFS-Benchmark kernel CSV", "HEADER"),
        Importer("nv-dvfs-legacy", ".nv_dvfs", "NV-DVFS-Benchmark legacy CSV", "LEGACY_HEADER"),
        Importer(
            "ascend",
            ".ascend",
            "Ascend msprof op_summary / torch_npu kernel_details CSV",
            "HEADER",
            needs_clock=True,
        ),
        Importer(
            "csv",
            ".generic_csv",
            "generic long profile CSV (op,name,freq_mhz,time_us)",
            "HEADER",
        ),
    )
}


def detect_format(path: str | os.PathLike[str]) -> str:
    """Return the name of the importer for ``path``, from its suffix or its CSV header.

    Raises
    ------
    ProfileFormatError
        If the file is missing or matches no known format. When some format's columns are
        partly there, the message names that format and the columns it lacks.
    """
    from opdvfs.io import torch_trace
    from opdvfs.io._common import missing_columns, read_csv_header

    src = Path(path)
    if not src.exists():
        raise ProfileFormatError(f"{src}: no such file")
    if src.suffix == ".parquet":
        return "parquet"
    if torch_trace.sniff_path(src):
        return "torch-trace"
    header = read_csv_header(src)
    csv_formats = [imp for imp in FORMATS.values() if imp.header is not None]
    lacking = {imp.name: missing_columns(imp.header or (), header) for imp in csv_formats}
    for imp in csv_formats:
        if not lacking[imp.name]:
            return imp.name
    got = f"{', '.join(header[:8])}{', ...' if len(header) > 8 else ''}"
    # the closest format: the largest share of its columns present (detection order on ties)
    best = max(csv_formats, key=lambda imp: 1 - len(lacking[imp.name]) / len(imp.header or ()))
    missing = lacking[best.name]
    if best.header is not None and len(missing) < len(best.header):
        names = ", ".join(" or ".join(repr(n) for n in group) for group in missing)
        raise ProfileFormatError(
            f"{src}: line 1: missing column {names} of the {best.name} format "
            f"({best.description}); the header has {got}"
        )
    raise ProfileFormatError(
        f"{src}: line 1: header matches no known profile format (got {got}); expected e.g. the "
        "generic layout op,name,freq_mhz,time_us, or pass --format"
    )


def read_profile(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    format: str | None = None,
    freqs_mhz: Sequence[float] | None = None,
    samples: bool = True,
) -> Profile:
    """Read one or more measurement files into one profile.

    Parameters
    ----------
    paths
        One file, or several (for formats that hold one clock per file).
    format
        Importer name (see :data:`FORMATS`); detected per file when None.
    freqs_mhz
        Core clock of each file, for formats that do not record it (Ascend CSVs, traces). One
        value applies to every file.
    samples
        False: an opdvfs Parquet profile whose rows carry per-op power is read without its
        sensor samples (:meth:`Profile.read <opdvfs.profile.Profile.read>`), as fits need it.

    Raises
    ------
    ProfileFormatError
        On the first file that fails to parse or validate, or when files do not line up.
    """
    files = [Path(paths)] if isinstance(paths, str | os.PathLike) else [Path(p) for p in paths]
    if not files:
        raise ProfileFormatError("no input files given")
    if format is not None and format not in FORMATS:
        raise ProfileFormatError(f"unknown format {format!r}; expected one of {', '.join(FORMATS)}")
    clocks: list[float | None]
    if freqs_mhz is None or len(freqs_mhz) == 0:
        clocks = [None] * len(files)
    elif len(freqs_mhz) == 1:
        clocks = [float(freqs_mhz[0])] * len(files)
    elif len(freqs_mhz) == len(files):
        clocks = [float(f) for f in freqs_mhz]
    else:
        raise ProfileFormatError(
            f"--freq-mhz: got {len(freqs_mhz)} clocks for {len(files)} files; expected one "
            "clock, or one per file"
        )
    profiles = []
    for src, clock in zip(files, clocks, strict=True):
        name = format or detect_format(src)
        extra = {"samples": False} if name == "parquet" and not samples else {}
        profiles.append(FORMATS[name].read(src, freq_mhz=clock, **extra))
    return profiles[0] if len(profiles) == 1 else _join(profiles, files)


def _join(profiles: list[Profile], files: list[Path]) -> Profile:
    import pandas as pd

    meta = profiles[0].meta
    meta["sources"] = [s for p in profiles for s in p.meta.get("sources", [])]
    formats = sorted({str(p.meta.get("format")) for p in profiles})
    meta["format"] = formats[0] if len(formats) == 1 else "+".join(formats)
    dropped: dict[str, int] = {}
    for p in profiles:
        for reason, count in p.dropped.items():
            dropped[reason] = dropped.get(reason, 0) + count
    meta["dropped"] = dropped
    frames = []
    for p, src in zip(profiles, files, strict=True):
        ops = p.ops
        ops.index = pd.Index([f"{src.name} row {i + 1}" for i in range(len(ops))])
        frames.append(ops)
    samples = [p.samples for p in profiles if p.samples is not None]
    try:
        return Profile(pd.concat(frames), pd.concat(samples) if samples else None, meta=meta)
    except ValidationError as exc:
        raise ProfileFormatError(f"joining {len(files)} files: {exc.detail} ({exc.row})") from None
