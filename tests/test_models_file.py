"""MODELS files: JSON or columnar ``.npz`` (issue 17), the same models either way."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import opdvfs
from opdvfs.cli import app


@pytest.fixture(scope="module")
def bundle() -> opdvfs.ModelBundle:
    device = opdvfs.SimulatedDevice.from_preset("ascend-910b-like")
    profile = device.profile(opdvfs.load_workload("bert"), [1000, 1400, 1800])
    return opdvfs.ModelBundle(
        opdvfs.PerfModel().fit(profile),
        opdvfs.PowerModel().fit(profile, device=device.spec),
        device=device.spec,
    )


def test_npz_and_json_hold_the_same_models(bundle, tmp_path):
    bundle.write(tmp_path / "m.json")
    bundle.write(tmp_path / "m.npz")
    assert (tmp_path / "m.npz").read_bytes()[:4] == b"PK\x03\x04"  # an archive, not JSON text
    from_json = opdvfs.ModelBundle.read(tmp_path / "m.json")
    from_npz = opdvfs.ModelBundle.read(tmp_path / "m.npz")
    assert from_npz.to_dict() == from_json.to_dict()
    freqs = np.array([1000.0, 1250.0, 1800.0])
    time_us = from_json.perf.predict(freqs)
    np.testing.assert_array_equal(from_npz.perf.predict(freqs), time_us)
    a = from_json.power.predict(freqs, time_us=time_us)
    b = from_npz.power.predict(freqs, time_us=time_us)
    np.testing.assert_array_equal(a["chip_w"], b["chip_w"])
    assert from_npz.device == bundle.device


def test_the_long_lists_are_arrays_of_the_archive(bundle, tmp_path):
    bundle.write(tmp_path / "m.npz")
    with np.load(tmp_path / "m.npz") as npz:
        header = json.loads(str(npz["header.json"]))
        arrays = [name for name in npz.files if name != "header.json"]
        assert arrays and all(npz[name].dtype != object for name in arrays)
    assert "$array" in json.dumps(header) and len(json.dumps(header)) < 20_000


def test_fit_writes_npz_and_plan_reads_it(bundle, tmp_path):
    device = opdvfs.SimulatedDevice.from_preset("ascend-910b-like")
    device.profile(opdvfs.load_workload("bert"), [1000, 1400, 1800]).write(tmp_path / "p.parquet")
    runner = CliRunner()
    res = runner.invoke(app, ["fit", str(tmp_path / "p.parquet"), "--out", str(tmp_path / "m.npz")])
    assert res.exit_code == 0, res.output
    res = runner.invoke(
        app,
        ["plan", str(tmp_path / "m.npz"), "--target", "0.02", "--out", str(tmp_path / "s.json")],
    )
    assert res.exit_code == 0, res.output
    assert opdvfs.Schedule.read(tmp_path / "s.json").device == "ascend-910b-like"


def test_a_broken_archive_is_one_line(tmp_path):
    (tmp_path / "m.npz").write_bytes(b"PK\x03\x04" + b"\0" * 64)
    res = CliRunner().invoke(
        app,
        ["plan", str(tmp_path / "m.npz"), "--target", "0.02", "--out", str(tmp_path / "s.json")],
    )
    assert res.exit_code == 2 and "not a valid opdvfs .npz file" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "s.json").exists()


def test_a_small_model_writes_the_same_npz_as_its_json_document(tmp_path):
    """Under 64 operators every list stays in the header, as to_dict() writes it (NaN as null)."""
    device = opdvfs.SimulatedDevice.from_preset("ascend-910b-like")
    work = opdvfs.load_workload("bert")
    small = type(work)(work.ops.iloc[:20].reset_index(drop=True), name="bert20")
    profile = device.profile(small, [1000, 1400, 1800])
    models = opdvfs.ModelBundle(
        opdvfs.PerfModel().fit(profile), opdvfs.PowerModel().fit(profile, device=device.spec)
    )
    models.perf.coef_[0, 0] = np.nan  # a missing parameter travels as null in the header
    models.write(tmp_path / "m.npz")
    with np.load(tmp_path / "m.npz") as npz:
        assert npz.files == ["header.json"]
        header = json.loads(str(npz["header.json"]))
    assert header == json.loads(json.dumps(models.to_dict()))
    back = opdvfs.ModelBundle.read(tmp_path / "m.npz")
    assert np.isnan(back.perf.coef_[0, 0])
    np.testing.assert_array_equal(back.perf.names_, models.perf.names_)
