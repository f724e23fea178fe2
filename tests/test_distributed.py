"""Two CPU ranks on gloo: rank 0's schedule reaches rank 1 intact (needs torch)."""

import os
import socket

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from opdvfs import Schedule  # noqa: E402
from opdvfs.runtime.distributed import broadcast_schedule  # noqa: E402


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
    with pytest.raises(ValueError, match="no schedule"):
        broadcast_schedule(None)
