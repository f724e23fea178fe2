import json

import numpy as np
import pytest
from typer.testing import CliRunner

from opdvfs import Profile, Schedule
from opdvfs.cli import UsageError, app, parse_clocks
from opdvfs.datasets import dataset_path
from opdvfs.plan.on_profile import DEFAULT_MAX_GAP, auto_clocks
from opdvfs.sim.presets import preset_spec

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_import_then_info_json(tmp_path, fixtures):
    out = tmp_path / "p.parquet"
    res = invoke("import", fixtures / "nv_dvfs_layout.csv", "--out", out)
    assert res.exit_code == 0, res.output
    assert "3 operators x 3 clocks" in res.stdout
    res = invoke("info", out, "--json")
    assert res.exit_code == 0
    summary = json.loads(res.stdout)  # exactly one JSON object on stdout
    assert summary["operators"] == 3 and summary["clocks"] == 3
    assert summary["freqs_mhz"] == [405.0, 945.0, 1380.0]
    assert Profile.read(out).n_ops == 3


def test_import_json_and_several_files(tmp_path, fixtures):
    out = tmp_path / "p.parquet"
    src = fixtures / "ascend_op_summary.csv"
    res = invoke("import", src, src, "--freq-mhz", "1000,1800", "--out", out, "--json")
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert payload["out"] == str(out) and payload["clocks"] == 2


def test_info_human_table(fixtures):
    res = invoke("info", dataset_path("perseus-gpt3-175b-a100"))
    assert res.exit_code == 0
    assert "16 operators" in res.stdout and "38 clocks" in res.stdout
    assert "no rows dropped" in res.stdout


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("", "empty file"),
        ("op,name,freq_mhz,time_us\n0,a,1000,\n", "line 2, column 'time_us'"),
        ("op,name,freq_mhz,time_us\n0,a,1000,nan\n", "line 2, column 'time_us'"),
        ("op,name,freq_mhz,time_us\n0,a,1000,-5\n", "expected a finite number >= 0"),
        ("op,name,freq_mhz\n0,a,1000\n", "missing column 'time_us' of the csv format"),
        ("a,b\n1,2\n", "header matches no known profile format"),
        ("op,name,freq_mhz,time_us\n0,a,1000,5\n1,b,1000,5,7\n", "Expected 4 fields in line 3"),
        ("op,name,freq_mhz,time_us\n0,a,1000,5\n1,b,10", "line 3, column 'time_us'"),
        (
            "op,name,freq_mhz,time_us\n0,a,1000,5,7\n",
            "line 2: expected 4 fields as in the header, saw 5",
        ),
    ],
)
def test_bad_input_exit_2_one_line_no_output(tmp_path, content, needle):
    src = tmp_path / "in.csv"
    src.write_text(content)
    out = tmp_path / "p.parquet"
    res = invoke("import", src, "--out", out)
    assert res.exit_code == 2
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("opdvfs: error: ") and str(src) in lines[0]
    assert needle in lines[0]
    assert "Traceback" not in res.output
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [src]  # no temp file left behind either


def test_failed_import_keeps_existing_output(tmp_path, fixtures):
    out = tmp_path / "p.parquet"
    assert invoke("import", fixtures / "generic_profile.csv", "--out", out).exit_code == 0
    before = out.read_bytes()
    bad = tmp_path / "bad.csv"
    bad.write_text("op,name,freq_mhz,time_us\n0,a,1000,-1\n")
    assert invoke("import", bad, "--out", out).exit_code == 2
    assert out.read_bytes() == before


def test_bad_clock_list_and_format(fixtures, tmp_path):
    res = invoke(
        "import",
        fixtures / "ascend_op_summary.csv",
        "--freq-mhz",
        "fast",
        "--out",
        tmp_path / "p.parquet",
    )
    assert res.exit_code == 2 and "clock 'fast'" in res.stderr
    res = invoke("info", fixtures / "generic_profile.csv", "--format", "xls")
    assert res.exit_code == 2 and "unknown format 'xls'" in res.stderr


def test_schema_commands():
    res = invoke("schema", "schedule")
    assert res.exit_code == 0
    schema = json.loads(res.stdout)
    assert schema["title"] == "Schedule" and "stages" in schema["properties"]
    res = invoke("schema", "profile")
    cols = [c["name"] for c in json.loads(res.stdout)["columns"]]
    assert {"op", "name", "freq_mhz", "time_us", "ratio_*"} <= set(cols)
    assert invoke("schema", "nope").exit_code == 2


def test_formats_lists_importers():
    res = invoke("formats")
    assert res.exit_code == 0 and "torch-trace" in res.stdout and "ascend" in res.stdout


def test_parse_clocks_words():
    assert parse_clocks("1000, 1400,1800") == [1000.0, 1400.0, 1800.0]
    grid = [1000.0 + 100 * i for i in range(9)]
    assert parse_clocks("min,mid,max", grid) == [1000.0, 1400.0, 1800.0]
    with pytest.raises(UsageError, match="need a device"):
        parse_clocks("max")
    with pytest.raises(UsageError, match="need a device"):
        parse_clocks("auto")
    # auto: the top, the clocks nearest 7.5% and 15% below it, mid and min, ascending, and
    # clocks between them until no gap is wider than DEFAULT_MAX_GAP of the top
    a100 = list(range(210, 1411, 15))
    auto = parse_clocks("auto", a100)
    assert auto == sorted(auto) and {210.0, 810.0, 1200.0, 1305.0, 1410.0} <= set(auto)
    assert np.diff(auto).max() <= DEFAULT_MAX_GAP * 1410.0
    with pytest.raises(UsageError, match="positive"):
        parse_clocks("-5")


def test_profile_then_info_and_simulate(tmp_path):
    out = tmp_path / "p.parquet"
    res = invoke(
        "profile",
        "--device",
        "ascend-910b-like",
        "--workload",
        "resnet50",
        "--freqs",
        "min,1400,max",
        "--iterations",
        "2",
        "--out",
        out,
        "--json",
    )
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert payload["freqs_mhz"] == [1000.0, 1400.0, 1800.0]
    assert payload["operators"] == 565 and payload["iterations"] == 2
    assert Profile.read(out).meta["simulated"] is True
    res = invoke(
        "simulate",
        "--device",
        "ascend-910b-like",
        "--workload",
        "resnet50",
        "--freq-mhz",
        "1400",
        "--json",
    )
    assert res.exit_code == 0, res.output
    run = json.loads(res.stdout)
    assert run["simulated"] is True and run["iterations"] == 3
    assert run["chip_energy_j"] == pytest.approx(run["chip_power_w"] * run["iteration_time_s"])


def test_simulate_applies_a_schedule_file(tmp_path):
    from opdvfs import Schedule
    from opdvfs.workloads import BUILDERS

    n = len(BUILDERS["resnet50"]())
    path = tmp_path / "s.json"
    Schedule.from_stage_freqs(
        [0, n // 2], [1800, 1200], n_ops=n, target=0.05, solver="manual"
    ).write(path)
    out = tmp_path / "run.json"
    res = invoke(
        "simulate", path, "--device", "ascend-910b-like", "--workload", "resnet50", "--out", out
    )
    assert res.exit_code == 0, res.output
    # steady state: down to 1200 MHz mid-iteration, back up to 1800 MHz at the next one
    assert "2 switches/iteration" in res.stdout
    from opdvfs import RunResult

    result = RunResult.read(out)
    assert [s.freq_mhz for s in result.timeline] == [1800.0, 1200.0]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--device", "tpu-like", "--workload", "bert"], "unknown device 'tpu-like'"),
        (["--device", "ascend-910b-like", "--workload", "gpt5"], "unknown workload 'gpt5'"),
        (
            ["--device", "ascend-910b-like", "--workload", "bert", "--freq-mhz", "1250"],
            "1250 MHz is not a supported clock",
        ),
    ],
)
def test_simulate_bad_input_exit_2(args, needle):
    res = invoke("simulate", *args)
    assert res.exit_code == 2
    assert needle in res.stderr and "Traceback" not in res.output


def test_devices_and_workloads_lists():
    res = invoke("devices", "--json")
    assert set(json.loads(res.stdout)) == {
        "ascend-910b-like",
        "a100-like",
        "h100-like",
        "v100-like",
    }
    res = invoke("workloads", "--json")
    names = {r["workload"] for r in json.loads(res.stdout)}
    assert {"gpt3", "bert", "resnet50", "llama2-infer"} <= names


def test_plan_warns_when_stages_are_shorter_than_the_switch(tmp_path):
    profile = tmp_path / "p.parquet"
    res = invoke(
        "profile", "--device", "a100-like", "--workload", "resnet50", "--freqs",
        "min,810,max", "--out", profile,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    # a100-like switches in 15 ms: default flags plan stages of at least 15 ms, silently; an
    # interval asked for below it is raised, and the warning says so
    res = invoke("plan", profile, "--target", "0.05", "--out", tmp_path / "s.json")
    assert res.exit_code == 0, res.output
    assert "switch latency" not in res.stderr
    res = invoke(
        "plan", profile, "--target", "0.05", "--interval-ms", "2", "--out", tmp_path / "t.json"
    )
    assert res.exit_code == 0, res.output
    assert "shorter than the 15 ms switch latency: stages are planned at least 15 ms" in res.stderr
    assert Schedule.read(tmp_path / "t.json").stages == Schedule.read(tmp_path / "s.json").stages
    # board power only (a GPU's sensor): core energy cannot be planned, and the line says why
    res = invoke(
        "plan", profile, "--target", "0.05", "--interval-ms", "15", "--objective", "core-energy",
        "--out", tmp_path / "core.json",
    )  # fmt: skip
    assert res.exit_code == 2
    assert "board (chip) power only" in res.stderr and "--objective energy" in res.stderr
    assert "Traceback" not in res.output and not (tmp_path / "core.json").exists()


@pytest.mark.parametrize("command", ["fit", "plan"])
def test_one_clock_profile_says_how_to_sweep(tmp_path, command):
    # what a plain capture on an unlocked GPU gives: every row at its own boost clock
    src = tmp_path / "one_clock.csv"
    src.write_text("op,name,freq_mhz,time_us\n0,mm,1920,800\n1,gelu,1920,120\n")
    out = tmp_path / "out.json"
    res = invoke(command, src, "--out", out, *(["--target", "0.02"] if command == "plan" else []))
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and str(src) in lines[0] and "one core clock (1920 MHz)" in lines[0]
    assert "capture --profile" in lines[0] and "opdvfs tune" in lines[0]
    assert not out.exists()


def test_profile_defaults_to_the_auto_clocks(tmp_path):
    # a preset with default flags: no --freqs
    out = tmp_path / "p.parquet"
    res = invoke("profile", "-d", "a100-like", "-w", "resnet50", "-n", "1", "--out", out, "--json")
    assert res.exit_code == 0, res.output
    grid = preset_spec("a100-like").freqs_mhz
    assert json.loads(res.stdout)["freqs_mhz"] == sorted(auto_clocks(grid))
