"""Two CPU ranks on gloo: rank 0's schedule reaches rank 1 intact (needs torch)."""

import os
import socket

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from opdvfs import Schedule  # noqa: E402
from opdvfs.exceptions import DistributedError  # noqa: E402
from opdvfs.runtime.actuators import DryRunActuator  # noqa: E402
from opdvfs.runtime.dispatch import ScheduleExecutor  # noqa: E402
from opdvfs.runtime.distributed import (  # noqa: E402
    broadcast_schedule,
    share_schedule_on_group_init,
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, path: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        mine = Schedule.read(path) if rank == 0 else None
        got = broadcast_schedule(mine)
        with open(f"{out}.{rank}", "w") as fh:
            fh.write(got.to_json())
    finally:
        dist.destroy_process_group()


def test_rank0_schedule_reaches_every_rank(tmp_path):
    plan = Schedule.from_stage_freqs(
        [0, 10, 20],
        [1410.0, 1005.0, 1410.0],
        n_ops=30,
        target=0.02,
        solver="dp",
        device="a100-like",
    )
    path = tmp_path / "s.json"
    plan.write(path)
    out = tmp_path / "got"
    mp.spawn(_rank, args=(_free_port(), str(path), str(out)), nprocs=2, join=True)
    for rank in (0, 1):
        assert Schedule.from_json((tmp_path / f"got.{rank}").read_text()) == plan


def test_single_process_is_the_identity():
    plan = Schedule.from_stage_freqs([0], [1410.0], n_ops=5, target=0.0, solver="dp")
    assert broadcast_schedule(plan) is plan
    with pytest.raises(DistributedError, match="no schedule"):
        broadcast_schedule(None)


def test_the_schedule_arrives_when_the_script_makes_its_group(tmp_path):
    plan = Schedule.from_stage_freqs([0, 2], [1410.0, 1005.0], n_ops=5, target=0.0, solver="dp")
    executor = ScheduleExecutor(None, DryRunActuator([1005.0, 1410.0]))
    original = dist.init_process_group
    with share_schedule_on_group_init(executor, plan):
        assert executor.schedule is None  # nothing before the group exists
        # what the user's script calls, looked up on torch.distributed as a script does
        torch.distributed.init_process_group(
            "gloo", rank=0, world_size=1, init_method=f"file://{tmp_path / 'store'}"
        )
        try:
            assert executor.schedule == plan
        finally:
            dist.destroy_process_group()
    assert dist.init_process_group is original


def test_the_hook_is_undone_however_the_block_ends():
    original = dist.init_process_group
    executor = ScheduleExecutor(None, DryRunActuator([1410.0]))

    def crashing_script() -> None:
        with share_schedule_on_group_init(executor, None):
            assert dist.init_process_group is not original
            raise RuntimeError("script crashed")

    with pytest.raises(RuntimeError, match="script crashed"):
        crashing_script()
    assert dist.init_process_group is original
