"""What ``opdvfs tune`` writes into ``--out DIR``, and its summary lines.

:func:`write_tune` writes, each atomically (a temporary file in the folder, then a rename):
the swept profile (``profile.parquet``), the fitted models (``models.json``), the chosen
schedule (``schedule.json``), the JSON result (``tune.json``: the opdvfs version and the
command, every iteration's phase, time and energy, every round's measured intervals, the whole
run against the top clock), a markdown report (``report.md``) that leads with the headline
(:func:`headline_lines`), its figures (matplotlib, Agg): the whole run over time, clock, power
and phase (``run.png``), the clock over one iteration run under the schedule (``clock.png``),
the mean time and energy per iteration in each phase (``phases.png``), each clock axis from the
device's lowest clock to its top one, the top marked; and a Chrome/Perfetto trace of the run
(``trace.json``: the phases as slices, clock and power as counter tracks, on the device's
clock), to open in https://ui.perfetto.dev beside torch.profiler's trace.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from opdvfs._files import atomic_path, signals_raise, write_text_atomic
from opdvfs.exceptions import MissingExtraError
from opdvfs.profile import samples_path
from opdvfs.tuner.result import Interval, TuneResult, TuneRound

__all__ = ["headline_lines", "headline_metrics", "round_line", "summary_lines", "write_tune"]


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


def round_line(index: int, rnd: TuneRound) -> str:
    """Return one round's line: what was planned, predicted and measured (A/B intervals)."""
    if rnd.static_mhz is not None:
        what = f"the best static clock, {rnd.static_mhz:g} MHz (planned at {rnd.budget:.2%}"
    else:
        what = f"planned at {rnd.budget:.2%} ({rnd.stages} stage{'s' if rnd.stages != 1 else ''}"
    dropped = rnd.dropped
    return (
        f"round {index + 1}: {what}; predicted "
        f"{_pct(rnd.predicted_slowdown)} time, {_pct(-(rnd.predicted_saving or 0))} energy); "
        f"measured slowdown {_ci(rnd.slowdown)}, energy saved {_ci(rnd.saving, '')}"
        + (
            f"; {dropped} tuned iteration{'s' if dropped != 1 else ''} dropped (the "
            "executor fell back to the top clock)"
            if dropped
            else ""
        )
    )


def _steady_line(r: TuneResult) -> str:
    best = r.best
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
        return (
            f"started from the cache ({r.cache_key and r.cache_key[:12]}): the schedule applied "
            f"from iteration {r.count('warmup')}, no profiling or planning{then}; "
            f"re-measured in {r.count('switch', 'reference', 'tuned')} A/B iterations"
        )
    if best is None:
        return "steady state: not reached (no round was measured)"
    if r.schedule is None:
        return "steady state: the top clock (no round saved energy)"
    what = (
        f"the static clock {best.static_mhz:g} MHz"
        if best.static_mhz is not None
        else f"a per-operator plan of {best.stages} stages"
    )
    saving = (
        f"energy saved {_bracket(best.saving, '')}"
        if best.saving is not None and best.saving.n
        else "energy not measured"
    )
    doubt = "" if r.saving_resolved is not False else " (not told apart from no saving)"
    return (
        f"steady state (round {(r.best_round or 0) + 1}, {what}): {saving}{doubt}, slowdown "
        f"{_bracket(best.slowdown)} vs the top clock (95% t-intervals over the A/B pairs)"
    )


def _whole_run_lines(r: TuneResult) -> list[str]:
    run = r.whole_run()
    if run is None:
        return [
            "whole run: no top-clock reference iterations in this run to compare it with"
            + (" (started from the cache)" if r.cache_hit else "")
        ]
    top = f" ({r.range_mhz[1]:g} MHz)" if r.range_mhz else ""
    line = (
        f"whole run, tuning included ({run.iterations} iterations): time "
        f"{_pct(run.slowdown)} ({run.time_s:.4g} s vs {run.top_time_s:.4g} s), "
    )
    saving = run.saving
    if saving is None or run.energy_j is None:
        return [line + "energy not measured", "break-even: no energy counter"]
    line += (
        f"energy {_pct(-saving)} ({run.energy_j:.4g} J vs {run.top_energy_j:.4g} J) against the "
        f"same iterations at the top clock{top} (the mean of {run.reference_iterations} "
        "A/B reference iterations)"
    )
    cost = f"tuning cost {run.tuning_cost_j:.4g} J over the top clock"
    per = (
        f"{run.steady_saving_j:.4g} J saved per steady iteration"
        if run.steady_saving_j is not None
        else "no steady iterations"
    )
    if run.break_even is None:
        even = f"break-even: not reached and not in reach ({cost}; {per})"
    elif run.projected:
        even = (
            f"break-even: at iteration {run.break_even}, past this run's end (projected: {cost}, "
            f"{per}); a longer run pays for its tuning"
        )
    else:
        even = f"break-even: tuning paid for itself at iteration {run.break_even} ({cost}; {per})"
    return [line, even]


def _static_line(r: TuneResult) -> str:
    static = r.static
    if static is None:
        return (
            "best static clock: not measured (it is the last of --rounds, 2 or more; or the "
            "top clock was the best static clock the models found)"
            if not r.cache_hit
            else "best static clock: not measured (started from the cache)"
        )
    f = static.static_mhz
    line = (
        f"best static clock (nvidia-smi -lgc {f:g}), measured the same way: energy saved "
        f"{_bracket(static.saving, '') if static.saving is not None else 'not measured'}, "
        f"slowdown {_bracket(static.slowdown)}"
    )
    best = r.best
    ops = [x for x in r.rounds if x.static_mhz is None]
    if best is static and r.schedule is not None:
        if not ops:
            return line + ": the per-operator planner chose this one clock itself; applied"
        return line + ": it beat the per-operator plans and was applied"
    chosen = best if best is not None and best.static_mhz is None else None
    if chosen is None and ops:
        chosen = ops[0]
    if chosen is not None and chosen.saving is not None and static.saving is not None:
        gain = chosen.saving.mean - static.saving.mean
        line += (
            f"; per-operator switching (round {r.rounds.index(chosen) + 1}) saves "
            f"{gain * 100:+.2f} points more"
        )
    if static.slowdown.mean > r.target:
        line += f" (the static clock measured over the {r.target:.2%} target)"
    return line


def headline_lines(result: TuneResult) -> list[str]:
    """Return the four lines that lead tune's report: what a user needs to trust the result.

    The steady state's saving and slowdown (with their intervals); the whole run, tuning
    included, against the top clock (:meth:`TuneResult.whole_run`); the iteration at which
    tuning has paid for itself; and the best single static clock measured the same way.
    """
    return [_steady_line(result), *_whole_run_lines(result), _static_line(result)]


def headline_metrics(result: TuneResult, prefix: str = "opdvfs/") -> dict[str, float]:
    """Return the headline as numbers for a trainer's loggers (fractions, MHz, J, iterations).

    Only what was measured: the applied round's saving and slowdown (means and 95% interval
    ends), the whole run's against the top clock, the break-even iteration, the best static
    clock's. Names start with ``prefix``.
    """
    out: dict[str, float] = {}

    def put(name: str, value: float | None) -> None:
        if value is not None and value == value:  # (no nan)
            out[prefix + name] = float(value)

    def interval(name: str, iv: Interval | None) -> None:
        if iv is not None and iv.n:
            put(name, iv.mean)
            put(f"{name}_low", iv.low)
            put(f"{name}_high", iv.high)

    best = result.best
    if best is not None and result.schedule is not None:
        interval("steady_saving", best.saving)
        interval("steady_slowdown", best.slowdown)
        put("steady_static_mhz", best.static_mhz)
    run = result.whole_run()
    if run is not None:
        put("run_slowdown", run.slowdown)
        put("run_saving", run.saving)
        put("run_energy_j", run.energy_j)
        put("run_top_energy_j", run.top_energy_j)
        put("tuning_cost_j", run.tuning_cost_j)
        put("break_even_iteration", run.break_even)
    static = result.static
    if static is not None:
        put("static_mhz", static.static_mhz)
        interval("static_saving", static.saving)
        interval("static_slowdown", static.slowdown)
    return out


def summary_lines(result: TuneResult) -> list[str]:
    """Return the lines ``opdvfs tune`` prints: the headline, phases, each round, the choice.

    The first lines are :func:`headline_lines`. The final line gives the applied round's
    slowdown and saving with their intervals, and claims a saving only when its interval
    excludes 0 (:attr:`TuneResult.saving_resolved`).
    """
    r = result
    n = len(r.iterations)
    lines = headline_lines(r)
    if not r.cache_hit:  # (a cache hit's line leads the headline)
        clocks = ", ".join(f"{f:g}" for f in r.clocks_mhz)
        lines.append(
            f"tuned on {r.actuator} in one run of {n} iterations: {r.count('warmup')} warm-up, "
            f"{r.profiling_iterations} profiling at {clocks} MHz, {r.planning_iterations} at the "
            f"top clock while planning ({r.plan_seconds:.2f} s), "
            f"{r.count('switch', 'reference', 'tuned')} A/B measuring, {r.count('steady')} "
            f"steady; profiling + planning {r.overhead_fraction:.1%} of the iterations"
        )
    if r.added_clock is not None:
        lines.append(f"active profiling added a clock to the sweep: {r.added_clock}")
    if r.world_size > 1:
        lines.append(
            f"a job of {r.world_size} ranks: each iteration's time is the slowest rank's and its "
            "energy all ranks' together; "
            + (
                "every rank applies rank 0's plan (data-parallel)"
                if r.same_sequence is not False
                else f"the ranks run {r.pipeline_stages} pipeline stages (or data-parallel groups "
                "whose work differs): planned together on the job's dependency graph, each rank "
                "applies its own stage's plan"
            )
        )
    if r.rounds and r.block is not None:
        lines.append(
            f"A/B: {r.pairs} pairs of blocks of {r.block} iterations per round (the first of "
            f"each block discarded): {r.block_by}"
        )
    lines += [round_line(i, rnd) for i, rnd in enumerate(r.rounds)]
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
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise MissingExtraError("matplotlib", "plot", "drawing tune's figures") from e

    fig = Figure(figsize=(8, 3.4), constrained_layout=True)
    yield fig
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")


def _clock_axis(ax: Any, result: TuneResult, planned: list[float]) -> None:
    """Scale a clock axis from the device's lowest clock to its top one, the top marked."""
    if result.range_mhz is not None:
        low, top = result.range_mhz
    else:
        low, top = min(planned), max(planned)
    pad = 0.03 * (top - low or top)
    ax.set_ylim(low - pad, top + pad)
    ax.axhline(top, color="tab:red", lw=0.8, ls="--")
    # the top clock as a tick of its own, named: the reference every saving is against
    near = 0.06 * (top - low or top)
    ticks = [t for t in ax.get_yticks() if low - pad <= t <= top - near]
    ax.set_yticks([*ticks, top], [f"{t:g}" for t in ticks] + [f"top {top:g}"])
    ax.get_yticklabels()[-1].set_color("tab:red")
    ax.set_ylabel("clock (MHz)")


#: The colour of each phase in the run figure (the tuning phases warm, the steady one green).
PHASE_COLORS = {
    "warmup": "#d9d9d9",
    "settle": "#fdd0a2",
    "unsteady": "#fdae6b",
    "counted": "#fd8d3c",
    "planning": "#c6dbef",
    "switch": "#dadaeb",
    "reference": "#bcbddc",
    "tuned": "#9e9ac8",
    "steady": "#c7e9c0",
    "top": "#f0f0f0",
}


def _run_series(result: TuneResult) -> dict[str, Any]:
    """Per iteration: start and end (s, device clock), phase, clock band (MHz), power (W)."""
    import numpy as np

    its = result.iterations
    time_s = np.array([it.time_s for it in its], dtype=float)
    ends = np.cumsum(time_s)
    starts = ends - time_s
    energy = np.array([np.nan if it.energy_j is None else it.energy_j for it in its], dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        power = np.where(time_s > 0, energy / time_s, np.nan)
    top = result.range_mhz[1] if result.range_mhz else max(result.clocks_mhz)
    low = np.array([it.freq_mhz if it.freq_mhz is not None else top for it in its], dtype=float)
    high = low.copy()
    best = result.best
    for i, it in enumerate(its):
        # a plan's iteration runs at several clocks: its band is the plan's lowest to highest
        rnd = (
            result.rounds[it.round]
            if it.round is not None and it.round < len(result.rounds)
            else None
        )
        if it.phase == "steady" and best is not None and result.schedule is not None:
            rnd = best
        if it.phase in ("tuned", "steady") and rnd is not None and rnd.freqs_mhz:
            low[i], high[i] = min(rnd.freqs_mhz), max(rnd.freqs_mhz)
        elif it.phase == "steady" and result.schedule is not None:
            freqs = [st.freq_mhz for st in result.schedule.stages]
            low[i], high[i] = min(freqs), max(freqs)
    phases = [it.phase for it in its]
    return {"start": starts, "end": ends, "phase": phases, "low": low, "high": high, "power": power}


def _plot_run(result: TuneResult, path: Path) -> bool:
    """Draw the whole run over time: clock (a plan's band of clocks), power, phases shaded."""
    if not result.iterations:
        return False
    series = _run_series(result)
    starts, ends, phases = series["start"], series["end"], series["phase"]
    with _figure(path) as fig:
        fig.set_size_inches(10, 5)
        ax_f, ax_p = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
        seen: dict[str, Any] = {}
        a = 0
        for b in range(1, len(phases) + 1):  # one shaded span per run of equal phases
            if b == len(phases) or phases[b] != phases[a]:
                color = PHASE_COLORS.get(phases[a], "#ffffff")
                for ax in (ax_f, ax_p):
                    span = ax.axvspan(starts[a], ends[b - 1], color=color, lw=0)
                seen.setdefault(phases[a], span)
                a = b
        xs = [v for pair in zip(starts, ends, strict=True) for v in pair]
        low = [v for v in series["low"] for _ in (0, 1)]
        high = [v for v in series["high"] for _ in (0, 1)]
        ax_f.fill_between(xs, low, high, color="tab:blue", alpha=0.35, lw=0)
        ax_f.plot(xs, high, color="tab:blue", lw=1.0)
        ax_f.plot(xs, low, color="tab:blue", lw=1.0)
        _clock_axis(ax_f, result, list(series["low"]))
        ax_f.set_title("the whole run: clock (a plan's band of clocks), power, phase")
        power = [v for v in series["power"] for _ in (0, 1)]
        ax_p.plot(xs, power, color="tab:orange", lw=0.9)
        ax_p.set_ylabel("power (W)")
        ax_p.set_xlabel("time (s, device clock)")
        ax_f.legend(
            list(seen.values()),
            list(seen),
            fontsize=7,
            title="phase",
            title_fontsize=7,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
        )
    return True


def _trace(result: TuneResult) -> dict[str, Any]:
    """Return the run as a Chrome trace: phases as slices, clock and power as counters (us)."""
    series = _run_series(result)
    events: list[dict[str, Any]] = [
        {
            "ph": "M",
            "name": "process_name",
            "pid": 1,
            "args": {"name": f"opdvfs tune ({result.actuator})"},
        },
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "phase"}},
    ]
    for i, phase in enumerate(series["phase"]):
        t0, t1 = float(series["start"][i]) * 1e6, float(series["end"][i]) * 1e6
        it = result.iterations[i]
        events.append(
            {
                "ph": "X",
                "name": phase,
                "cat": "iteration",
                "pid": 1,
                "tid": 1,
                "ts": t0,
                "dur": t1 - t0,
                "args": {"iteration": it.iteration, "round": it.round, "energy_j": it.energy_j},
            }
        )
        clock = {"low": float(series["low"][i]), "high": float(series["high"][i])}
        events.append({"ph": "C", "name": "clock_mhz", "pid": 1, "ts": t0, "args": clock})
        power = float(series["power"][i])
        if power == power:
            events.append({"ph": "C", "name": "power_w", "pid": 1, "ts": t0, "args": {"W": power}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


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
        _clock_axis(ax, result, ys)
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
    summary = summary_lines(r)
    head = len(headline_lines(r))
    lines = [
        "# opdvfs tune",
        "",
        f"Target slowdown {r.target:.2%} on `{r.actuator}`"
        + (f" ({r.device})" if r.device else "")
        + f"; {len(r.iterations)} iterations"
        + (f"; opdvfs {r.version}" if r.version else "")
        + ".",
        "",
        *([f"Command: `{' '.join(r.command)}`", ""] if r.command else []),
        "## Headline",
        "",
        *[f"- {line}" for line in summary[:head]],
        "",
        "## The run",
        "",
        *[f"- {line}" for line in summary[head:]],
        "",
        "The figures: `run.png` (the whole run over time), `clock.png` (one iteration under the "
        "schedule), `phases.png` (per phase); `trace.json` opens in https://ui.perfetto.dev "
        "(the phases, and the clock and power as counter tracks).",
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
#: The figures ``write_tune`` draws: file name, drawer (False: nothing to draw).
_FIGURES = (("run.png", _plot_run), ("clock.png", _plot_clock), ("phases.png", _plot_phases))

#: Every file ``write_tune`` may write (the rest of an earlier run's are removed).
TUNE_FILES = (
    "profile.parquet",
    samples_path("profile.parquet").name,  # the profile's samples, when it has any
    "models.json",
    "schedule.json",
    "pipeline.json",
    "tune.json",
    "trace.json",
    "report.md",
    *(name for name, _ in _FIGURES),
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
        if result.profile.samples is not None:
            written.append(samples_path("profile.parquet").name)
    if result.models is not None:
        result.models.write(folder / "models.json")
        written.append("models.json")
    if result.schedule is not None:
        result.schedule.write(folder / "schedule.json")
        written.append("schedule.json")
    if result.pipeline is not None:
        result.pipeline.write(folder / "pipeline.json")
        written.append("pipeline.json")
    write_text_atomic(folder / "tune.json", json.dumps(result.to_dict(), indent=1))
    written.append("tune.json")
    if result.iterations:
        write_text_atomic(folder / "trace.json", json.dumps(_trace(result)))
        written.append("trace.json")
    try:
        figures = [name for name, draw in _FIGURES if draw(result, folder / name)]
    except MissingExtraError as e:  # the run's files stand without their figures
        warnings.warn(f"figures skipped: {e}", stacklevel=2)
        figures = []
    write_text_atomic(folder / "report.md", _markdown(result, figures))
    return [*written, "report.md", *figures]
