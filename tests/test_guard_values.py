"""Bad values refused before a job trains, outputs checked first and left whole, ``--log`` on
every actuator, the record of a clock left set (#33). In-process: no training, no signals."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opdvfs.cli import app
from opdvfs.exceptions import OutputPathError

from conftest import read_log

SCRIPT_MARK = "import pathlib; pathlib.Path({mark!r}).write_text('ran')"


def _one_line(res) -> str:
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.output, res.stderr
    return lines[0]


def _tune(tmp_path: Path, *options: str, env: dict[str, str] | None = None):
    mark = tmp_path / "ran"
    argv = [
        *("tune", "--out", str(tmp_path / "out"), *options),
        *("--", "python", "-c", SCRIPT_MARK.format(mark=str(mark))),
    ]
    res = CliRunner().invoke(app, argv, env=env)
    assert not mark.exists(), "the script ran"
    assert not (tmp_path / "out").exists(), "something was written"
    return res


@pytest.mark.parametrize(
    ("options", "env", "needle"),
    [
        (("--target", "2", "--actuator", "sim:a100-like"), None, "--target 2: expected a slowdown"),
        (("--target", "0.02", "--actuator", "sim:a100-like"), {"RANK": "abc"}, "RANK='abc'"),
        (
            ("--target", "0.02", "--actuator", "sim:a100-like"),
            {"WORLD_SIZE": "-2"},
            "WORLD_SIZE='-2'",
        ),
        (
            ("--target", "0.02", "--actuator", "zeusd"),
            {"ZEUSD_HOST_PORT": "host:notaport", "ZEUSD_SOCK_PATH": ""},
            "ZEUSD_HOST_PORT='host:notaport': expected host:port",
        ),
        (
            ("--target", "0.02", "--actuator", "sim:a100-like", "--pairs", "10000000"),
            None,
            "--pairs 10000000: expected 1 to 1 000",
        ),
        (
            ("--target", "0.02", "--actuator", "sim:a100-like", "--rounds", "1000000"),
            None,
            "--rounds 1000000: expected 1 to 100",
        ),
        (
            ("--target", "0.02", "--actuator", "sim:a100-like", "--work-scale", "1e300"),
            None,
            "work_scale 1e+300: expected > 0 and at most 1e+12",
        ),
    ],
)
def test_bad_values_are_one_line_and_exit_2_before_the_script_runs(tmp_path, options, env, needle):
    assert needle in _one_line(_tune(tmp_path, *options, env=env))


def test_the_library_refuses_a_budget_above_one():
    import opdvfs

    with pytest.raises(ValueError, match="fraction"):
        opdvfs.tune(2.0, actuator="sim:a100-like")


def test_an_unwritable_out_is_refused_before_the_script_trains(tmp_path):
    (tmp_path / "file").write_text("")
    mark = tmp_path / "ran"
    res = CliRunner().invoke(
        app,
        [
            *("tune", "--target", "0.02", "--actuator", "sim:a100-like"),
            *("--out", str(tmp_path / "file" / "out")),
            *("--", "python", "-c", SCRIPT_MARK.format(mark=str(mark))),
        ],
    )
    assert "file is a file, not a folder" in _one_line(res) and not mark.exists()
    res = CliRunner().invoke(
        app,
        [
            *("tune", "--target", "0.02", "--actuator", "sim:a100-like"),
            *("--out", "/proc/opdvfs-out"),
            *("--", "python", "-c", SCRIPT_MARK.format(mark=str(mark))),
        ],
    )
    assert "/proc/opdvfs-out: cannot write there" in _one_line(res) and not mark.exists()


def test_the_python_api_checks_out_when_built_and_keeps_it_absolute(tmp_path, monkeypatch):
    import opdvfs

    with pytest.raises(OutputPathError, match="cannot write"):
        opdvfs.tune(0.02, actuator="sim:a100-like", out="/proc/opdvfs-out")
    monkeypatch.chdir(tmp_path)
    t = opdvfs.tune(0.02, actuator="sim:a100-like", out="rel")
    t.tuner.actuator.close()
    assert t.out == tmp_path / "rel" and not (tmp_path / "rel").exists()


def test_the_blocks_own_exception_wins_over_a_file_opdvfs_cannot_write(tmp_path, capsys):
    import opdvfs

    t = opdvfs.tune(0.02, actuator="sim:a100-like", out=tmp_path / "a" / "out")

    def block() -> None:
        with t:
            t.tuner.phase = "top"  # as if tuning were over: the files are due
            (tmp_path / "a").write_text("")  # ... and now cannot be written
            raise RuntimeError("the script's own")

    with pytest.raises(RuntimeError, match="the script's own"):
        block()
    assert "opdvfs: error:" in capsys.readouterr().err


def test_a_reused_out_keeps_no_file_of_an_earlier_run(tmp_path):
    from opdvfs.tuner.report import write_tune
    from opdvfs.tuner.result import TuneResult

    out = tmp_path / "out"
    out.mkdir()
    (out / "schedule.json").write_text("{}")  # an earlier run's choice
    (out / "notes.txt").write_text("mine")
    result = TuneResult(0.02, "sim:a100-like", "a100-like", [1410.0, 210.0], iterations=[], pairs=2)
    written = write_tune(result, out)
    assert "schedule.json" not in written and not (out / "schedule.json").exists()
    assert (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in out.iterdir()) == sorted([*written, "notes.txt"])
    assert not list(out.glob("*.tmp")) and not list(out.glob(".*"))


def test_a_reused_out_keeps_no_samples_file_of_an_earlier_profile(tmp_path):
    from opdvfs.profile import Profile
    from opdvfs.tuner.report import write_tune
    from opdvfs.tuner.result import TuneResult

    with_samples = Profile.read(Path(__file__).parent / "fixtures" / "profile_v1.parquet")
    assert with_samples.samples is not None
    out = tmp_path / "out"

    def run(profile):
        result = TuneResult(0.02, "sim:a100-like", None, (1410.0, 210.0), [], profile=profile)
        written = write_tune(result, out)
        assert sorted(p.name for p in out.iterdir()) == sorted(written)
        return written

    assert "profile.samples.parquet" in run(with_samples)
    assert "profile.samples.parquet" not in run(None)  # no profile: neither file is left
    assert not (out / "profile.parquet").exists()
    run(with_samples)
    written = run(Profile(with_samples.ops, meta=with_samples.meta))  # a profile without samples
    assert "profile.parquet" in written and "profile.samples.parquet" not in written
    assert Profile.read(out / "profile.parquet").samples is None


# ------------------------------------------------------------------------------ schedules
def _schedule(path: Path, **fields) -> Path:
    doc = {
        "format": "opdvfs.schedule",
        "n_ops": 4,
        "stages": [
            {"first_op": 0, "last_op": 1, "freq_mhz": 1410.0, "start_s": 0.0},
            {"first_op": 2, "last_op": 3, "freq_mhz": 810.0, "start_s": 0.002},
        ],
        "switches": [
            {"trigger_op": 0, "stage": 0, "freq_mhz": 1410.0},
            {"trigger_op": 1, "stage": 1, "freq_mhz": 810.0},
        ],
        "target": 0.02,
        "solver": "test",
        "device": "a100-like",
        "predicted_time_s": 0.1,
        **fields,
    }
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"switch_latency_ms": 15.0}, "holds 1410 MHz for 2 ms, shorter than the 15 ms switch"),
        (
            {
                "switches": [
                    {"trigger_op": 0, "stage": 0, "freq_mhz": 1410.0},
                    {"trigger_op": 1, "stage": 1, "freq_mhz": 810.0, "delay_us": 1e15},
                ]
            },
            "switches[1].delay_us 1e+15: longer than the iteration (0.1 s)",
        ),
    ],
)
def test_run_refuses_a_schedule_that_cannot_land_in_one_line(tmp_path, fields, needle):
    path = _schedule(tmp_path / "s.json", **fields)
    mark = tmp_path / "ran"
    res = CliRunner().invoke(
        app,
        [
            *("run", str(path), "--actuator", "dry-run", "--log", str(tmp_path / "calls.jsonl")),
            *("--", "python", "-c", SCRIPT_MARK.format(mark=str(mark))),
        ],
    )
    assert needle in _one_line(res)
    assert not mark.exists() and not (tmp_path / "calls.jsonl").exists()


def test_a_schedule_held_long_enough_still_runs(tmp_path):
    from opdvfs.runtime.checks import check_schedule
    from opdvfs.schedule import Schedule

    plan = Schedule.read(_schedule(tmp_path / "s.json", switch_latency_ms=1.0))
    check_schedule(plan, freqs_mhz=[1410.0, 810.0])  # 2 ms held, 1 ms latency: fine


# ----------------------------------------------------------------- nvml: log and record
def test_log_records_what_nvml_set_and_the_guard_keeps_a_record_meanwhile(fake_nvml, tmp_path):
    from opdvfs.runtime.actuators import ClockGuard, LoggedActuator, make_actuator

    fake_nvml.nvmlDeviceGetIndex.return_value = 0
    records = Path(os.environ["OPDVFS_CACHE_DIR"]) / "clocks"
    with make_actuator("nvml", log=tmp_path / "calls.jsonl", header={"command": "x"}) as act:
        assert isinstance(act, LoggedActuator) and act.kind == "nvml"
        with ClockGuard(act):
            act.set_freq_mhz(1005.0)
            (record,) = records.glob("*-gpu0.json")
            doc = json.loads(record.read_text())
            assert (doc["kind"], doc["gpu"], doc["freq_mhz"]) == ("nvml", "gpu0", 1005.0)
            assert doc["pid"] == os.getpid()
    assert not list(records.glob("*.json"))  # restored: the record is gone
    calls = read_log(tmp_path / "calls.jsonl")
    assert [c["kind"] for c in calls] == ["run", "set", "restore"]
    assert calls[0]["actuator"] == "nvml" and calls[0]["command"] == "x"
    fake_nvml.nvmlDeviceSetGpuLockedClocks.assert_called_once_with("handle0", 1005, 1005)
    fake_nvml.nvmlDeviceResetGpuLockedClocks.assert_called_once_with("handle0")


def test_a_refused_reset_raises_at_the_end_of_a_block_that_raised_nothing(fake_nvml, capsys):
    import pynvml

    from opdvfs.exceptions import ClockNotRestoredError
    from opdvfs.runtime.actuators import ClockGuard, NvmlActuator

    fake_nvml.nvmlDeviceGetIndex.return_value = 0
    fake_nvml.nvmlDeviceResetGpuLockedClocks.side_effect = pynvml.NVMLError(
        pynvml.NVML_ERROR_NO_PERMISSION
    )
    act = NvmlActuator()

    def block(error: Exception | None) -> None:
        with ClockGuard(act):
            act.set_freq_mhz(1005.0)
            if error is not None:
                raise error

    with act:
        with pytest.raises(ClockNotRestoredError, match="could not restore gpu0's clock"):
            block(None)
        with pytest.raises(KeyError, match="mine"):  # the block's own error wins
            block(KeyError("mine"))
    assert "opdvfs: error: could not restore gpu0's clock" in capsys.readouterr().err


# ------------------------------------------------------------------------------ bounded
