"""Jobs of many GPUs: 2 ranks on a fake 4-GPU node, 2 nodes x 2 ranks, a killed rank (#32).

The tests that start processes (torch.multiprocessing, two torchrun agents) are slow; the rank
exchange's bounded waits are tested in this process on a real TCPStore.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pynvml")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from fake_nvml_node import FakeNode  # noqa: E402
from opdvfs.runtime.distributed import StoreJob  # noqa: E402

from conftest import read_log  # noqa: E402

TESTS = Path(__file__).parent
SRC = TESTS.parent / "src"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------- no store read waits for ever
def _job(store, rank: int, world: int, timeout_s: float) -> StoreJob:
    """A StoreJob on ``store`` without a process group (the exchange alone)."""
    return StoreJob(timeout_s, store=store, rank=rank, world_size=world)


def test_a_rank_that_never_comes_is_given_up_on_after_the_timeout():
    from opdvfs.exceptions import DistributedError

    store = dist.TCPStore("127.0.0.1", _free_port(), 2, True, wait_for_workers=False)
    job = _job(store, 0, 2, timeout_s=1.0)
    with pytest.raises(DistributedError, match=r"rank 1 did not end its iteration within 1 s"):
        job.iteration(1.0, 2.0, False)


def test_a_rank_that_left_ends_the_others_wait_at_once():
    import threading

    from opdvfs.exceptions import DistributedError

    store = dist.TCPStore("127.0.0.1", _free_port(), 3, True, wait_for_workers=False)
    waiting = _job(store, 0, 3, timeout_s=600.0)  # a wait this long would hang the test
    threading.Timer(0.2, _job(store, 2, 3, timeout_s=600.0).leave).start()
    with pytest.raises(DistributedError, match="1 rank.s. left the job .* waited for rank 1"):
        waiting.iteration(1.0, 2.0, False)


def test_a_long_wait_for_a_rank_logs_no_store_timeout(capfd):
    """A rank waiting 0.8 s for another's figures: no c10d "waitForInput ... timed out" line.

    torch's TCPStore client writes one pair of such lines to stderr (fd 2, from C++) at every
    expiry of a store wait with a timeout; the exchange used to wait in 0.5 s slices.
    """
    import threading

    store = dist.TCPStore("127.0.0.1", _free_port(), 2, True, wait_for_workers=False)
    waiting, late = _job(store, 0, 2, timeout_s=600.0), _job(store, 1, 2, timeout_s=600.0)
    timer = threading.Timer(0.8, late._post, args=(json.dumps([3.0, 4.0, True]),))
    timer.start()
    capfd.readouterr()
    assert waiting.iteration(1.0, 2.0, False) == (3.0, 6.0, True)
    timer.join()
    err = capfd.readouterr().err
    assert "waitForInput" not in err and "timed out" not in err, err


def test_a_signal_ends_a_wait_for_a_rank_at_once_and_its_helper_thread():
    """The wait runs in a helper thread: a signal's exception reaches the waiting thread at
    once (a wait in the store would hold it off until the wait ended), and the key the helper
    waits for is written (the wake-up) so that the helper ends too."""
    import threading

    from opdvfs.runtime.distributed import _WAKE

    class Stop(Exception):
        pass

    def stop(signum, frame):
        raise Stop

    store = dist.TCPStore("127.0.0.1", _free_port(), 2, True, wait_for_workers=False)
    waiting = _job(store, 0, 2, timeout_s=600.0)  # a wait this long would hang the test
    before = signal.signal(signal.SIGUSR1, stop)
    try:
        threading.Timer(0.3, os.kill, args=(os.getpid(), signal.SIGUSR1)).start()
        with pytest.raises(Stop):
            waiting.iteration(1.0, 2.0, False)
    finally:
        signal.signal(signal.SIGUSR1, before)
    helpers = [t for t in threading.enumerate() if t.name == "opdvfs-store-wait"]
    for t in helpers:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in helpers)
    assert waiting.store.get("0/1") == _WAKE.encode()  # rank 1's key: the wake-up
    # a rank that reads it gives up as after a departure
    from opdvfs.exceptions import DistributedError

    with pytest.raises(DistributedError, match="a rank left the job .* waited for rank 1"):
        _job(store, 0, 2, timeout_s=600.0).iteration(1.0, 2.0, False)


def test_the_timeout_is_read_from_the_environment(monkeypatch):
    from opdvfs.exceptions import DistributedError
    from opdvfs.runtime.distributed import RANK_TIMEOUT_S, rank_timeout_s

    assert rank_timeout_s({}) == RANK_TIMEOUT_S
    assert rank_timeout_s({"OPDVFS_RANK_TIMEOUT_S": "2.5"}) == 2.5
    for bad in ("0", "-1", "soon", "inf"):
        with pytest.raises(DistributedError, match="OPDVFS_RANK_TIMEOUT_S"):
            rank_timeout_s({"OPDVFS_RANK_TIMEOUT_S": bad})


# ---------------------------------------------------- a 2-rank job on the fake 4-GPU node


def _rank_on_node(rank: int, port: int, state: str) -> None:
    """One rank of a data-parallel job tuning through nvml on the fake node's GPUs 2 and 3."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE="2",
        CUDA_VISIBLE_DEVICES="2,3",
    )
    torch.set_num_threads(1)
    sys.path.insert(0, str(TESTS))
    import opdvfs

    from tiny_gpt import TinyGPT

    with FakeNode.load(Path(state)).patched():
        context = opdvfs.tune(
            0.02,
            actuator="nvml",
            clocks=[1410.0, 1005.0],
            iterations_per_clock=1,
            block=2,
            pairs=1,
            rounds=1,
            cache=False,
        )
        torch.manual_seed(rank)
        model = TinyGPT()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        with context:
            dist.init_process_group("gloo", rank=rank, world_size=2)
            try:
                for _ in range(12):
                    model(torch.randint(0, 64, (2, 16))).sum().backward()
                    opt.step()
            finally:
                dist.destroy_process_group()
        result = context.result
    Path(state).with_name(f"result.rank{rank}.json").write_text(json.dumps(result.to_dict()))


@pytest.mark.slow
def test_a_two_rank_job_drives_only_its_visible_gpus_each_rank_its_own(tmp_path):
    node = FakeNode.four_gpus(tmp_path / "node.json")
    node.hold(0, 1005, "another job")  # GPU 0 is another job's: it must stay so
    before = node.locked()
    mp.spawn(_rank_on_node, args=(_free_port(), str(node.path)), nprocs=2, join=True)
    writes = node.writes()
    assert writes, "no rank set a clock"
    for rank in (0, 1):
        mine = [(fn, gpu) for fn, gpu, r in writes if r == rank]
        assert {gpu for _, gpu in mine} == {2 + rank}, (rank, mine)  # its own GPU, only
        assert mine[0] == ("nvmlDeviceSetGpuLockedClocks", 2 + rank)
        assert mine[-1] == ("nvmlDeviceResetGpuLockedClocks", 2 + rank)  # restored last
        sets = [
            c["args"]
            for c in node.calls
            if c["rank"] == rank and c["fn"] == "nvmlDeviceSetGpuLockedClocks"
        ]
        assert [1005, 1005] in sets, sets  # the sweep went below the top on this GPU
    # every GPU ends as it began; GPUs 0 and 1 were only listed (UUIDs matched), never touched
    assert node.locked() == before and node.holders()[0] == "another job"
    assert {c["gpu"] for c in node.calls if c["fn"] != "nvmlDeviceGetUUID"} == {2, 3}
    results = [json.loads((tmp_path / f"result.rank{r}.json").read_text()) for r in (0, 1)]
    assert results[0]["world_size"] == 2


# ------------------------------------------------------------------ 2 nodes x 2 ranks


#: The clocks the sweep profiles: auto's (the top, ~7.5% and ~15% below it, mid and min); with
#: only 1410,1380,210 the models filled the clocks between 1380 and 210, and a plan missed the
#: 2% target by up to 3 points in 3 of 7 runs here (a planning matter: the ranks were alike).
CLOCKS = "auto"


def _two_nodes(
    tmp_path: Path, steps: int, kill_at: str = "-1", *, all_reduce: bool = True, env=None
):
    """Two torchrun agents on this machine, 2 ranks each, c10d rendezvous on 127.0.0.1."""
    script = TESTS / "train_dp.py"  # its ranks all-reduce their gradients (or only share the group)
    port = _free_port()
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *("--nnodes", "2", "--nproc-per-node", "2", "--max-restarts", "0"),
        *("--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"),
        *("--rdzv-id", f"opdvfs-test-{port}"),
        *("-m", "opdvfs", "tune", "--target", "0.02", "--actuator", "sim:a100-like"),
        *("--work-scale", "1e6", "--clocks", CLOCKS, "--iterations-per-clock", "1"),
        *("--block", "2", "--pairs", "2", "--rounds", "2", "--no-cache"),
        *("--out", str(tmp_path / "out"), "--log-file", str(tmp_path / "calls.jsonl")),
        *("--", "python", str(script), str(steps), "-1", kill_at, str(int(all_reduce))),
    ]
    run_env = {
        **os.environ,
        "PYTHONPATH": str(SRC),
        "PYTHONWARNINGS": "ignore",
        "OMP_NUM_THREADS": "1",
        **(env or {}),
    }
    agents = [
        subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=run_env,
            cwd=tmp_path,
            start_new_session=True,
        )
        for _ in range(2)
    ]
    out = []
    try:
        for agent in agents:
            stdout, stderr = agent.communicate(timeout=400)
            out.append((agent.returncode, stdout, stderr))
    finally:
        for agent in agents:
            if agent.poll() is None:  # a hung job: end the agent's whole group, then fail
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()
    return out


@pytest.mark.slow
def test_two_nodes_of_two_ranks_tune_as_one_job(tmp_path):
    out = _two_nodes(tmp_path, 40)
    for code, stdout, stderr in out:
        assert code == 0, stdout + stderr
    summary = "".join(stdout for _, stdout, _ in out)
    assert summary.count("tuned on sim:a100-like") == 1 and "a job of 4 ranks" in summary
    result = json.loads((tmp_path / "out" / "tune.json").read_text())
    assert result["world_size"] == 4 and result["same_sequence"] is True and result["met"]
    its = result["per_iteration"]
    for it in its:  # the job's time: the slowest rank's; its energy: every GPU's
        assert len(it["ranks_time_s"]) == len(it["ranks_energy_j"]) == 4
        assert it["time_s"] == max(it["ranks_time_s"])
        assert it["energy_j"] == pytest.approx(sum(it["ranks_energy_j"]))

    # each GPU saved energy: its own tuned iterations against its own reference ones
    def mean(phase: str, rank: int) -> float:
        picked = [it["ranks_energy_j"][rank] for it in its if it["phase"] == phase]
        assert picked, phase
        return sum(picked) / len(picked)

    for rank in range(4):
        assert mean("tuned", rank) < 0.97 * mean("reference", rank), rank
    # every rank applied the plan's clocks and restored its GPU once, last
    plan = json.loads((tmp_path / "out" / "schedule.json").read_text())
    planned = {stage["freq_mhz"] for stage in plan["stages"]}
    for rank in range(4):
        calls = read_log(tmp_path / f"calls.rank{rank}.jsonl")
        kinds = [c["kind"] for c in calls]
        assert kinds[-1] == "restore" and kinds.count("restore") == 1, (rank, kinds[-3:])
        assert planned <= {c["freq_mhz"] for c in calls if c["kind"] == "set"}, rank


@pytest.mark.slow
@pytest.mark.parametrize("all_reduce", [True, False], ids=["collectives", "no-collectives"])
def test_a_killed_rank_ends_the_job_and_every_other_gpu_is_restored(tmp_path, all_reduce):
    """Rank 3 SIGKILLs itself: its agent stops rank 2 (SIGTERM), ranks 0 and 1 stop waiting.

    With collectives, gloo fails them at once; without, rank 2 says it left and ranks 0 and 1
    give up on the exchange within a poll (0.5 s) instead of the store's 30 min.
    """
    out = _two_nodes(
        tmp_path, 30, "12", all_reduce=all_reduce, env={"OPDVFS_RANK_TIMEOUT_S": "120"}
    )
    assert all(code != 0 for code, _, _ in out), [c for c, _, _ in out]
    killed_at = float(
        next(
            line for _, stdout, _ in out for line in stdout.splitlines() if "killed at" in line
        ).split()[-1]
    )
    for rank in range(3):
        calls = read_log(tmp_path / f"calls.rank{rank}.jsonl")
        kinds = [c["kind"] for c in calls]
        assert kinds[-1] == "restore" and kinds.count("restore") == 1, (rank, kinds[-3:])
        # restored long before the exchange's timeout: nobody waited it out
        assert calls[-1]["t_s"] - killed_at < 60, (rank, calls[-1]["t_s"] - killed_at)
    if not all_reduce:
        errors = "".join(stderr for _, _, stderr in out)
        assert "left the job" in errors and "did not end its iteration" not in errors, errors


def test_a_bad_rank_timeout_is_one_line_before_the_script_runs(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from opdvfs.cli import app

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("OPDVFS_RANK_TIMEOUT_S", "soon")
    script = tmp_path / "train.py"
    script.write_text("print('the script ran')\n")
    argv = ["tune", "--target", "0.02", "--actuator", "sim:a100-like", "--out", str(tmp_path / "o")]
    res = CliRunner().invoke(app, [*argv, "--", "python", str(script)])
    assert res.exit_code == 2 and "the script ran" not in res.stdout, res.output
    assert res.stderr.strip() == (
        "opdvfs: error: OPDVFS_RANK_TIMEOUT_S='soon': expected seconds > 0"
    ), res.stderr
