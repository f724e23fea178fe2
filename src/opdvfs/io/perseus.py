"""Perseus (SOSP'24) stage profiles: ``stage,instruction,frequency,time,energy``.

Each row is one pipeline stage's forward or backward computation of a microbatch at a locked SM
clock: ``time`` in seconds, ``energy`` in joules (NVML). One (stage, instruction) pair is one
operator of the profile; its mean power is ``energy / time``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from opdvfs.io._common import Header, build_profile, parse_column, read_csv_text, resolve_columns
from opdvfs.profile import Profile

FORMAT = "perseus"
_ALIASES = {
    "stage": ("stage",),
    "instruction": ("instruction",),
    "frequency": ("frequency",),
    "time": ("time",),
    "energy": ("energy",),
}
_INSTRUCTION_ORDER = {"forward": 0, "backward": 1}
#: The columns that identify a Perseus stage profile.
HEADER: Header = tuple(_ALIASES.values())


def read(path: Path, *, freq_mhz: float | None = None) -> Profile:
    """Read a Perseus stage-profile CSV; ``freq_mhz`` is unused (the file has its clocks)."""
    raw = read_csv_text(path)
    cols = resolve_columns(path, list(raw.columns), _ALIASES, required=tuple(_ALIASES))
    stage = parse_column(raw, cols["stage"], path, kind="int", min_value=0)
    lowered = raw.assign(**{cols["instruction"]: raw[cols["instruction"]].str.strip().str.lower()})
    instruction = parse_column(
        lowered, cols["instruction"], path, kind="str", choices=tuple(_INSTRUCTION_ORDER)
    )
    time_s = parse_column(raw, cols["time"], path, min_value=0.0, exclusive=True)
    energy_j = parse_column(raw, cols["energy"], path, min_value=0.0)
    freq = parse_column(raw, cols["frequency"], path, min_value=0.0, exclusive=True)
    # Operators in pipeline order: stage 0 forward, stage 0 backward, stage 1 forward, ...
    key = stage.to_numpy() * 2 + instruction.map(_INSTRUCTION_ORDER).to_numpy()
    _, op = np.unique(key, return_inverse=True)
    frame = pd.DataFrame(
        {
            "op": op,
            "name": "stage" + stage.astype(str) + "." + instruction,
            "type": instruction,
            "freq_mhz": freq,
            "time_us": time_s * 1e6,
            "chip_power_w": energy_j / time_s,
        },
        index=raw.index,
    )
    meta = {"format": FORMAT, "sources": [path.name]}
    source = {
        "op": cols["stage"],
        "name": cols["instruction"],
        "freq_mhz": cols["frequency"],
        "time_us": cols["time"],
        "chip_power_w": cols["energy"],
    }
    return build_profile(frame, path=path, source_columns=source, meta=meta)
