import json

import pytest
from typer.testing import CliRunner

from opdvfs import Profile
from opdvfs.cli import UsageError, app, parse_clocks
from opdvfs.datasets import dataset_path

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
        ("op,name,freq_mhz\n0,a,1000\n", "header matches no known profile format"),
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
    with pytest.raises(UsageError, match="positive"):
        parse_clocks("-5")
