"""One schedule for every rank: rank 0 loads (or plans) it and broadcasts it (needs torch).

Under ``torchrun`` each rank applies the schedule to its own device; they must all apply the
*same* plan, so rank 0's copy is sent to the others over the default process group (gloo or
nccl) as JSON text. The user's script creates that group, so :func:`share_schedule_on_group_init`
waits for it: it hooks ``torch.distributed.init_process_group`` and broadcasts right after.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from opdvfs.exceptions import DistributedError
from opdvfs.schedule import Schedule

if TYPE_CHECKING:
    from opdvfs.runtime.applier import ScheduleApplier

__all__ = ["broadcast_schedule", "share_schedule_on_group_init"]


def broadcast_schedule(schedule: Schedule | None, *, src: int = 0) -> Schedule:
    """Return rank ``src``'s schedule on every rank (the argument is ignored elsewhere).

    Without an initialised process group this is the identity (a single process).

    Parameters
    ----------
    schedule
        This rank's schedule; only rank ``src``'s is used (the others may pass None).
    src
        The rank whose schedule every rank receives.

    Returns
    -------
    Schedule
        Rank ``src``'s schedule.

    Raises
    ------
    DistributedError
        If there is no schedule to send: None without a process group, or on rank ``src``.
    """
    if not (dist.is_available() and dist.is_initialized()):
        if schedule is None:
            raise DistributedError("no schedule and no process group to receive one from")
        return schedule
    payload = [schedule.to_json() if dist.get_rank() == src and schedule is not None else None]
    if dist.get_rank() == src and schedule is None:
        raise DistributedError(f"rank {src} has no schedule to broadcast")
    dist.broadcast_object_list(payload, src=src)
    text = payload[0]
    if text is None:
        raise DistributedError(f"rank {src} sent no schedule")
    return Schedule.from_json(text, source=f"rank {src}")


@contextmanager
def share_schedule_on_group_init(
    executor: ScheduleApplier, schedule: Schedule | None, *, src: int = 0
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
        This rank's schedule (rank ``src`` must have one; the others may pass None).
    src
        The rank whose schedule every rank applies.
    """
    original = dist.init_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        executor.use_schedule(broadcast_schedule(schedule, src=src))
        return out

    dist.init_process_group = init_process_group
    try:
        yield
    finally:
        dist.init_process_group = original
