"""`opdvfs tune` on a preemptible script (#33): its own SIGTERM handler writes a whole checkpoint
and sets the exit status; a script that catches the signal and trains on ends restored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

from test_tune import FAST, SIM

from conftest import read_log

pytestmark = pytest.mark.slow  # subprocesses that train

TESTS = str(Path(__file__).resolve().parent)
SRC = str(Path(__file__).resolve().parents[1] / "src")

#: ``preemptible.py STEPS SIGNAL_AT exit|train-on CHECKPOINT``: the tiny GPT with a SIGTERM
#: handler of its own, installed after opdvfs started; at step SIGNAL_AT it is preempted.
PREEMPTIBLE = textwrap.dedent("""
    import os, signal, sys, time
    import torch
    sys.path.insert(0, {tests!r})
    from tiny_gpt import TinyGPT
    steps, signal_at, how, ckpt = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    preempted = []

    def on_term(signum, frame):
        preempted.append(signum)
        if how == "exit":  # save (for 2 s, past opdvfs's 1 s grace), then leave with status 0
            with open(ckpt + ".part", "w") as f:
                for i in range(20):
                    f.write(f"{{i}}\\n"); f.flush(); time.sleep(0.1)
            os.replace(ckpt + ".part", ckpt)
            sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    if how == "chdir":  # as Hydra does: every relative path now means another folder
        os.makedirs("elsewhere", exist_ok=True)
        os.chdir("elsewhere")
    torch.manual_seed(0)
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 64, (steps, 2, 17))
    for i in range(steps):
        if i == signal_at:
            os.kill(os.getpid(), signal.SIGTERM)
        loss = torch.nn.functional.cross_entropy(
            model(data[i, :, :-1]).reshape(-1, 64), data[i, :, 1:].reshape(-1)
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    print("trained", len(preempted), file=sys.stderr)
""")


def _tune(tmp_path: Path, steps: int, how: str, signal_at: int = 4) -> subprocess.CompletedProcess:
    script = tmp_path / "preemptible.py"
    script.write_text(PREEMPTIBLE.format(tests=TESTS))
    argv = [  # relative --out and --log: the command's working folder is tmp_path
        *(sys.executable, "-m", "opdvfs", "tune", "--target", "0.02", *SIM, *FAST),
        *("--out", "out", "--log", "calls.jsonl", "--no-cache"),
        *("--", "python", str(script), str(steps), str(signal_at), how, str(tmp_path / "ckpt.txt")),
    ]
    env = {**os.environ, "PYTHONPATH": SRC, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=600, env=env, check=False, cwd=tmp_path
    )


@pytest.mark.parametrize("signal_at", [4, 20])  # profiling; after the sweep
def test_a_preempted_script_saves_its_whole_checkpoint_and_sets_the_status(tmp_path, signal_at):
    done = _tune(tmp_path, 40, "exit", signal_at=signal_at)
    assert done.returncode == 0, done.stderr  # the script's own status (not 143, not 2)
    assert (tmp_path / "ckpt.txt").read_text().split() == [str(i) for i in range(20)]
    calls = read_log(tmp_path / "calls.jsonl")
    kinds = [c["kind"] for c in calls]
    assert "set" in kinds and kinds.count("restore") == 1 and kinds[-1] == "restore"
    assert "Traceback" not in done.stderr
    if signal_at == 4:
        assert "ended after SIGTERM before tuning was done; nothing was written" in done.stderr
        assert not (tmp_path / "out").exists()
    else:  # what the run measured is written, whole
        assert json.loads((tmp_path / "out" / "tune.json").read_text())["target"] == 0.02
    assert not list(tmp_path.rglob("*.tmp")) and not list(tmp_path.rglob(".*.tmp"))


def test_a_script_that_trains_on_after_sigterm_ends_restored(tmp_path):
    steps = 40
    done = _tune(tmp_path, steps, "train-on")
    assert done.returncode == 0, done.stderr
    assert "trained 1" in done.stderr  # the script's handler ran, and the script went on
    kinds = [c["kind"] for c in read_log(tmp_path / "calls.jsonl")]
    last_restore = len(kinds) - 1 - kinds[::-1].index("restore")
    assert "set" not in kinds[last_restore:]  # no clock left set after the final restore
    assert kinds.count("restore") >= 2  # at the signal, and again after the later clocks
    assert "restore" in kinds[: kinds.index("set") + 3]  # the signal came during the sweep
    written = json.loads((tmp_path / "out" / "tune.json").read_text())
    assert written["target"] == 0.02


def _train(steps: int, **options):
    """Tune the tiny GPT for ``steps`` in this process (sim:a100-like); return the context."""
    import torch

    import opdvfs

    sys.path.insert(0, TESTS)
    from tiny_gpt import TinyGPT, train_step

    torch.manual_seed(0)
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 64, (steps, 2, 17))
    kw = {"clocks": [1410.0, 1380.0, 210.0], "iterations_per_clock": 1, "block": 2, **options}
    with opdvfs.tune(target=0.02, actuator="sim:a100-like", work_scale=1e6, **kw) as t:
        for i in range(steps):
            train_step(model, opt, data[i])
    return t


@pytest.mark.parametrize(("clock_mhz", "kept"), [(210.0, False), (5000.0, None)])
def test_an_edited_cache_entry_is_refused_or_re_measured_and_dropped(clock_mhz, kept):
    """An entry edited to the lowest clock (+400% time) is applied, re-measured, dropped; one
    edited past the device's clocks is not applied at all (it aborted the job, #33)."""
    from opdvfs import Schedule
    from opdvfs.tuner.cache import TuneCache

    first = _train(3)  # ends in the sweep: its key, nothing cached
    key, n_ops = first.result.cache_key, first.tuner.n_launches
    assert key is not None and n_ops
    cache = TuneCache()
    edited = Schedule.from_stage_freqs([0], [clock_mhz], n_ops=n_ops, target=0.02, solver="x")
    cache.put(key, edited, {"budget": 0.02})
    second = _train(14)
    result = second.result
    if kept is None:  # never applied: tuned afresh, no clock past the device's ever set
        assert not result.cache_hit
        assert all(it.freq_mhz is None or it.freq_mhz <= 1410.0 for it in result.iterations)
        return
    assert result.cache_hit and "dropped from the cache" in (result.error or "")
    assert result.rounds[0].slowdown.mean > 1.0  # the brief check saw it
    assert result.schedule is None and not cache.path(key).exists()
    assert [it.phase for it in result.iterations][-1] == "top"
    assert second.tuner.guard.restored


def test_relative_paths_stay_where_the_command_started_after_the_script_chdirs(tmp_path):
    done = _tune(tmp_path, 40, "chdir", signal_at=-1)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "tune.json").is_file()
    kinds = [c["kind"] for c in read_log(tmp_path / "calls.jsonl")]
    assert kinds[-1] == "restore" and kinds.count("set") >= 1
    assert not (tmp_path / "elsewhere" / "out").exists()
    assert not (tmp_path / "elsewhere" / "calls.jsonl").exists()


def _preempted(tmp_path: Path, *command: str, signal_at: int) -> subprocess.CompletedProcess:
    """Run ``opdvfs COMMAND -- python preemptible.py`` (preempted at ``signal_at``, then exit)."""
    script = tmp_path / "preemptible.py"
    script.write_text(PREEMPTIBLE.format(tests=TESTS))
    argv = [
        *(sys.executable, "-m", "opdvfs", *command),
        *("--", "python", str(script), "40", str(signal_at), "exit", str(tmp_path / "ckpt.txt")),
    ]
    env = {**os.environ, "PYTHONPATH": SRC, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=600, env=env, check=False, cwd=tmp_path
    )


def test_a_clock_sweep_preempted_ends_with_the_scripts_status_and_writes_nothing(tmp_path):
    done = _preempted(
        tmp_path,
        *("capture", "--out", "w.json", "--profile", "p.parquet", "--freqs", "1410,1380,210"),
        *(*SIM, "--iterations-per-clock", "2", "--log", "calls.jsonl"),
        signal_at=4,
    )
    assert done.returncode == 0, done.stderr  # the script's own status, not 2
    assert (tmp_path / "ckpt.txt").read_text().split() == [str(i) for i in range(20)]
    assert "opdvfs: SIGTERM received: " in done.stderr and "nothing was written" in done.stderr
    assert "Traceback" not in done.stderr and "error" not in done.stderr
    assert not (tmp_path / "p.parquet").exists() and not (tmp_path / "w.json").exists()
    kinds = [c["kind"] for c in read_log(tmp_path / "calls.jsonl")]
    assert "set" in kinds and kinds.count("restore") == 1 and kinds[-1] == "restore"


def test_a_run_preempted_before_its_schedule_applied_ends_with_the_scripts_status(tmp_path):
    import opdvfs

    device = opdvfs.SimulatedDevice.from_preset("ascend-910b-like")  # (per-op power)
    work = opdvfs.load_workload("vgg19")
    profile = device.profile(work, [1000.0, 1400.0, 1800.0])
    models = opdvfs.ModelBundle(
        opdvfs.PerfModel().fit(profile), opdvfs.PowerModel().fit(profile, device=device.spec)
    )
    inputs = opdvfs.PlanInputs.from_workload(work, device.spec.freqs_mhz, device=device.spec.name)
    opdvfs.plan_schedule(models, inputs, target=0.05).write(tmp_path / "s.json")
    # preempted at step 0: no iteration ended, so the schedule never applied (else exit 2)
    done = _preempted(tmp_path, "run", "s.json", "--actuator", "dry-run", signal_at=0)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ckpt.txt").read_text().split() == [str(i) for i in range(20)]
    assert "SIGTERM received and the program ended by itself: the schedule was never applied" in (
        done.stdout + done.stderr
    )
    assert "Traceback" not in done.stderr and "opdvfs: error" not in done.stderr
