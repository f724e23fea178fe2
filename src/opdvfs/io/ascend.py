"""Huawei Ascend profiles: msprof ``op_summary*.csv`` and torch_npu ``kernel_details.csv``.

Both are one row per device task, with header spellings that differ across CANN versions; the
aliases below cover those seen in the CANN and torch_npu docs. Neither file records the AI Core
clock, so the caller passes it (``--freq-mhz``). Pipeline-utilisation columns (``aic_mac_ratio``,
``aiv_vec_ratio``, ``mte2_ratio`` ...) are kept as ``ratio_<unit>`` for the paper's bottleneck
classification (Fig. 12), and ``Task Type`` / ``Accelerator Core`` as ``task_type``.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from opdvfs.exceptions import ProfileFormatError
from opdvfs.io._common import Header, build_profile, parse_column, read_csv_text, resolve_columns
from opdvfs.profile import Profile

FORMAT = "ascend"

_ALIASES = {
    "name": ("Op Name", "Name", "OP Name"),
    "type": ("OP Type", "Type", "Op Type"),
    "task_type": ("Task Type", "Accelerator Core"),
    "duration": ("Task Duration(us)", "Duration(us)", "Task Duration"),
    "start": ("Task Start Time(us)", "Start Time(us)", "Task Start Time"),
    "stream": ("Stream ID",),
    "device": ("Device_id", "Device ID"),
    "iteration": ("Step Id", "Step ID", "Iteration ID"),
}
_RATIO = re.compile(r"^(?P<unit>[a-z0-9_]+)_ratio$")
#: Values the profiler writes where a metric does not apply (task_time=l0, long ops).
_NOT_APPLICABLE = ("N/A", "NA", "-")
_COMM_TASKS = ("COMMUNICATION", "HCCL")


#: The columns that identify an op_summary or kernel_details table (any spelling of each).
HEADER: Header = (_ALIASES["name"], _ALIASES["duration"])


def read(path: Path, *, freq_mhz: float | None = None) -> Profile:
    """Read an Ascend op_summary or kernel_details CSV measured at AI Core clock ``freq_mhz``."""
    if freq_mhz is None:
        raise ProfileFormatError(
            f"{path}: Ascend profiles do not record the AI Core clock; pass --freq-mhz "
            "(one clock per file)"
        )
    raw = read_csv_text(path)
    raw = raw.replace(dict.fromkeys(_NOT_APPLICABLE, ""))
    cols = resolve_columns(path, list(raw.columns), _ALIASES, required=("name", "duration"))
    if "device" in cols:
        devices = raw[cols["device"]].str.strip().unique()
        if len(devices) > 1:
            raise ProfileFormatError(
                f"{path}: column {cols['device']!r}: holds {len(devices)} devices "
                f"({', '.join(sorted(devices))}); expected one device per file"
            )
    name = parse_column(raw, cols["name"], path, kind="str")
    frame = pd.DataFrame(
        {
            "name": name,
            "type": raw[cols["type"]].str.strip() if "type" in cols else name,
            "freq_mhz": float(freq_mhz),
            "time_us": parse_column(raw, cols["duration"], path, min_value=0.0),
        },
        index=raw.index,
    )
    frame["type"] = frame["type"].where(frame["type"] != "", frame["name"])
    source = {"name": cols["name"], "time_us": cols["duration"], "type": cols.get("type", "")}
    # Step ids count from wherever the profiler schedule started; iterations count from 0.
    frame["iteration"] = (
        pd.factorize(parse_column(raw, cols["iteration"], path, kind="int"), sort=True)[0]
        if "iteration" in cols
        else 0
    )
    start = None
    if "start" in cols:
        start = parse_column(raw, cols["start"], path, allow_nan=True)
        source["start_us"] = cols["start"]
    order = start if start is not None and not start.isna().any() else None
    # Position within the iteration: launch order by start time where every row has one.
    frame["_order"] = order.to_numpy() if order is not None else np.arange(len(frame))
    frame["op"] = frame.groupby("iteration")["_order"].rank(method="first").astype(int) - 1
    if order is not None:
        first = frame.groupby("iteration")["_order"].transform("min")
        frame["start_us"] = frame["_order"] - first
    frame = frame.drop(columns="_order")
    if "task_type" in cols:
        task = raw[cols["task_type"]].str.strip().str.upper()
        frame["task_type"] = task.where(task != "", "UNKNOWN")
        frame["stream"] = np.where(task.isin(_COMM_TASKS), "comm", "compute")
        source["task_type"] = cols["task_type"]
    for column in raw.columns:
        match = _RATIO.match(column.strip().lower())
        if match:
            dest = f"ratio_{match['unit']}"
            frame[dest] = parse_column(raw, column, path, min_value=0.0, allow_nan=True)
            source[dest] = column
    meta = {"format": FORMAT, "sources": [path.name]}
    return build_profile(frame, path=path, source_columns=source, meta=meta)
