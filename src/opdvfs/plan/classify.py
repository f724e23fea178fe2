"""Bottleneck classification: which operators want the high clock (paper §6.3, Fig. 12, Table 1).

From pipeline ratios (Ascend CANN profiles): ``sum < 1`` -> no-pipeline bound; else
``max < 0.8`` -> latency bound; else the unit with the largest ratio: a load/store (uncore) unit
-> uncore bound, any core unit -> core bound. Core- and latency-bound operators are
frequency-sensitive: high-frequency candidates (HFC); uncore-bound, communication, host/AI-CPU and
no-pipeline-bound operators are low-frequency candidates (LFC). The paper does not place
no-pipeline bound in Table 1; it has free time during execution, so it goes with the LFC here.

Without ratios (GPUs), the fitted time model decides: the sensitivity
``s = -d ln T / d ln f`` between the lowest and highest clock is 1 for a compute-bound op and 0
for a memory-bound one; ``s >= threshold`` -> HFC.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from opdvfs.exceptions import ValidationError

__all__ = ["HIGH", "LOW", "classify_by_ratios", "classify_by_sensitivity", "sensitivity"]

#: Stage/op classes: low- and high-frequency candidates.
LOW, HIGH = 0, 1

#: Ratio columns of load/store units between L2/HBM and the core (the uncore side, paper §4.1).
_UNCORE_UNITS = ("mte2", "mte3")
_OFF_CORE_TASKS = ("AI_CPU", "COMMUNICATION", "HCCL")


def sensitivity(
    time_lo_us: np.ndarray, time_hi_us: np.ndarray, f_lo: float, f_hi: float
) -> np.ndarray:
    """``-d ln T / d ln f`` between two clocks, per op (1: time ~ 1/f; 0: flat)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(time_lo_us / time_hi_us) / np.log(f_hi / f_lo)


def classify_by_sensitivity(
    s: np.ndarray, streams: np.ndarray, *, threshold: float = 0.5
) -> np.ndarray:
    """HIGH where the op's time follows the clock (``s >= threshold``) on the compute stream."""
    on_compute = np.asarray(streams) == "compute"
    return np.where(on_compute & (np.nan_to_num(s) >= threshold), HIGH, LOW)


def classify_by_ratios(ops: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Paper Fig. 12 on one row per op with ``ratio_*`` columns.

    Returns
    -------
    classes : ndarray of {LOW, HIGH}
    bound : ndarray of str
        ``no-pipeline``, ``latency``, ``uncore:<unit>``, ``core:<unit>`` or ``off-core``.

    Raises
    ------
    ValidationError
        If ``ops`` has no ``ratio_*`` column.
    """
    cols = [c for c in ops.columns if c.startswith("ratio_")]
    if not cols:
        raise ValidationError(
            "no ratio_* columns: classify by sensitivity instead", field="ratio_*"
        )
    ratios = ops[cols].to_numpy(dtype=float)
    units = np.array([c.removeprefix("ratio_").split("_")[-1] for c in cols])
    filled = np.nan_to_num(ratios)
    total, top = filled.sum(axis=1), filled.max(axis=1)
    # each op's label as an index into the few labels there are (text per op took ~0.5 s at 1M)
    labels = [
        "no-pipeline",
        "latency",
        *[("uncore:" if u in _UNCORE_UNITS else "core:") + u for u in units.tolist()],
        "off-core",
    ]
    label = np.where(total < 1.0, 0, np.where(top < 0.8, 1, 2 + filled.argmax(axis=1)))
    off_core = (
        (ops["stream"].to_numpy() != "compute") if "stream" in ops else np.zeros(len(ops), bool)
    )
    if "task_type" in ops:
        off_core |= ops["task_type"].isin(_OFF_CORE_TASKS).to_numpy()
    off_core |= np.isnan(ratios).all(axis=1)
    label[off_core] = len(labels) - 1
    high = np.array([t.startswith("core:") or t == "latency" for t in labels])[label]
    return np.where(high, HIGH, LOW), np.array(labels, dtype=object)[label]
