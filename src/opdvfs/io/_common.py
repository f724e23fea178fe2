"""Pieces every importer shares: reading CSV text safely and turning a frame into a Profile.

Importers index their frames by the source line number, so a validation failure becomes one line
that names the file, the line, the column as the *file* spells it, and what was expected.
"""

from __future__ import annotations

import codecs
import csv
import io
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from opdvfs._files import file_kind
from opdvfs._table import Column, Kind, coerce_column
from opdvfs.exceptions import ProfileFormatError, ValidationError
from opdvfs.profile import Profile

__all__ = [
    "Header",
    "build_profile",
    "missing_columns",
    "other_opdvfs_file",
    "parse_column",
    "read_csv_header",
    "read_csv_text",
    "read_csv_typed",
    "resolve_columns",
]


#: The columns a CSV format requires, as groups of alternatives: each group needs one of its names
#: in the header (``(("Op Name", "Name"), ("Duration(us)",))``).
Header = tuple[tuple[str, ...], ...]


def missing_columns(required: Header, header: Sequence[str]) -> list[tuple[str, ...]]:
    """Return the groups of ``required`` that have none of their names in ``header``."""
    present = set(header)
    return [group for group in required if not present & set(group)]


def other_opdvfs_file(path: Path, doc: Any) -> ProfileFormatError | None:
    """Return the error for another opdvfs file given where a profile belongs, or None.

    Parameters
    ----------
    path
        The file, for the message.
    doc
        Its parsed JSON, or for Parquet the set of its metadata keys (decoded).
    """
    kind = file_kind(doc)
    if kind is None:
        return None
    what, taken_by = kind
    return ProfileFormatError(f"{path}: {what}, not a profile; {taken_by}")


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise ProfileFormatError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ProfileFormatError(f"{path}: is a directory, expected a file") from None
    except OSError as exc:
        raise ProfileFormatError(f"{path}: cannot read ({exc.strerror})") from None


def _decode(path: Path, raw: bytes) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ProfileFormatError(
            f"{path}: byte {exc.start}: not UTF-8 text (expected a CSV file)"
        ) from None


def _read_text(path: Path) -> str:
    return _decode(path, _read_bytes(path))


def read_csv_header(path: Path) -> list[str]:
    """Return the column names on the first line of a CSV file (for format detection)."""
    text = _read_text(path)
    first = text.splitlines()[0] if text.strip() else ""
    if not first.strip():
        raise ProfileFormatError(f"{path}: empty file; expected a CSV header line")
    return [c.strip() for c in next(csv.reader([first]))]


def read_csv_text(path: Path) -> pd.DataFrame:
    """Read a CSV file as strings, indexed by 1-based line number; blank lines are skipped.

    Every cell stays a string (numbers are parsed and checked later, column by column), so a
    malformed value is reported with its line rather than silently turned into NaN.
    """
    raw = _read_bytes(path)
    _decode(path, raw)  # not UTF-8: one line naming the byte (the decoded copy goes at once)
    if not raw or raw.isspace():
        raise ProfileFormatError(f"{path}: empty file; expected a CSV header line")
    # pandas parses the bytes: an io.StringIO of the text would hold 4 bytes per character
    data = io.BytesIO(raw[len(codecs.BOM_UTF8) :] if raw.startswith(codecs.BOM_UTF8) else raw)
    try:
        with warnings.catch_warnings():
            # With index_col=False pandas only warns (and drops data) when the first data row
            # has more fields than the header; make that an error.
            warnings.simplefilter("error", pd.errors.ParserWarning)
            frame = pd.read_csv(
                data,
                encoding="utf-8",
                dtype=str,
                index_col=False,
                keep_default_na=False,
                na_filter=False,
                skip_blank_lines=False,
                skipinitialspace=True,
            )
    except pd.errors.ParserWarning:
        raise ProfileFormatError(f"{path}: {_long_row(_decode(path, raw))}") from None
    except pd.errors.ParserError as exc:
        raise ProfileFormatError(f"{path}: {_parser_message(exc)}") from None
    except (pd.errors.EmptyDataError, csv.Error, ValueError) as exc:
        raise ProfileFormatError(f"{path}: not a CSV table ({exc})") from None
    frame.columns = [str(c).strip() for c in frame.columns]
    dup = frame.columns[frame.columns.duplicated()]
    if len(dup):
        raise ProfileFormatError(f"{path}: line 1: column {dup[0]!r} appears twice")
    frame.index = pd.RangeIndex(2, len(frame) + 2)
    # A blank line reads as one empty cell followed by missing ones; drop such rows. Only rows
    # whose first cell is blank can be blank: look at the other cells of those alone.
    maybe = (frame.iloc[:, 0].fillna("").astype(str).str.strip() == "").to_numpy()
    if maybe.any():
        cells = frame[maybe].fillna("").astype(str)
        blank = ~cells.apply(lambda col: col.str.strip() != "").any(axis=1).to_numpy()
        drop = np.flatnonzero(maybe)[blank]
        frame = frame.drop(index=frame.index[drop])
    if frame.empty:
        raise ProfileFormatError(f"{path}: no data rows after the header")
    return frame


def read_csv_typed(path: Path, numeric: Callable[[str], bool]) -> pd.DataFrame | None:
    """Read a clean CSV file with its numeric columns converted as they are read, or None.

    The fast path of :func:`read_csv_text` for a large file (pyarrow's CSV reader, in blocks
    and threads: no per-cell string is made). A column whose stripped header name ``numeric``
    accepts must read as numbers (an empty cell is NaN, as :func:`read_csv_text`'s empty cell
    becomes); every other column is text, read as a categorical (its distinct values once).
    Anything else (a cell that is not a number, a row of the wrong length, a blank line of
    spaces, a repeated or empty column name, bytes that are not UTF-8, no data rows) returns
    None: the caller then reads the file with :func:`read_csv_text`, whose checks name the line
    and field. A caller also falls back when the typed frame fails validation, so that every
    message is the text reader's; only a file that imports cleanly is read here.
    """
    import pyarrow as pa
    import pyarrow.csv as pv

    try:
        with open(path, encoding="utf-8-sig", newline="") as src:
            header = next(csv.reader([src.readline()]))  # as written: pyarrow's names
    except (OSError, UnicodeDecodeError, StopIteration, csv.Error):
        return None
    names = [c.strip() for c in header]
    if len(set(names)) != len(names) or "" in names:
        return None
    wanted = [numeric(n) for n in names]
    text = pa.dictionary(pa.int32(), pa.string())
    # every type given: inferring them keeps each block's parsed text until its columns
    # convert (10x the table's memory at 3M rows). Numbers are doubles, as the text reader
    # parses them (an int column becomes int64 in validation, from the same double).
    types = {raw: pa.float64() if num else text for raw, num in zip(header, wanted, strict=True)}
    try:
        table = pv.read_csv(
            path,
            parse_options=pv.ParseOptions(newlines_in_values=False),
            convert_options=pv.ConvertOptions(
                column_types=types,
                null_values=[""],
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
                check_utf8=True,
            ),
        )
    except (pa.ArrowException, OSError, ValueError):
        return None
    if table.num_rows == 0 or table.column_names != header:
        return None
    frame = table.to_pandas(split_blocks=True, self_destruct=True)
    del table
    frame.columns = names
    frame.index = pd.RangeIndex(2, len(frame) + 2)
    return frame


def _long_row(text: str) -> str:
    rows = csv.reader(io.StringIO(text))
    width = len(next(rows))
    for line, row in enumerate(rows, start=2):
        if len(row) > width:
            return f"line {line}: expected {width} fields as in the header, saw {len(row)}"
    return "a row has more fields than the header"


def _parser_message(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[-1] if str(exc).strip() else "malformed CSV"
    return text.replace("Error tokenizing data. C error: ", "")


def resolve_columns(
    path: Path, header: Sequence[str], aliases: Mapping[str, Sequence[str]], required: Sequence[str]
) -> dict[str, str]:
    """Map canonical names to the first alias present in ``header``.

    Raises
    ------
    ProfileFormatError
        If a ``required`` canonical column has none of its aliases in the header.
    """
    present = set(header)
    found: dict[str, str] = {}
    for canon, names in aliases.items():
        for name in names:
            if name in present:
                found[canon] = name
                break
    for canon in required:
        if canon not in found:
            names = " or ".join(repr(n) for n in aliases[canon])
            raise ProfileFormatError(f"{path}: line 1: missing column {names}")
    return found


def build_profile(
    frame: pd.DataFrame,
    *,
    path: Path,
    source_columns: Mapping[str, str],
    meta: Mapping[str, Any],
    samples: pd.DataFrame | None = None,
    row_word: str = "line",
) -> Profile:
    """Construct a Profile, re-wording validation errors in the source file's own terms.

    Parameters
    ----------
    frame
        Profile columns, indexed by the source line number (or event index, see ``row_word``).
    source_columns
        Profile column -> the column name in the source file, for error messages.
    row_word
        What the index counts (``line`` for CSV, ``event`` for traces).
    """
    try:
        return Profile(frame, samples, meta=meta)
    except ValidationError as exc:
        # Header-level errors (no row) already name their column in the detail.
        where = []
        if exc.row is not None:
            where.append(f"{row_word} {exc.row}")
            if exc.field is not None:
                where.append(f"column {source_columns.get(exc.field, exc.field)!r}")
        prefix = f"{', '.join(where)}: " if where else ""
        raise ProfileFormatError(f"{path}: {prefix}{exc.detail}") from None


def parse_column(
    raw: pd.DataFrame,
    column: str,
    path: Path,
    *,
    kind: Kind = "float",
    min_value: float | None = None,
    exclusive: bool = False,
    allow_nan: bool = False,
    choices: tuple[str, ...] | None = None,
) -> pd.Series:
    """Parse one source column, reporting the first bad cell by line and source column name."""
    spec = Column(
        column,
        kind,
        min_value=min_value,
        exclusive_min=exclusive,
        allow_nan=allow_nan,
        choices=choices,
    )
    try:
        return coerce_column(raw[column], spec, "")
    except ValidationError as exc:
        raise ProfileFormatError(
            f"{path}: line {exc.row}, column {column!r}: {exc.detail}"
        ) from None
