"""One schedule for every rank: rank 0 loads (or plans) it and broadcasts it (needs torch).

A pipeline-parallel job's file holds one schedule per pipeline stage
(:class:`~opdvfs.schedule.PipelineSchedule`): it travels whole, and each rank applies its own
stage's.

Under ``torchrun`` each rank applies the schedule to its own device; they must all apply the
*same* plan, so rank 0's copy is sent to the others over the default process group (gloo or
nccl) as JSON text. The user's script creates that group, so :func:`share_schedule_on_group_init`
waits for it: it hooks ``torch.distributed.init_process_group`` and broadcasts right after.

``opdvfs tune`` coordinates its ranks at every iteration end through the group's key-value store
instead (:class:`StoreJob`): a store call runs no tensor operator, so no trace or operator count
sees it.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import math
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from opdvfs.exceptions import DistributedError, ValidationError
from opdvfs.schedule import PipelineSchedule, Schedule

if TYPE_CHECKING:
    from opdvfs.runtime.applier import ScheduleApplier

__all__ = [
    "JobView",
    "StoreJob",
    "broadcast_schedule",
    "group_ready",
    "share_schedule_on_group_init",
]


def broadcast_schedule(
    schedule: Schedule | PipelineSchedule | None,
    *,
    src: int = 0,
    rank_map: Sequence[int] | None = None,
) -> Schedule:
    """Return rank ``src``'s schedule on every rank (the argument is ignored elsewhere).

    A :class:`~opdvfs.schedule.PipelineSchedule` travels whole, and each rank keeps its own
    pipeline stage's schedule (:meth:`~opdvfs.schedule.PipelineSchedule.for_rank`).
    Without an initialised process group this is the identity (a single process; rank 0 of 1).

    Parameters
    ----------
    schedule
        This rank's schedule file; only rank ``src``'s is used (the others may pass None).
    src
        The rank whose schedule every rank receives.
    rank_map
        For a pipeline schedule: the stage of each rank (else contiguous blocks).

    Returns
    -------
    Schedule
        Rank ``src``'s schedule, or this rank's stage of rank ``src``'s pipeline schedule.

    Raises
    ------
    DistributedError
        If there is no schedule to send: None without a process group, or on rank ``src``.
    """
    if not (dist.is_available() and dist.is_initialized()):
        if schedule is None:
            raise DistributedError("no schedule and no process group to receive one from")
        if isinstance(schedule, PipelineSchedule):
            return schedule.for_rank(0, 1, rank_map)
        return schedule
    payload = [schedule.to_json() if dist.get_rank() == src and schedule is not None else None]
    if dist.get_rank() == src and schedule is None:
        raise DistributedError(f"rank {src} has no schedule to broadcast")
    dist.broadcast_object_list(payload, src=src)
    text = payload[0]
    if text is None:
        raise DistributedError(f"rank {src} sent no schedule")
    if '"format": "opdvfs.pipeline-schedule"' in text:  # to_json's own spelling of the tag
        pipeline = PipelineSchedule.from_json(text, source=f"rank {src}")
        return pipeline.for_rank(dist.get_rank(), dist.get_world_size(), rank_map)
    return Schedule.from_json(text, source=f"rank {src}")


@contextmanager
def share_schedule_on_group_init(
    executor: ScheduleApplier,
    schedule: Schedule | PipelineSchedule | None,
    *,
    src: int = 0,
    rank_map: Sequence[int] | None = None,
) -> Iterator[None]:
    """Within the block, give ``executor`` rank ``src``'s schedule once the process group exists.

    ``torch.distributed.init_process_group`` is wrapped: after the original returns, every
    rank calls :func:`broadcast_schedule` and hands the result to
    :meth:`~opdvfs.runtime.applier.ScheduleApplier.use_schedule`, so a script run unchanged
    under ``torchrun`` applies one plan on all ranks. The original function is put back when the
    block ends, however it ends.

    Parameters
    ----------
    executor
        The executor the schedule is given to (it may start without one).
    schedule
        This rank's schedule file (rank ``src`` must have one; the others may pass None); a
        pipeline schedule gives each rank its own stage's.
    src
        The rank whose schedule every rank applies.
    rank_map
        For a pipeline schedule: the stage of each rank.
    """
    original = dist.init_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        executor.use_schedule(broadcast_schedule(schedule, src=src, rank_map=rank_map))
        return out

    dist.init_process_group = init_process_group
    try:
        yield
    finally:
        dist.init_process_group = original


@dataclass(frozen=True)
class JobView:
    """How the ranks' operator sequences compare (``opdvfs tune`` under torchrun).

    Attributes
    ----------
    rank, world_size
        This rank and the number of ranks (0 and 1 without a process group).
    keys
        Every rank's operator-sequence key, by rank.
    """

    rank: int
    world_size: int
    keys: tuple[str, ...]

    @property
    def same_sequence(self) -> bool:
        """Whether every rank runs the same operators: data-parallel ranks share one plan."""
        return len(set(self.keys)) <= 1

    @property
    def groups(self) -> dict[str, list[int]]:
        """The ranks of each distinct operator sequence (pipeline stages: one group each)."""
        out: dict[str, list[int]] = {}
        for rank, key in enumerate(self.keys):
            out.setdefault(key, []).append(rank)
        return out


def group_ready() -> bool:
    """Whether a process group of more than one rank exists (torchrun, after the script's init)."""
    return bool(dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)


#: Environment variable: seconds a rank waits for another at an iteration end (``tune``).
EXCHANGE_TIMEOUT_ENV = "OPDVFS_RANK_TIMEOUT_S"
#: Its default: far above the spread of the ranks' iteration ends in a data-parallel job (they
#: meet in every step's collectives), far below the process group's own (30 min on gloo).
EXCHANGE_TIMEOUT_S = 300.0


def exchange_timeout_s() -> float:
    """Return the seconds a rank waits for another at an iteration end (``$OPDVFS_RANK_TIMEOUT_S``).

    Raises
    ------
    ValidationError
        If the variable is not a positive number of seconds.
    """
    text = os.environ.get(EXCHANGE_TIMEOUT_ENV, "").strip()
    if not text:
        return EXCHANGE_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise ValidationError(
            f"{EXCHANGE_TIMEOUT_ENV}={text!r}: expected a positive number of seconds",
            field=EXCHANGE_TIMEOUT_ENV,
        )
    return value


class StoreJob:
    """The ranks of a torchrun job, coordinated at each iteration end; rank 0 leads (``tune``).

    The ranks exchange their figures through the process group's key-value store (the one
    ``init_process_group`` made), not its collectives: a store call runs no tensor operator,
    so the executor's operator counts, the simulated GPU's launches and a real device's
    torch.profiler trace see none of it, and it works beside any backend (NCCL's collectives
    would take CUDA tensors). Every exchange has its own keys; a rank deletes its keys once an
    exchange in which every rank took part shows they were all read.
    """

    def __init__(self) -> None:
        from torch.distributed.distributed_c10d import _get_default_store

        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.store = dist.PrefixStore("opdvfs-tune/", _get_default_store())
        #: A follower whose operators are rank 0's applies rank 0's clocks and schedules.
        self.follows_plan = True
        self.sent: Schedule | None = None  # the leader's last schedule sent
        self.sent_mhz: float | None = None  # the leader's last clock sent
        self._n = 0  # exchanges so far
        self._posted: list[str] = []  # this rank's keys not yet deleted
        #: Seconds this rank waits for another at an exchange (:func:`exchange_timeout_s`).
        self.timeout_s = exchange_timeout_s()

    def _get(self, n: int, rank: int) -> str:
        """Return ``rank``'s value of exchange ``n``, waiting at most :attr:`timeout_s`.

        Raises
        ------
        DistributedError
            If it did not come in time (one line: which rank, which exchange, what it means).
        """
        key = f"{n}/{rank}"
        try:
            self.store.wait([key], datetime.timedelta(seconds=self.timeout_s))
        except Exception as exc:  # torch's DistStoreError (a RuntimeError), by version
            raise DistributedError(
                f"rank {rank} did not reach exchange {n} within {self.timeout_s:g} s "
                f"({EXCHANGE_TIMEOUT_ENV}): it ended, died, or ends iterations (optimizer "
                f"steps) the other ranks do not ({type(exc).__name__})"
            ) from exc
        return self.store.get(key).decode()

    @property
    def leader(self) -> bool:
        """Whether this rank leads (rank 0: it sweeps, plans and measures for the job)."""
        return self.rank == 0

    def _post(self, value: str) -> str:
        key = f"{self._n}/{self.rank}"
        self._n += 1
        self.store.set(key, value)
        self._posted.append(key)
        return key

    def _all(self, value: str) -> list[str]:
        """Return every rank's ``value``, by rank (an exchange every rank takes part in)."""
        key = self._post(value)
        n = key.split("/")[0]
        out = [value if r == self.rank else self._get(int(n), r) for r in range(self.world_size)]
        # every rank posted here, so it has read every key of the exchanges before this one
        done, self._posted = self._posted[:-1], self._posted[-1:]
        for old in done:
            with contextlib.suppress(Exception):
                self.store.delete_key(old)
        return out

    def iteration(
        self, time_s: float, energy_j: float | None, abandoned: bool
    ) -> tuple[float, float | None, bool]:
        """Return the job's time (max), energy (sum; None if a rank has none), any abandoned.

        The energy is summed in rank order on every rank (the same float everywhere).
        """
        rows = [json.loads(v) for v in self._all(json.dumps([time_s, energy_j, abandoned]))]
        energies = [row[1] for row in rows]
        total = None if any(e is None for e in energies) else float(math.fsum(energies))
        return max(float(row[0]) for row in rows), total, any(bool(row[2]) for row in rows)

    def same_sequence(self, op_names: Sequence[str]) -> tuple[bool, dict[str, list[int]]]:
        """Compare every rank's operator sequence; set :attr:`follows_plan`; return the groups."""
        key = hashlib.sha256("\n".join(op_names).encode()).hexdigest()
        view = JobView(self.rank, self.world_size, tuple(self._all(key)))
        self.follows_plan = view.keys[self.rank] == view.keys[0]
        return view.same_sequence, view.groups

    def exchange(self, directive: dict[str, Any] | None) -> dict[str, Any]:
        """Return rank 0's ``directive`` on every rank (the others pass None)."""
        if self.leader:
            self._post(json.dumps(directive))
            assert directive is not None
            return directive
        n = self._n
        self._n += 1
        doc: dict[str, Any] = json.loads(self._get(n, 0))
        return doc
