"""The ``Profile``: measured time (and optionally power) of every operator at every clock.

A profile is a long table with one row per (iteration, operator position, core clock), plus an
optional table of power-sensor samples. It is what every importer returns and what the models fit.

On disk (format version 2) the operator rows are one Parquet file, ``p.parquet`` (so
``pandas.read_parquet`` opens it), whose key-value metadata holds only a small JSON header: the
format version, the metadata, and where the samples are. The samples, which grow with the run
(NVML-style sensors: one per 100 ms of every iteration), are data rather than metadata: their own
Parquet file beside it, ``p.samples.parquet``, tied to the header by a random id so a stale or
foreign samples file is refused. Version 1 files (samples as a Parquet blob inside the footer's
metadata, which pyarrow's thrift reader refuses past ~100 MB) still read.

In memory the rows are compact (~110 B per row on a simulated Ascend profile, 311 B before):
operator names, types, streams and task types are categoricals, ``iteration``, ``op`` and
``kernels`` are int32 where they fit. Every float column stays float64: times, powers and clocks
feed fits and plans whose printed figures must not move, and ratios meet thresholds in the
classifier, where float32 rounding could flip an operator's class.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from opdvfs._files import atomic_path
from opdvfs._table import (
    Column,
    TableSchema,
    first_bad_row,
    metadata_json_ready,
    require_unique,
)
from opdvfs.exceptions import ProfileFormatError, ValidationError

if TYPE_CHECKING:  # pandas and pyarrow load with the first profile, not with `opdvfs --help`
    import pandas as pd

__all__ = [
    "OP_COLUMNS",
    "SAMPLE_COLUMNS",
    "STREAMS",
    "CellBlocks",
    "Profile",
    "block_medians",
    "cell_medians",
]

#: Where an operator runs: on the compute engine, a communication engine, or the host (idle for
#: the device). Planning treats ``comm`` and ``host`` as low-frequency candidates (paper Table 1).
STREAMS = ("compute", "comm", "host")

#: Columns that say which operator a row is; shared by profiles and workloads.
OPERATOR_COLUMNS = (
    Column("name", "str", description="operator name, e.g. aten::mm or MatMulV2"),
    Column("type", "str", required=False, description="operator type; defaults to the name"),
    Column(
        "stream",
        "str",
        required=False,
        default="compute",
        choices=STREAMS,
        description="compute, comm (collectives) or host",
    ),
    Column(
        "peer",
        "int",
        required=False,
        min_value=-1,
        description="the other rank of a point-to-point send or receive (its torch.distributed "
        "rank), -1 for other operators",
    ),
)


def _measured(name: str, description: str, *, positive: bool = False) -> Column:
    """Return an optional measured column, >= 0 (> 0 if ``positive``), empty where unmeasured."""
    return Column(
        name,
        "float",
        required=False,
        min_value=0.0,
        exclusive_min=positive,
        allow_nan=True,
        description=description,
    )


OP_COLUMNS = TableSchema(
    what="profile",
    columns=(
        Column(
            "iteration",
            "int",
            required=False,
            default=0,
            min_value=0,
            description="training/inference iteration the row was measured in",
        ),
        Column(
            "op",
            "int",
            min_value=0,
            description="position of the operator in the iteration (0-based)",
        ),
        *OPERATOR_COLUMNS,
        Column(
            "freq_mhz",
            "float",
            min_value=0.0,
            exclusive_min=True,
            description="core clock the row was measured at (MHz)",
        ),
        Column(
            "time_us", "float", min_value=0.0, description="operator execution time (microseconds)"
        ),
        Column(
            "start_us",
            "float",
            required=False,
            allow_nan=True,
            description="start time relative to the start of its iteration (us)",
        ),
        Column(
            "wall_s",
            "float",
            required=False,
            allow_nan=True,
            description="start time on the sensor samples' clock (s), to attribute their energy",
        ),
        _measured("core_power_w", "mean core-rail power while the operator ran (W)"),
        _measured("chip_power_w", "mean chip/board power while the operator ran (W)"),
        Column(
            "temp_c",
            "float",
            required=False,
            allow_nan=True,
            description="chip temperature while the operator ran (deg C)",
        ),
        _measured("mem_freq_mhz", "memory clock (MHz), where it was recorded", positive=True),
        Column(
            "task_type",
            "str",
            required=False,
            description="engine that ran the op (Ascend Task Type: AI_CORE, AI_CPU, ...)",
        ),
        Column(
            "kernels",
            "int",
            required=False,
            min_value=0,
            description="device kernels attributed to the operator (traces)",
        ),
    ),
    float_prefixes=("ratio_",),
)

SAMPLE_COLUMNS = TableSchema(
    what="profile samples",
    columns=(
        Column("t_s", "float", description="sample time (s), on the profile's clock"),
        _measured("power_w", "chip/board power (W), as the sensor reports it"),
        _measured("core_power_w", "core-rail power (W)"),
        Column(
            "temp_c",
            "float",
            required=False,
            allow_nan=True,
            description="chip temperature (deg C)",
        ),
        _measured("freq_mhz", "core clock at the sample (MHz)", positive=True),
        _measured("energy_j", "cumulative energy counter (J), e.g. NVML total energy"),
    ),
)

_META_KEY = b"opdvfs.profile"
#: Version 1 kept the samples here, as a Parquet blob in the footer; read only.
_SAMPLES_KEY = b"opdvfs.samples"
#: The samples file's own tag (``_files.FILE_KINDS`` names it when given as a profile).
SAMPLES_FILE_KEY = b"opdvfs.profile-samples"
_FORMAT_VERSION = 2
#: Rows per Parquet row group (and per conversion step when writing), so a large table is never
#: converted to Arrow all at once.
_ROW_GROUP = 1 << 20
#: Text columns held as categoricals: a few hundred distinct names over a million rows.
_CATEGORICAL = ("name", "type", "stream", "task_type")
#: Integer columns held as int32 when their values fit.
_INT32 = ("iteration", "op", "kernels", "peer")


def samples_path(path: str | os.PathLike[str]) -> Path:
    """Return the samples file that belongs beside the profile at ``path``.

    ``p.parquet`` keeps its samples in ``p.samples.parquet`` (a name without ``.parquet`` gets
    ``.samples.parquet`` appended).
    """
    src = Path(path)
    stem = src.name[: -len(".parquet")] if src.name.endswith(".parquet") else src.name
    return src.with_name(f"{stem}.samples.parquet")


class Profile:
    """Measured per-operator times (and power) at one or more core clocks.

    Parameters
    ----------
    ops
        Long table, one row per (iteration, op, freq_mhz); columns as in :data:`OP_COLUMNS`
        (``op``, ``name``, ``freq_mhz`` and ``time_us`` required, ``ratio_*`` allowed).
    samples
        Optional power-sensor samples, columns as in :data:`SAMPLE_COLUMNS`, sorted by ``t_s``.
    meta
        JSON-ready metadata: ``format`` (importer), ``sources`` (files), ``device``, ``dropped``
        (``{reason: rows}`` the importer left out), ``notes``.

    Raises
    ------
    ValidationError
        If a column is missing or unknown, a value breaks its column's constraints, an
        (iteration, op, freq_mhz) key repeats, or one op position carries two names.

    Notes
    -----
    Validation is vectorised: 100k rows validate in well under a second. The tables are copied
    on construction, so mutating the caller's frames afterwards does not change the profile.
    """

    def __init__(
        self,
        ops: pd.DataFrame,
        samples: pd.DataFrame | None = None,
        *,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        table = OP_COLUMNS.validate(_categorical_text(ops))
        if "type" not in table.columns:
            table.insert(3, "type", table["name"])
        order = _row_order(table)
        _require_unique_keys(table, order)
        _require_one_name_per_op(table)
        self._ops = _compact(_sorted_rows(table, order).reset_index(drop=True))
        self._samples: pd.DataFrame | None = None
        if samples is not None:
            smp = SAMPLE_COLUMNS.validate(samples)
            pos = first_bad_row(np.diff(smp["t_s"].to_numpy()) < 0)
            if pos is not None:
                detail = "expected non-decreasing sample times"
                raise ValidationError(
                    f"profile samples: row {smp.index[pos + 1]}, column 't_s': {detail}",
                    field="t_s",
                    row=smp.index[pos + 1],
                    detail=detail,
                )
            self._samples = smp.reset_index(drop=True)
        self._meta: dict[str, Any] = metadata_json_ready(meta or {})
        self._meta.setdefault("dropped", {})

    # ----------------------------------------------------------------------------- accessors
    @property
    def ops(self) -> pd.DataFrame:
        """The operator rows (a copy), sorted by iteration, clock and op position.

        A lazy copy: pandas' copy-on-write copies a column only when the caller writes to it, so
        reading a million-row profile costs no memory.
        """
        return self._ops.copy(deep=False)

    @property
    def samples(self) -> pd.DataFrame | None:
        """The power-sensor samples (a copy), or None."""
        return None if self._samples is None else self._samples.copy(deep=False)

    def without_samples(self) -> Profile:
        """Return this profile without its sensor samples (the same rows and metadata).

        Not validated again: the rows are this profile's, shared (they are never written to).
        """
        bare = copy.copy(self)
        bare._samples = None
        return bare

    @property
    def meta(self) -> dict[str, Any]:
        """The metadata (a deep copy)."""
        return json.loads(json.dumps(self._meta))

    @property
    def freqs_mhz(self) -> np.ndarray:
        """Distinct core clocks in the profile, ascending (MHz)."""
        return np.sort(_distinct(self._ops["freq_mhz"].to_numpy()))

    @property
    def n_ops(self) -> int:
        """Number of distinct operator positions."""
        return int(self._ops["op"].nunique())

    @property
    def op_ids(self) -> np.ndarray:
        """Distinct operator positions, ascending (``np.unique`` of the rows' ``op``, no sort)."""
        return _dense_codes(self._ops["op"].to_numpy())[0]

    @property
    def n_iterations(self) -> int:
        """Number of distinct iterations."""
        return int(self._ops["iteration"].nunique())

    @property
    def dropped(self) -> dict[str, int]:
        """Rows the importer left out, by reason."""
        return dict(self._meta.get("dropped", {}))

    def __len__(self) -> int:
        return len(self._ops)

    def __repr__(self) -> str:
        clocks = ",".join(f"{f:g}" for f in self.freqs_mhz)
        return (
            f"Profile(ops={self.n_ops}, iterations={self.n_iterations}, "
            f"freqs_mhz=[{clocks}], rows={len(self)}, samples={self._sample_count()})"
        )

    def _sample_count(self) -> int:
        return 0 if self._samples is None else len(self._samples)

    def equals(self, other: Profile) -> bool:
        """Return whether two profiles hold identical rows, samples and metadata."""
        same_samples = (self._samples is None and other._samples is None) or (
            self._samples is not None
            and other._samples is not None
            and self._samples.equals(other._samples)
        )
        return self._ops.equals(other._ops) and same_samples and self._meta == other._meta

    # ----------------------------------------------------------------------------- views
    def cells(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return the op ids and clocks (both ascending) and every row's (op, clock) cell.

        The cell of a row is ``op_index * n_freqs + freq_index``, one int64 per row, in row
        order (rows are sorted by iteration, clock and op: a cell's rows come in iteration
        order). What :meth:`time_matrix_us` and the planner's measured tables group by, without
        pandas' grouping (at a million ops it built ~250 MB of group keys).
        """
        op_ids, op_index = _dense_codes(self._ops["op"].to_numpy())
        freq = self._ops["freq_mhz"].to_numpy()
        freqs = np.sort(_distinct(freq))
        cell = op_index * len(freqs) + np.searchsorted(freqs, freq)
        return op_ids, freqs.astype(float), cell

    def time_matrix_us(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Median time of every op at every clock, as a dense matrix.

        Returns
        -------
        op_ids : ndarray, shape (n_ops,)
            Operator positions, ascending.
        freqs_mhz : ndarray, shape (n_freqs,)
            Clocks, ascending.
        time_us : ndarray, shape (n_ops, n_freqs)
            Median over iterations; NaN where an op was not measured at a clock.
        """
        op_ids, freqs, key = self.cells()
        counts = np.bincount(key, minlength=len(op_ids) * len(freqs))
        times = cell_medians(self._ops["time_us"].to_numpy(), key, counts)
        return op_ids, freqs, times.reshape(len(op_ids), len(freqs))

    def summary(self) -> dict[str, Any]:
        """Return a JSON-ready summary (the payload of ``opdvfs info --json``)."""
        ops = self._ops
        n_iter = max(self.n_iterations, 1)
        has_power = "chip_power_w" in ops.columns
        # Energy of a row = its time x its mean power; a clock with any row lacking power gets
        # no energy figure rather than an undercount.
        energy_j = ops["time_us"] * ops["chip_power_w"] * 1e-6 if has_power else ops["time_us"] * 0
        per_freq = (
            ops.assign(_energy_j=energy_j, _no_power=energy_j.isna())
            .groupby("freq_mhz")
            .agg(
                rows=("time_us", "size"),
                ops=("op", "nunique"),
                iterations=("iteration", "nunique"),
                total_us=("time_us", "sum"),
                energy_j=("_energy_j", "sum"),
                no_power=("_no_power", "any"),
            )
        )
        per_freq["time_per_iteration_ms"] = per_freq["total_us"] / per_freq["iterations"] / 1e3
        per_freq["energy_per_iteration_j"] = per_freq["energy_j"] / per_freq["iterations"]
        time_ms = per_freq["time_per_iteration_ms"].to_numpy(dtype=float)
        energy = per_freq["energy_per_iteration_j"].to_numpy(dtype=float)
        known = has_power & ~per_freq["no_power"].to_numpy(dtype=bool)
        clocks = [
            {
                "freq_mhz": float(freq),
                "rows": int(per_freq["rows"].iloc[i]),
                "ops": int(per_freq["ops"].iloc[i]),
                "iterations": int(per_freq["iterations"].iloc[i]),
                "time_per_iteration_ms": float(time_ms[i]),
                "chip_energy_per_iteration_j": float(energy[i]) if known[i] else None,
                "mean_chip_power_w": float(energy[i] / (time_ms[i] * 1e-3)) if known[i] else None,
            }
            for i, freq in enumerate(per_freq.index.to_numpy(dtype=float))
        ]
        ratio_cols = [c for c in ops.columns if c.startswith("ratio_")]
        power_cols = [c for c in ("core_power_w", "chip_power_w", "temp_c") if c in ops.columns]
        return {
            "format": self._meta.get("format"),
            "sources": self._meta.get("sources", []),
            "device": self._meta.get("device"),
            "operators": self.n_ops,
            "iterations": self.n_iterations,
            "rows": len(ops),
            "clocks": len(clocks),
            "freqs_mhz": [float(f) for f in self.freqs_mhz],
            "per_clock": clocks,
            # as text: a categorical's value_counts would order ties by category, not by first seen
            "streams": {
                str(k): int(v) for k, v in ops["stream"].astype(object).value_counts().items()
            },
            "op_types": int(ops["type"].nunique()),
            "power_columns": power_cols,
            "ratio_columns": ratio_cols,
            "samples": self._sample_count(),
            "rows_dropped": self.dropped,
            "rows_per_iteration": len(ops) / n_iter,
        }

    # ----------------------------------------------------------------------------- files
    def write(self, path: str | os.PathLike[str]) -> None:
        """Write the profile as Parquet, atomically (temp files, then rename).

        The operator rows go to ``path``; the samples, if any, to :func:`samples_path` beside
        it. Both are written in row groups of a million rows, so a table is converted to Arrow
        a slice at a time.
        """
        header: dict[str, Any] = {"version": _FORMAT_VERSION, "meta": self._meta}
        stale = samples_path(path)
        with contextlib.ExitStack() as files:
            if self._samples is not None:
                token = uuid.uuid4().hex
                header["samples"] = {"file": stale.name, "rows": len(self._samples), "id": token}
                tmp = files.enter_context(atomic_path(stale))
                _write_parquet(self._samples, tmp, {SAMPLES_FILE_KEY: token.encode()})
            # entered last, so renamed first: the header never names samples not yet in place
            # for long, and a reader that meets a mismatch is told by the id
            tmp = files.enter_context(atomic_path(path))
            _write_parquet(self._ops, tmp, {_META_KEY: json.dumps(header).encode()})
        if self._samples is None:
            stale.unlink(missing_ok=True)

    @classmethod
    def read(cls, path: str | os.PathLike[str], *, samples: bool = True) -> Profile:
        """Read a profile written by :meth:`write` (format version 2, or version 1).

        ``samples=False`` leaves the sensor samples unread where the rows carry per-op power
        (``core_power_w`` or ``chip_power_w``): the models fit that and never the samples
        (~0.5 s and ~140 MB at 1M ops x 3 clocks). The samples file is still checked to belong
        to the profile; a profile without per-op power keeps its samples, its only power.

        Raises
        ------
        ProfileFormatError
            If the file is missing, is not Parquet, holds rows that fail validation, or its
            samples file is missing or belongs to another profile.
        """
        import pyarrow as pa
        import pyarrow.parquet as pq

        src = Path(path)
        try:
            parquet = pq.ParquetFile(src)
            raw = parquet.schema_arrow.metadata or {}
        except FileNotFoundError:
            raise ProfileFormatError(f"{src}: no such file") from None
        except (pa.ArrowException, OSError) as exc:
            raise ProfileFormatError(f"{src}: not a Parquet profile ({_first_line(exc)})") from None
        try:
            header = json.loads(raw.get(_META_KEY, b"{}"))
            skip = not samples and bool(_POWER_COLUMNS & set(parquet.schema_arrow.names))
            table = _read_samples(src, header, raw, decode=not skip)
        except ProfileFormatError:
            raise
        except (ValueError, KeyError, TypeError, OSError, pa.ArrowException) as exc:
            raise ProfileFormatError(
                f"{src}: corrupt opdvfs metadata ({_first_line(exc)})"
            ) from None
        try:
            frame = _to_pandas(parquet)
        except (pa.ArrowException, OSError) as exc:
            raise ProfileFormatError(f"{src}: not a Parquet profile ({_first_line(exc)})") from None
        frame.index = frame.index + 1
        try:
            return cls(frame, table, meta=header.get("meta", {}))
        except ValidationError as exc:
            raise ProfileFormatError(f"{src}: {exc}") from None
        finally:
            # Arrow's pool keeps the decoded columns that validation replaced (~50 MB per
            # million rows) for reuse that never comes; hand them back before the models run
            del frame
            pa.default_memory_pool().release_unused()


def _categorical_text(ops: pd.DataFrame, names: Iterable[str] = _CATEGORICAL) -> pd.DataFrame:
    """Return ``ops`` with its text columns ``names`` as categoricals (shallow copy if any change).

    Done before validation, so the text checks run once per distinct name rather than per row,
    and the validated table already holds the categoricals the table keeps (``Profile``, and
    ``Workload`` with its own text columns).
    """
    import pandas as pd

    text = {
        name: ops[name].astype("category")
        for name in names
        if name in ops.columns and not isinstance(ops[name].dtype, pd.CategoricalDtype)
    }
    return ops.assign(**text) if text else ops


_KEYS = ("iteration", "op", "freq_mhz")
# per-op power: where the rows carry it, the models never read the sensor samples
_POWER_COLUMNS = frozenset(("core_power_w", "chip_power_w"))


def _row_order(table: pd.DataFrame) -> np.ndarray:
    """Return the stable order of ``table``'s rows by iteration, clock and op position.

    Rows already in that order (a file this class wrote, the simulator's) keep it: checked
    pair by pair, not sorted (a stable sort of sorted keys is the identity).
    """
    iteration, freq, op = (table[k].to_numpy() for k in ("iteration", "freq_mhz", "op"))
    if len(table) > 1:
        # each row's key at or after the one before it: (iteration, freq, op) lexicographically
        later = iteration[1:] > iteration[:-1]
        same = iteration[1:] == iteration[:-1]
        later |= same & (freq[1:] > freq[:-1])
        same &= freq[1:] == freq[:-1]
        later |= same & (op[1:] >= op[:-1])
        if later.all():
            return np.arange(len(table))
    return np.lexsort((op, freq, iteration))


def _require_unique_keys(table: pd.DataFrame, order: np.ndarray) -> None:
    """Refuse a repeated (iteration, op, freq_mhz), naming the first row that repeats one.

    In key order (``order``, stable) a repeat is a row whose key equals the one before it; the
    first such row in the table's own order is the one ``require_unique`` names, and it is named
    through it (same message). Compared in blocks of rows: a million-op profile's hashed
    ``duplicated`` took ~0.9 s and ~180 MB.
    """
    columns = [table[k].to_numpy() for k in _KEYS]
    repeat = np.zeros(len(order), dtype=bool)
    for start in range(1, len(order), _ROW_GROUP):
        here = order[start : start + _ROW_GROUP]
        before = order[start - 1 : start - 1 + len(here)]
        same = columns[0][here] == columns[0][before]
        for column in columns[1:]:
            same &= column[here] == column[before]
        repeat[start : start + len(here)] = same
    if repeat.any():
        at = np.flatnonzero(repeat)
        k = int(at[np.argmin(order[at])])
        # the row and the earlier one it repeats (stable order: the earlier is first)
        require_unique(table.iloc[[order[k - 1], order[k]]], _KEYS, "profile")


def _sorted_rows(table: pd.DataFrame, order: np.ndarray) -> pd.DataFrame:
    """Return ``table`` in ``order`` (:func:`_row_order`).

    Profiles mostly arrive in that order already (the simulator, files this class wrote), and
    then no sorted copy of every column is made.
    """
    if np.array_equal(order, np.arange(len(table))):
        return table
    return table.take(order)


def _distinct(values: np.ndarray) -> np.ndarray:
    """Distinct values of ``values``, unordered: a hash pass, not a sort of every row."""
    import pandas as pd

    return np.asarray(pd.unique(values))


def cell_medians(values: np.ndarray, cell: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Return the median of each cell's values, skipping NaN; NaN where a cell has none.

    Parameters
    ----------
    values
        One value per row.
    cell
        Each row's cell (:meth:`Profile.cells`).
    counts
        Rows per cell, ``np.bincount(cell, minlength=n_cells)``.

    The median is pandas' own (:func:`block_medians`), without grouping the rows in pandas.
    """
    out = np.full(len(counts), np.nan)
    if counts.max(initial=0) <= 1:  # one value per cell: it is the median (NaN: none)
        out[cell] = values
        return out
    for cells, block in CellBlocks.of(cell, counts).blocks(values):
        out[cells] = block_medians(block)
    return out


@dataclass(frozen=True)
class CellBlocks:
    """The rows of every (op, clock) cell, in blocks of the cells measured equally often.

    Statistics per cell without grouping the rows in pandas: one block per distinct count of
    rows (the iterations measured), a (count x cells) table of each cell's values in row order.

    Attributes
    ----------
    cells
        Each block's cells.
    rows
        Each block's rows, (count x cells), in row order; None where the rows are every cell
        once per iteration, each iteration in one order (what ``opdvfs profile`` writes): then
        the block is the values themselves, ``values.reshape(count, -1)``, no row gathered.
    """

    cells: tuple[np.ndarray, ...]
    rows: tuple[np.ndarray | None, ...]

    @classmethod
    def of(cls, cell: np.ndarray, counts: np.ndarray) -> CellBlocks:
        """Return the blocks of rows with cells ``cell`` (:meth:`Profile.cells`), ``counts``."""
        count = int(counts.max(initial=0))
        n_cells = len(counts)
        if count and len(cell) == count * n_cells:
            first = cell[:n_cells]
            each = np.broadcast_to(first, (count, n_cells))
            if np.array_equal(cell.reshape(count, n_cells), each):  # each iteration alike
                return cls((first,), (None,))
        # each cell's rows together, in row order (the rows come in runs of ascending cells,
        # which a stable sort merges)
        order = np.argsort(cell, kind="stable")
        start = np.cumsum(counts) - counts
        present = np.flatnonzero(np.bincount(counts))
        cells = tuple(np.flatnonzero(counts == c) for c in present[present > 0])
        rows = tuple(order[start[c] + np.arange(counts[c[0]])[:, None]] for c in cells)
        return cls(cells, rows)

    def blocks(self, values: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yield each block's cells and its values of ``values`` (one per row), (count x cells)."""
        values = np.asarray(values, dtype=float)
        for cells, rows in zip(self.cells, self.rows, strict=True):
            yield cells, values.reshape(-1, len(cells)) if rows is None else values[rows]


def block_medians(block: np.ndarray) -> np.ndarray:
    """Return each column's median, skipping NaN (NaN where a column has none): pandas' median.

    The middle value, or ``(lower + upper) / 2`` of the two middle ones for an even count.
    """
    count = len(block)
    block = np.sort(block, axis=0)  # NaN last
    n = count - np.isnan(block).sum(axis=0)
    if (n == count).all():  # no NaN: the middle rows
        lower, upper = block[(count - 1) // 2], block[count // 2]
    else:
        lower = np.take_along_axis(block, (np.maximum(n - 1, 0) // 2)[None, :], axis=0)[0]
        upper = np.take_along_axis(block, (n // 2)[None, :], axis=0)[0]
    return np.where(n % 2 == 1, lower, (lower + upper) / 2)  # n = 0: NaN


def _dense_codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return the distinct integers of ``values`` (ascending) and each value's index in them.

    Op positions are dense (0 to n-1, a few missing): a table of which occur replaces the sort
    that ``np.unique`` would make of every row.
    """
    if len(values) and values.min() >= 0 and values.max() < 4 * len(values):
        present = np.zeros(int(values.max()) + 1, dtype=bool)
        present[values] = True
        return np.flatnonzero(present).astype(values.dtype), (np.cumsum(present) - 1)[values]
    ids, index = np.unique(values, return_inverse=True)
    return ids, index.reshape(-1)


def _compact(table: pd.DataFrame) -> pd.DataFrame:
    """Give ``table`` (the caller's own) categorical text and int32 positions; return it."""
    for name in table.columns:
        column = table[name]
        if name in _CATEGORICAL:
            table[name] = _python_categories(column.astype("category"))
        elif name in _INT32 and (column.empty or column.max() <= np.iinfo(np.int32).max):
            table[name] = column.astype(np.int32)
    return table


def _python_categories(column: pd.Series) -> pd.Series:
    """Return the categorical ``column`` with its categories as Python strings (object).

    pandas' default ``str`` categories live in Arrow: every row read out as text (an op's name
    per op: a million of them to fit a million ops) became a new Python string, 74 MB and ~1 s.
    With Python strings the rows share the few hundred category objects. Same values and codes.
    """
    import pandas as pd

    categories = column.cat.categories
    if categories.dtype == object:
        return column
    dtype = pd.CategoricalDtype(categories.astype(object), ordered=column.cat.ordered)
    codes = column.cat.codes.to_numpy()
    return pd.Series(pd.Categorical.from_codes(codes, dtype=dtype), index=column.index, copy=False)


def _write_parquet(frame: pd.DataFrame, path: Path, metadata: Mapping[bytes, bytes]) -> None:
    """Write ``frame`` to ``path`` one row group at a time, with ``metadata`` in the footer."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.Schema.from_pandas(frame.iloc[:0], preserve_index=False)
    # text categories are Python strings in memory (_python_categories); the file keeps the
    # large_string dictionaries that pandas' str categories write, so its bytes do not change
    schema = pa.schema(
        [_large_text(field) for field in schema], metadata={**(schema.metadata or {}), **metadata}
    )
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        for start in _row_groups(len(frame)):
            part = frame.iloc[start : start + _ROW_GROUP]
            writer.write_table(pa.Table.from_pandas(part, schema=schema, preserve_index=False))


def _large_text(field: Any) -> Any:
    """Return ``field`` with a dictionary of ``string`` values as one of ``large_string``."""
    import pyarrow as pa

    kind = field.type
    if pa.types.is_dictionary(kind) and pa.types.is_string(kind.value_type):
        return field.with_type(pa.dictionary(kind.index_type, pa.large_string(), kind.ordered))
    return field


def _row_groups(rows: int) -> Iterator[int]:
    """Yield the first row of each row group (one, empty, for an empty table)."""
    yield from range(0, max(rows, 1), _ROW_GROUP)


def _to_pandas(parquet: Any) -> pd.DataFrame:
    """Return a Parquet file's table as pandas, a column at a time, in numpy's own memory.

    Decoding the whole table and then converting it held the file's data twice at the peak, and
    left the columns in Arrow's memory pool, whose allocator kept ~300 MB of a million-op
    profile resident after the buffers were freed. Each column is decoded, converted and (if
    Arrow still owns it) copied out before the next; the values and dtypes are those of one
    whole-table conversion. A file whose pandas index is not the plain row numbers (another
    tool's) or whose column names repeat converts whole, as before.
    """
    import pandas as pd

    schema = parquet.schema_arrow
    index = (schema.pandas_metadata or {}).get("index_columns", [])
    plain = all(
        isinstance(i, dict) and i.get("kind") == "range" and i.get("start", 0) == 0
        and i.get("step", 1) == 1
        for i in index
    )  # fmt: skip
    if not plain or len(set(schema.names)) != len(schema.names):
        return parquet.read().to_pandas(self_destruct=True, split_blocks=True)
    columns = {}
    for name in schema.names:
        series = parquet.read(columns=[name]).column(0).to_pandas()
        values = series.to_numpy() if isinstance(series.dtype, np.dtype) else None
        if values is not None and values.dtype.kind in "biuf" and not values.flags.owndata:
            series = pd.Series(values.copy(), name=name, copy=False)
        columns[name] = series
    return pd.DataFrame(columns, copy=False)


def _read_samples(
    src: Path, header: Mapping[str, Any], raw: Mapping[bytes, bytes], *, decode: bool = True
) -> pd.DataFrame | None:
    """Return the samples of the profile at ``src`` (either format version), or None.

    ``decode=False`` checks the samples file (present, of this profile) and returns None.
    """
    import pyarrow.parquet as pq

    version = header.get("version", 1)
    if not isinstance(version, int) or version > _FORMAT_VERSION:
        raise ProfileFormatError(
            f"{src}: profile format version {version!r}; this opdvfs reads versions up to "
            f"{_FORMAT_VERSION} (upgrade opdvfs)"
        )
    if version == 1:
        blob = raw.get(_SAMPLES_KEY)
        if blob is None or not decode:
            return None
        return pq.read_table(io.BytesIO(blob)).to_pandas()
    where = header.get("samples")
    if where is None:
        return None
    side = src.with_name(str(where["file"]))
    if not side.exists():
        raise ProfileFormatError(
            f"{src}: its samples file {side.name} is missing; keep the two files together"
        )
    parquet = pq.ParquetFile(side)
    token = (parquet.schema_arrow.metadata or {}).get(SAMPLES_FILE_KEY, b"").decode()
    if token != where.get("id") or parquet.metadata.num_rows != where.get("rows"):
        raise ProfileFormatError(
            f"{src}: {side.name} holds the samples of another profile (written separately); "
            "write the profile again"
        )
    return _to_pandas(parquet) if decode else None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _require_one_name_per_op(table: pd.DataFrame) -> None:
    """Every row at one op position must name the same operator (alignment across clocks).

    Each row's name code is compared with that of its op's first row, found with
    ``np.minimum.at`` in blocks of rows: pandas' ``groupby(...).transform("first")`` held ~85 MB
    of group keys at a million ops, at the moment the simulator's tables are also alive.
    """
    import pandas as pd

    name = table["name"]
    if not isinstance(name.dtype, pd.CategoricalDtype):  # validated profiles are categorical
        names = table.groupby("op")["name"].transform("first")
        pos = first_bad_row((name != names).to_numpy())
        earlier = None if pos is None else names.iloc[pos]
    else:
        codes = name.cat.codes.to_numpy()
        _, op_index = _dense_codes(table["op"].to_numpy())
        first = np.full(int(op_index.max(initial=-1)) + 1, len(table), dtype=np.int64)
        for start in range(0, len(table), _ROW_GROUP):
            rows = op_index[start : start + _ROW_GROUP]
            np.minimum.at(first, rows, np.arange(start, start + len(rows)))
        first_code = codes[first]
        del first
        pos = first_bad_row(codes != first_code[op_index])
        earlier = None if pos is None else name.cat.categories[first_code[op_index[pos]]]
    if pos is not None:
        row = table.iloc[pos]
        detail = (
            f"op {row['op']} is {row['name']!r} here but {earlier!r} in an earlier row; "
            "one op position must be the same operator in every iteration and at every clock"
        )
        raise ValidationError(
            f"profile: row {table.index[pos]}: {detail}",
            field="name",
            row=table.index[pos],
            detail=detail,
        )
