from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


def make_ops(n_ops: int = 4, freqs=(1000.0, 1800.0), iterations: int = 1, seed: int = 0):
    """A valid long profile table: compute-bound-ish times that fall with the clock."""
    rng = np.random.default_rng(seed)
    work = rng.uniform(50, 500, n_ops)
    rows = []
    for it in range(iterations):
        for f in freqs:
            for op in range(n_ops):
                rows.append(
                    {
                        "iteration": it,
                        "op": op,
                        "name": f"op{op}",
                        "freq_mhz": f,
                        "time_us": work[op] * 1800.0 / f,
                    }
                )
    return pd.DataFrame(rows)
