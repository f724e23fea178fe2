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
    JobView,
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


@pytest.mark.slow  # two ranks, spawned
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


def test_job_view_groups_the_ranks_by_operator_sequence():
    # ranks 0 and 1 run one sequence (data parallel), rank 2 another (a pipeline stage)
    view = JobView(2, 3, ("gpt-stage-a", "gpt-stage-a", "gpt-stage-b"))
    assert not view.same_sequence
    assert view.groups == {"gpt-stage-a": [0, 1], "gpt-stage-b": [2]}
    alone = JobView(0, 1, ("k",))
    assert alone.same_sequence and alone.groups == {"k": [0]}


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


PIPELINE_SCRIPT = """
import sys
import time
import torch
import torch.distributed as dist

# a toy 2-stage pipeline (GPipe: both forwards, then both backwards), activations and
# gradients over send/recv; rank r runs stage r. Each instruction also takes 80 ms, so that
# iterations last about as planned (0.33 s: the ranks' sleeps overlap) and --trigger time
# applies the plan.
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
stage = torch.nn.Linear(16, 16)
opt = torch.optim.SGD(stage.parameters(), lr=0.01)
for step in range(int(sys.argv[1])):
    opt.zero_grad()
    outs, ins = [], []
    for m in range(2):
        time.sleep(0.08)
        if rank == 0:
            y = stage(torch.randn(8, 16))
            dist.send(y.detach(), 1)
            outs.append(y)
        else:
            x = torch.empty(8, 16)
            dist.recv(x, 0)
            x.requires_grad_()
            ins.append(x)
            outs.append(stage(x).square().mean())
    for m in range(2):
        time.sleep(0.08)
        if rank == 0:
            grad = torch.empty(8, 16)
            dist.recv(grad, 1)
            outs[m].backward(grad)
        else:
            outs[m].backward()
            dist.send(ins[m].grad, 0)
    opt.step()
dist.barrier()
dist.destroy_process_group()
"""


def _stage_schedule(freqs, starts):
    """One stage's 4 instructions (F0 F1 B0 B1), a clock and a planned start each."""
    return Schedule.from_stage_freqs(
        [0, 1, 2, 3],
        freqs,
        n_ops=4,
        start_s=starts,
        target=0.0,
        solver="dag",
        predicted_time_s=0.33,
    )


@pytest.mark.slow  # torchrun
def test_torchrun_gives_each_pipeline_rank_its_own_schedule(tmp_path):
    import subprocess

    from opdvfs.schedule import PipelineSchedule

    from conftest import read_log, torchrun_opdvfs

    # clocks only stage 0 uses, and clocks only stage 1 uses
    mine = {0: [1410.0, 1005.0, 1200.0, 1095.0], 1: [1350.0, 960.0, 1305.0, 915.0]}
    pipe = PipelineSchedule(
        stages=(
            # about the toy pipeline's own timeline
            _stage_schedule(mine[0], [0.0, 0.055, 0.22, 0.275]),
            _stage_schedule(mine[1], [0.055, 0.11, 0.165, 0.22]),
        ),
        pipeline="gpipe",
        n_microbatches=2,
        target=0.0,
        solver="dag",
    )
    path = tmp_path / "pipe.json"
    pipe.write(path)
    script = tmp_path / "pipe_train.py"
    script.write_text(PIPELINE_SCRIPT)
    log = tmp_path / "calls.jsonl"
    proc = subprocess.run(
        torchrun_opdvfs(
            2,
            "run",
            str(path),
            "--actuator",
            "dry-run",
            "--trigger",
            "time",  # a pipeline stage's operators are its instructions, not aten ops
            "--log-file",
            str(log),
            "--",
            "python",
            str(script),
            "6",
        ),
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        timeout=240,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in (0, 1):
        calls = read_log(tmp_path / f"calls.rank{rank}.jsonl")
        header = [c for c in calls if c.get("kind") == "header" or "command" in c]
        assert header and header[0].get("pipeline_stage") == rank, calls[:2]
        sets = {c["freq_mhz"] for c in calls if c.get("kind") == "set"}
        # every clock of its own stage was set, and none of the other stage's
        assert set(mine[rank]) - {1410.0} <= sets, (rank, sets)
        assert not sets & set(mine[1 - rank]), (rank, sets)
