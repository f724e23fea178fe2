import numpy as np
import pandas as pd
import pytest

from opdvfs import Profile, ProfileFormatError, ValidationError

from conftest import make_ops


def test_valid_profile_sorted_and_typed():
    ops = make_ops(n_ops=3, freqs=(1800.0, 1000.0)).sample(frac=1.0, random_state=1)
    p = Profile(ops)
    assert p.n_ops == 3
    assert list(p.freqs_mhz) == [1000.0, 1800.0]
    table = p.ops
    # compact in memory: int32 positions, categorical text, float64 measurements
    assert table["op"].dtype == np.int32
    assert table["iteration"].dtype == np.int32
    assert isinstance(table["name"].dtype, pd.CategoricalDtype)
    assert isinstance(table["stream"].dtype, pd.CategoricalDtype)
    assert table["time_us"].dtype == np.float64
    assert table["freq_mhz"].is_monotonic_increasing
    # type defaults to name, stream to compute
    assert (table["type"] == table["name"]).all()
    assert set(table["stream"]) == {"compute"}


def test_profile_copies_input_and_output():
    ops = make_ops()
    p = Profile(ops)
    ops.loc[0, "time_us"] = -1.0
    out = p.ops
    out.loc[0, "time_us"] = 99.0
    assert (p.ops["time_us"] > 0).all()
    assert p.ops["time_us"].iloc[0] != 99.0


@pytest.mark.parametrize(
    ("column", "value", "needle"),
    [
        ("time_us", -1.0, "column 'time_us': expected a finite number >= 0"),
        ("time_us", np.nan, "column 'time_us'"),
        ("time_us", np.inf, "column 'time_us'"),
        ("freq_mhz", 0.0, "column 'freq_mhz': expected a finite number > 0"),
        ("op", 1.5, "column 'op': expected an integer"),
        ("name", "", "column 'name': expected a non-empty string"),
    ],
)
def test_bad_values_name_row_and_column(column, value, needle):
    ops = make_ops()
    ops[column] = ops[column].astype(object)
    ops.loc[5, column] = value
    with pytest.raises(ValidationError) as err:
        Profile(ops)
    assert needle in str(err.value)
    assert err.value.row == 5
    assert err.value.field == column


@pytest.mark.parametrize(
    ("column", "dtype", "value", "needle"),
    [
        ("op", np.int32, -1, "column 'op': expected an integer >= 0, got -1"),
        ("iteration", np.int16, -2, "column 'iteration': expected an integer >= 0, got -2"),
        ("time_us", np.float64, -np.inf, "column 'time_us': expected a finite number >= 0"),
        ("freq_mhz", np.float64, np.nan, "column 'freq_mhz': expected a finite number > 0"),
        ("chip_power_w", np.float64, np.inf, "column 'chip_power_w'"),
    ],
)
def test_typed_columns_are_checked_as_text_ones_are(column, dtype, value, needle):
    """Numeric columns (checked in a few passes, 32-bit integers as integers) refuse the same."""
    ops = make_ops().assign(chip_power_w=100.0)
    values = ops[column].to_numpy(dtype=dtype, copy=True)
    values[5] = value
    ops[column] = values
    with pytest.raises(ValidationError) as err:
        Profile(ops)
    assert needle in str(err.value)
    assert (err.value.row, err.value.field) == (5, column)


def test_typed_columns_keep_their_values_and_missing_power():
    """A NaN where NaN marks a missing value passes; 16- and 32-bit positions become int32."""
    ops = make_ops().assign(chip_power_w=100.0)
    ops.loc[3, "chip_power_w"] = np.nan
    ops["op"] = ops["op"].astype(np.int16)
    ops["iteration"] = ops["iteration"].astype(np.uint8)
    table = Profile(ops).ops
    assert table["op"].dtype == np.int32 and table["iteration"].dtype == np.int32
    assert table["chip_power_w"].isna().sum() == 1
    assert sorted(table["op"].unique()) == list(range(4))


def test_unknown_stream_and_column_rejected():
    ops = make_ops().assign(stream="gpu")
    with pytest.raises(ValidationError, match="'compute', 'comm', 'host'"):
        Profile(ops)
    with pytest.raises(ValidationError, match="unknown column 'time_ms'"):
        Profile(make_ops().assign(time_ms=1.0))


def test_missing_required_column():
    with pytest.raises(ValidationError, match="missing required column 'time_us'"):
        Profile(make_ops().drop(columns="time_us"))


def test_duplicate_key_rejected():
    ops = make_ops()
    dup = pd.concat([ops, ops.iloc[[2]]], ignore_index=True)
    with pytest.raises(ValidationError, match="duplicate") as err:
        Profile(dup)
    assert err.value.row == len(ops)


def test_one_name_per_op_position():
    ops = make_ops()
    ops.loc[(ops["op"] == 1) & (ops["freq_mhz"] == 1800.0), "name"] = "other"
    with pytest.raises(ValidationError, match="op 1 is 'other' here but 'op1'"):
        Profile(ops)


def test_parquet_round_trip_is_lossless(tmp_path):
    ops = make_ops(n_ops=5, iterations=2).assign(
        chip_power_w=np.linspace(100, 200, 20), ratio_mte2=np.r_[np.nan, np.linspace(0, 1, 19)]
    )
    samples = pd.DataFrame({"t_s": np.arange(10) * 0.1, "power_w": np.linspace(90, 110, 10)})
    p = Profile(ops, samples, meta={"format": "csv", "sources": ("a.csv",), "dropped": {"x": 2}})
    path = tmp_path / "p.parquet"
    p.write(path)
    back = Profile.read(path)
    assert back.equals(p)
    assert back.meta["sources"] == ["a.csv"]
    assert back.dropped == {"x": 2}
    # the op rows are a plain Parquet table for other tools
    assert len(pd.read_parquet(path)) == len(p)


def test_without_samples_keeps_the_rows_and_metadata():
    samples = pd.DataFrame({"t_s": np.arange(10) * 0.1, "power_w": np.linspace(90, 110, 10)})
    p = Profile(make_ops(n_ops=3), samples, meta={"format": "csv", "device": "d"})
    bare = p.without_samples()
    assert bare.samples is None and p.samples is not None and len(p.samples) == 10
    assert bare.equals(Profile(p.ops, meta=p.meta))
    assert not bare.equals(p)


def test_samples_must_be_time_ordered():
    samples = pd.DataFrame({"t_s": [0.0, 0.2, 0.1], "power_w": [1.0, 2.0, 3.0]})
    with pytest.raises(ValidationError, match="non-decreasing") as err:
        Profile(make_ops(), samples)
    assert err.value.row == 2


def test_read_rejects_non_parquet(tmp_path):
    bad = tmp_path / "p.parquet"
    bad.write_text("not parquet")
    with pytest.raises(ProfileFormatError, match="not a Parquet profile"):
        Profile.read(bad)
    with pytest.raises(ProfileFormatError, match="no such file"):
        Profile.read(tmp_path / "missing.parquet")


def test_time_matrix_medians_over_iterations():
    ops = make_ops(n_ops=2, freqs=(1000.0,), iterations=3)
    ops.loc[ops["iteration"] == 2, "time_us"] *= 10  # an outlier iteration
    op_ids, freqs, times = Profile(ops).time_matrix_us()
    base = make_ops(n_ops=2, freqs=(1000.0,))["time_us"].to_numpy()
    assert list(op_ids) == [0, 1]
    assert list(freqs) == [1000.0]
    np.testing.assert_allclose(times[:, 0], base)


def test_summary_counts_time_per_clock():
    p = Profile(make_ops(n_ops=3, freqs=(1000.0, 1800.0), iterations=2))
    s = p.summary()
    assert s["operators"] == 3
    assert s["clocks"] == 2
    assert s["iterations"] == 2
    one_iter = make_ops(n_ops=3, freqs=(1000.0,))["time_us"].sum() / 1e3
    assert s["per_clock"][0]["time_per_iteration_ms"] == pytest.approx(one_iter)


def test_summary_energy_only_where_every_row_has_power():
    ops = make_ops(n_ops=2, freqs=(1000.0, 1800.0)).assign(
        chip_power_w=[100.0, 200.0, 150.0, np.nan]
    )
    clocks = Profile(ops).summary()["per_clock"]
    low = make_ops(n_ops=2, freqs=(1000.0,))["time_us"].to_numpy()
    assert clocks[0]["chip_energy_per_iteration_j"] == pytest.approx(
        (low[0] * 100 + low[1] * 200) * 1e-6
    )
    assert clocks[0]["mean_chip_power_w"] == pytest.approx(
        clocks[0]["chip_energy_per_iteration_j"] / (low.sum() * 1e-6)
    )
    assert clocks[1]["chip_energy_per_iteration_j"] is None  # one row lacks power
