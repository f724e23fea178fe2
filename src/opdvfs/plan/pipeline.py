"""One pipeline stage's instruction chain (1F1B) from a per-instruction stage profile.

Pipeline-parallel profiles such as Perseus's (:mod:`opdvfs.io.perseus`) measure each stage's
forward and backward computation of one microbatch at every clock, as operators named
``stage{s}.forward`` and ``stage{s}.backward``. A stage runs them once per microbatch, in the
1F1B order (Narayanan et al., PipeDream-Flush, SC'21): ``n_stages - s - 1`` warm-up forwards,
then alternating one forward and one backward, then the remaining backwards. On one stage the
chain's time and energy are sums, so the order does not change the optimum; it fixes which
instruction a clock switch follows.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from opdvfs.exceptions import ValidationError
from opdvfs.profile import Profile

__all__ = ["one_f_one_b", "stage_chain"]

_STAGE_OP = re.compile(r"^stage(\d+)\.(forward|backward)$")


def one_f_one_b(stage: int, n_stages: int, n_microbatches: int) -> list[str]:
    """Return stage ``stage``'s instructions (``forward``/``backward``) in 1F1B order.

    Parameters
    ----------
    stage
        Pipeline stage, 0-based.
    n_stages
        Pipeline stages.
    n_microbatches
        Microbatches per iteration.
    """
    warmup = min(n_stages - stage - 1, n_microbatches)
    steady = n_microbatches - warmup
    return (
        ["forward"] * warmup
        + ["forward", "backward"] * steady
        + ["backward"] * (n_microbatches - steady)
    )


def stage_chain(profile: Profile, stage: int, n_microbatches: int = 8) -> Profile:
    """Return the profile of stage ``stage``'s 1F1B chain: one op per instruction and microbatch.

    Every op of the chain carries the measured rows (every clock and iteration) of its
    instruction; ops are named ``forward{m}`` / ``backward{m}`` for microbatch ``m``.

    Parameters
    ----------
    profile
        A stage profile whose ops are named ``stage{s}.forward`` / ``stage{s}.backward``.
    stage
        The pipeline stage, 0-based.
    n_microbatches
        Microbatches per iteration (the chain has twice as many instructions).

    Raises
    ------
    ValidationError
        If the profile holds no op of that stage.
    """
    rows = profile.ops
    parsed = rows["name"].str.extract(_STAGE_OP)
    if parsed[0].isna().all():
        raise ValidationError(
            "no op named stage<s>.forward / stage<s>.backward: not a stage profile", field="name"
        )
    n_stages = int(parsed[0].dropna().astype(int).max()) + 1
    mine = rows[parsed[0].astype(float).to_numpy() == stage]
    if mine.empty:
        raise ValidationError(
            f"stage {stage} is not in the profile (stages 0-{n_stages - 1})", field="stage"
        )
    order = one_f_one_b(stage, n_stages, n_microbatches)
    kinds = np.asarray(order)
    # microbatch index of each instruction: its rank among the instructions of its kind
    micro = np.zeros(len(kinds), dtype=int)
    for kind in ("forward", "backward"):
        micro[kinds == kind] = np.arange(int((kinds == kind).sum()))
    chain = pd.DataFrame(
        {
            "op": np.arange(len(kinds)),
            "name": [f"{k}{m}" for k, m in zip(kinds, micro, strict=True)],
            "instruction": kinds,
        }
    )
    measured = mine.drop(columns=["op", "name"]).assign(
        instruction=mine["name"].str.rsplit(".", n=1).str[-1].to_numpy()
    )
    table = chain.merge(measured, on="instruction").drop(columns="instruction")
    meta = {**profile.meta, "workload": f"stage {stage} of {n_stages}, 1F1B x{n_microbatches}"}
    return Profile(table, meta=meta)
