"""Power-sensor samples beside a profile: read them, and make the energy counter's windows.

NVML (and Zeus, and ``opdvfs capture --profile``) read a GPU's power, temperature, SM clock and
cumulative energy counter every few tens of milliseconds. :func:`read_samples` reads such a log
(CSV or Parquet: ``t_s`` Unix seconds, ``power_w`` and/or ``energy_j``; ``temp_c``, ``freq_mhz``
optional), :func:`counter_windows` turns the reads into the windows the power attribution uses,
and :func:`run_clock_mhz` gives the clock the run went at.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from opdvfs.exceptions import ProfileFormatError, ValidationError
from opdvfs.profile import SAMPLE_COLUMNS

__all__ = ["counter_windows", "read_samples", "run_clock_mhz", "window_ms"]


def read_samples(path: str | Path) -> pd.DataFrame:
    """Read a sensor log (CSV or Parquet) into the profile's samples table.

    Raises
    ------
    ProfileFormatError
        If the file cannot be read, lacks ``t_s``, has neither ``power_w`` nor ``energy_j``,
        or a value breaks its column's type (the message names the file and the column).
    """
    path = Path(path)
    try:
        frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    except Exception as exc:
        raise ProfileFormatError(f"{path}: not a samples CSV or Parquet file ({exc})") from exc
    if "t_s" not in frame or not ({"power_w", "energy_j"} & set(frame.columns)):
        raise ProfileFormatError(
            f"{path}: a samples file needs t_s (Unix seconds) and power_w or energy_j; it has "
            f"{', '.join(map(str, frame.columns)) or 'no columns'}"
        )
    known = [c.name for c in SAMPLE_COLUMNS.columns]
    frame = frame[[c for c in frame.columns if c in known]]
    try:
        return SAMPLE_COLUMNS.validate(frame).sort_values("t_s", kind="stable")
    except ValidationError as exc:
        raise ProfileFormatError(f"{path}: {exc}") from exc


def counter_windows(samples: pd.DataFrame) -> pd.DataFrame:
    """Replace each sample's power by the energy counter's mean power since the previous one.

    NVML's power reading is a 1 s average on Ampere and newer (except GA100), too coarse to
    attribute operators with; the total-energy counter is exact, so its difference over each
    interval is that interval's energy (the window the attribution then uses). The counter need
    not change at every read: on an H200 it moved every 100 ms (median; 96-103 ms, 5th-95th
    percentile) under reads every ~24 ms, so per-read differences alternate between 0 W and
    four times the power. Such a counter's windows are its own updates: each sample is a read
    that saw a new value, timed half-way between it and the read before (the update happened
    between them), and its power is the energy since the previous update over that time. A
    counter that moved at every read keeps the reads' own times.
    """
    t = samples["t_s"].to_numpy(dtype=float)
    e = samples["energy_j"].to_numpy(dtype=float)
    if len(t) < 2 or not np.all(np.isfinite(e)) or np.any(np.diff(e) < 0):
        return samples  # no usable counter: keep the readings
    moved = np.flatnonzero(np.diff(e) > 0) + 1  # the first read showing each new value
    if len(moved) == len(t) - 1:
        power = np.diff(e) / np.maximum(np.diff(t), 1e-9)
        return samples.iloc[1:].assign(power_w=power).reset_index(drop=True)
    if len(moved) < 2:
        return samples.iloc[:0]  # not one whole update interval
    at = (t[moved - 1] + t[moved]) / 2
    power = np.diff(e[moved]) / np.maximum(np.diff(at), 1e-9)
    return samples.iloc[moved[1:]].assign(t_s=at[1:], power_w=power).reset_index(drop=True)


def run_clock_mhz(samples: pd.DataFrame) -> float | None:
    """Return the SM clock a sampled run ran at (MHz): the median of the samples' clocks.

    Not the clock read before the run: an idle GPU sits at its lowest clocks until work
    arrives (an H200 read 345 MHz before a training run that then ran at 1980 MHz).
    """
    clocks = samples["freq_mhz"].to_numpy(dtype=float) if len(samples) else np.empty(0)
    clocks = clocks[np.isfinite(clocks)]
    return float(np.median(clocks)) if clocks.size else None


def window_ms(samples: pd.DataFrame, default_ms: float) -> float:
    """Return the length (ms) of :func:`counter_windows`'s windows: their median spacing."""
    t = samples["t_s"].to_numpy(dtype=float)
    return float(np.median(np.diff(t))) * 1e3 if len(t) >= 2 else default_ms
