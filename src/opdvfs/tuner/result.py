"""What a tuning run did and measured: per iteration, per round, and the run as a whole.

Plain records (the JSON result's content, :meth:`TuneResult.to_dict`): the loop
(:mod:`opdvfs.tuner.loop`) appends to them, the A/B statistics (:mod:`opdvfs.tuner.ab`) and
the policy (:mod:`opdvfs.tuner.policy`) read them, and the report (:mod:`opdvfs.tuner.report`)
writes them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

import numpy as np

from opdvfs.models.bundle import ModelBundle
from opdvfs.profile import Profile
from opdvfs.schedule import PipelineSchedule, Schedule

__all__ = [
    "PHASES",
    "PROFILING",
    "Interval",
    "Phase",
    "TuneIteration",
    "TuneResult",
    "TuneRound",
    "WholeRun",
]

Phase = Literal[
    "warmup",
    "settle",
    "unsteady",
    "counted",
    "planning",
    "switch",
    "reference",
    "tuned",
    "steady",
    "top",
]
#: Every phase an iteration can be in, in the order a run goes through them.
PHASES: tuple[str, ...] = get_args(Phase)
#: Phases that cost the job profiling (the sweep after the warm-up) or planning.
PROFILING = ("settle", "unsteady", "counted")
#: Phases in which the run is tuning rather than applying its choice (every phase from the
#: sweep to the last A/B block).
TUNING = (*PROFILING, "planning", "switch", "reference", "tuned")


@dataclass(frozen=True)
class Interval:
    """A mean and its two-sided Student-t confidence interval.

    Attributes
    ----------
    mean, low, high
        The mean and the interval's ends (``nan`` with fewer than two values).
    n
        How many values.
    confidence
        The interval's level (0.95).
    """

    mean: float
    low: float
    high: float
    n: int
    confidence: float = 0.95


@dataclass
class TuneIteration:
    """One iteration of a tuning run: its phase, the clock last requested, its time and energy.

    ``time_s`` and ``energy_j`` are on the device's clock and counter (a simulated GPU's
    virtual time; a real GPU's wall time after a synchronise and its energy counter; None
    where the device has no counter). ``round`` is the A/B round it measured, if any.
    """

    iteration: int
    phase: str
    freq_mhz: float | None
    time_s: float
    energy_j: float | None
    round: int | None = None
    #: Under torchrun: this rank's own time and energy (``time_s``/``energy_j`` are the job's).
    rank_time_s: float | None = None
    rank_energy_j: float | None = None
    #: Under torchrun: every rank's time and energy, by rank (each GPU's own figures).
    ranks_time_s: list[float] | None = None
    ranks_energy_j: list[float | None] | None = None


@dataclass
class TuneRound:
    """One planned schedule and what its A/B blocks measured against the top clock.

    ``slowdown`` and ``saving`` are paired intervals over the block pairs (tuned over
    reference time minus 1; 1 minus tuned over reference energy). ``dropped``: tuned
    iterations left out because the time-triggered executor fell back to the top clock in them.
    """

    budget: float
    stages: int
    predicted_slowdown: float | None
    predicted_saving: float | None
    slowdown: Interval
    saving: Interval | None
    pairs: int
    dropped: int = 0
    #: The best single static clock (MHz: one stage, as ``nvidia-smi -lgc`` locks it), when
    #: this round is that contender; None: a per-operator plan.
    static_mhz: float | None = None
    #: The clocks the plan sets (MHz, ascending; one for a static clock).
    freqs_mhz: tuple[float, ...] = ()


@dataclass(frozen=True)
class WholeRun:
    """The whole run, tuning included, against the same iterations at the top clock.

    The top clock's run is the counterfactual: the warm-up iterations as measured (they ran at
    the top clock), every later one at the mean time and energy of the A/B reference blocks'
    iterations (the top clock, measured the same way, interleaved with the tuned blocks).

    Attributes
    ----------
    iterations
        Iterations of the run.
    time_s, energy_j
        What the run took (s, J; energy None without a counter).
    top_time_s, top_energy_j
        What the same iterations would have taken at the top clock.
    reference_iterations
        The reference iterations the top clock's figures are the mean of.
    break_even
        The iteration from which the run's energy, summed from its start, stays at or below
        the top clock's: tuning has paid for itself. Projected past the run's end at the steady
        phase's saving per iteration when the run ended before (``projected``); None: not
        within reach (no steady saving, or no energy counter).
    projected
        Whether ``break_even`` lies past the run's end (a projection).
    tuning_cost_j
        Energy the tuning phases cost over the top clock (J; the peak of the running excess).
    steady_saving_j
        Energy saved per steady iteration against the top clock (J), None without steady ones.
    """

    iterations: int
    time_s: float
    energy_j: float | None
    top_time_s: float
    top_energy_j: float | None
    reference_iterations: int
    break_even: int | None
    projected: bool
    tuning_cost_j: float | None
    steady_saving_j: float | None

    @property
    def slowdown(self) -> float:
        """The run's time over the top clock's, minus 1."""
        return self.time_s / self.top_time_s - 1

    @property
    def saving(self) -> float | None:
        """1 minus the run's energy over the top clock's (None without a counter)."""
        if self.energy_j is None or not self.top_energy_j:
            return None
        return 1 - self.energy_j / self.top_energy_j

    def to_dict(self) -> dict[str, Any]:
        """Return the fields and the two ratios (JSON-able)."""
        return {**asdict(self), "slowdown": self.slowdown, "saving": self.saving}


def whole_run(iterations: list[TuneIteration]) -> WholeRun | None:
    """Return the whole run against the top clock (:class:`WholeRun`), or None.

    None where the run measured no reference iteration (a cache hit, or a run that ended
    before its first A/B block): there is no top clock measured the same way to compare with.
    Vectorised over the iterations.
    """
    phase = np.array([it.phase for it in iterations], dtype=object)
    ref = phase == "reference"
    if not ref.any():
        return None
    time_s = np.array([it.time_s for it in iterations], dtype=float)
    energy = np.array(
        [np.nan if it.energy_j is None else it.energy_j for it in iterations], dtype=float
    )
    warm = phase == "warmup"
    top_t = np.where(warm, time_s, float(time_s[ref].mean()))
    has_energy = bool(np.isfinite(energy[ref]).any() and np.isfinite(energy[~warm]).any())
    if not has_energy:
        return WholeRun(
            len(iterations), float(time_s.sum()), None, float(top_t.sum()), None,
            int(ref.sum()), None, False, None, None,
        )  # fmt: skip
    e_ref = float(np.nanmean(energy[ref]))
    # an iteration the counter missed counts as the top clock's (no excess either way)
    e = np.where(np.isfinite(energy), energy, e_ref)
    top_e = np.where(warm, e, e_ref)
    excess = np.cumsum(e - top_e)
    steady = phase == "steady"
    saving_j = float(e_ref - e[steady].mean()) if steady.any() else None
    above = np.flatnonzero(excess > 0)
    projected = False
    if above.size == 0:
        break_even: int | None = iterations[0].iteration
    elif above[-1] + 1 < len(iterations):
        break_even = iterations[int(above[-1]) + 1].iteration
    elif saving_j is not None and saving_j > 0:
        projected = True
        break_even = iterations[-1].iteration + int(np.ceil(excess[-1] / saving_j))
    else:
        break_even = None
    return WholeRun(
        len(iterations), float(time_s.sum()), float(e.sum()), float(top_t.sum()),
        float(top_e.sum()), int(ref.sum()), break_even, projected,
        float(max(excess.max(), 0.0)), saving_j,
    )  # fmt: skip


@dataclass
class TuneResult:
    """What a tuning run did and measured (the JSON result's content)."""

    target: float
    actuator: str
    device: str | None
    clocks_mhz: tuple[float, ...]
    iterations: list[TuneIteration]
    rounds: list[TuneRound] = field(default_factory=list)
    best_round: int | None = None
    met: bool | None = None
    cache_key: str | None = None
    cache_hit: bool = False
    schedule: Schedule | None = None
    profile: Profile | None = None
    models: ModelBundle | None = None
    error: str | None = None
    plan_seconds: float = 0.0
    timeline: dict[str, list[float]] | None = None
    #: What the cached schedule measured when it was tuned (a cache hit).
    cached: dict[str, Any] | None = None
    #: Ranks of the job (torchrun); time is the slowest rank's, energy every rank's.
    world_size: int = 1
    #: Under torchrun: whether every rank ran rank 0's operator sequence (None: not compared).
    same_sequence: bool | None = None
    #: Pipeline stages planned together (the ranks' distinct sequences; None: not so planned).
    pipeline_stages: int | None = None
    #: The applied plan of every stage, when they were planned together (``schedule`` is
    #: this rank's stage's).
    pipeline: PipelineSchedule | None = None
    #: How the applied round was chosen (:func:`~opdvfs.tuner.policy.choose_round`; None: no
    #: round measured).
    chosen_by: str | None = None
    #: Iterations per A/B block (the first discarded), and why that many
    #: (:func:`~opdvfs.tuner.policy.block_size`).
    block: int | None = None
    block_by: str | None = None
    #: A/B block pairs per round.
    pairs: int | None = None
    #: The device's lowest and top clock (MHz): the figures' clock axis.
    range_mhz: tuple[float, float] | None = None
    #: The opdvfs version and the command (or Python call) that ran the tuning.
    version: str | None = None
    command: list[str] | None = None
    #: The clock active profiling added to the sweep, and why, in one line
    #: (:func:`~opdvfs.tuner.policy.added_clock`); None: none was worth it.
    added_clock: str | None = None

    def count(self, *phases: str) -> int:
        """Return how many iterations were in any of ``phases``."""
        return sum(1 for it in self.iterations if it.phase in phases)

    @property
    def profiling_iterations(self) -> int:
        """Iterations the sweep took after the warm-up (switch settling, unsteady, counted)."""
        return self.count(*PROFILING)

    @property
    def planning_iterations(self) -> int:
        """Iterations run at the top clock while the models were fitted and plans made."""
        return self.count("planning")

    @property
    def stages_together(self) -> bool:
        """Whether the ranks' groups were planned together, each on its own profile.

        Under torchrun: pipeline stages, or data-parallel ranks whose work differs.
        """
        return self.pipeline_stages is not None

    @property
    def overhead_fraction(self) -> float:
        """Profiling and planning iterations over all the run's iterations."""
        n = len(self.iterations)
        return (self.profiling_iterations + self.planning_iterations) / n if n else math.nan

    def phase_means(self) -> dict[str, dict[str, float | int | None]]:
        """Return per phase: iterations, mean time (s) and mean energy (J) per iteration."""
        out: dict[str, dict[str, float | int | None]] = {}
        for phase in PHASES:
            rows = [it for it in self.iterations if it.phase == phase]
            if not rows:
                continue
            energy = [it.energy_j for it in rows if it.energy_j is not None]
            out[phase] = {
                "iterations": len(rows),
                "time_s": float(np.mean([it.time_s for it in rows])),
                "energy_j": float(np.mean(energy)) if energy else None,
            }
        return out

    def whole_run(self) -> WholeRun | None:
        """Return the whole run, tuning included, against the top clock (:func:`whole_run`)."""
        return whole_run(self.iterations)

    @property
    def static(self) -> TuneRound | None:
        """The best static clock's round (the ``nvidia-smi -lgc`` contender), if measured."""
        return next((r for r in self.rounds if r.static_mhz is not None), None)

    @property
    def best(self) -> TuneRound | None:
        """The round whose schedule runs in the steady phase."""
        return self.rounds[self.best_round] if self.best_round is not None else None

    @property
    def saving_resolved(self) -> bool | None:
        """Whether the applied round's saving interval excludes 0 (None: no interval).

        False: at this many pairs the measured saving is not told apart from none (or the
        interval lies wholly below 0).
        """
        best = self.best
        if best is None or best.saving is None or best.saving.n < 2:
            return None
        low, high = best.saving.low, best.saving.high
        if not (math.isfinite(low) and math.isfinite(high)):
            return None
        return bool(low > 0 or high < 0)

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-able result (no profile, models or schedule: they have their files)."""
        best = self.best
        run = self.whole_run()
        return {
            "version": self.version,
            "command": self.command,
            "target": self.target,
            "actuator": self.actuator,
            "device": self.device,
            "clocks_mhz": list(self.clocks_mhz),
            "added_clock": self.added_clock,
            "iterations": len(self.iterations),
            "profiling_iterations": self.profiling_iterations,
            "planning_iterations": self.planning_iterations,
            "overhead_fraction": self.overhead_fraction,
            "phases": self.phase_means(),
            "rounds": [asdict(r) for r in self.rounds],
            "best_round": self.best_round,
            "chosen_by": self.chosen_by,
            "met": self.met,
            "saving_resolved": self.saving_resolved,
            "block": self.block,
            "block_by": self.block_by,
            "pairs": self.pairs,
            "measured_slowdown": asdict(best.slowdown) if best else None,
            "measured_saving": asdict(best.saving) if best and best.saving else None,
            "whole_run": run.to_dict() if run is not None else None,
            "static_round": next(
                (i for i, r in enumerate(self.rounds) if r.static_mhz is not None), None
            ),
            "range_mhz": list(self.range_mhz) if self.range_mhz else None,
            "cache_key": self.cache_key,
            "cache_hit": self.cache_hit,
            "cached": self.cached,
            "world_size": self.world_size,
            "same_sequence": self.same_sequence,
            "pipeline_stages": self.pipeline_stages,
            "stages_together": self.stages_together,
            "plan_seconds": self.plan_seconds,
            "error": self.error,
            "per_iteration": [asdict(it) for it in self.iterations],
        }
