"""One schedule for every rank: rank 0 loads (or plans) it and broadcasts it (needs torch).

A pipeline-parallel job's file holds one schedule per pipeline stage
(:class:`~opdvfs.schedule.PipelineSchedule`): it travels whole, and each rank applies its own
stage's.

Under ``torchrun`` each rank applies the schedule to its own device; they must all apply the
*same* plan, so rank 0's copy is sent to the others over the default process group (gloo or
nccl) as JSON text. The user's script creates that group, so :func:`share_schedule_on_group_init`
waits for it: it hooks ``torch.distributed.init_process_group`` and broadcasts right after.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from opdvfs.exceptions import DistributedError
from opdvfs.schedule import PipelineSchedule, Schedule

if TYPE_CHECKING:
    from opdvfs.runtime.applier import ScheduleApplier

__all__ = ["JobView", "broadcast_schedule", "share_schedule_on_group_init"]


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
