"""Column schemas and one vectorised validator for the table-backed data objects.

``Profile`` and ``Workload`` hold tens of thousands of rows, so validation is a handful of numpy
masks over whole columns, never a loop over rows. The first offending row is reported by its index
label: importers index their frames by the source file's line number, so the message they pass on
names the line a user can open.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from opdvfs.exceptions import ValidationError

if TYPE_CHECKING:  # pandas loads with the first table, not with the CLI's `schema` command
    import pandas as pd

Kind = Literal["int", "float", "str"]

__all__ = [
    "Column",
    "TableSchema",
    "coerce_column",
    "first_bad_row",
    "metadata_json_ready",
    "require_unique",
]


@dataclass(frozen=True)
class Column:
    """One column of a table schema.

    Parameters
    ----------
    name
        Column name, with its unit as a suffix (``time_us``, ``freq_mhz``).
    kind
        ``"int"``, ``"float"`` or ``"str"``.
    required
        Whether the column must be present. Absent optional columns with a ``default`` are filled.
    default
        Value an absent optional column is filled with; ``None`` leaves it absent.
    min_value, exclusive_min
        Lower bound for numeric columns (inclusive unless ``exclusive_min``).
    allow_nan
        Whether NaN marks a missing measurement (optional numeric columns only).
    choices
        Allowed values of a string column.
    description
        What the column holds, for the docs and ``opdvfs schema``.
    """

    name: str
    kind: Kind
    required: bool = True
    default: Any = None
    min_value: float | None = None
    exclusive_min: bool = False
    allow_nan: bool = False
    choices: tuple[str, ...] | None = None
    description: str = ""

    def expected(self) -> str:
        """Describe in words what a valid value of this column is."""
        if self.kind == "str":
            if self.choices:
                return "one of " + ", ".join(repr(c) for c in self.choices)
            return "a non-empty string"
        what = "an integer" if self.kind == "int" else "a finite number"
        if self.min_value is not None:
            op = ">" if self.exclusive_min else ">="
            what += f" {op} {self.min_value:g}"
        if self.allow_nan:
            what += " (or empty)"
        return what


def first_bad_row(mask: np.ndarray) -> int | None:
    """Return the position of the first True in a boolean mask, or None."""
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.size else None


@dataclass(frozen=True)
class TableSchema:
    """A fixed set of columns plus an optional family of prefixed float columns (``ratio_*``)."""

    what: str
    columns: tuple[Column, ...]
    float_prefixes: tuple[str, ...] = ()

    def column(self, name: str) -> Column:
        """Return the column called ``name``."""
        for col in self.columns:
            if col.name == name:
                return col
        raise KeyError(name)

    @property
    def names(self) -> tuple[str, ...]:
        """Names of the fixed columns, in schema order."""
        return tuple(c.name for c in self.columns)

    def validate(self, frame: pd.DataFrame) -> pd.DataFrame:
        """Return a validated, type-coerced copy of ``frame`` in schema column order.

        Raises
        ------
        ValidationError
            On the first missing or unknown column, or the first row whose value breaks its
            column's constraints; ``.field`` and ``.row`` (the index label) say where.
        """
        import pandas as pd

        known = set(self.names)
        for name in frame.columns:
            if not isinstance(name, str):
                raise ValidationError(f"{self.what}: column names must be strings, got {name!r}")
            if name not in known and not name.startswith(self.float_prefixes):
                allowed = ", ".join(self.names)
                prefixes = "".join(f", {p}*" for p in self.float_prefixes)
                detail = f"unknown column {name!r} (expected {allowed}{prefixes})"
                raise ValidationError(f"{self.what}: {detail}", field=name, detail=detail)
        out: dict[str, pd.Series] = {}
        n = len(frame)
        for col in self.columns:
            if col.name in frame.columns:
                out[col.name] = coerce_column(frame[col.name], col, self.what)
            elif col.required:
                detail = f"missing required column {col.name!r}"
                raise ValidationError(f"{self.what}: {detail}", field=col.name, detail=detail)
            elif col.default is not None:
                out[col.name] = coerce_column(_filled(col, n, frame.index), col, self.what)
        extra = Column("", "float", min_value=0.0, allow_nan=True)
        for name in sorted(c for c in frame.columns if c not in known):
            out[name] = coerce_column(frame[name], Column(name, **_fields(extra)), self.what)
        # unconsolidated: stacking the columns into one block would copy every one of them
        return pd.DataFrame(out, index=frame.index, copy=False)

    def describe(self) -> list[dict[str, Any]]:
        """Return the schema as a list of JSON-ready column descriptions."""
        rows = [
            {
                "name": c.name,
                "type": c.kind,
                "required": c.required,
                "expected": c.expected(),
                "description": c.description,
            }
            for c in self.columns
        ]
        rows += [
            {
                "name": f"{p}*",
                "type": "float",
                "required": False,
                "expected": "a finite number >= 0 (or empty)",
                "description": "pipeline utilisation ratios (0-1) as the profiler gives them",
            }
            for p in self.float_prefixes
        ]
        return rows


def _filled(col: Column, n: int, index: Any) -> pd.Series:
    """Return an absent column filled with its default: one category or one numpy fill."""
    import pandas as pd

    if col.kind == "str":
        codes = np.zeros(n, dtype=np.int8)
        categories = pd.Index([col.default])
        return pd.Series(pd.Categorical.from_codes(codes, categories=categories), index=index)
    dtype = np.int64 if col.kind == "int" else np.float64
    return pd.Series(np.full(n, col.default, dtype=dtype), index=index, copy=False)


def _fields(col: Column) -> dict[str, Any]:
    return {k: v for k, v in col.__dict__.items() if k != "name"}


def _fail(what: str, col: Column, series: pd.Series, pos: int, got: Any) -> ValidationError:
    label = _plain(series.index[pos])
    # a numpy scalar's repr (np.float64(-1.0)) is noise in a message; show the plain value
    detail = f"expected {col.expected()}, got {_plain(got)!r}"
    return ValidationError(
        f"{what}: row {label}, column {col.name!r}: {detail}",
        field=col.name,
        row=label,
        detail=detail,
    )


#: Rows of text parsed as numbers at once (bounds the parser's temporaries).
_PARSE_ROWS = 1 << 19


def _parse_text_numbers(series: pd.Series, col: Column, what: str) -> np.ndarray:
    """Parse text cells as floats; empty cells and 'nan' become NaN, anything unparsable raises.

    The C parser takes the clean cells; only the cells it rejects are stripped and retried
    (torch_npu appends a tab to its timestamps).
    """
    import pandas as pd

    # parsed as it is (object or Arrow-backed text), a block of rows at a time: an object copy
    # of a 3M-row Arrow column, or the parser's temporaries for all of it, cost hundreds of MB
    values = np.empty(len(series))
    for start in range(0, len(series), _PARSE_ROWS):
        part = pd.to_numeric(series.iloc[start : start + _PARSE_ROWS], errors="coerce")
        values[start : start + len(part)] = part.to_numpy(dtype=float, na_value=np.nan)
    retry = np.isnan(values)
    if retry.any():
        sub = series[retry].astype(object)
        stripped: pd.Series = sub.where(sub.notna(), "").astype(str).str.strip()
        parsed = pd.to_numeric(stripped.replace("", np.nan), errors="coerce")
        missing = (stripped == "") | (stripped.str.lower() == "nan")
        pos = first_bad_row((parsed.isna() & ~missing).to_numpy())
        if pos is not None:
            raise _fail(what, col, series, int(np.flatnonzero(retry)[pos]), sub.iloc[pos])
        values[retry] = parsed.to_numpy(dtype=float)
    return values


def coerce_column(series: pd.Series, col: Column, what: str) -> pd.Series:
    """Return ``series`` as ``col``'s kind, or raise ValidationError at the first bad row."""
    if col.kind == "str":
        return _coerce_str(series, col, what)
    return _coerce_number(series, col, what)


def _coerce_str(series: pd.Series, col: Column, what: str) -> pd.Series:
    """Return ``series`` as stripped text, checking each distinct value once.

    A million profile rows hold a few hundred operator names, so the checks and the stripping run
    over the categories, and no per-row string is created. A categorical ``series`` comes back
    categorical (categories sorted, unused ones dropped, as ``astype("category")`` of the text
    would give); any other comes back as an object column of the same strings.
    """
    import pandas as pd

    values = series if isinstance(series.dtype, pd.CategoricalDtype) else series.astype("category")
    codes = values.cat.codes.to_numpy()
    missing = codes < 0
    # str() of each category, as astype(str) does per row (a number in a text column is its text)
    text = pd.Index(values.cat.categories.astype(object), dtype=object).map(str).str.strip()
    bad_text = np.asarray(text == "", dtype=bool)
    if col.choices is not None:
        bad_text |= ~np.asarray(text.isin(col.choices), dtype=bool)
    bad = missing.copy()
    if len(text):
        bad |= bad_text[np.where(missing, 0, codes)]
    pos = first_bad_row(bad)
    if pos is not None:
        raise _fail(what, col, series, pos, None if missing[pos] else series.iloc[pos])
    # stripping can merge categories ("mm " and "mm"); keep the used ones, sorted
    used = np.bincount(codes, minlength=len(text)) > 0
    merged, uniques = pd.factorize(text[used], sort=True)
    remap = np.full(len(text), -1, dtype=np.int64)
    remap[used] = merged
    categories: Any = pd.Index(uniques)  # str dtype, as astype("category") of text gives
    out = pd.Categorical.from_codes(remap[codes], categories=categories)
    if isinstance(series.dtype, pd.CategoricalDtype):
        return pd.Series(out, index=series.index, copy=False)
    return pd.Series(np.asarray(out, dtype=object), index=series.index, dtype=object, copy=False)


def _coerce_number(series: pd.Series, col: Column, what: str) -> pd.Series:
    import pandas as pd

    if series.dtype == object or pd.api.types.is_string_dtype(series.dtype):
        values = _parse_text_numbers(series, col, what)
    elif pd.api.types.is_bool_dtype(series.dtype):
        raise ValidationError(
            f"{what}: column {col.name!r}: expected {col.expected()}, got booleans",
            field=col.name,
        )
    elif series.dtype == np.float64:
        values = series.to_numpy()  # a view: a float column is checked in place, not copied
    elif _exact_in_float(series.dtype):
        return _coerce_small_int(series, col, what)
    else:
        values = series.to_numpy(dtype=float, na_value=np.nan)
    pos = first_bad_row(_bad_numbers(values, col))
    if pos is not None:
        raise _fail(what, col, series, pos, series.iloc[pos])
    if col.kind == "int":
        return pd.Series(values.astype(np.int64), index=series.index, copy=False)
    if series.dtype == np.float64:
        return series.rename(None)  # a lazy copy: copy-on-write still separates the two
    return pd.Series(values, index=series.index, copy=False)


def _bad_numbers(values: np.ndarray, col: Column) -> np.ndarray:
    """Return which ``values`` break ``col``'s constraints (a few passes over the column).

    Infinite, NaN unless ``col.allow_nan``, below ``col.min_value`` (a NaN is not below it), and
    for an integer column not whole (NaN aside).
    """
    with np.errstate(invalid="ignore"):
        if col.min_value is None:
            bad = np.isinf(values) if col.allow_nan else ~np.isfinite(values)
        elif col.allow_nan:  # low or infinite; NaN compares False
            bad = values <= col.min_value if col.exclusive_min else values < col.min_value
            bad |= np.isinf(values)
        else:  # not at or above the bound (NaN fails it), or +inf
            bad = ~(values > col.min_value if col.exclusive_min else values >= col.min_value)
            bad |= values == np.inf
        if col.kind == "int":
            whole = values == np.round(values)
            if col.allow_nan:
                whole |= np.isnan(values)
            bad |= ~whole
    return bad


def _exact_in_float(dtype: Any) -> bool:
    """Whether ``dtype`` is an integer type every value of which a float64 holds exactly."""
    return isinstance(dtype, np.dtype) and dtype.kind in "iu" and dtype.itemsize <= 4


def _coerce_small_int(series: pd.Series, col: Column, what: str) -> pd.Series:
    """:func:`_coerce_number` of integers of up to 32 bits: the checks on the integers.

    Never NaN, infinite or fractional: only the bound is checked, and the values come back as
    int64 (an integer column) or float64, as through a float column (exact at 32 bits).
    """
    import pandas as pd

    values = series.to_numpy()
    if col.min_value is not None:
        low = values <= col.min_value if col.exclusive_min else values < col.min_value
        pos = first_bad_row(low)
        if pos is not None:
            raise _fail(what, col, series, pos, series.iloc[pos])
    kind = np.int64 if col.kind == "int" else np.float64
    return pd.Series(values.astype(kind), index=series.index, copy=False)


def require_unique(frame: pd.DataFrame, keys: Sequence[str], what: str) -> None:
    """Raise ValidationError at the first row whose ``keys`` repeat an earlier row's."""
    dup = frame.duplicated(list(keys), keep="first").to_numpy()
    pos = first_bad_row(dup)
    if pos is not None:
        label = frame.index[pos]
        key = ", ".join(f"{k}={_plain(frame[k].iloc[pos])!r}" for k in keys)
        detail = f"duplicate ({key}); each ({', '.join(keys)}) must appear once"
        raise ValidationError(
            f"{what}: row {label}: {detail}", field=keys[-1], row=label, detail=detail
        )


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def metadata_json_ready(meta: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``meta`` with tuples turned into lists, so it equals itself after a JSON trip."""

    def convert(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {str(k): convert(v) for k, v in value.items()}
        if isinstance(value, Iterable) and not isinstance(value, str | bytes):
            return [convert(v) for v in value]
        return _plain(value)

    return convert(meta)
