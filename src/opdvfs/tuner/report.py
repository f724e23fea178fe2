"""What ``opdvfs tune`` writes into ``--out DIR``, and its summary lines.

:func:`write_tune` writes, each atomically (a temporary file in the folder, then a rename):
the swept profile (``profile.parquet``), the fitted models (``models.json``), the chosen
schedule (``schedule.json``), the JSON result (``tune.json``: every iteration's phase, time
and energy, every round's measured intervals), a markdown report (``report.md``) and its two
figures (matplotlib, Agg): the clock over one iteration run under the schedule
(``clock.png``), and the mean time and energy per iteration in each phase (``phases.png``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from opdvfs._files import atomic_path, signals_raise, write_text_atomic
from opdvfs.tuner.result import Interval, TuneResult

__all__ = ["summary_lines", "write_tune"]


def _pct(value: float | None, sign: str = "+") -> str:
    return "?" if value is None or value != value else f"{value:{sign}.2%}"


def _ci(interval: Interval | None, sign: str = "+") -> str:
    if interval is None or interval.n == 0:
        return "not measured"
    mean, low, high = (_pct(v, sign) for v in (interval.mean, interval.low, interval.high))
    if interval.n < 2:
        return f"{mean} (1 pair: no interval)"
    return f"{mean} [{low}, {high}] ({interval.confidence:.0%} t-interval, {interval.n} pairs)"


def _bracket(interval: Interval, sign: str = "+") -> str:
    """``mean [low, high]``, or the mean alone where there is no interval."""
    if interval.n < 2 or not (interval.low == interval.low and interval.high == interval.high):
        return f"{_pct(interval.mean, sign)} ({interval.n} pair: no interval)"
    return f"{_pct(interval.mean, sign)} [{_pct(interval.low, sign)}, {_pct(interval.high, sign)}]"


def _blocks(r: TuneResult) -> str:
    """``3 pairs of 10-iteration blocks`` (counted iterations), as far as the result knows."""
    pairs = r.best.pairs if r.best is not None else r.pairs
    what = f"{pairs} pair{'s' if pairs != 1 else ''}"
    if r.block is not None:
        what += f" of blocks of {r.block - 1} counted iteration{'s' if r.block != 2 else ''}"
    return what


def _applied_line(r: TuneResult) -> str:
    """Return the final line: the round's two intervals; a saving claimed only if resolved."""
    best = r.best
    assert best is not None
    slow = best.slowdown
    if not r.met:
        within = f"NOT within the {r.target:.2%} target"
    elif slow.n >= 2 and slow.high == slow.high and slow.high > r.target:
        within = f"mean within the {r.target:.2%} target, its interval reaching above it"
    else:
        within = f"within the {r.target:.2%} target"
    line = (
        f"applied round {(r.best_round or 0) + 1} for the rest of the run: measured slowdown "
        f"{_bracket(slow)} ({within}), "
    )
    saving = best.saving
    resolved = r.saving_resolved
    if saving is None or saving.n == 0:
        line += "energy not measured"
    elif resolved:  # (only a round whose mean saving is above 0 applies: above 0 throughout)
        line += f"energy saved {_bracket(saving, '')} vs the top clock"
    else:
        line += (
            f"energy saved {_bracket(saving, '')}: not distinguishable from no saving at "
            f"{_blocks(r)} (more --pairs or a longer --block narrow the interval)"
        )
    if r.chosen_by is not None and len(r.rounds) > 1:
        line += f"; chosen by {r.chosen_by}"
    return line


def summary_lines(result: TuneResult) -> list[str]:
    """Return the lines ``opdvfs tune`` prints: phases, each round, the choice.

    The final line gives the applied round's slowdown and saving with their intervals, and
    claims a saving only when its interval excludes 0 (:attr:`TuneResult.saving_resolved`).
    """
    r = result
    n = len(r.iterations)
    lines = []
    if r.cache_hit:
        then = ""
        cached = r.cached or {}
        if cached.get("slowdown") and cached.get("saving"):
            slow, save = Interval(**cached["slowdown"]), Interval(**cached["saving"])
            held = save.n >= 2 and save.low <= 0 <= save.high  # (nan compares False)
            then = (
                f" (when it was tuned: measured slowdown {_bracket(slow)}, energy saved "
                f"{_bracket(save, '')}"
                + (": not distinguishable from no saving" if held else "")
                + ")"
            )
        lines.append(
            f"started from the cache ({r.cache_key and r.cache_key[:12]}): the schedule applied "
            f"from iteration {r.count('warmup')}, no profiling or planning{then}; "
            f"re-measured in {r.count('switch', 'reference', 'tuned')} A/B iterations"
        )
    else:
        clocks = ", ".join(f"{f:g}" for f in r.clocks_mhz)
        lines.append(
            f"tuned on {r.actuator} in one run of {n} iterations: {r.count('warmup')} warm-up, "
            f"{r.profiling_iterations} profiling at {clocks} MHz, {r.planning_iterations} at the "
            f"top clock while planning ({r.plan_seconds:.2f} s), "
            f"{r.count('switch', 'reference', 'tuned')} A/B measuring, {r.count('steady')} "
            f"steady; profiling + planning {r.overhead_fraction:.1%} of the iterations"
        )
    if r.world_size > 1:
        lines.append(
            f"a job of {r.world_size} ranks: each iteration's time is the slowest rank's and its "
            "energy all ranks' together; "
            + (
                "every rank applies rank 0's plan (data-parallel)"
                if r.same_sequence is not False
                else "the ranks' operators differ: planned as data-parallel on rank 0's "
                "sequence, the ranks whose sequence differs stayed at the top clock"
            )
        )
    if r.rounds and r.block is not None:
        lines.append(
            f"A/B: {r.pairs} pairs of blocks of {r.block} iterations per round (the first of "
            f"each block discarded): {r.block_by}"
        )
    for i, rnd in enumerate(r.rounds):
        dropped = rnd.dropped
        lines.append(
            f"round {i + 1}: planned at {rnd.budget:.2%} ({rnd.stages} stages; predicted "
            f"{_pct(rnd.predicted_slowdown)} time, {_pct(-(rnd.predicted_saving or 0))} energy); "
            f"measured slowdown {_ci(rnd.slowdown)}, energy saved {_ci(rnd.saving, '')}"
            + (
                f"; {dropped} tuned iteration{'s' if dropped != 1 else ''} dropped (the "
                "executor fell back to the top clock)"
                if dropped
                else ""
            )
        )
    best = r.best
    if best is not None and r.schedule is not None:
        lines.append(_applied_line(r))
    elif r.schedule is None and r.rounds:
        lines.append("no round saved energy: the run went on at the top clock")
    if r.error is not None and r.schedule is not None:
        lines.append(f"not done: {r.error}")
    steady = r.phase_means().get("steady")
    if steady and not r.rounds:
        energy = steady["energy_j"]
        lines.append(
            f"steady: {steady['iterations']} iterations, {steady['time_s']:.6g} s"
            + (f" and {energy:.6g} J" if energy is not None else "")
            + " each (the device's clock and energy counter)"
        )
    return lines


@contextmanager
def _figure(path: Path) -> Iterator[Any]:
    """Yield a figure; save it to ``path`` (atomically) when the block ends without an error.

    Drawn on matplotlib's Agg canvas directly, without pyplot: the user's process keeps its
    own backend (``opdvfs.tune`` runs inside it).
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 3.4), constrained_layout=True)
    yield fig
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")


def _plot_clock(result: TuneResult, path: Path) -> bool:
    """Clock over one iteration run under the schedule (measured), else the plan per operator."""
    if result.timeline is None and result.schedule is None:
        return False  # (a return inside the figure's block would still save it, empty)
    with _figure(path) as fig:
        ax = fig.add_subplot()
        if result.timeline is not None:
            t = result.timeline
            ends = [s + d for s, d in zip(t["start_s"], t["time_s"], strict=True)]
            xs = [v * 1e3 for pair in zip(t["start_s"], ends, strict=True) for v in pair]
            ys = [f for f in t["freq_mhz"] for _ in (0, 1)]
            ax.plot(xs, ys, lw=1.0, color="tab:blue")
            ax.set_xlabel("time in the iteration (ms, device clock)")
            ax.set_title("core clock over one iteration under the schedule (measured)")
        elif result.schedule is not None:
            stages = result.schedule.stages
            xs = [v for s in stages for v in (s.first_op, s.last_op + 1)]
            ys = [s.freq_mhz for s in stages for _ in (0, 1)]
            ax.plot(xs, ys, lw=1.0, color="tab:blue")
            ax.set_xlabel("operator in the iteration")
            ax.set_title("core clock over one iteration (the schedule's stages)")
        ax.set_ylabel("clock (MHz)")
    return True


def _plot_phases(result: TuneResult, path: Path) -> bool:
    """Mean time and energy per iteration in each phase."""
    means = result.phase_means()
    if not means:
        return False
    names = list(means)
    with _figure(path) as fig:
        ax_t, ax_e = fig.subplots(1, 2)
        ax_t.bar(names, [means[n]["time_s"] or 0.0 for n in names], color="tab:gray")
        ax_t.set_ylabel("time per iteration (s)")
        ax_e.bar(names, [means[n]["energy_j"] or 0.0 for n in names], color="tab:orange")
        ax_e.set_ylabel("energy per iteration (J)")
        for ax in (ax_t, ax_e):
            ax.tick_params(axis="x", rotation=45, labelsize=8)
        fig.suptitle("per phase of the tuning run")
    return True


def _markdown(result: TuneResult, figures: list[str]) -> str:
    r = result
    lines = [
        "# opdvfs tune",
        "",
        f"Target slowdown {r.target:.2%} on `{r.actuator}`"
        + (f" ({r.device})" if r.device else "")
        + f"; {len(r.iterations)} iterations.",
        "",
        *[f"- {line}" for line in summary_lines(r)],
        "",
    ]
    if r.error:
        lines += [f"**Not done:** {r.error}", ""]
    lines += [
        "## Phases",
        "",
        "| phase | iterations | time per iteration (s) | energy per iteration (J) |",
        "|---|---:|---:|---:|",
    ]
    for phase, m in r.phase_means().items():
        energy = "" if m["energy_j"] is None else f"{m['energy_j']:.6g}"
        lines.append(f"| {phase} | {m['iterations']} | {m['time_s']:.6g} | {energy} |")
    if r.rounds:
        lines += [
            "",
            "## Rounds (A/B: tuned blocks against interleaved top-clock blocks, ABBA)",
            "",
            "| round | budget | stages | predicted time | measured slowdown (95% CI) | "
            "measured saving (95% CI) | pairs | dropped (fallback) | applied |",
            "|---:|---:|---:|---:|---|---|---:|---:|---|",
        ]
        for i, rnd in enumerate(r.rounds):
            applied = "yes" if i == r.best_round and r.schedule is not None else ""
            lines.append(
                f"| {i + 1} | {rnd.budget:.2%} | {rnd.stages} | {_pct(rnd.predicted_slowdown)} | "
                f"{_ci(rnd.slowdown)} | {_ci(rnd.saving, '')} | {rnd.pairs} | {rnd.dropped} | "
                f"{applied} |"
            )
        if r.chosen_by is not None:
            lines += ["", f"The applied round was chosen by {r.chosen_by}."]
    if figures:
        lines += ["", "## Figures", ""] + [f"![{f}]({f})" for f in figures]
    return "\n".join(lines) + "\n"


#: Every file :func:`write_tune` may write; those a run does not write are removed from ``out``.
TUNE_FILES = (
    "profile.parquet",
    "models.json",
    "schedule.json",
    "tune.json",
    "report.md",
    "clock.png",
    "phases.png",
)


def write_tune(result: TuneResult, out: str | os.PathLike[str]) -> list[str]:
    """Write the run's files into ``out`` (created); return the names written.

    Each file is whole or absent, whatever signal comes while they are written (the
    temporary file is removed on the way out); a file of :data:`TUNE_FILES` that an earlier
    run left in ``out`` and this run does not write (a ``schedule.json`` beside a
    ``tune.json`` that chose none) is removed. Other files in ``out`` are not touched.
    """
    with signals_raise():
        written = _write_tune(result, Path(out))
        for stale in set(TUNE_FILES) - set(written):
            (Path(out) / stale).unlink(missing_ok=True)
    return written


def _write_tune(result: TuneResult, folder: Path) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    if result.profile is not None:
        result.profile.write(folder / "profile.parquet")
        written.append("profile.parquet")
    if result.models is not None:
        result.models.write(folder / "models.json")
        written.append("models.json")
    if result.schedule is not None:
        result.schedule.write(folder / "schedule.json")
        written.append("schedule.json")
    write_text_atomic(folder / "tune.json", json.dumps(result.to_dict(), indent=1))
    written.append("tune.json")
    figures = [
        name
        for name, draw in (("clock.png", _plot_clock), ("phases.png", _plot_phases))
        if draw(result, folder / name)
    ]
    write_text_atomic(folder / "report.md", _markdown(result, figures))
    return [*written, "report.md", *figures]
