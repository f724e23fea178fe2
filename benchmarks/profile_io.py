"""Speed of building, validating, writing and reading a large profile (issue #2: 100k rows).

Prints a table of seconds per step with the ratio against the plain pandas/pyarrow work the same
step cannot avoid (building the frame; a bare Parquet write/read), measured in the same run.

    .venv/bin/python benchmarks/profile_io.py [--rows 100000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from opdvfs import Profile
from opdvfs.io import read_profile


def timed(fn, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    args = parser.parse_args()
    n_freqs = 4
    n_ops = args.rows // n_freqs
    rng = np.random.default_rng(0)
    freqs = np.repeat([1000.0, 1300.0, 1500.0, 1800.0], n_ops)
    op = np.tile(np.arange(n_ops), n_freqs)
    frame = pd.DataFrame(
        {
            "op": op,
            "name": np.tile(np.array([f"op{i % 97}" for i in range(n_ops)], dtype=object), n_freqs)
            + "_"
            + op.astype(str),
            "freq_mhz": freqs,
            "time_us": rng.uniform(5, 5000, len(op)) * 1800 / freqs,
            "chip_power_w": rng.uniform(150, 300, len(op)),
            "ratio_mte2": rng.uniform(0, 1, len(op)),
        }
    )
    with tempfile.TemporaryDirectory() as tmp:
        parquet = Path(tmp) / "p.parquet"
        bare = Path(tmp) / "bare.parquet"
        csv = Path(tmp) / "p.csv"
        frame.to_csv(csv, index=False)
        profile = Profile(frame)
        rows = [
            (
                "validate (Profile(frame))",
                timed(lambda: Profile(frame)),
                timed(lambda: frame.sort_values(["freq_mhz", "op"])),
            ),
            (
                "write Parquet",
                timed(lambda: profile.write(parquet)),
                timed(lambda: frame.to_parquet(bare, index=False)),
            ),
            (
                "read Parquet + validate",
                timed(lambda: Profile.read(parquet)),
                timed(lambda: pd.read_parquet(bare)),
            ),
            (
                "import generic CSV",
                timed(lambda: read_profile(csv), repeat=2),
                timed(lambda: pd.read_csv(csv), repeat=2),
            ),
        ]
    print(f"profile of {len(frame)} rows ({n_ops} ops x {n_freqs} clocks)")
    print(f"{'step':28s} {'opdvfs s':>10s} {'baseline s':>11s} {'ratio':>7s}  baseline")
    names = [
        "DataFrame.sort_values (the sort it does)",
        "DataFrame.to_parquet",
        "pandas.read_parquet",
        "pandas.read_csv",
    ]
    for (step, ours, base), name in zip(rows, names, strict=True):
        print(f"{step:28s} {ours:10.3f} {base:11.3f} {ours / base:7.1f}  {name}")


if __name__ == "__main__":
    main()
