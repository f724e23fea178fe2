"""tune's pipeline stages: every stage profiled, planned together, each rank its stage's schedule.

When the ranks of a torchrun job run different operator sequences (pipeline stages; the groups of
:class:`~opdvfs.runtime.distributed.JobView`, stage ``s`` the ``s``-th group by its first rank),
every rank follows rank 0's clock through the sweep, and the first rank of each stage builds its
profile of the swept iterations (on a simulated GPU: :func:`~opdvfs.runtime.sweep.sim_profile`;
off it, from its own torch.profiler trace of the sweep:
:meth:`~opdvfs.tuner.drive.DeviceDrive.build_stage_profile`, and each stage's plan applies by
time).
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
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from opdvfs.exceptions import OpdvfsError, ValidationError
from opdvfs.profile import Profile
from opdvfs.schedule import PipelineSchedule, Schedule, on_launches

if TYPE_CHECKING:
    from opdvfs.devices.spec import DeviceSpec
    from opdvfs.runtime.distributed import StoreJob

__all__ = [
    "gather_stage_profiles",
    "job_saving",
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
_BY_TIME = 2**64 - 1  # no operators counted: a plan applied by time (off the simulated GPU)


def profile_bytes(profile: Profile, n_launches: int | None) -> bytes:
    """Return ``profile`` (its two Parquet files) and its operators launched, as bytes.

    ``n_launches`` None: the stage's plan applies by time, on the profile's operators.
    """
    with tempfile.TemporaryDirectory(prefix="opdvfs-stage-") as tmp:
        path = Path(tmp) / "p.parquet"
        profile.write(path)
        ops = path.read_bytes()
        samples_path = Path(tmp) / "p.samples.parquet"
        samples = samples_path.read_bytes() if samples_path.exists() else b""
    n = _BY_TIME if n_launches is None else n_launches
    return _HEADER.pack(n, len(ops), len(samples)) + ops + samples


def profile_from_bytes(data: bytes) -> tuple[Profile, int | None]:
    """Return the profile and operators launched :func:`profile_bytes` packed."""
    n_launches, n_ops, n_samples = _HEADER.unpack_from(data)
    body = memoryview(data)[_HEADER.size :]
    with tempfile.TemporaryDirectory(prefix="opdvfs-stage-") as tmp:
        path = Path(tmp) / "p.parquet"
        path.write_bytes(body[:n_ops])
        if n_samples:
            (Path(tmp) / "p.samples.parquet").write_bytes(body[n_ops : n_ops + n_samples])
        return Profile.read(path), None if n_launches == _BY_TIME else int(n_launches)


def send_stage_profile(job: StoreJob, profile: Profile, n_launches: int | None) -> None:
    """Post a stage's swept profile for rank 0 (from the stage's first rank, not rank 0)."""
    job.put_bytes(_KEY, profile_bytes(profile, n_launches))


def send_stage_failure(job: StoreJob, error: str) -> None:
    """Post, in place of a stage's profile, why it could not be built (rank 0 fails with it)."""
    job.put_bytes(_KEY, _FAILED + error.encode())


def gather_stage_profiles(
    job: StoreJob,
    own: Profile,
    own_launches: int | None,
    *,
    stop: Callable[[], bool] | None = None,
) -> tuple[list[Profile], list[int | None]] | None:
    """Rank 0: return every stage's profile and operators launched, stage 0 (its own) first.

    ``stop``: from another thread than the one that exchanges each iteration (rank 0's
    planning thread, off the simulated GPU), each profile is awaited by looking, not waiting
    in the store (:meth:`~opdvfs.runtime.distributed.StoreJob.await_bytes`); None is
    returned once ``stop()`` says the run ended.

    Raises
    ------
    DistributedError
        When a stage's first rank left the job or posted nothing in time (as an exchange).
    OpdvfsError
        When a stage's first rank could not build its profile (its line).
    """
    assert job.view is not None, "the ranks' sequences are compared first"
    profiles: list[Profile] = [own]
    launches: list[int | None] = [own_launches]
    for rank in job.view.stage_leads[1:]:
        if stop is not None and not job.await_bytes(_KEY, rank, stop=stop):
            return None
        data = job.take_bytes(_KEY, rank)
        if data.startswith(_FAILED):
            raise OpdvfsError(f"stage of rank {rank} not profiled: {data[len(_FAILED) :].decode()}")
        profile, n = profile_from_bytes(data)
        profiles.append(profile)
        launches.append(n)
    return profiles, launches


def plan_stages(
    profiles: Sequence[Profile],
    n_launches: Sequence[int | None],
    budget: float,
    *,
    rank_map: Sequence[int],
    time_limit_s: float | None = None,
    iteration_s: float | None = None,
    spec: DeviceSpec | None = None,
) -> PipelineSchedule:
    """Plan every stage together at ``budget`` (``plan --pipeline ranks``), on the launches.

    Each stage's schedule, planned on its profile's kernels, is re-indexed onto the operators
    its ranks count per iteration (``n_launches``; None: off the simulated GPU, where the plan
    applies by time on the traced operators it was planned on); ``rank_map`` (the stage of
    every rank) goes into the file, so each rank finds its own. The messages' recorded peers
    (job ranks) are planned as the stages those ranks run; a traced profile has none
    (torch.profiler's trace names no peer), and the stages are then a linear pipeline
    (:func:`~opdvfs.plan.ranks.plan_ranks`'s rule).

    ``iteration_s``: the job's measured iteration at the top clock (s), for the stages applied
    by time: their planned times are their operators' alone, and the host's share of a step
    (the ranks' exchange, Python) is not in them, so each such stage's timing is stretched to
    it (:func:`_on_iteration`), as the time-anchored executor scales its offsets to each
    iteration's length, which must stay within its tolerance of the planned one.

    ``spec``: the clocks to plan on (:func:`~opdvfs.tuner.policy.clock_grid`: a real GPU's
    supported clocks within the swept range); None: the swept range of the simulated GPU's
    preset (:func:`~opdvfs.plan.on_profile.within_profiled`), else the swept clocks alone.
    """
    from opdvfs.plan.on_profile import within_profiled
    from opdvfs.plan.ranks import plan_ranks

    inputs = [_peers_as_stages(p, rank_map) for p in profiles]
    sources = [f"stage{s}" for s in range(len(profiles))]
    if spec is None:
        spec = within_profiled(profiles[0])  # (every stage swept the same clocks)
    try:
        plan = plan_ranks(inputs, budget, sources=sources, spec=spec, time_limit_s=time_limit_s)
    except ValidationError as exc:
        if not any(_messages(p).any() for p in inputs) or any("peer" in p.ops for p in inputs):
            raise
        # traced profiles: their messages name no peer and cannot be matched (a middle stage's
        # with no direction hint, NCCL's one SendRecv kernel): each stage on its own operators
        warnings.warn(
            f"opdvfs: the stages' traced messages cannot be matched ({exc}): each stage is "
            "planned on its own operators, its messages local to it",
            stacklevel=2,
        )
        local = [_messages_local(p) for p in inputs]
        plan = plan_ranks(local, budget, sources=sources, spec=spec, time_limit_s=time_limit_s)
    stages = tuple(
        schedule if n is None else on_launches(schedule, np.sort(profile.ops["op"].unique()), n)
        for schedule, profile, n in zip(plan.schedule.stages, profiles, n_launches, strict=True)
    )
    if iteration_s is not None:
        stages = tuple(
            _on_iteration(st, iteration_s) if n is None else st
            for st, n in zip(stages, n_launches, strict=True)
        )
    return plan.schedule.model_copy(update={"stages": stages, "rank_map": tuple(rank_map)})


def job_saving(pipeline: PipelineSchedule) -> float | None:
    """Return the job's predicted energy saving against the top clock (0.2: 20% saved).

    What the A/B blocks measure: every rank's energy together, each rank's its stage's
    (``rank_map``; without one, each stage once). A stage's own schedule predicts its rank's
    alone: rank 0's stage's saving is not the job's (the 2-stage toy's rank 0 predicted 27.5%,
    the job 24.4%). None where a stage has no energy figures.
    """
    stages = pipeline.stages
    ranks = pipeline.rank_map if pipeline.rank_map is not None else range(len(stages))
    base = planned = 0.0
    for s in ranks:
        b, p = stages[s].baseline_energy_j, stages[s].predicted_energy_j
        if b is None or p is None:
            return None
        base, planned = base + b, planned + p
    return 1 - planned / base if base > 0 else None


def _on_iteration(schedule: Schedule, iteration_s: float) -> Schedule:
    """Return ``schedule`` with its times stretched: its top-clock iteration to ``iteration_s``.

    (Its stages' start times, its baseline and predicted times, by one factor; unchanged when
    its baseline is not shorter.)
    """
    top_s = schedule.baseline_time_s or schedule.predicted_time_s
    if not top_s or iteration_s <= top_s:
        return schedule
    scale = iteration_s / top_s
    stages = tuple(
        st if st.start_s is None else st.model_copy(update={"start_s": st.start_s * scale})
        for st in schedule.stages
    )
    times = {
        k: getattr(schedule, k) * scale
        for k in ("baseline_time_s", "predicted_time_s")
        if getattr(schedule, k) is not None
    }
    return schedule.model_copy(update={"stages": stages, **times})


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


def _messages(profile: Profile) -> np.ndarray:
    """Return which operators are sends or receives (their type, else name, says so)."""
    ops = profile.ops
    types = ops["type" if "type" in ops else "name"].astype("string")
    send = types.str.contains("send", case=False, regex=False)
    recv = types.str.contains("recv", case=False, regex=False)
    return (send | recv).to_numpy(dtype=bool)


def _messages_local(profile: Profile) -> Profile:
    """Return ``profile`` with its sends and receives as operators of its own stage alone."""
    hit = _messages(profile)
    if not hit.any():
        return profile
    types = profile.ops["type"] if "type" in profile.ops else profile.ops["name"]
    ops = profile.ops.assign(type=np.where(hit, "message", types.astype(str).to_numpy()))
    return Profile(ops, profile.samples, meta=profile.meta)
