"""tune under torchrun: every rank measures, rank 0 leads, the others follow.

At each iteration end the ranks exchange the iteration's time and energy through the process
group's key-value store (:class:`~opdvfs.runtime.distributed.StoreJob`: no tensor operator the
executor or a trace would see), and each takes the job's: the slowest rank's time and every
rank's energy. Rank 0 alone runs the phases on those job-wide figures (its sweep, its planning
thread, its A/B blocks) and broadcasts what it decided (:class:`Decision`: the phase, the clock
it set, the schedule it applies), so every rank moves through the same phases at the same
iterations, the A/B blocks start and end together, and data-parallel ranks share rank 0's plan
(and sweep the clock its active profiling adds, with the others: :attr:`Decision.added`).

When the ranks' sequences differ (pipeline stages; :class:`~opdvfs.runtime.distributed.JobView`),
every stage is profiled and the stages are planned together (:mod:`opdvfs.tuner.stages`; on a
simulated GPU from its records, off it from each stage's first rank's trace): rank 0 sends the
whole :class:`~opdvfs.schedule.PipelineSchedule` and each rank applies its own stage's. Only
rank 0 reads and writes the cache (a pipeline job's key holds every stage's sequence).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opdvfs.exceptions import OpdvfsError, ValidationError
from opdvfs.schedule import PipelineSchedule, Schedule

if TYPE_CHECKING:
    from opdvfs.runtime.distributed import StoreJob

__all__ = ["Decision", "Measurement", "Ranks", "launched_as"]

#: One iteration's time (s) and energy (J): the job's, then this rank's own (None off torchrun).
Measurement = tuple[float, float | None, float | None, float | None]


def launched_as() -> tuple[int, int]:
    """Return this process's rank and the job's world size as torchrun set them ((0, 1) alone).

    Raises
    ------
    ValidationError
        If ``RANK`` or ``WORLD_SIZE`` is not a whole number (one line naming the variable).
    """

    def read(name: str, default: int, least: int) -> int:
        text = os.environ.get(name, "").strip()
        if not text:
            return default
        if not text.isdigit() or int(text) < least:
            raise ValidationError(
                f"{name}={text!r}: expected a whole number >= {least}, as torchrun sets it",
                field=name,
            )
        return int(text)

    return read("RANK", 0, 0), read("WORLD_SIZE", 1, 1)


@dataclass(frozen=True)
class Decision:
    """What rank 0 decided at an iteration end, as every other rank receives it.

    Attributes
    ----------
    iteration
        The iteration that ended.
    phase, round
        The phase (and A/B round) that iteration was in.
    next
        The phase the run is in from the next iteration.
    freq_mhz
        A clock rank 0 set directly (None: none, or the same as last sent).
    schedule
        A schedule rank 0 applies from the next iteration (None: none new).
    error, cache_key, cache_hit
        As the result's.
    counted
        Pipeline stages, once the sweep is done: each swept iteration and its clock (MHz), for
        every stage's first rank to build its profile (None: not now).
    """

    iteration: int
    phase: str
    round: int | None
    next: str
    freq_mhz: float | None
    schedule: Schedule | None
    error: str | None
    cache_key: str | None
    cache_hit: bool
    counted: dict[int, float] | None = None
    #: Whether ``schedule`` is this rank's stage of a pipeline schedule rank 0 sent.
    staged: bool = False
    #: The clock active profiling added to the sweep (MHz) and why, once, when rank 0 chose it
    #: (every rank sweeps it: it follows rank 0's clock).
    added: tuple[float, str] | None = None


class Ranks:
    """A process's place in a torchrun job, once the script has made its process group."""

    def __init__(self) -> None:
        self.job: StoreJob | None = None
        #: How long an exchange waits for a rank that said nothing (s): read before training, so
        #: a bad ``OPDVFS_RANK_TIMEOUT_S`` is one line at start, not an error in the first step.
        self.timeout_s: float | None = None
        if launched_as()[1] > 1:
            from opdvfs.runtime.distributed import rank_timeout_s  # (torch: lazily)

            self.timeout_s = rank_timeout_s()
        #: Set when the ranks lost each other: this rank went on alone at the top clock.
        self.lost = False
        #: Whether another rank's executor abandoned its schedule at the last exchange.
        self.peer_abandoned = False

    @property
    def rank(self) -> int:
        """Return this process's rank in the job (0 without a process group)."""
        if self.job is not None:
            return self.job.rank
        return launched_as()[0]

    def join(self) -> bool:
        """Join the job's ranks once the script has made its process group; True: just joined."""
        if self.job is not None or self.lost:
            return False
        from opdvfs.runtime.distributed import StoreJob, group_ready  # (torch: lazily)

        if not group_ready():
            return False
        self.job = StoreJob(self.timeout_s)
        return True

    def waits_for_group(self) -> bool:
        """Return whether this is a rank other than 0 of a torchrun job with no group (yet)."""
        return launched_as()[1] > 1 and self.rank != 0

    def lose(self, exc: BaseException) -> str:
        """Leave the job after a failed exchange; return the result's error line."""
        error = (
            f"rank {self.rank}: the ranks could not exchange an iteration's figures "
            f"({type(exc).__name__}: {exc}); this rank went on at the top clock"
        )
        self.job, self.lost = None, True
        return error

    def measure(
        self,
        job: StoreJob,
        iteration: int,
        measured: Measurement,
        *,
        abandoned: bool,
        op_names: Sequence[str],
        compare_at: int,
        work_s: float | None = None,
    ) -> tuple[Measurement, bool | None]:
        """Return the job's iteration (slowest rank's time, all ranks' energy) and this rank's.

        At iteration ``compare_at`` (the last warm-up one) the ranks' operator sequences are
        compared, and whether they are the same is returned (None at other iterations).
        ``work_s``: this rank's busy time over
        that iteration, where known: ranks of one sequence whose work differs compare as
        different (:func:`~opdvfs.runtime.distributed.work_keys`).
        """
        time_s, energy_j = measured[0], measured[1]
        job_s, job_j, any_abandoned = job.iteration(time_s, energy_j, abandoned)
        self.peer_abandoned = any_abandoned and not abandoned
        same: bool | None = None
        if iteration == compare_at:
            same = job.same_sequence(op_names, work_s)[0]
        return (job_s, job_j, time_s, energy_j), same

    @staticmethod
    def lead(
        job: StoreJob,
        decision: Decision,
        *,
        top_mhz: float,
        sweeping_mhz: float | None,
        pipeline: PipelineSchedule | None = None,
    ) -> None:
        """Rank 0: send what this iteration end decided to the others.

        A schedule is sent once (the others keep applying it): the whole ``pipeline`` whose
        rank-0 stage it is, when it is one; with no schedule applied, the clock: the sweep's
        (``sweeping_mhz``, while it runs), else the top, each once.
        """
        schedule = decision.schedule
        payload = None
        if schedule is not job.sent:
            whole: Schedule | PipelineSchedule | None = pipeline or schedule
            payload = whole.to_json() if whole is not None else None
            job.sent, job.sent_mhz = schedule, None  # a clock after a schedule is sent anew
        freq: float | None = None
        if schedule is None:
            freq = sweeping_mhz if sweeping_mhz is not None else top_mhz
            if freq == job.sent_mhz:
                freq = None
            else:
                job.sent_mhz = freq
        doc: dict[str, Any] = {
            "iteration": decision.iteration,
            "phase": decision.phase,
            "round": decision.round,
            "next": decision.next,
            "freq_mhz": freq,
            "schedule": payload,
            "error": decision.error,
            "cache_key": decision.cache_key,
            "cache_hit": decision.cache_hit,
            "counted": None if decision.counted is None else sorted(decision.counted.items()),
            "added": decision.added,
        }
        job.exchange(doc)

    @staticmethod
    def follow(job: StoreJob, iteration: int) -> Decision:
        """Another rank: take rank 0's decision for this iteration end.

        A pipeline schedule gives this rank its own stage's (the job's stage of each rank:
        :attr:`~opdvfs.runtime.distributed.JobView.rank_map`).

        Raises
        ------
        OpdvfsError
            If rank 0 ended another iteration (the ranks lost step).
        """
        d = job.exchange(None)
        if d["iteration"] != iteration:
            raise OpdvfsError(f"rank 0 ended iteration {d['iteration']}, this rank {iteration}")
        schedule, staged = None, False
        text = d["schedule"]
        if text is not None and '"format": "opdvfs.pipeline-schedule"' in text:
            pipeline = PipelineSchedule.from_json(text, source="rank 0")
            rank_map = job.view.rank_map if job.view is not None else None
            schedule = pipeline.for_rank(job.rank, job.world_size, rank_map)
            staged = True
        elif text is not None:
            schedule = Schedule.from_json(text, source="rank 0")
        counted = d.get("counted")
        added = d.get("added")
        return Decision(
            iteration=d["iteration"],
            phase=d["phase"],
            round=d["round"],
            next=d["next"],
            freq_mhz=d["freq_mhz"],
            schedule=schedule,
            error=d["error"],
            cache_key=d["cache_key"],
            cache_hit=d["cache_hit"],
            counted=None if counted is None else {int(i): float(f) for i, f in counted},
            staged=staged,
            added=None if added is None else (float(added[0]), str(added[1])),
        )
