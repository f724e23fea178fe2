"""Real measurements bundled with opdvfs (licences permitting), for the demo and the tests.

``python -m opdvfs.datasets NAME`` prints a dataset's path; ``python -m opdvfs.datasets`` lists
them. Each dataset's folder holds a NOTICE.md with its origin, licence and citation.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["DATASETS", "dataset_path"]

#: name -> (path inside this package, one-line description)
DATASETS: dict[str, tuple[str, str]] = {
    "perseus-gpt3-175b-a100": (
        "perseus/gpt3-175b+a100_sxm_bf16.csv",
        "Perseus: GPT-3 175B stage fwd/bwd time+energy, A100-SXM4, 38 SM clocks",
    ),
    "perseus-gpt3-175b-a40": (
        "perseus/gpt3-175b+a40_bf16.csv",
        "Perseus: GPT-3 175B stage fwd/bwd time+energy, A40, 60 SM clocks",
    ),
    "perseus-bloom-a100": (
        "perseus/bloom+a100_sxm_bf16.csv",
        "Perseus: BLOOM 176B stage fwd/bwd time+energy, A100-SXM4, 38 SM clocks",
    ),
    "perseus-bloom-a40": (
        "perseus/bloom+a40_bf16.csv",
        "Perseus: BLOOM 176B stage fwd/bwd time+energy, A40, 60 SM clocks",
    ),
}


def dataset_path(name: str) -> Path:
    """Return the file path of bundled dataset ``name``.

    Raises
    ------
    KeyError
        If no dataset has that name.
    """
    if name not in DATASETS:
        raise KeyError(f"unknown dataset {name!r}; expected one of {', '.join(DATASETS)}")
    return Path(str(resources.files(__name__).joinpath(DATASETS[name][0])))
