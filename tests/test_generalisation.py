"""Models on a GPU opdvfs has never seen (issue 16): the V-f prior, characterise, 3 clocks, flags.

Synthetic kernels whose board power is ``u_i + a_i f V(f)^2`` on a known curve: the prior's
derivation and the joint rise must recover the curve, the power model must use the prior (never
a straight line in f) without a device, and a characterised DEVICE.json must carry the curve and
the idle floor through the command line.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from opdvfs import Profile
from opdvfs.cli import app
from opdvfs.devices.spec import DeviceSpec, IdlePower, VoltageCurve
from opdvfs.exceptions import ValidationError
from opdvfs.models.characterise import characterise_spec
from opdvfs.models.perf import (
    VIOLATION_LOW_CLOCK_OFF_TREND,
    PerfModel,
    low_clock_off_trend,
)
from opdvfs.models.power import PowerModel
from opdvfs.models.validation import training_plan, validate_perf
from opdvfs.models.vf_prior import (
    ENVELOPE_RISE_SD,
    PRIOR_KNEE_FRACTION,
    PRIOR_RISE_SD,
    PRIOR_TOP_RISE,
    curve_errors,
    derive_envelope_error,
    derive_prior,
    derive_rise_spread,
    envelope_rise,
    fit_top_rise,
    prior_curve,
    shape_curve,
    two_clock_curve,
)

FREQS = np.array([600.0, 700.0, 800.0, 900.0, 1000.0, 1100.0, 1200.0, 1300.0, 1400.0])


def board_power(n: int, freqs: np.ndarray, curve: VoltageCurve, seed: int = 0) -> np.ndarray:
    """Power (n, k) of n kernels: a clock-independent part plus switching on ``curve``."""
    rng = np.random.default_rng(seed)
    u, a = rng.uniform(40, 120, n), rng.uniform(20, 120, n)
    return u[:, None] + a[:, None] * freqs[None, :] / 1e3 * curve.voltage_v(freqs)[None, :] ** 2


def kernels(power: np.ndarray, freqs: np.ndarray, time_us: np.ndarray | None = None) -> Profile:
    n, k = power.shape
    op = np.repeat(np.arange(n), k)
    return Profile(
        pd.DataFrame(
            {
                "iteration": 0,
                "op": op,
                "name": [f"k{i}" for i in op],
                "freq_mhz": np.tile(freqs, n),
                "time_us": 100.0 if time_us is None else time_us.ravel(),
                "chip_power_w": power.ravel(),
            }
        )
    )


def test_prior_is_flat_to_the_knee_then_rises_to_the_top():
    vf = prior_curve(1400.0)
    assert vf.voltage_v(0.5 * 1400) == pytest.approx(1.0)
    assert vf.voltage_v(PRIOR_KNEE_FRACTION * 1400) == pytest.approx(1.0)
    assert vf.voltage_v(1400.0) == pytest.approx(1.0 + PRIOR_TOP_RISE)
    # the shipped numbers are derive_prior's on the real GPUs: near 0.8 of the top, modest rise
    assert 0.7 <= PRIOR_KNEE_FRACTION <= 0.85
    assert 0.1 <= PRIOR_TOP_RISE <= 0.35


def test_derive_prior_recovers_the_shape_all_gpus_share_and_leaves_one_out():
    truth = (0.7, 0.3)
    gpus = {}
    for g, top in enumerate((1200.0, 1400.0, 1800.0)):
        f = np.linspace(0.45 * top, top, 10)
        gpus[f"gpu{g}"] = [(f, board_power(40, f, shape_curve(top, *truth), seed=g))]
    assert derive_prior(gpus) == pytest.approx(truth)
    # any two of them give the same: what a held-out GPU is scored with
    assert derive_prior({k: v for k, v in gpus.items() if k != "gpu1"}) == pytest.approx(truth)
    errors = curve_errors(*gpus["gpu0"][0])
    assert errors.min() < 1e-6 < 1e-2 < errors.max()


def kernel_population(
    n: int, freqs: np.ndarray, switching: np.ndarray, seed: int = 0, idle_w: float = 40.0
) -> np.ndarray:
    """Power (n, k): a shared idle floor, each kernel's own memory power (none for a third of
    them: pure switching) and its switching ``a_i * switching(f)``; busier kernels move more
    memory (memory power grows with ``a_i``, as on real boards)."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(20, 120, n)
    memory = np.where(np.arange(n) % 3 == 0, 0.0, rng.uniform(0.1, 0.6, n) * a)
    return idle_w + memory[:, None] + a[:, None] * switching[None, :]


def test_two_clock_envelope_recovers_the_voltage_rise_of_the_kernels():
    for rise in (0.1, 0.3, 0.5):
        curve = shape_curve(FREQS[-1], PRIOR_KNEE_FRACTION, rise)
        power = kernel_population(60, FREQS, FREQS / 1e3 * curve.voltage_v(FREQS) ** 2)
        got, sd = envelope_rise(FREQS[[0, -1]], power[:, [0, -1]], FREQS[-1])
        assert got == pytest.approx(rise)
        assert sd < 0.05
        # a regression through all kernels reads memory growing with activity as a flatter V
        p1, dp = power[:, 0], power[:, -1] - power[:, 0]
        slope = np.cov(p1, dp)[0, 1] / np.var(dp, ddof=1)
        g1 = FREQS[0] * curve.voltage_v(FREQS[0]) ** 2
        g2 = FREQS[-1] * curve.voltage_v(FREQS[-1]) ** 2
        assert slope > 1.2 * g1 / (g2 - g1)


def test_two_clock_envelope_linear_power_gives_constant_voltage_cubic_the_steepest():
    linear = kernel_population(60, FREQS, FREQS / 1e3, seed=1)
    assert envelope_rise(FREQS[[0, -1]], linear[:, [0, -1]], FREQS[-1])[0] == 0.0
    cubic = kernel_population(60, FREQS, (FREQS / 1e3) ** 3, seed=2)
    rise, _ = envelope_rise(FREQS[[0, -1]], cubic[:, [0, -1]], FREQS[-1])
    # V rising as fast as f is beyond the flat-then-linear family at the prior's knee: the
    # steepest of the family, which matches the power ratio of the two clocks best
    assert rise == pytest.approx(1.0)
    g = (
        FREQS[[0, -1]]
        * shape_curve(FREQS[-1], PRIOR_KNEE_FRACTION, 1.0).voltage_v(FREQS[[0, -1]]) ** 2
    )
    assert g[1] / g[0] < (FREQS[-1] / FREQS[0]) ** 3


def test_two_clock_envelope_falls_back_to_the_prior_when_it_pins_nothing():
    curve = shape_curve(FREQS[-1], PRIOR_KNEE_FRACTION, 0.4)
    power = kernel_population(60, FREQS, FREQS / 1e3 * curve.voltage_v(FREQS) ** 2)
    two = power[:, [0, -1]]
    prior = shape_curve(FREQS[-1], PRIOR_KNEE_FRACTION, PRIOR_TOP_RISE)
    # too few kernels
    assert envelope_rise(FREQS[[0, -1]], two[:2], FREQS[-1]) == (None, 0.0)
    assert two_clock_curve(FREQS[[0, -1]], two[:2], FREQS[-1]) == prior
    # low-clock power falling as switching power grows (no V-f curve does that): the prior
    falling = np.stack([200.0 - 0.5 * two[:, 1] + two[:, 0] * 0, two[:, 1]], axis=1)
    falling[:, 0] = 300.0 - 0.8 * (two[:, 1] - two[:, 0])
    assert envelope_rise(FREQS[[0, -1]], falling, FREQS[-1]) == (None, 0.0)
    assert two_clock_curve(FREQS[[0, -1]], falling, FREQS[-1]) == prior
    # the two estimates weighed by precision: a certain prior wins, an uninformative one loses
    top = FREQS[-1]
    assert two_clock_curve(FREQS[[0, -1]], two, top, prior_sd=0.0) == prior
    assert two_clock_curve(FREQS[[0, -1]], two, top, prior_sd=np.inf) == curve


def test_two_clock_envelope_keeps_the_prior_when_the_kernels_hardly_differ():
    # sixteen pipeline stages of one model: the same switching, 1% measurement noise; the
    # envelope is then noise, and the rule keeps the prior (rejected or uncertain)
    prior = prior_curve(FREQS[-1])
    same = (40.0 + 80.0 * FREQS / 1e3 * prior.voltage_v(FREQS) ** 2)[None, :]
    for seed in range(4):
        power = same * np.random.default_rng(seed).normal(1.0, 0.01, (16, len(FREQS)))
        curve = two_clock_curve(FREQS[[0, -1]], power[:, [0, -1]], FREQS[-1])
        assert curve.voltage_v(FREQS[-1]) == pytest.approx(1 + PRIOR_TOP_RISE, abs=0.05)
    # while 60 varied kernels with the same noise still pin their own rise
    truth = shape_curve(FREQS[-1], PRIOR_KNEE_FRACTION, 0.5)
    varied = kernel_population(60, FREQS, FREQS / 1e3 * truth.voltage_v(FREQS) ** 2)
    varied = varied * np.random.default_rng(9).normal(1.0, 0.01, varied.shape)
    rise, sd = envelope_rise(FREQS[[0, -1]], varied[:, [0, -1]], FREQS[-1])
    assert rise == pytest.approx(0.5, abs=0.1) and sd < 0.1


def test_rise_spread_is_how_far_gpus_rises_differ():
    gpus = {}
    for g, rise in enumerate((0.1, 0.3, 0.5)):
        f = np.linspace(0.45 * 1400, 1400, 10)
        gpus[f"gpu{g}"] = [(f, board_power(40, f, shape_curve(1400, 0.75, rise), seed=g))]
    assert derive_rise_spread(gpus, 0.75) == pytest.approx(0.2)
    assert derive_rise_spread({"gpu0": gpus["gpu0"]}, 0.75) == np.inf


def test_envelope_error_is_how_far_the_envelope_missed_each_gpus_own_rise():
    gpus = {}
    for g, rise in enumerate((0.1, 0.3, 0.5)):
        f = np.linspace(0.45 * 1400, 1400, 10)
        vf = shape_curve(1400, 0.75, rise)
        gpus[f"gpu{g}"] = [(f, kernel_population(60, f, f / 1e3 * vf.voltage_v(f) ** 2, seed=g))]
    assert derive_envelope_error(gpus, 0.75) == pytest.approx(0.0, abs=1e-9)
    # a GPU whose low-clock power has its own bend (a kernel-independent convex floor) is missed
    f = np.linspace(0.45 * 1400, 1400, 10)
    flat = kernel_population(60, f, f / 1e3, seed=4) + 30.0 * (f / 1400) ** 6
    missed = derive_envelope_error({"gpu": [(f, flat)]}, 0.75)
    assert missed >= 0.05
    # RMS over GPUs: the three it recovers count as zeros
    both = derive_envelope_error({**gpus, "gpu": [(f, flat)]}, 0.75)
    assert both == pytest.approx(missed / 2)


def test_two_clocks_without_a_device_use_the_prior_not_a_straight_line():
    power = board_power(30, FREQS, prior_curve(FREQS[-1]))
    profile = kernels(power, FREQS)
    model = PowerModel().fit(profile, [600.0, 1400.0])
    assert model.voltage_ == prior_curve(1400.0)
    test = FREQS[1:-1]
    np.testing.assert_allclose(model.predict(test)["chip_w"], power[:, 1:-1], rtol=1e-9)
    # the constant voltage this replaces over-predicts every clock in between
    flat = VoltageCurve(knee_mhz=1400.0, flat_v=1.0, slope_v_per_mhz=0.0)
    line = PowerModel(voltage=flat).fit(profile, [600.0, 1400.0]).predict(test)["chip_w"]
    assert (line > power[:, 1:-1]).all()
    with pytest.raises(ValidationError, match="two-clock V-f curve") as err:
        PowerModel(two_clocks="bogus").fit(profile, [600.0, 1400.0])  # type: ignore[arg-type]
    assert err.value.field == "two_clocks"


def test_two_clocks_with_the_envelope_option_read_the_rise_off_the_kernels():
    curve = shape_curve(FREQS[-1], PRIOR_KNEE_FRACTION, 0.3)
    power = kernel_population(30, FREQS, FREQS / 1e3 * curve.voltage_v(FREQS) ** 2)
    profile = kernels(power, FREQS)
    model = PowerModel(two_clocks="envelope").fit(profile, [600.0, 1400.0])
    assert PowerModel().fit(profile, [600.0, 1400.0]).voltage_ == prior_curve(1400.0)
    assert model.voltage_ == two_clock_curve(FREQS[[0, -1]], power[:, [0, -1]], 1400.0)
    # the envelope's 0.3 weighed against the prior's 0.175 by their measured errors on real GPUs
    w = PRIOR_RISE_SD**2 / (PRIOR_RISE_SD**2 + ENVELOPE_RISE_SD**2)
    expected = 1 + w * 0.3 + (1 - w) * PRIOR_TOP_RISE
    assert model.voltage_.voltage_v(1400.0) == pytest.approx(expected, abs=0.01)
    # with the envelope trusted alone, the held-out clocks are the kernels' own
    own = two_clock_curve(FREQS[[0, -1]], power[:, [0, -1]], 1400.0, prior_sd=np.inf)
    test = FREQS[1:-1]
    pred = PowerModel(voltage=own).fit(profile, [600.0, 1400.0]).predict(test)["chip_w"]
    np.testing.assert_allclose(pred, power[:, 1:-1], rtol=1e-9)
    # the constant voltage this replaces over-predicts every clock in between
    flat = VoltageCurve(knee_mhz=1400.0, flat_v=1.0, slope_v_per_mhz=0.0)
    line = PowerModel(voltage=flat).fit(profile, [600.0, 1400.0]).predict(test)["chip_w"]
    assert (line > power[:, 1:-1]).all()
    assert (model.predict(test)["chip_w"] < line).all()


def test_three_clocks_keep_the_knee_and_fit_one_rise_across_all_ops():
    curve = shape_curve(FREQS[-1], PRIOR_KNEE_FRACTION, 0.4)
    power = board_power(50, FREQS, curve, seed=3)
    train = [600.0, 1000.0, 1400.0]
    fitted = fit_top_rise(np.array(train), power[:, [0, 4, 8]], FREQS[-1])
    assert fitted.knee_mhz == pytest.approx(curve.knee_mhz)
    assert fitted.voltage_v(1400.0) == pytest.approx(1.4)
    model = PowerModel().fit(kernels(power, FREQS), train)
    assert model.voltage_ == fitted
    held = ~np.isin(FREQS, train)
    np.testing.assert_allclose(model.predict(FREQS[held])["chip_w"], power[:, held], rtol=1e-6)


def test_training_plan_spreads_two_three_and_four_clocks():
    f = np.arange(855.0, 1411.0, 15.0)
    np.testing.assert_array_equal(training_plan(f, 2), [855.0, 1410.0])
    np.testing.assert_array_equal(training_plan(f, 3), [855.0, 1125.0, 1410.0])
    # the fourth in the upper part of the range, between the middle and the top
    np.testing.assert_array_equal(training_plan(f, 4), [855.0, 1125.0, 1275.0, 1410.0])
    np.testing.assert_array_equal(training_plan(f[:3], 4), f[:3])


def test_lowest_clock_off_trend_is_flagged_from_four_clocks():
    f_ghz = np.array([0.7, 1.0, 1.2, 1.4])
    cycles = np.array([[1000.0], [1000.0]]) * np.ones((2, 4))  # compute-bound: T = c / f
    t_us = cycles / f_ghz
    t_us[1, 0] *= 1.15  # the second op runs 15% slow at the lowest clock
    flags = low_clock_off_trend(f_ghz, t_us)
    np.testing.assert_array_equal(flags, [0, VIOLATION_LOW_CLOCK_OFF_TREND])
    # three clocks rest the trend on two points: not flagged
    np.testing.assert_array_equal(low_clock_off_trend(f_ghz[[0, 2, 3]], t_us[:, [0, 2, 3]]), 0)
    rows = kernels(np.full((2, 4), 100.0), f_ghz * 1e3, t_us)
    model = PerfModel().fit(rows, [700.0, 1000.0, 1200.0, 1400.0])
    assert model.violation_[1] & VIOLATION_LOW_CLOCK_OFF_TREND
    assert not model.violation_[0]
    # validate perf counts them (a fifth clock to score)
    f5 = np.array([0.7, 1.0, 1.1, 1.2, 1.4])
    t5 = 1000.0 / f5 * np.ones((2, 1))
    t5[1, 0] *= 1.15
    result = validate_perf(kernels(np.full((2, 5), 100.0), f5 * 1e3, t5), [700, 1000, 1200, 1400])
    assert result["flagged_ops"] == result["low_clock_off_trend_ops"] == 1


def test_throughput_form_without_an_idle_floor_is_refused():
    power = board_power(10, FREQS, prior_curve(FREQS[-1]))
    profile = kernels(power, FREQS)
    with pytest.raises(ValidationError, match="needs an idle power floor") as err:
        PowerModel(dynamic="throughput").fit(profile, [600.0, 1400.0])
    assert err.value.field == "calibration"
    # a characterised device brings one
    device = DeviceSpec(
        name="gpu",
        freqs_mhz=tuple(FREQS),
        voltage=prior_curve(FREQS[-1]),
        idle=IdlePower(rail="chip", beta_w_per_ghz_v2=10.0, theta_w_per_v=30.0),
    )
    model = PowerModel(dynamic="throughput").fit(profile, [600.0, 1400.0], device=device)
    assert (model.beta_, model.theta_) == pytest.approx((10.0, 30.0))
    PowerModel(dynamic="throughput").fit(profile, [600.0, 1000.0, 1400.0])  # 3 clocks: joint


def test_characterise_writes_a_device_the_commands_take(tmp_path):
    curve = shape_curve(FREQS[-1], 0.7, 0.35)
    power = board_power(60, FREQS, curve, seed=5)
    rng = np.random.default_rng(5)
    time_us = rng.uniform(50, 500, (60, 1)) * 1400.0 / FREQS[None, :]
    bench = tmp_path / "bench.parquet"
    kernels(power, FREQS, time_us).write(bench)
    spec = characterise_spec(Profile.read(bench), name="my-gpu")
    np.testing.assert_allclose(spec.voltage.voltage_v(FREQS), curve.voltage_v(FREQS), rtol=0.02)
    out = tmp_path / "gpu.json"
    runner = CliRunner()
    res = runner.invoke(app, ["characterise", str(bench), "--out", str(out), "--name", "my-gpu"])
    assert res.exit_code == 0, res.output
    assert "wrote" in res.stdout and "my-gpu" in res.stdout
    device = DeviceSpec.read(out)
    assert device == spec.with_changes(source=device.source)
    assert "60 kernels at 9 clocks" in device.source
    assert device.freqs_mhz == tuple(FREQS) and device.idle is not None
    # --device DEVICE.json: the validate and fit commands take it like a preset name
    app_path = tmp_path / "app.parquet"
    kernels(board_power(20, FREQS, curve, seed=6), FREQS, time_us[:20]).write(app_path)
    base = ["validate", "power", str(app_path), "--device", str(out), "--json"]
    res = runner.invoke(app, [*base, "--train-freqs", "min,top"])
    assert res.exit_code == 0, res.output
    with_curve = json.loads(res.stdout)
    assert with_curve["train_freqs_mhz"] == [600.0, 1400.0]
    assert with_curve["mape_pct"] < 0.5
    res = runner.invoke(app, [*base, "--train-freqs", "min,top", "--dynamic", "throughput"])
    assert res.exit_code == 0, res.output
    models = tmp_path / "m.json"
    res = runner.invoke(
        app, ["fit", str(app_path), "--device", str(out), "--train-freqs", "min,top", "-o", models]
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(models.read_text())
    assert doc["device"]["name"] == "my-gpu"
    assert doc["power"]["voltage"] == device.voltage.model_dump()


def test_train_freqs_take_steps_down_from_the_top(tmp_path):
    path = tmp_path / "p.parquet"
    kernels(board_power(5, FREQS, prior_curve(1400.0)), FREQS).write(path)
    res = CliRunner().invoke(
        app, ["validate", "perf", str(path), "--train-freqs", "min,top-2,top", "--json"]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["train_freqs_mhz"] == [600.0, 1200.0, 1400.0]


def test_plan_takes_the_same_step_names(tmp_path):
    path = tmp_path / "p.parquet"
    kernels(board_power(5, FREQS, prior_curve(1400.0)), FREQS).write(path)
    runner = CliRunner()
    out = tmp_path / "s.json"
    res = runner.invoke(
        app,
        ["plan", str(path), "--target", "0.05", "--train-freqs", "min,top-1,top", "-o", str(out)],
    )
    assert res.exit_code == 0, res.output
    assert out.is_file()
    res = runner.invoke(
        app, ["plan", str(path), "--target", "0.05", "--train-freqs", "min,top-9", "-o", str(out)]
    )
    assert res.exit_code == 2
    assert "top-N with N below 9" in res.output
    res = runner.invoke(
        app,
        [
            "plan",
            str(path),
            "--target",
            "0.05",
            "--train-freqs",
            "top",
            "--values",
            "measured",
            "-o",
            str(out),
        ],
    )
    assert res.exit_code == 2
    assert "--values measured plans without them" in res.output
