"""Profile files: samples in their own table, old files still read, large runs read back."""

import resource
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from opdvfs import Profile, ProfileFormatError
from opdvfs.io import read_profile
from opdvfs.profile import samples_path

from conftest import make_ops

FIXTURES = Path(__file__).parent / "fixtures"


def test_version_1_file_still_reads():
    # written by the code before format 2: samples as a Parquet blob in the footer
    p = Profile.read(FIXTURES / "profile_v1.parquet")
    assert (p.n_ops, p.n_iterations, len(p), len(p.samples)) == (4, 2, 16, 6)
    assert p.meta["device"] == "ascend-910b-like"
    assert p.dropped == {"warm-up": 3}


def test_version_1_rewritten_as_version_2_is_equal(tmp_path):
    old = Profile.read(FIXTURES / "profile_v1.parquet")
    old.write(tmp_path / "p.parquet")
    assert samples_path(tmp_path / "p.parquet").name == "p.samples.parquet"
    assert Profile.read(tmp_path / "p.parquet").equals(old)
    # the rows stay a plain Parquet table
    assert len(pd.read_parquet(tmp_path / "p.parquet")) == 16


def test_ten_million_samples_write_and_read_back(tmp_path):
    n = 10_000_000
    samples = pd.DataFrame(
        {"t_s": np.arange(n) * 1e-4, "power_w": np.full(n, 250.0) + (np.arange(n) % 7)}
    )
    profile = Profile(make_ops(), samples)
    out = tmp_path / "big.parquet"
    profile.write(out)
    # the footer holds only the header, not the samples
    assert out.stat().st_size < 100_000
    back = read_profile(out)
    assert len(back.samples) == n
    assert back.samples["power_w"].iloc[-1] == samples["power_w"].iloc[-1]
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 2 * 1024**2  # KiB: < 2 GiB


def test_samples_file_missing_or_foreign_is_one_line(tmp_path):
    old = Profile.read(FIXTURES / "profile_v1.parquet")
    old.write(tmp_path / "a.parquet")
    old.write(tmp_path / "b.parquet")
    shutil.copy(tmp_path / "b.samples.parquet", tmp_path / "a.samples.parquet")
    with pytest.raises(ProfileFormatError, match="samples of another profile"):
        Profile.read(tmp_path / "a.parquet")
    (tmp_path / "a.samples.parquet").unlink()
    with pytest.raises(ProfileFormatError, match="samples file a.samples.parquet is missing"):
        Profile.read(tmp_path / "a.parquet")


def test_samples_left_unread_only_where_rows_carry_power(tmp_path):
    # fits read per-op power, never the samples: `fit` and `plan` skip decoding them
    samples = pd.DataFrame({"t_s": [0.0, 0.1], "power_w": [200.0, 210.0]})
    with_power = Profile(make_ops().assign(chip_power_w=250.0), samples)
    with_power.write(tmp_path / "a.parquet")
    bare = Profile.read(tmp_path / "a.parquet", samples=False)
    assert bare.samples is None and bare.ops.equals(Profile.read(tmp_path / "a.parquet").ops)
    assert read_profile(tmp_path / "a.parquet", samples=False).samples is None
    assert np.array_equal(bare.op_ids, np.unique(bare.ops["op"]))
    # still checked to be the profile's own
    (tmp_path / "a.samples.parquet").unlink()
    with pytest.raises(ProfileFormatError, match="is missing"):
        Profile.read(tmp_path / "a.parquet", samples=False)
    # without per-op power the samples are the only power: kept
    Profile(make_ops(), samples).write(tmp_path / "b.parquet")
    assert len(Profile.read(tmp_path / "b.parquet", samples=False).samples) == 2


def test_samples_file_given_as_a_profile_is_named(tmp_path):
    Profile.read(FIXTURES / "profile_v1.parquet").write(tmp_path / "p.parquet")
    with pytest.raises(ProfileFormatError, match="sensor samples of an opdvfs profile"):
        read_profile(tmp_path / "p.samples.parquet")


def test_rewrite_without_samples_removes_the_stale_samples_file(tmp_path):
    old = Profile.read(FIXTURES / "profile_v1.parquet")
    old.write(tmp_path / "p.parquet")
    Profile(old.ops, meta=old.meta).write(tmp_path / "p.parquet")
    assert not (tmp_path / "p.samples.parquet").exists()
    assert Profile.read(tmp_path / "p.parquet").samples is None


def test_compact_rows_take_few_bytes():
    from opdvfs.sim.twin import SimulatedDevice
    from opdvfs.workloads import load_workload

    profile = SimulatedDevice.from_preset("ascend-910b-like").profile(
        load_workload("bert"), [1000, 1800]
    )
    ops = profile.ops
    assert ops.memory_usage(deep=True).sum() / len(ops) <= 200
