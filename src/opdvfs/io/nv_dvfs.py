"""NV-DVFS-Benchmark kernel measurements (Wang & Chu, ICPADS'18 / TPDS'20).

Two layouts:

* ``nv-dvfs``: ``benchmark, kernel, argNo, core_frequency, memory_frequency, time`` (ms per
  launch), ``average_power`` (W, board) and the DCGM activity fractions ``DRAMA, FP16A, FP32A,
  FP64A, SMACT, SMOCC, TENSO`` (kept as ``ratio_*``). Extra columns (PTX instruction counts in
  ``*-dvfs-real.csv``) are ignored.
* ``nv-dvfs-legacy``: ``appName, coreF, memF, argNo, kernel, time/ms, ..., power/W`` with ~45
  nvprof metrics (ignored).

One (benchmark, kernel, input) triple is one operator. These kernels are independent programs,
not one iteration; their "position" is the order of first appearance.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from opdvfs.exceptions import ProfileFormatError
from opdvfs.io._common import Header, build_profile, parse_column, read_csv_text, resolve_columns
from opdvfs.profile import Profile

FORMAT = "nv-dvfs"
LEGACY_FORMAT = "nv-dvfs-legacy"

_ALIASES = {
    "benchmark": ("benchmark", "appName"),
    "kernel": ("kernel",),
    "input": ("argNo",),
    "freq": ("core_frequency", "coreF"),
    "mem_freq": ("memory_frequency", "memF"),
    "time_ms": ("time", "time/ms"),
    "power_w": ("average_power", "power/W"),
}
#: DCGM profiling fields (1002-1008), fractions of the run the unit was active.
_RATIOS = {
    "DRAMA": "ratio_dram_active",
    "FP16A": "ratio_fp16_active",
    "FP32A": "ratio_fp32_active",
    "FP64A": "ratio_fp64_active",
    "SMACT": "ratio_sm_active",
    "SMOCC": "ratio_sm_occupancy",
    "TENSO": "ratio_tensor_active",
}


#: The columns that identify the NV-DVFS-Benchmark layout and its legacy layout.
HEADER: Header = (("benchmark",), ("kernel",), ("core_frequency",), ("time",))
LEGACY_HEADER: Header = (("appName",), ("coreF",), ("kernel",), ("time/ms",))


def read(path: Path, *, freq_mhz: float | None = None) -> Profile:
    """Read either NV-DVFS-Benchmark layout; ``freq_mhz`` is unused (the file has its clocks)."""
    raw = read_csv_text(path)
    cols = resolve_columns(
        path, list(raw.columns), _ALIASES, required=("benchmark", "kernel", "freq", "time_ms")
    )
    text = {k: raw[cols[k]].str.strip() for k in ("benchmark", "kernel")}
    for key, series in text.items():
        parse_column(raw.assign(**{cols[key]: series}), cols[key], path, kind="str")
    inputs = raw[cols["input"]].str.strip() if "input" in cols else pd.Series("", index=raw.index)
    name = text["benchmark"] + "/" + text["kernel"]
    name = name.where(inputs == "", name + "[" + inputs + "]")
    op = pd.factorize(name)[0]
    frame = pd.DataFrame(
        {
            "op": op,
            "name": name,
            "type": text["kernel"],
            "freq_mhz": parse_column(raw, cols["freq"], path, min_value=0.0, exclusive=True),
            "time_us": parse_column(raw, cols["time_ms"], path, min_value=0.0) * 1e3,
        },
        index=raw.index,
    )
    source = {
        "op": cols["kernel"],
        "name": cols["kernel"],
        "freq_mhz": cols["freq"],
        "time_us": cols["time_ms"],
    }
    if "power_w" in cols:
        frame["chip_power_w"] = parse_column(
            raw, cols["power_w"], path, min_value=0.0, allow_nan=True
        )
        source["chip_power_w"] = cols["power_w"]
    if "mem_freq" in cols:
        mem = parse_column(raw, cols["mem_freq"], path, min_value=0.0, exclusive=True)
        if mem.nunique() > 1:
            clocks = ", ".join(f"{m:g}" for m in sorted(mem.unique()))
            raise ProfileFormatError(
                f"{path}: column {cols['mem_freq']!r}: holds several memory clocks ({clocks}); "
                "a profile sweeps the core clock at one memory clock: keep one memory clock's rows"
            )
        frame["mem_freq_mhz"] = mem
        source["mem_freq_mhz"] = cols["mem_freq"]
    for src, dest in _RATIOS.items():
        if src in raw.columns:
            frame[dest] = parse_column(raw, src, path, min_value=0.0, allow_nan=True)
            source[dest] = src
    fmt = FORMAT if cols["freq"] == "core_frequency" else LEGACY_FORMAT
    meta = {"format": fmt, "sources": [path.name]}
    return build_profile(frame, path=path, source_columns=source, meta=meta)
