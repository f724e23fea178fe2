"""A user's own project through `opdvfs capture` and `opdvfs run` (issue 14): the script runs as
`python` would run it, other launchers activate opdvfs through PYTHONPATH, inference marks its
iterations with --iteration-at, the schedule is checked before the script starts, and a signal
restores the clock even while the main thread is stuck in native code (needs torch)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

from typer.testing import CliRunner

from opdvfs import Schedule
from opdvfs.cli import app

from conftest import read_log

MYMODEL = textwrap.dedent("""
    import torch

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(8, 16)
            self.b = torch.nn.Linear(16, 4)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))
""")

TRAIN = textwrap.dedent("""
    import pathlib, sys, warnings, torch
    from mymodel import MLP  # a sibling module: needs the script's folder on sys.path
    pathlib.Path("started").write_text(repr(sys.argv))
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(int(sys.argv[1])):
        loss = model(torch.ones(2, 8)).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    pathlib.Path("seen.json").write_text(__import__("json").dumps(
        {"argv": sys.argv, "path0": sys.path[0], "warnoptions": sys.warnoptions,
         "x": sorted(sys._xoptions), "name": __name__}))
    sys.exit(0)  # an explicit clean exit is a normal end
""")

INFER = textwrap.dedent("""
    import sys, torch
    from mymodel import MLP
    torch.manual_seed(0)
    model = MLP().eval()
    with torch.no_grad():
        for _ in range(int(sys.argv[1])):
            model(torch.ones(2, 8))
""")

OPDVFS = [sys.executable, "-m", "opdvfs"]


@pytest.fixture
def proj(tmp_path, monkeypatch):
    """A user's project folder (train.py, infer.py, a sibling mymodel.py), the working folder."""
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "mymodel.py").write_text(MYMODEL)
    (folder / "train.py").write_text(TRAIN)
    (folder / "infer.py").write_text(INFER)
    monkeypatch.chdir(folder)
    # the launched `python` is this interpreter (it has opdvfs and torch)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delitem(sys.modules, "mymodel", raising=False)
    yield folder
    sys.modules.pop("mymodel", None)


def _schedule(path: Path, n_ops: int, freqs=(1000.0, 1800.0), device="ascend-910b-like") -> Path:
    Schedule.from_stage_freqs(
        [0, n_ops // 2][: len(freqs)],
        list(freqs),
        n_ops=n_ops,
        target=0.1,
        solver="manual",
        device=device,
    ).write(path)
    return path


def test_a_script_imports_its_sibling_and_sees_what_python_gives_it(proj):
    res = CliRunner().invoke(app, ["capture", "--out", "w.json", "--", "python", "train.py", "3"])
    assert res.exit_code == 0, res.output
    seen = json.loads((proj / "seen.json").read_text())
    assert seen["argv"] == ["train.py", "3"] and seen["name"] == "__main__"
    assert Path(seen["path0"]) == proj.resolve()
    assert sys.path[0] != seen["path0"]  # put back afterwards
    assert "wrote w.json" in res.stdout and json.loads(Path("w.json").read_text())["ops"]


def test_the_script_folder_not_the_working_folder_goes_on_the_path(proj, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.chdir(elsewhere)
    res = CliRunner().invoke(
        app, ["capture", "--out", "w.json", "--", "python", str(proj / "train.py"), "2"]
    )
    assert res.exit_code == 0, res.output  # mymodel imported from the script's folder
    assert Path(json.loads((elsewhere / "seen.json").read_text())["path0"]) == proj.resolve()


def test_module_form_with_python_flags(proj):
    res = CliRunner().invoke(
        app,
        [
            "capture",
            "--out",
            "w.json",
            "--",
            "python",
            "-u",
            "-W",
            "ignore::DeprecationWarning",
            "-Xfaulthandler",
            "-m",
            "train",
            "2",
        ],
    )
    assert res.exit_code == 0, res.output
    seen = json.loads((proj / "seen.json").read_text())
    assert seen["argv"] == [str(proj / "train.py"), "2"]  # as runpy (and python -m) set it
    assert Path(seen["path0"]) == proj.resolve()  # -m: the working folder
    assert seen["warnoptions"] == ["ignore::DeprecationWarning"] and "faulthandler" in seen["x"]
    assert "ignore::DeprecationWarning" not in sys.warnoptions  # put back afterwards


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["python", "-O", "train.py"], "python -O takes effect only when an interpreter starts"),
        (["python", "-X", "importtime", "train.py"], "start opdvfs with it instead"),
        (["python", "-W", "explode", "train.py"], "action 'explode' is not one of"),
        (["python", "missing.py"], "missing.py: no such script"),
        (["python", "-m", "missing_module", "3"], "-m missing_module: no module named"),
        (["python", "-m", "train", "-W", "explode"], None),  # -W after the module: its argument
        (["no-such-launcher-here", "train.py"], "no-such-launcher-here: no such program"),
    ],
)
def test_what_cannot_run_is_one_line_before_the_script_starts(proj, argv, needle):
    res = CliRunner().invoke(app, ["capture", "--out", "w.json", "--", *argv])
    if needle is None:  # not an error: the program gets it
        assert res.exit_code != 0 and (proj / "started").exists()
        return
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("opdvfs: error: ") and len(res.stderr.splitlines()) == 1
    assert needle in res.stderr and not (proj / "started").exists()


def test_an_inference_script_is_captured_and_run_with_iteration_at(proj):
    runner = CliRunner()
    mark = ["--iteration-at", "mymodel:MLP.forward"]
    res = runner.invoke(app, ["capture", "--out", "w.json", *mark, "--", "python", "infer.py", "4"])
    assert res.exit_code == 0, res.output
    names = json.loads(Path("w.json").read_text())["ops"]["name"]
    assert [n for n in names if "addmm" in n] == ["aten::addmm"] * 2  # one forward each
    _schedule(proj / "s.json", len(names))
    with pytest.warns(UserWarning, match="falling back"):  # iteration 0 also builds the model
        res = runner.invoke(
            app,
            [
                "run",
                "s.json",
                "--log",
                "calls.jsonl",
                "-w",
                "w.json",
                *mark,
                "--",
                "python",
                "infer.py",
                "4",
            ],
        )
    assert res.exit_code == 0, res.output
    assert "ran 4 iterations; diverged in 1" in res.stdout
    calls = read_log(proj / "calls.jsonl")
    steady = [
        (c["op_index"], c["freq_mhz"]) for c in calls if c["kind"] == "set" and c["iteration"] == 3
    ]
    assert steady == [(0, 1000.0), (len(names) // 2, 1800.0)]
    # without the mark, no iteration ever ends: one line, exit 2, no workload
    res = runner.invoke(app, ["capture", "--out", "w2.json", "--", "python", "infer.py", "2"])
    assert res.exit_code == 2 and "no optimizer step was seen" in res.stderr
    assert not Path("w2.json").exists()


def test_iteration_at_a_function_that_does_not_exist_is_one_line(proj):
    res = CliRunner().invoke(
        app,
        [
            "capture",
            "--out",
            "w.json",
            "--iteration-at",
            "mymodel:MLP.nope",
            "--",
            "python",
            "infer.py",
            "2",
        ],
    )
    assert res.exit_code == 2 and "module mymodel has no MLP.nope" in res.stderr
    res = CliRunner().invoke(
        app,
        ["capture", "--out", "w.json", "--iteration-at", "not a spec", "--", "python", "infer.py"],
    )
    assert res.exit_code == 2 and "expected MODULE:FUNCTION" in res.stderr


@pytest.mark.parametrize(
    ("schedule", "options", "needle"),
    [
        ({"freqs": (1000.0, 2100.0)}, [], "stage 1 runs at 2100 MHz, not a clock of"),
        ({}, ["--device", "a100-like"], "was planned for ascend-910b-like, not a100-like"),
        (
            {"n_ops": 7},
            ["--workload", "w.json"],
            "plans 7 operators per iteration, the workload has",
        ),
    ],
)
def test_run_checks_the_schedule_before_the_script_starts(proj, schedule, options, needle):
    from opdvfs.workloads.library import load_workload

    load_workload("resnet50").write(proj / "w.json")
    _schedule(
        proj / "s.json", schedule.get("n_ops", 6), freqs=schedule.get("freqs", (1000.0, 1800.0))
    )
    res = CliRunner().invoke(
        app, ["run", "s.json", "--log", "calls.jsonl", *options, "--", "python", "train.py", "2"]
    )
    assert res.exit_code == 2, res.output
    assert needle in res.stderr and len(res.stderr.splitlines()) == 1
    assert not (proj / "started").exists() and not (proj / "calls.jsonl").exists()


def test_a_schedule_no_iteration_ran_under_exits_2_with_a_final_line(proj):
    _schedule(proj / "s.json", 5)  # the script's iterations have many more ops
    with pytest.warns(UserWarning, match="falling back"):
        res = CliRunner().invoke(
            app, ["run", "s.json", "--log", "calls.jsonl", "--", "python", "train.py", "3"]
        )
    assert res.exit_code == 2
    assert "ran 3 iterations; diverged in 2, schedule abandoned" in res.stdout
    assert res.stderr.startswith("opdvfs: error: the schedule was abandoned: none of the 3")


def test_each_run_appended_to_a_log_starts_with_a_header(proj):
    _schedule(proj / "s.json", 6)
    for _ in range(2):
        res = CliRunner().invoke(
            app,
            [
                "run",
                "s.json",
                "--log",
                "calls.jsonl",
                "--iteration-at",
                "mymodel:MLP.forward",
                "--",
                "python",
                "infer.py",
                "2",
            ],
        )
        assert res.exit_code == 0, res.output
    calls = read_log(proj / "calls.jsonl")
    headers = [i for i, c in enumerate(calls) if c["kind"] == "run"]
    assert len(headers) == 2 and headers[0] == 0
    assert calls[headers[1] - 1]["kind"] == "restore"  # the first run ends before the second
    assert calls[0]["schedule"] == "s.json" and calls[0]["actuator"] == "dry-run"


@pytest.mark.slow  # subprocesses
def test_a_launcher_that_is_not_python_runs_activated(proj, tmp_path):
    """`bash -c` starting python: the launched process activates through PYTHONPATH, and an
    existing sitecustomize still runs (chained)."""
    other = tmp_path / "other_site"
    other.mkdir()
    (other / "sitecustomize.py").write_text(
        "import os\nopen(os.path.join(os.getcwd(), 'chained'), 'w').close()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(other), "PYTHONWARNINGS": "ignore"}
    mark = ["--iteration-at", "mymodel:MLP.forward"]
    res = subprocess.run(
        [*OPDVFS, "capture", "--out", "w.json", *mark, "--", "bash", "-c", "python infer.py 3"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "wrote " in res.stdout and (proj / "chained").exists()
    n = len(json.loads(Path("w.json").read_text())["ops"]["name"])
    _schedule(proj / "s.json", n)
    res = subprocess.run(
        [
            *OPDVFS,
            "run",
            "s.json",
            "--log",
            "calls.jsonl",
            *mark,
            "--",
            "bash",
            "-c",
            "python infer.py 4",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "ran 4 iterations; diverged in 1" in res.stdout
    calls = read_log(proj / "calls.jsonl")
    assert calls[0]["kind"] == "run" and calls[-1]["kind"] == "restore"
    assert [
        (c["op_index"], c["freq_mhz"]) for c in calls if c["kind"] == "set" and c["iteration"] == 3
    ] == [
        (0, 1000.0),
        (n // 2, 1800.0),
    ]
    # the launcher's failure is the command's
    res = subprocess.run(
        [*OPDVFS, "run", "s.json", "--", "bash", "-c", "exit 7"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert res.returncode == 7 and "exited with status 7" in res.stderr


@pytest.mark.slow  # subprocesses
def test_print_env_activates_any_launcher(proj):
    _schedule(proj / "s.json", 6)
    res = subprocess.run(
        [
            *OPDVFS,
            "run",
            "s.json",
            "--log",
            "calls.jsonl",
            "--iteration-at",
            "mymodel:MLP.forward",
            "--print-env",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert not (proj / "calls.jsonl").exists()  # printing runs nothing
    exports = res.stdout
    assert "export PYTHONPATH=" in exports and "export OPDVFS_SETTINGS=" in exports
    proc = subprocess.run(
        ["bash", "-c", f"{exports}\npython infer.py 3"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 0, proc.stderr
    kinds = [c["kind"] for c in read_log(proj / "calls.jsonl")]
    assert kinds[0] == "run" and "set" in kinds and kinds[-1] == "restore"


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="POSIX signals")
@pytest.mark.parametrize("blocked_in", ["os.read(r, 1)", "threading.Event().wait()", "native"])
def test_sigterm_restores_the_clock_while_the_main_thread_is_blocked(tmp_path, blocked_in):
    """The restore happens in the handler, before anything that can block: the log has it even
    when the main thread never gets back to Python (`native`: SIGTERM blocked in it, as when it
    waits inside a collective), and the process then ends with 128 + 15 on its own."""
    log = tmp_path / "calls.jsonl"
    wait = {
        "native": "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM}); time.sleep(60)",
    }.get(blocked_in, blocked_in)
    script = textwrap.dedent(f"""
        import os, signal, sys, threading, time
        from opdvfs.runtime.actuators import ClockGuard, DryRunActuator
        act = DryRunActuator([1000.0, 1800.0], log={str(log)!r})
        r, w = os.pipe()
        with ClockGuard(act):
            act.set_freq_mhz(1000.0)
            print("ready", flush=True)
            {wait}
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    try:
        # ended by the signal, not by its 60 s sleep nor never (the wait raises past 45 s; a
        # tighter wall bound, < 10 s, was the machine's load as much as the code's)
        status = proc.wait(timeout=45)
    finally:
        proc.kill()
    assert status == 128 + signal.SIGTERM, proc.stderr.read() if proc.stderr else ""
    assert [c["kind"] for c in read_log(log)] == ["run", "set", "restore"]


@pytest.mark.slow  # a subprocess
def test_a_signalled_run_restores_before_the_script_ends(proj):
    """`opdvfs run` itself, SIGTERM while the script waits: the log has the restore."""
    (proj / "wait.py").write_text(
        "import sys, threading, torch\nfrom mymodel import MLP\nm = MLP()\n"
        "m(torch.ones(2, 8)); m(torch.ones(2, 8))\nprint('ready', flush=True)\n"
        "threading.Event().wait()\n"
    )
    _schedule(proj / "s.json", 6)
    proc = subprocess.Popen(
        [
            *OPDVFS,
            "run",
            "s.json",
            "--log",
            "calls.jsonl",
            "--iteration-at",
            "mymodel:MLP.forward",
            "--",
            "python",
            "wait.py",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    try:
        status = proc.wait(timeout=20)
    finally:
        proc.kill()
    assert status == 128 + signal.SIGTERM
    calls = read_log(proj / "calls.jsonl")
    assert "set" in [c["kind"] for c in calls] and calls[-1]["kind"] == "restore"


def test_the_boot_folder_ships_with_the_package():
    from opdvfs.runtime.launch import BOOT_DIR

    assert (BOOT_DIR / "sitecustomize.py").is_file()
    assert shutil.which("bash") is not None


@pytest.mark.parametrize(
    ("device", "freqs", "needle"),
    [
        ("a100-like", (1000.0, 1800.0), "was planned for ascend-910b-like, not a100-like"),
        ("ascend-910b-like", (1000.0, 1850.0), "stage 1 runs at 1850 MHz, not a clock of"),
        ("ascend-910b-like", (1000.0, 1800.0), "plans 6 operators per iteration, the workload has"),
    ],
)
def test_simulate_checks_the_schedule_against_device_and_workload(tmp_path, device, freqs, needle):
    _schedule(tmp_path / "s.json", 6, freqs=freqs)
    res = CliRunner().invoke(
        app, ["simulate", str(tmp_path / "s.json"), "--device", device, "--workload", "bert"]
    )
    assert res.exit_code == 2 and needle in res.stderr and len(res.stderr.splitlines()) == 1


@pytest.mark.slow
@pytest.mark.parametrize("device", ["ascend-910b-like", "a100-like", "h100-like", "v100-like"])
def test_the_users_whole_flow_on_every_preset_with_default_flags(proj, device):
    """Issue 14's flow end to end: the user's own project (a sibling module, 5 AdamW steps)
    captured in the -m form, profiled on a preset with default flags, planned, run dry."""
    runner = CliRunner()

    def ok(*argv: str):
        res = runner.invoke(app, list(argv))
        assert res.exit_code == 0, (argv, res.output)
        return res

    ok("capture", "--out", "w.json", "--", "python", "-u", "-m", "train", "5")
    ok("profile", "-d", device, "-w", "w.json", "--freqs", "min,mid,max", "--out", "p.parquet")
    ok("plan", "p.parquet", "--target", "0.05", "--out", "s.json")
    schedule = Schedule.read(proj / "s.json")
    assert schedule.device == device and schedule.n_ops == len(
        json.loads(Path("w.json").read_text())["ops"]["name"]
    )
    with pytest.warns(UserWarning, match="falling back"):  # step 1 also creates AdamW's state
        res = ok(
            "run", "s.json", "--actuator", "dry-run", "--log", "calls.jsonl",
            "--", "python", "train.py", "5",
        )  # fmt: skip
    calls = read_log(proj / "calls.jsonl")
    assert calls[0]["kind"] == "run" and calls[-1]["kind"] == "restore"
    planned = {s.freq_mhz for s in schedule.stages}
    # iteration 0 falls back to the top clock; from then on only planned clocks are set
    later = [c["freq_mhz"] for c in calls if c["kind"] == "set" and c["iteration"] >= 1]
    assert later and set(later) <= planned
    assert "ran 5 iterations; diverged in 1" in res.stdout
