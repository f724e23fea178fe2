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
import hashlib
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from opdvfs.exceptions import DistributedError
from opdvfs.schedule import PipelineSchedule, Schedule

if TYPE_CHECKING:
    from opdvfs.runtime.applier import ScheduleApplier

__all__ = [
    "SAME_WORK_REL",
    "JobView",
    "StoreJob",
    "broadcast_schedule",
    "group_ready",
    "share_schedule_on_group_init",
    "work_keys",
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


#: Relative difference of two ranks' busy time over an iteration (at the top clock) above which
#: ranks of one operator sequence are planned apart: far above the simulated kernels' noise over
#: an iteration (0.6% per kernel, ~0.1% over a hundred), far below a batch size's difference.
SAME_WORK_REL = 0.01


def work_keys(posted: Sequence[str]) -> tuple[str, ...]:
    """Return every rank's group key from its posted ``"SEQUENCE_KEY WORK_S"`` (by rank).

    Ranks of one sequence are split by their work: sorted by it, a rank more than
    :data:`SAME_WORK_REL` above its cluster's first (least) starts a new one. A work of
    ``None`` (a real GPU's, unknown) never splits.
    """
    pairs = [p.rsplit(" ", 1) for p in posted]
    seqs = [seq for seq, _ in pairs]
    work = [None if w == "None" else float(w) for _, w in pairs]
    keys = list(seqs)
    for seq in dict.fromkeys(seqs):
        ranks = [r for r, s in enumerate(seqs) if s == seq and work[r] is not None]
        cluster, first = 0, None
        for r in sorted(ranks, key=lambda r: (work[r], r)):
            w = work[r]
            assert w is not None
            if first is not None and w > first * (1 + SAME_WORK_REL):
                cluster, first = cluster + 1, None
            first = w if first is None else first
            keys[r] = f"{seq}/{cluster}" if cluster else seq
    return tuple(keys)


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

    @property
    def rank_map(self) -> list[int]:
        """The stage of each rank: its sequence's place among the groups, by their first rank."""
        order = {key: stage for stage, key in enumerate(self.groups)}
        return [order[key] for key in self.keys]

    @property
    def stage_leads(self) -> list[int]:
        """The first rank of each stage (the one whose sweep profiles it), stage 0 first."""
        return [ranks[0] for ranks in self.groups.values()]


def group_ready() -> bool:
    """Whether a process group of more than one rank exists (torchrun, after the script's init)."""
    return bool(dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)


#: Seconds a rank waits at an iteration end for another rank's figures before it leaves the job
#: (``OPDVFS_RANK_TIMEOUT_S``): a rank that died without a word (SIGKILL) is given up on then.
RANK_TIMEOUT_S = 300.0

#: Seconds between looks, while waiting, for a rank that said it left (:meth:`StoreJob.leave`).
_POLL_S = 0.5

#: Where a rank cannot wait in the store (no second client: :meth:`StoreJob._wait_for`), the
#: first and the longest pause (s) between its looks for the key it waits for (a ``check``:
#: ~20 us on one node). The pause grows by half at each look: a wait ends at most half its
#: length, and never more than :data:`_LOOK_MAX_S`, after the key came.
_LOOK_MIN_S, _LOOK_MAX_S = 0.0002, 0.01

#: What a rank that gave up waiting for a key writes there, if it is still missing, to end its
#: own store wait (:meth:`StoreJob._wait_for`); a rank that reads it gives up as well.
_WAKE = "opdvfs: a rank gave up waiting for this key"

#: Seconds a store wait lasts past :attr:`StoreJob.timeout_s`: the rank gives up first and ends
#: the wait itself, so it never expires (torch logs every expiry as a c10d warning).
_WAIT_MARGIN_S = 600.0


def rank_timeout_s(env: dict[str, str] | os._Environ[str] = os.environ) -> float:
    """Return ``OPDVFS_RANK_TIMEOUT_S`` (s, > 0), default :data:`RANK_TIMEOUT_S`.

    Raises
    ------
    DistributedError
        When it is set to anything but a number of seconds > 0.
    """
    text = env.get("OPDVFS_RANK_TIMEOUT_S")
    if text is None or not text.strip():
        return RANK_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise DistributedError(f"OPDVFS_RANK_TIMEOUT_S={text!r}: expected seconds > 0")
    return value


class StoreJob:
    """The ranks of a torchrun job, coordinated at each iteration end; rank 0 leads (``tune``).

    The ranks exchange their figures through the process group's key-value store (the one
    ``init_process_group`` made), not its collectives: a store call runs no tensor operator,
    so the executor's operator counts, the simulated GPU's launches and a real device's
    torch.profiler trace see none of it, and it works beside any backend (NCCL's collectives
    would take CUDA tensors). Every exchange has its own keys; a rank deletes its keys once an
    exchange in which every rank took part shows they were all read.

    No read waits for ever: a rank that ends by an error or a signal says so (:meth:`leave`),
    and a rank waiting for it gives up within :data:`_POLL_S` of that; one that died without a
    word (SIGKILL) is given up on after :func:`rank_timeout_s`. Either raises
    :class:`~opdvfs.exceptions.DistributedError`, and tune goes on alone at the top clock.
    A read waits in the store, on a second client, from a helper thread (:meth:`_wait_for`):
    it wakes as the key comes, no store wait times out (torch logs each expiry as a c10d
    warning: "waitForInput ... timed out after 500ms" with 0.5 s slices), and the calling
    thread, free meanwhile, takes SIGINT/SIGTERM at once.

    Parameters
    ----------
    timeout_s
        How long a read waits for a rank that said nothing (s); default :func:`rank_timeout_s`.
    store, rank, world_size
        The store and this rank's place (default: the process group's store, rank and size).
    """

    def __init__(
        self,
        timeout_s: float | None = None,
        *,
        store: dist.Store | None = None,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        if store is None:
            from torch.distributed.distributed_c10d import _get_default_store

            store = _get_default_store()
        self.rank = dist.get_rank() if rank is None else rank
        self.world_size = dist.get_world_size() if world_size is None else world_size
        self.store = dist.PrefixStore("opdvfs-tune/", store)
        #: A second client of the store, for :meth:`_wait_for` (made at its first wait; None
        #: where the store cannot make one), and whether a wait is using it.
        self._waiter: dist.Store | None = None
        self._cloned = False
        self._waiting = threading.Lock()
        #: A follower whose operators are rank 0's applies rank 0's clocks and schedules.
        self.follows_plan = True
        self.sent: Schedule | None = None  # the leader's last schedule sent
        self.sent_mhz: float | None = None  # the leader's last clock sent
        self.timeout_s = rank_timeout_s() if timeout_s is None else timeout_s
        self._n = 0  # exchanges so far
        self._posted: list[str] = []  # this rank's keys not yet deleted
        #: The last :meth:`iteration`'s time (s) and energy (J) of every rank, by rank.
        self.ranks_time_s: list[float] = []
        self.ranks_energy_j: list[float | None] = []
        #: How the ranks' operator sequences compare (set by :meth:`same_sequence`).
        self.view: JobView | None = None

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
        out = [value if r == self.rank else self._get(f"{n}/{r}") for r in range(self.world_size)]
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
        self.ranks_time_s = [float(row[0]) for row in rows]
        self.ranks_energy_j = [None if e is None else float(e) for e in energies]
        total = None if any(e is None for e in energies) else float(math.fsum(energies))
        return max(float(row[0]) for row in rows), total, any(bool(row[2]) for row in rows)

    def same_sequence(
        self, op_names: Sequence[str], work_s: float | None = None
    ) -> tuple[bool, dict[str, list[int]]]:
        """Compare every rank's operator sequence; set :attr:`follows_plan`; return the groups.

        ``work_s``: this rank's busy time over the compared iteration at the top clock, where
        the device gives one (a simulated GPU); ranks of one sequence whose work differs by
        more than :data:`SAME_WORK_REL` (data-parallel ranks of different batch sizes) are
        groups of their own (:func:`work_keys`), each planned on its own profile.
        """
        key = hashlib.sha256("\n".join(op_names).encode()).hexdigest()
        posted = self._all(f"{key} {work_s!r}")
        view = JobView(self.rank, self.world_size, work_keys(posted))
        self.view = view
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
        doc: dict[str, Any] = json.loads(self._get(f"{n}/0"))
        return doc

    def put_bytes(self, name: str, data: bytes) -> None:
        """Post ``data`` under ``name`` (``NAME/RANK``) for one other rank to take once."""
        self.store.set(f"{name}/{self.rank}", data)  # type: ignore[arg-type]  # (bytes: as get)

    def take_bytes(self, name: str, rank: int) -> bytes:
        """Return what ``rank`` posted under ``name`` (waiting as an exchange does); delete it.

        Raises
        ------
        DistributedError
            As an exchange's read: a rank left, or nothing came within :attr:`timeout_s`.
        """
        key = f"{name}/{rank}"
        data = self._get_bytes(key)
        with contextlib.suppress(Exception):
            self.store.delete_key(key)
        return data

    def await_bytes(
        self, name: str, rank: int, *, poll_s: float = 0.05, stop: Callable[[], bool] | None = None
    ) -> bool:
        """Wait until ``rank`` posted under ``name`` (True), or until ``stop()`` (False).

        For another thread than the one that exchanges each iteration: it looks every
        ``poll_s`` seconds (and asks ``stop`` then) instead of ever more often.

        Raises
        ------
        DistributedError
            As :meth:`take_bytes`: a rank left, or nothing came within :attr:`timeout_s`.
        """
        return self._await(f"{name}/{rank}", f"posted no {name}", poll_s=poll_s, stop=stop)

    def _get(self, key: str) -> str:
        """Return what a rank posted at ``key`` (``EXCHANGE/RANK``) once it is there."""
        return self._get_bytes(key).decode()

    def _get_bytes(self, key: str) -> bytes:
        """Return what a rank posted at ``key`` (``.../RANK``) once it is there.

        Raises
        ------
        DistributedError
            When a rank said it left the job, or ``key`` is not there after :attr:`timeout_s`.
        """
        if not self.store.check([key]):
            self._wait_for(key)
        data = bytes(self.store.get(key))
        if data == _WAKE.encode():
            raise DistributedError(
                f"a rank left the job (an error or a signal) while rank {self.rank} waited for "
                f"rank {key.rsplit('/', 1)[-1]}"
            )
        return data

    def _wait_for(self, key: str) -> None:
        """Return once ``key`` is in the store; raise as :meth:`_await` when a rank left.

        A helper thread waits in the store for it, on a second client of the store (this
        one's calls meanwhile go on); this thread looks whether a rank left every
        :data:`_POLL_S` seconds until the helper's wait returns. When this thread gives up (a
        rank left, the timeout, a signal's exception), it writes :data:`_WAKE` at ``key`` if it
        is still missing, which ends the helper's wait. Without a second client (or with it in
        use by another thread), it looks for ``key`` instead (:meth:`_await`).
        """
        waiter = self._waiter_store()
        if waiter is None:
            self._await(key, "did not end its iteration")
            return
        done = threading.Event()

        def wait() -> None:
            try:
                waiter.wait([key], timedelta(seconds=self.timeout_s + _WAIT_MARGIN_S))
            except Exception:  # (the store closed: the caller looks instead)
                pass
            finally:
                self._waiting.release()
                done.set()

        threading.Thread(target=wait, name="opdvfs-store-wait", daemon=True).start()
        try:
            self._await(key, "did not end its iteration", ready=done)
        finally:
            if not done.is_set():
                with contextlib.suppress(Exception):
                    self.store.compare_set(key, "", _WAKE)

    def _waiter_store(self) -> dist.Store | None:
        """Return the second client, held for one wait (None: none, or another wait has it)."""
        if not self._waiting.acquire(blocking=False):
            return None
        if not self._cloned:
            self._cloned = True
            with contextlib.suppress(Exception):  # (a store without clone: look instead)
                self._waiter = self.store.clone()  # type: ignore[attr-defined]  # (no stub)
        if self._waiter is None:
            self._waiting.release()
        return self._waiter

    def _await(
        self,
        key: str,
        missing: str,
        *,
        poll_s: float | None = None,
        stop: Callable[[], bool] | None = None,
        ready: threading.Event | None = None,
    ) -> bool:
        """Wait until ``key`` (``.../RANK``) is in the store (True), or until ``stop()`` (False).

        It looks (``check``, which never waits in the store) after pauses from
        :data:`_LOOK_MIN_S` up to :data:`_LOOK_MAX_S`, or every ``poll_s`` seconds, or, with
        ``ready`` (set when a helper's wait in the store returned), each time it is set and
        every :data:`_POLL_S` seconds; whether a rank left (:meth:`leave`) at the first look
        and every :data:`_POLL_S` after.

        Raises
        ------
        DistributedError
            When a rank said it left the job, or ``key`` is not there after :attr:`timeout_s`
            (the line says the rank ``missing`` its figures).
        """
        rank = key.rsplit("/", 1)[-1]
        now = time.monotonic()
        deadline, left_at = now + self.timeout_s, now
        pause = _LOOK_MIN_S if poll_s is None else poll_s
        while not self.store.check([key]):
            if stop is not None and stop():
                return False
            now = time.monotonic()
            if now >= left_at or now >= deadline:
                left_at = now + _POLL_S
                gone = int(self.store.add("left", 0))
                if gone:
                    raise DistributedError(
                        f"{gone} rank(s) left the job (an error or a signal) while rank "
                        f"{self.rank} waited for rank {rank}"
                    )
            if now >= deadline:
                raise DistributedError(
                    f"rank {rank} {missing} within {self.timeout_s:g} s "
                    "(OPDVFS_RANK_TIMEOUT_S): it died or stalled"
                )
            if ready is not None and not ready.is_set():
                ready.wait(min(_POLL_S, max(deadline - now, 0.0)))
                continue
            time.sleep(min(pause, max(deadline - now, 0.0)))
            if poll_s is None:
                pause = min(pause * 1.5, _LOOK_MAX_S)
        return True

    def leave(self) -> None:
        """Tell the other ranks this one is gone (it ended by an error or a signal); never raises.

        Their waits at the next iteration end then give up at once instead of timing out.
        """
        with contextlib.suppress(Exception):
            self.store.add("left", 1)
