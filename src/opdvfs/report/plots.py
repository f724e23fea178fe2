"""The report's figures (matplotlib, Agg): clock timeline, savings vs target, model error CDF.

Each function draws one figure and writes it atomically as PNG.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from opdvfs._files import atomic_path
from opdvfs.exceptions import MissingExtraError
from opdvfs.experiments.bench import Outcome

try:
    import matplotlib
except ImportError as e:  # an optional extra: the figures' callers say what is skipped
    raise MissingExtraError("matplotlib", "plot", "drawing figures") from e

matplotlib.use("Agg")
import matplotlib.pyplot as plt

__all__ = ["plot_error_cdf", "plot_paper_comparison", "plot_savings", "plot_timeline"]


def _save(fig: plt.Figure, path: str | os.PathLike[str]) -> None:
    # close the figure even when the path is refused, or pyplot keeps it for the process's life
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=110, format="png")
    finally:
        plt.close(fig)


def plot_timeline(
    timeline: dict[str, np.ndarray], path: str | os.PathLike[str], title: str
) -> None:
    """Clock over one iteration, above a band of operator classes (sensitive / not)."""
    start, end = timeline["start_s"], timeline["end_s"]
    fig, (ax_f, ax_c) = plt.subplots(
        2, 1, figsize=(10, 3.6), sharex=True, height_ratios=(4, 1), constrained_layout=True
    )
    ax_f.step(start, timeline["freq_mhz"], where="post", lw=0.8, color="tab:blue")
    ax_f.set(ylabel="core clock (MHz)", title=title)
    ax_f.grid(alpha=0.3)
    for high, color, name in ((True, "tab:red", "clock-sensitive"), (False, "tab:green", "not")):
        sel = timeline["high"] == high
        spans = list(zip(start[sel], (end - start)[sel], strict=True))
        ax_c.broken_barh(spans, (0, 1), facecolors=color, label=name, linewidth=0)
    ax_c.set(yticks=[], xlabel="time in the iteration (s)")
    ax_c.legend(loc="upper right", fontsize=7, ncols=2)
    _save(fig, path)


def plot_savings(
    sweep: Sequence[Outcome], static: Sequence[Outcome], path: str | os.PathLike[str]
) -> None:
    """Measured energy saved vs measured slowdown: per-operator plans and static clocks."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), constrained_layout=True)
    for ax, rail in zip(axes, ("core", "chip"), strict=True):
        key = f"{rail}_energy_saving_pct"
        ax.plot(
            [o.perf_loss_pct for o in sweep],
            [getattr(o, key) for o in sweep],
            "o-",
            label="per-operator plan (targets)",
        )
        ax.plot(
            [o.perf_loss_pct for o in static],
            [getattr(o, key) for o in static],
            "s--",
            color="tab:gray",
            label="static clocks",
        )
        ax.plot(
            [o.target_pct for o in sweep],
            [getattr(o, key) for o in sweep],
            "x",
            color="tab:red",
            label="(at its target)",
        )
        ax.axhline(0, color="black", lw=0.5)
        ax.set(xlabel="measured slowdown (%)", ylabel=f"{rail} energy saved (%)", title=rail)
        ax.set_xlim(-0.5, max(12.0, max(o.target_pct for o in sweep) + 1))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    _save(fig, path)


def plot_error_cdf(errors: dict[str, np.ndarray], path: str | os.PathLike[str], title: str) -> None:
    """Cumulative share of (op, clock) points within each |error| (held-out clocks)."""
    fig, ax = plt.subplots(figsize=(5, 3.4), constrained_layout=True)
    for name, err in errors.items():
        if err.size == 0:
            continue
        x = np.sort(err)
        ax.plot(x, np.arange(1, x.size + 1) / x.size * 100, label=f"{name} (mean {x.mean():.2f}%)")
    for mark in (5, 10):
        ax.axvline(mark, color="gray", lw=0.5, ls=":")
    ax.set(xlabel="|prediction error| (%)", ylabel="share of points (%)", title=title)
    ax.set_xscale("symlog", linthresh=1.0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)


def plot_paper_comparison(
    rows: Sequence[Outcome], paper: Sequence[dict[str, float] | None], path: str | os.PathLike[str]
) -> None:
    """Power saved per Table 3 row, measured on the simulator beside the paper's figure."""
    labels = [f"{o.workload}\n{o.target_pct:g}%" for o in rows]
    x = np.arange(len(rows))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), constrained_layout=True, sharey=False)
    for ax, (rail, key) in zip(axes, (("core", "core_power"), ("chip", "soc_power")), strict=True):
        ours = [getattr(o, f"{rail}_power_saving_pct") for o in rows]
        theirs = [p[key] if p else np.nan for p in paper]
        energy = [getattr(o, f"{rail}_energy_saving_pct") for o in rows]
        ax.bar(x - 0.27, ours, 0.27, label="opdvfs, power (simulated)")
        ax.bar(x, energy, 0.27, label="opdvfs, energy (simulated)")
        ax.bar(x + 0.27, theirs, 0.27, label="paper, power (910B)", color="tab:gray")
        ax.axhline(0, color="black", lw=0.5)
        ax.set_xticks(x, labels, fontsize=8)
        ax.set(ylabel=f"{rail} saved (%)", title=f"{'AICore' if rail == 'core' else 'SoC'} rail")
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=7)
    _save(fig, path)
