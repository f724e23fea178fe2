"""tune's pipeline stages: every stage profiled, planned together, each rank its stage's schedule.

When the ranks of a torchrun job run different operator sequences (pipeline stages; the groups of
:class:`~opdvfs.runtime.distributed.JobView`, stage ``s`` the ``s``-th group by its first rank),
every rank follows rank 0's clock through the sweep, and the first rank of each stage builds its
profile of the swept iterations (on a simulated GPU: :func:`~opdvfs.runtime.sweep.sim_profile`).
Those profiles go to rank 0 through the job's key-value store as Parquet bytes
(:func:`send_stage_profile`, :func:`gather_stage_profiles`: no collective, so no operator count
sees them), and rank 0's planning thread plans the whole job on its dependency graph at each
budget (:func:`plan_stages`: :func:`~opdvfs.plan.ranks.plan_ranks`, what ``opdvfs plan
--pipeline ranks`` runs), each stage's schedule mapped onto the operators its ranks count
(:func:`~opdvfs.schedule.on_launches`). The whole :class:`~opdvfs.schedule.PipelineSchedule`
travels to every rank, which applies its own stage's (:meth:`PipelineSchedule.for_rank`).
"""

from __future__ import annotations

import struct
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from opdvfs.exceptions import OpdvfsError
from opdvfs.profile import Profile
from opdvfs.schedule import PipelineSchedule, on_launches

if TYPE_CHECKING:
    from opdvfs.runtime.distributed import StoreJob

__all__ = [
    "gather_stage_profiles",
    "plan_stages",
    "profile_bytes",
    "profile_from_bytes",
    "send_stage_failure",
    "send_stage_profile",
]

#: The store key a stage's profile travels under (``stage-profile/RANK``).
_KEY = "stage-profile"
_FAILED = b"failed:"  # a stage's profile that could not be built: its error follows
_HEADER = struct.Struct("<QQQ")  # operators launched, ops file bytes, samples file bytes


def profile_bytes(profile: Profile, n_launches: int) -> bytes:
    """Return ``profile`` (its two Parquet files) and its operators launched, as bytes."""
    with tempfile.TemporaryDirectory(prefix="opdvfs-stage-") as tmp:
        path = Path(tmp) / "p.parquet"
        profile.write(path)
        ops = path.read_bytes()
        samples_path = Path(tmp) / "p.samples.parquet"
        samples = samples_path.read_bytes() if samples_path.exists() else b""
    return _HEADER.pack(n_launches, len(ops), len(samples)) + ops + samples


def profile_from_bytes(data: bytes) -> tuple[Profile, int]:
    """Return the profile and operators launched :func:`profile_bytes` packed."""
    n_launches, n_ops, n_samples = _HEADER.unpack_from(data)
    body = memoryview(data)[_HEADER.size :]
    with tempfile.TemporaryDirectory(prefix="opdvfs-stage-") as tmp:
        path = Path(tmp) / "p.parquet"
        path.write_bytes(body[:n_ops])
        if n_samples:
            (Path(tmp) / "p.samples.parquet").write_bytes(body[n_ops : n_ops + n_samples])
        return Profile.read(path), int(n_launches)


def send_stage_profile(job: StoreJob, profile: Profile, n_launches: int) -> None:
    """Post a stage's swept profile for rank 0 (from the stage's first rank, not rank 0)."""
    job.put_bytes(_KEY, profile_bytes(profile, n_launches))


def send_stage_failure(job: StoreJob, error: str) -> None:
    """Post, in place of a stage's profile, why it could not be built (rank 0 fails with it)."""
    job.put_bytes(_KEY, _FAILED + error.encode())


def gather_stage_profiles(
    job: StoreJob, own: Profile, own_launches: int
) -> tuple[list[Profile], list[int]]:
    """Rank 0: return every stage's profile and operators launched, stage 0 (its own) first.

    Raises
    ------
    DistributedError
        When a stage's first rank left the job or posted nothing in time (as an exchange).
    OpdvfsError
        When a stage's first rank could not build its profile (its line).
    """
    assert job.view is not None, "the ranks' sequences are compared first"
    profiles, launches = [own], [own_launches]
    for rank in job.view.stage_leads[1:]:
        data = job.take_bytes(_KEY, rank)
        if data.startswith(_FAILED):
            raise OpdvfsError(f"stage of rank {rank} not profiled: {data[len(_FAILED) :].decode()}")
        profile, n = profile_from_bytes(data)
        profiles.append(profile)
        launches.append(n)
    return profiles, launches


def plan_stages(
    profiles: Sequence[Profile],
    n_launches: Sequence[int],
    budget: float,
    *,
    rank_map: Sequence[int],
    time_limit_s: float | None = None,
) -> PipelineSchedule:
    """Plan every stage together at ``budget`` (``plan --pipeline ranks``), on the launches.

    Each stage's schedule, planned on its profile's kernels, is re-indexed onto the operators
    its ranks count per iteration (``n_launches``); ``rank_map`` (the stage of every rank) goes
    into the file, so each rank finds its own. The messages' recorded peers (job ranks) are
    planned as the stages those ranks run.
    """
    from opdvfs.plan.on_profile import within_profiled
    from opdvfs.plan.ranks import plan_ranks

    plan = plan_ranks(
        [_peers_as_stages(p, rank_map) for p in profiles],
        budget,
        sources=[f"stage{s}" for s in range(len(profiles))],
        spec=within_profiled(profiles[0]),  # (every stage swept the same clocks)
        time_limit_s=time_limit_s,
    )
    stages = tuple(
        on_launches(schedule, np.sort(profile.ops["op"].unique()), n)
        for schedule, profile, n in zip(plan.schedule.stages, profiles, n_launches, strict=True)
    )
    return plan.schedule.model_copy(update={"stages": stages, "rank_map": tuple(rank_map)})


def _peers_as_stages(profile: Profile, rank_map: Sequence[int]) -> Profile:
    """Return ``profile`` with its messages' peers (job ranks) as the stages they run."""
    ops = profile.ops
    if "peer" not in ops:
        return profile
    peer = ops["peer"].to_numpy(dtype=np.int64)
    stage_of = np.asarray(rank_map, dtype=np.int64)
    known = (peer >= 0) & (peer < len(stage_of))
    if not known.any():
        return profile
    ops = ops.assign(peer=np.where(known, stage_of[np.where(known, peer, 0)], peer))
    return Profile(ops, profile.samples, meta=profile.meta)
