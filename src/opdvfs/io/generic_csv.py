"""The generic long profile CSV, the interchange format every importer can emit (DESIGN §6).

Columns: ``op``, ``name``, ``freq_mhz``, ``time_us`` and optionally ``type``, ``stream``,
``iteration``, ``core_power_w``, ``chip_power_w``, ``temp_c``, ``start_us``, ``mem_freq_mhz``,
``task_type``, ``kernels`` and ``ratio_*``. Unknown columns are an error, so a typo in a header
(``time_ms``) is caught rather than silently ignored.
"""

from __future__ import annotations

from pathlib import Path

from opdvfs.io._common import Header, build_profile, read_csv_text
from opdvfs.profile import OP_COLUMNS, Profile

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
    frame = read_csv_text(path)
    if "freq_mhz" not in frame.columns and freq_mhz is not None:
        frame["freq_mhz"] = str(freq_mhz)
    known = {c for c in frame.columns if c in OP_COLUMNS.names or c.startswith("ratio_")}
    meta = {"format": FORMAT, "sources": [path.name]}
    return build_profile(frame, path=path, source_columns={c: c for c in known}, meta=meta)
