"""``--json`` on tune, run and capture: one JSON object on stdout, the script's prints elsewhere."""

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from typer.testing import CliRunner

from opdvfs.cli import app

from tiny_gpt import write_train_script

SIM = ("--actuator", "sim:a100-like", "--work-scale", "1e6")


@pytest.fixture(scope="module")
def script(tmp_path_factory) -> Path:
    return write_train_script(tmp_path_factory.mktemp("json"))


def _json(res) -> dict:
    assert res.exit_code == 0, res.output
    (line,) = res.stdout.strip().splitlines()  # one object, nothing else on stdout
    return json.loads(line)


@pytest.fixture(scope="module")
def tuned(script, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("tuned")
    argv = [
        "tune",
        *("--target", "0.02", *SIM, "--out", str(out), "--no-cache", "--json"),
        *("--clocks", "1410,1380,210", "--iterations-per-clock", "1"),
        *("--block", "2", "--pairs", "2", "--rounds", "2"),
        *("--", "python", str(script), "40"),
    ]
    return out, _json(CliRunner().invoke(app, argv))


@pytest.mark.slow
def test_tune_json_is_the_result_with_its_headline(tuned):
    out, doc = tuned
    assert doc["out"] == str(out) and "tune.json" in doc["written"]
    assert doc["iterations"] == 40 and doc["static_round"] == 1
    assert doc["whole_run"]["iterations"] == 40 and "per_iteration" not in doc
    assert doc["command"][0] == "opdvfs"  # (sys.argv: under CliRunner, pytest's)
    assert json.loads((out / "tune.json").read_text())["whole_run"] == doc["whole_run"]


@pytest.mark.slow
def test_run_json_gives_the_iterations_time_and_energy(tuned, script):
    out, _ = tuned
    argv = ["run", str(out / "schedule.json"), *SIM, "--json", "--", "python", str(script), "4"]
    doc = _json(CliRunner().invoke(app, argv))
    assert doc["command"] == "run" and doc["iterations"] == 4 and doc["virtual"] is True
    assert doc["time_s"] > 0 and doc["energy_j"] > 0 and doc["applied_iterations"] >= 1
    assert any(line.startswith("ran 4 iterations") for line in doc["lines"])


@pytest.mark.slow
def test_capture_json_gives_the_workload_and_the_profile(script, tmp_path):
    work, profile = tmp_path / "w.json", tmp_path / "p.parquet"
    argv = [
        "capture",
        *("--out", str(work), "--profile", str(profile), "--freqs", "1410,210", *SIM),
        *("--iterations-per-clock", "1", "--json", "--", "python", str(script), "20"),
    ]
    doc = _json(CliRunner().invoke(app, argv))
    assert doc["command"] == "capture" and doc["out"] == str(work) and work.is_file()
    assert doc["operators"] > 0 and doc["profile"]["freqs_mhz"] == [210.0, 1410.0]
    assert doc["profile"]["counted_per_clock"] == {"1410": 1, "210": 1}
