"""The generic long profile CSV, the interchange format every importer can emit (DESIGN §6).

Columns: ``op``, ``name``, ``freq_mhz``, ``time_us`` and optionally ``type``, ``stream``,
``iteration``, ``core_power_w``, ``chip_power_w``, ``temp_c``, ``start_us``, ``mem_freq_mhz``,
``task_type``, ``kernels`` and ``ratio_*``. Unknown columns are an error, so a typo in a header
(``time_ms``) is caught rather than silently ignored.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from opdvfs.exceptions import ProfileFormatError
from opdvfs.io._common import Header, build_profile, read_csv_text, read_csv_typed
from opdvfs.profile import OP_COLUMNS, Profile

if TYPE_CHECKING:
    import pandas as pd

FORMAT = "csv"
REQUIRED = ("op", "name", "freq_mhz", "time_us")
#: The columns that identify the generic layout.
HEADER: Header = tuple((name,) for name in REQUIRED)


def read(path: Path, *, freq_mhz: float | None = None) -> Profile:
    """Read a generic profile CSV.

    Parameters
    ----------
    path
        The CSV file.
    freq_mhz
        Clock for a file without a ``freq_mhz`` column; must not contradict one that has it.
    """
    # numbers converted as they are read; a file that does not import so is read again as
    # text, whose checks name the line and column of what is wrong
    typed = read_csv_typed(path, _numeric)
    if typed is not None:
        try:
            return _build(typed, path, freq_mhz)
        except ProfileFormatError:
            pass
    return _build(read_csv_text(path), path, freq_mhz)


def _numeric(name: str) -> bool:
    """Return whether the generic column ``name`` holds numbers."""
    if name.startswith("ratio_"):
        return True
    return name in OP_COLUMNS.names and OP_COLUMNS.column(name).kind != "str"


def _build(frame: pd.DataFrame, path: Path, freq_mhz: float | None) -> Profile:
    if "freq_mhz" not in frame.columns and freq_mhz is not None:
        frame["freq_mhz"] = str(freq_mhz)
    known = {c for c in frame.columns if c in OP_COLUMNS.names or c.startswith("ratio_")}
    meta = {"format": FORMAT, "sources": [path.name]}
    return build_profile(frame, path=path, source_columns={c: c for c in known}, meta=meta)
