"""Every GPU of a node: each process drives its own, NVML answers as a real driver (#32).

The GPU a process drives is its CUDA device, matched to NVML by UUID through
``CUDA_VISIBLE_DEVICES`` (:func:`opdvfs.runtime.gpu_select.select_gpu`, tested as the pure
function it is); the actuators, the meter, the sampler and zeusd use that GPU; against
:class:`fake_nvml_node.FakeNode`, a 4-GPU node whose NVML refuses what the real one refuses,
each refusal is one line and exit status 2 with every clock as it was.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pynvml")

from typer.testing import CliRunner

from fake_nvml_node import FakeGpu, FakeNode, gpu_uuid, mig_uuid
from opdvfs.exceptions import DeviceNotFoundError, ValidationError
from opdvfs.runtime.gpu_select import GpuChoice, select_gpu

NODE = [(i, gpu_uuid(i)) for i in range(4)]


# ------------------------------------------------------------------- the choice, a pure function
@pytest.mark.parametrize(
    ("env", "cuda_device", "expected"),
    [
        ({}, None, 0),  # alone: CUDA device 0, every GPU visible
        ({"LOCAL_RANK": "3"}, None, 3),  # torchrun, before the script sets its device
        ({"LOCAL_RANK": "3"}, 1, 1),  # the script set device 1: CUDA's word wins
        ({"CUDA_VISIBLE_DEVICES": "2,3", "LOCAL_RANK": "1"}, None, 3),
        ({"CUDA_VISIBLE_DEVICES": "3,2", "LOCAL_RANK": "0"}, None, 3),  # CUDA's order
        ({"CUDA_VISIBLE_DEVICES": f"{gpu_uuid(2)},{gpu_uuid(1)}"}, 1, 1),  # full UUIDs
        ({"CUDA_VISIBLE_DEVICES": "GPU-00000002"}, None, 2),  # a unique UUID prefix
        ({"CUDA_VISIBLE_DEVICES": " 1 , 2 "}, 1, 2),  # spaces, as CUDA allows
    ],
)
def test_the_gpu_is_the_cuda_device_through_cuda_visible_devices(env, cuda_device, expected):
    choice = select_gpu(env, cuda_device, NODE)
    assert (choice.index, choice.uuid) == NODE[expected]
    assert not choice.mig and choice.label == f"GPU {expected} ({gpu_uuid(expected)})"


def test_torchs_uuid_names_the_gpu_whatever_the_order():
    # CUDA_DEVICE_ORDER=FASTEST_FIRST on a mixed node: CUDA's device 0 is NVML's GPU 3
    choice = select_gpu({}, 0, NODE, cuda_uuid=gpu_uuid(3))
    assert choice.index == 3 and "UUID" in choice.reason


def test_a_mig_instance_is_chosen_by_its_uuid_and_says_so():
    mig = mig_uuid(1, 0)
    choice = select_gpu({"CUDA_VISIBLE_DEVICES": mig}, None, NODE)
    assert choice == GpuChoice(None, mig, choice.reason) and choice.mig
    assert choice.label == f"MIG instance {mig}"


@pytest.mark.parametrize(
    ("override", "env", "expected"),
    [
        ("2", {}, 2),
        (gpu_uuid(1), {"CUDA_VISIBLE_DEVICES": "3"}, 1),  # --gpu is NVML's, not CUDA's
        ("GPU-00000003", {}, 3),
        ("2,0", {"LOCAL_RANK": "1"}, 0),  # one per local rank
    ],
)
def test_gpu_overrides(override, env, expected):
    choice = select_gpu(env, 1, NODE, override=override)
    assert choice.index == expected and choice.reason.startswith(f"--gpu {override}")


@pytest.mark.parametrize(
    ("env", "override", "needle"),
    [
        ({"CUDA_VISIBLE_DEVICES": "2,3", "LOCAL_RANK": "2"}, None, "makes 2 visible"),
        ({"CUDA_VISIBLE_DEVICES": "2,x,3", "LOCAL_RANK": "1"}, None, "makes 1 visible"),
        ({"CUDA_VISIBLE_DEVICES": "", "LOCAL_RANK": "0"}, None, "makes 0 visible"),
        ({"CUDA_VISIBLE_DEVICES": "-1"}, None, "makes 0 visible"),
        ({"LOCAL_RANK": "one"}, None, "LOCAL_RANK='one': expected a rank"),
        ({}, "7", "--gpu 7: no such GPU"),
        ({}, "GPU-0000000", "--gpu GPU-0000000: no such GPU"),  # a prefix of every UUID
        ({"LOCAL_RANK": "2"}, "0,1", "give one per local rank"),
    ],
)
def test_no_such_gpu_is_one_line(env, override, needle):
    with pytest.raises(ValidationError, match=needle) as info:
        select_gpu(env, None, NODE, override=override)
    assert "\n" not in str(info.value)


def test_no_gpu_at_all():
    with pytest.raises(DeviceNotFoundError, match="NVML lists no GPU"):
        select_gpu({}, None, [])


# ------------------------------------------------------------------- on the fake 4-GPU node
@pytest.fixture
def node(tmp_path, monkeypatch):
    """A 4-GPU node: GPU 1 cannot lock clocks (pre-Volta), GPU 3 has a MIG instance."""
    gpus = [FakeGpu(i, gpu_uuid(i)) for i in range(4)]
    gpus[1].can_lock = False
    gpus[1].name = "Tesla P100-PCIE-16GB"
    gpus[3].migs = [mig_uuid(3, 0)]
    for name in ("CUDA_VISIBLE_DEVICES", "LOCAL_RANK", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    made = FakeNode(tmp_path / "node.json", gpus)
    with made.patched():
        yield made


def test_each_local_rank_drives_and_measures_its_own_gpu(node, monkeypatch):
    from opdvfs.runtime.actuators import ClockGuard, make_actuator
    from opdvfs.runtime.sampler import NvmlSampler

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    for local in (0, 1):
        monkeypatch.setenv("LOCAL_RANK", str(local))
        monkeypatch.setenv("RANK", str(local))
        with make_actuator("nvml") as act, ClockGuard(act):
            assert act.meter.gpu.index == 2 + local
            act.set_freq_mhz(1005.0)
            act.set_freq_mhz(1380.0)
            assert node.locked()[2 + local] == [1380, 1380]
            # the energy counter is this GPU's own (GPU i's counter starts at (i + 1) 10^6 J)
            assert 1e6 * (3 + local) < act.read_energy_j() < 1e6 * (3 + local) + 1e3
        with NvmlSampler(interval_ms=1.0) as sampler:
            pass
        assert sampler._device.gpu.index == 2 + local
    writes = node.writes()
    for local in (0, 1):
        mine = [(fn, gpu) for fn, gpu, rank in writes if rank == local]
        assert mine == [
            ("nvmlDeviceSetGpuLockedClocks", 2 + local),
            ("nvmlDeviceSetGpuLockedClocks", 2 + local),
            ("nvmlDeviceResetGpuLockedClocks", 2 + local),
        ]
    assert node.locked() == {0: None, 1: None, 2: None, 3: None}
    # GPUs 0 and 1 were only listed (to match UUIDs), never opened, read or set
    touched = {c["gpu"] for c in node.calls if c["fn"] != "nvmlDeviceGetUUID"}
    assert touched == {2, 3}


def test_a_gpu_never_set_is_never_reset(node, monkeypatch):
    from opdvfs.runtime.actuators import ClockGuard, make_actuator

    with make_actuator("nvml", gpu="2") as act, ClockGuard(act):
        act.read_power_w()
    assert node.writes() == []


def test_zeusd_gets_the_processs_gpu(node, zeusd, monkeypatch):
    from opdvfs.runtime.actuators import ClockGuard, make_actuator

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with make_actuator("zeusd") as act, ClockGuard(act):
        act.set_freq_mhz(1005.0)
    assert [r[2]["gpu_ids"] for r in zeusd.requests] == ["3", "3"]
    assert node.writes() == []  # the writes went to the daemon, the reads to GPU 3
    assert {c["gpu"] for c in node.calls if c["fn"] != "nvmlDeviceGetUUID"} == {3}


def test_zeusd_refuses_a_mig_instance_in_one_line(node, zeusd, monkeypatch):
    from opdvfs.exceptions import NotSupportedError
    from opdvfs.runtime.actuators import make_actuator

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", mig_uuid(3, 0))
    with pytest.raises(NotSupportedError, match="zeusd cannot lock the clock of MIG instance"):
        make_actuator("zeusd")
    assert zeusd.requests == []


def test_the_dry_run_meter_reads_the_processs_gpu(node, monkeypatch):
    from opdvfs.runtime.actuators import make_actuator

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with make_actuator("dry-run") as act:
        assert act.meter.gpu.index == 3
        act.set_freq_mhz(1005.0)
    assert node.writes() == []


def test_a_dry_run_where_cuda_sees_no_gpu_measures_none(node, monkeypatch):
    from opdvfs.runtime.actuators import make_actuator

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ValidationError, match="a dry run needs the clocks"):
        make_actuator("dry-run")
    with pytest.raises(ValidationError, match="--gpu 9: no such GPU"):
        make_actuator("dry-run", gpu="9")


TRAIN = "import sys\nprint('the script ran')\n"


def _tune(tmp_path, *args: str):
    from opdvfs.cli import app

    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    argv = ["tune", "--target", "0.02", "--actuator", "nvml", "--out", str(tmp_path / "out")]
    return CliRunner().invoke(app, [*argv, *args, "--", "python", str(script)])


def _one_error_line(res, *needles: str) -> str:
    assert res.exit_code == 2, (res.exit_code, res.output, res.stderr)
    errors = [line for line in res.stderr.splitlines() if line.startswith("opdvfs: error: ")]
    assert len(errors) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "the script ran" not in res.stdout
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


@pytest.mark.parametrize(
    ("visible", "root", "needles"),
    [
        ("2", False, ("GPU 2 (", "NO_PERMISSION", "needs root", "zeusd", "ZEUSD_SOCK_PATH")),
        ("1", True, ("GPU 1 (", "NOT_SUPPORTED", "Volta or newer")),
        (mig_uuid(3, 0), True, (f"MIG instance {mig_uuid(3, 0)}", "NOT_SUPPORTED")),
    ],
    ids=["no-permission", "cannot-lock", "mig"],
)
def test_each_nvml_refusal_is_one_line_exit_2_and_nothing_changed(
    node, tmp_path, monkeypatch, visible, root, needles
):
    if not root:
        with node._update() as doc:
            doc["root"] = False
    node.hold(0, 1005, "another job")  # a GPU of another process: left as it is
    before = node.locked()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    res = _tune(tmp_path)
    _one_error_line(res, *needles)
    # the one write tried (the top clock for the warm-up) was refused; no reset followed
    assert [fn for fn, _, _ in node.writes()] == ["nvmlDeviceSetGpuLockedClocks"]
    assert node.locked() == before
    assert not (tmp_path / "out").exists()


def test_a_gpu_another_opdvfs_process_drives_is_refused_in_one_line(node, tmp_path, monkeypatch):
    node.hold(2, 1005, "the other process")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\n"
            "from opdvfs.runtime.gpu_select import GpuChoice, GpuClaim\n"
            f"claim = GpuClaim(GpuChoice(2, {gpu_uuid(2)!r}, 'held'))\n"
            "print('claimed', flush=True)\n"
            "sys.stdin.read()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")},
    )
    try:
        assert holder.stdout.readline().strip() == "claimed"
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
        res = _tune(tmp_path)
        _one_error_line(res, "GPU 2 (", f"another opdvfs process (pid {holder.pid})", "--gpu")
        assert node.writes() == []
        assert node.locked()[2] == [1005, 1005] and node.holders()[2] == "the other process"
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


def test_the_claim_is_given_back(node, monkeypatch):
    from opdvfs.runtime.gpu_select import GpuClaim

    gpu = GpuChoice(2, gpu_uuid(2), "test")
    first = GpuClaim(gpu)
    second = GpuClaim(gpu)  # this process again: shared
    first.release()
    second.release()
    second.release()
    code = (
        "from opdvfs.runtime.gpu_select import GpuChoice, GpuClaim\n"
        f"GpuClaim(GpuChoice(2, {gpu_uuid(2)!r}, 'x'))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    # another process claims it at once: this one gave it back
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)


def test_the_start_line_names_the_gpu(node, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with node._update() as doc:
        doc["root"] = False
    res = _tune(tmp_path)
    line = res.stderr.splitlines()[0]
    assert line == (
        f"opdvfs: rank 3 of 4 drives GPU 3 ({gpu_uuid(3)}): CUDA device 1 (LOCAL_RANK=1) of "
        "CUDA_VISIBLE_DEVICES=2,3"
    ), res.stderr


def test_device_reads_the_gpu_named_by_gpu_or_its_old_name(node, tmp_path):
    from opdvfs.cli import app

    for flag in ("--gpu", "--gpu-index"):
        out = tmp_path / f"{flag}.json"
        res = CliRunner().invoke(app, ["device", "--out", str(out), flag, "1"])
        assert res.exit_code == 0, res.output
        assert json.loads(out.read_text())["name"] == "Tesla P100-PCIE-16GB"


def test_run_drives_the_gpu_named_by_gpu(node, tmp_path):
    """``run --gpu 2``: the schedule's clocks go to GPU 2 alone, restored once at the end."""
    from opdvfs import Schedule
    from opdvfs.cli import app
    from test_cli_run import train_script

    from conftest import captured_op_count

    script = train_script(tmp_path / "train.py")
    n = captured_op_count(script)
    schedule = tmp_path / "s.json"
    Schedule.from_stage_freqs(
        [0, n // 2], [1410.0, 1005.0], n_ops=n, target=0.1, solver="manual", device="a100-like"
    ).write(schedule)
    argv = ["run", str(schedule), "--actuator", "nvml", "--gpu", "2", "--trigger", "op"]
    res = CliRunner().invoke(app, [*argv, "--", "python", str(script), "3"])
    assert res.exit_code == 0, res.output + res.stderr
    assert res.stderr.splitlines()[0] == (
        f"opdvfs: this process drives GPU 2 ({gpu_uuid(2)}): --gpu 2"
    )
    writes = [(fn, gpu) for fn, gpu, _ in node.writes()]
    assert {gpu for _, gpu in writes} == {2}
    locked = [c["args"] for c in node.calls if c["fn"] == "nvmlDeviceSetGpuLockedClocks"]
    assert [1005, 1005] in locked, locked  # the schedule's low stage, on GPU 2
    assert writes[-1] == ("nvmlDeviceResetGpuLockedClocks", 2) and node.locked()[2] is None


def test_capture_takes_gpu_only_with_a_clock_sweep(tmp_path):
    from opdvfs.cli import app

    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    argv = ["capture", "--out", str(tmp_path / "w.json"), "--gpu", "1"]
    res = CliRunner().invoke(app, [*argv, "--", "python", str(script)])
    _one_error_line(res, "--gpu goes with --freqs")
