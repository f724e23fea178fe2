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
from opdvfs.schedule import Schedule

__all__ = [
    "PHASES",
    "PROFILING",
    "Interval",
    "Phase",
    "TuneIteration",
    "TuneResult",
    "TuneRound",
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
    #: How the applied round was chosen (:func:`~opdvfs.tuner.policy.choose_round`; None: no
    #: round measured).
    chosen_by: str | None = None
    #: Iterations per A/B block (the first discarded), and why that many
    #: (:func:`~opdvfs.tuner.policy.block_size`).
    block: int | None = None
    block_by: str | None = None
    #: A/B block pairs per round.
    pairs: int | None = None

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
        return {
            "target": self.target,
            "actuator": self.actuator,
            "device": self.device,
            "clocks_mhz": list(self.clocks_mhz),
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
            "cache_key": self.cache_key,
            "cache_hit": self.cache_hit,
            "cached": self.cached,
            "world_size": self.world_size,
            "same_sequence": self.same_sequence,
            "plan_seconds": self.plan_seconds,
            "error": self.error,
            "per_iteration": [asdict(it) for it in self.iterations],
        }
