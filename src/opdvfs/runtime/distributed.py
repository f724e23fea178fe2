"""One schedule for every rank: rank 0 loads (or plans) it and broadcasts it (needs torch).

Under ``torchrun`` each rank applies the schedule to its own device; they must all apply the
*same* plan, so rank 0's copy is sent to the others over the default process group (gloo or
nccl) as JSON text.
"""

from __future__ import annotations

import torch.distributed as dist

from opdvfs.schedule import Schedule

__all__ = ["broadcast_schedule"]


def broadcast_schedule(schedule: Schedule | None, *, src: int = 0) -> Schedule:
    """Return rank ``src``'s schedule on every rank (the argument is ignored elsewhere).

    Without an initialised process group this is the identity (a single process).
    """
    if not (dist.is_available() and dist.is_initialized()):
        if schedule is None:
            raise ValueError("no schedule and no process group to receive one from")
        return schedule
    payload = [schedule.to_json() if dist.get_rank() == src and schedule is not None else None]
    if dist.get_rank() == src and schedule is None:
        raise ValueError(f"rank {src} has no schedule to broadcast")
    dist.broadcast_object_list(payload, src=src)
    text = payload[0]
    if text is None:
        raise ValueError(f"rank {src} sent no schedule")
    return Schedule.from_json(text, source=f"rank {src}")
