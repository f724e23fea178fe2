import json
import warnings

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from opdvfs import Profile, ValidationError
from opdvfs.calibration import PowerCalibration
from opdvfs.cli import app
from opdvfs.devices.spec import VoltageCurve
from opdvfs.models._lsq import fit_fixed_effects
from opdvfs.models.attribution import (
    MIN_WINDOWS,
    attribute_class_power,
    class_time_in_windows,
    power_rows,
    sensor_iterations,
)
from opdvfs.models.characterise import (
    CHARACTERISE_GRID,
    characterise_device,
    fit_voltage_curve,
)
from opdvfs.models.perf import PerfModel
from opdvfs.models.power import PowerModel, fit_core_power
from opdvfs.models.thermal import solve_temperature
from opdvfs.models.validation import validate_power
from opdvfs.sim import SimulatedDevice
from opdvfs.sim.presets import get_preset
from opdvfs.workloads.library import BUILDERS

ASCEND = get_preset("ascend-910b-like")
VF = VoltageCurve(knee_mhz=1300, flat_v=0.75, slope_v_per_mhz=1.3e-4)


@pytest.fixture(scope="module")
def bert_profile():
    dev = SimulatedDevice.from_preset("ascend-910b-like", seed=0)
    return dev, dev.profile(BUILDERS["bert"](), ASCEND.spec.freqs_mhz)


def synthetic_rows(alpha, gamma, theta, freqs, temps, seed=0):
    rng = np.random.default_rng(seed)
    n = len(alpha)
    op = np.repeat(np.arange(n), len(freqs))
    f = np.tile(freqs, n)
    volt = VF.voltage_v(f)
    x = f / 1e3 * volt**2
    dtemp = np.tile(temps, n) + rng.normal(0, 0.5, n * len(freqs))
    power = alpha[op] * x + gamma * dtemp * volt + theta * volt
    return x, volt, dtemp, power, op


def test_fixed_effects_fit_recovers_the_papers_coefficients():
    alpha = np.random.default_rng(1).uniform(5, 40, 300)
    x, volt, dtemp, power, op = synthetic_rows(
        alpha, 0.2, 4.0, np.array([1000.0, 1400, 1800]), np.array([30.0, 36, 44])
    )
    a, g, t = fit_core_power(x, volt, dtemp, power, op, 300)
    np.testing.assert_allclose(a, alpha, rtol=1e-8)
    assert g == pytest.approx(0.2, rel=1e-8)
    assert t == pytest.approx(4.0, rel=1e-8)


def test_shared_coefficients_are_solved_with_their_bounds_not_clipped():
    """theta = 0 on the boundary: clipping an unconstrained solve kept gamma's excess (a bug
    that made a 3-clock fit predict +200% core energy at 1000 MHz on resnet152)."""
    alpha = np.random.default_rng(2).uniform(5, 40, 200)
    # temperatures nearly proportional to V: the unconstrained solve trades theta for gamma
    freqs = np.array([1000.0, 1400, 1800])
    x, volt, dtemp, power, op = synthetic_rows(
        alpha, 0.25, 0.0, freqs, 40 * VF.voltage_v(freqs), seed=3
    )
    power = power + np.random.default_rng(4).normal(0, 0.3, len(power))
    a, g, t = fit_core_power(x, volt, dtemp, power, op, 200)
    assert t >= 0 and g >= 0
    assert g == pytest.approx(0.25, abs=0.05)
    assert (a > 0).all()
    np.testing.assert_allclose(a, alpha, rtol=0.1)


def test_three_clock_fit_predicts_the_measured_direction():
    dev = SimulatedDevice.from_preset("ascend-910b-like", seed=0)
    w = BUILDERS["resnet152"]()
    model = PowerModel().fit(dev.profile(w, [1000, 1400, 1800]), device=ASCEND.spec)
    assert (model.alpha_ > 0).all()
    low, _ = dev.run(w, freq_mhz=1000.0)
    top, _ = dev.run(w)
    measured = low.core_energy_j / top.core_energy_j
    perf = PerfModel().fit(dev.profile(w, [1000, 1400, 1800]))
    t = perf.predict([1000.0, 1800.0])
    e = (model.predict([1000.0, 1800.0])["core_w"] * t).sum(axis=0)
    assert e[0] / e[1] == pytest.approx(measured, abs=0.05)


@pytest.mark.parametrize("thermal", ["workload", "op"])
@pytest.mark.parametrize("dynamic", ["clock", "throughput"])
def test_predict_is_the_core_terms_at_the_solved_temperature(
    bert_profile, monkeypatch, thermal, dynamic
):
    """Each clock's terms computed once, outside the fixed point: ``_core``'s numbers, to the bit.

    With a temperature term (``gamma``) and an uncore one, on the die of each clock and held at
    the top clock's.
    """
    from opdvfs.models import power

    _, profile = bert_profile
    spec = get_preset("ascend-910b-like").spec
    model = PowerModel(thermal=thermal, dynamic=dynamic).fit(profile, device=spec)
    model.use_temperature_, model.gamma_, model.uncore_gamma_ = True, 0.013, 0.007
    freqs = np.asarray(profile.freqs_mhz)
    time_us = PerfModel().fit(profile).predict(freqs)
    n = len(model.op_ids_)
    rises = []

    def solve(chip_w_at, k_c_per_w, n_rises):
        rises.append(solve_temperature(chip_w_at, k_c_per_w, n_rises))
        return rises[-1]

    monkeypatch.setattr(power, "solve_temperature", solve)
    for die in (None, float(freqs[-1])):
        rises.clear()
        out = model.predict(freqs, time_us=time_us, die_at_mhz=die)
        assert len(rises) == (len(freqs) if die is None else 1)
        assert all(steps > 1 for _, steps in rises)
        for j, f in enumerate(freqs):
            volt = float(model.voltage_.voltage_v(f))
            inv_t = model._inverse_times(time_us, n, len(freqs))
            core = model._core(
                np.arange(n),
                np.full(n, f / 1e3 * volt**2),
                np.full(n, volt),
                rises[j if die is None else 0][0],
                None if inv_t is None else inv_t[:, j],
            )
            np.testing.assert_array_equal(out["core_w"][:, j], core)


def test_fixed_point_converges_in_few_iterations():
    # dT = k (P0 + g dT): contraction with k g = 0.035, the paper's "<= 4 iterations"
    dtemp, steps = solve_temperature(lambda dt: 200.0 + 0.2 * dt, 0.175, 3)
    assert dtemp == pytest.approx(np.full(3, 0.175 * 200 / (1 - 0.175 * 0.2)), abs=0.01)
    assert steps <= 4


def test_voltage_curve_fitted_jointly_across_ops():
    rng = np.random.default_rng(2)
    f = np.linspace(1000, 1800, 9)
    truth = VoltageCurve(knee_mhz=1300, flat_v=1.0, slope_v_per_mhz=4e-4)
    x = f / 1e3 * truth.voltage_v(f) ** 2
    power = rng.uniform(50, 150, (40, 1)) + rng.uniform(10, 40, (40, 1)) * x
    fit = fit_voltage_curve(f, power, knees=41, slopes=61)
    np.testing.assert_allclose(
        fit.voltage_v(f) / fit.voltage_v(f[0]), truth.voltage_v(f), rtol=0.02
    )


def test_refined_voltage_curve_finds_a_small_rise_between_grid_steps():
    # a power-capped board's V-f (A40-like range): a 4% rise, a third of the 25 x 25 grid's
    # step in the rise; every clock measured, as a characterisation has them
    rng = np.random.default_rng(3)
    f = np.linspace(855, 1740, 30)
    truth = VoltageCurve(knee_mhz=1300, flat_v=1.0, slope_v_per_mhz=0.04 / 440)
    x = f / 1e3 * truth.voltage_v(f) ** 2
    power = rng.uniform(50, 150, (40, 1)) + rng.uniform(10, 40, (40, 1)) * x

    def miss(curve: VoltageCurve) -> float:
        return float(np.abs(curve.voltage_v(f) / curve.voltage_v(f[0]) - truth.voltage_v(f)).max())

    coarse = fit_voltage_curve(f, power)
    refined = fit_voltage_curve(f, power, **CHARACTERISE_GRID)
    assert miss(refined) < 0.005 < miss(coarse)


def test_paper_procedure_on_the_simulator(bert_profile):
    dev, profile = bert_profile
    cal = dev.calibration_runs()
    result = validate_power(profile, [1000, 1800], device=ASCEND.spec, calibration=cal)
    assert result["rail"] == "core"
    assert result["mape_pct"] <= 3.0  # goal (paper: 4.62% on its hardware)
    # On the calibrated twin (issue 18) temperature follows f V^2 so closely that alpha f V^2 and
    # theta V absorb the leakage rise: the term no longer lowers the error as on the paper's
    # hardware (4.62% vs 4.97%), but it must not cost more than noise (docs/twin-calibration.md).
    assert result["mape_pct"] <= result["mape_no_temperature_pct"] + 0.1
    assert 5 < result["temperature_share_pct"] < 50
    assert result["iterations"] <= 4
    assert len(result["test_freqs_mhz"]) == 7


def test_calibration_recovers_the_twins_leakage_slope(bert_profile):
    dev, _ = bert_profile
    p = ASCEND.twin
    cal = dev.calibration_runs()
    temp = cal.cooldown["temp_c"].mean()
    # the twin's leakage is exponential; its slope at the cool-down temperature:
    slope = (
        p.leak_a * np.log(2) / p.leak_doubling_c * 2 ** ((temp - p.leak_ref_c) / p.leak_doubling_c)
    )
    assert cal.gamma(ASCEND.spec.voltage) == pytest.approx(slope, rel=0.15)
    idle = cal.idle.sort_values("freq_mhz")
    assert (np.diff(idle["core_power_w"]) > 0).all()  # idle power rises with the clock


def test_class_time_in_windows_is_exact():
    start = np.array([0.0, 0.3, 0.5, 1.2])
    dur = np.array([0.2, 0.2, 0.4, 0.3])
    cls = np.array([0, 1, 0, 1])
    busy = class_time_in_windows(start, dur, cls, 2, np.array([0.4, 1.0, 1.5]), 0.5)
    np.testing.assert_allclose(busy, [[0.2, 0.1], [0.4, 0.0], [0.0, 0.3]], atol=1e-12)


def test_attribution_recovers_class_power_from_windows():
    """Ops alternate in phases, so windows see different mixes: class power is identifiable."""
    rng = np.random.default_rng(0)
    n = 4000
    cls = np.where((np.arange(n) // 200) % 2 == 0, 0, rng.integers(1, 3, n))
    dur = rng.uniform(0.5e-3, 2e-3, n)
    start = np.r_[0.0, np.cumsum(dur)[:-1]]
    power = np.array([300.0, 150.0, 220.0])[cls]
    t = np.arange(0.1, start[-1], 0.1)
    edges = np.r_[start, start[-1] + dur[-1]]
    energy = np.interp(t, edges, np.r_[0.0, np.cumsum(power * dur)])
    samples = pd.DataFrame(
        {
            "t_s": t,
            "power_w": (energy - np.interp(t - 0.1, edges, np.r_[0.0, np.cumsum(power * dur)]))
            / 0.1,
        }
    )
    rows = pd.DataFrame(
        {
            "wall_s": start,
            "time_us": dur * 1e6,
            "type": np.array(["mm", "gelu", "add"])[cls],
            "freq_mhz": 1410.0,
        }
    )
    got = attribute_class_power(rows, samples, window_s=0.1).set_index("type")["power_w"]
    assert got["mm"] == pytest.approx(300, rel=0.03)
    assert got["gelu"] == pytest.approx(150, rel=0.05)
    assert got["add"] == pytest.approx(220, rel=0.05)


def test_a_window_that_read_no_energy_is_left_out_of_the_residual():
    """A sensor that reads 0 W in a window (an idle rank) gives no divide-by-zero warning."""
    start = np.arange(0.0, 1.0, 0.01)
    rows = pd.DataFrame(
        {
            "wall_s": start,
            "time_us": 5e3,
            "type": np.where(start < 0.5, "mm", "add"),
            "freq_mhz": 1410.0,
        }
    )
    t = np.arange(0.1, 1.01, 0.1)
    power = np.where(t <= 0.5, 100.0, 60.0)
    power[4] = 0.0  # a window that read nothing
    samples = pd.DataFrame({"t_s": t, "power_w": power})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = attribute_class_power(rows, samples, window_s=0.1)
    resid = got["residual_pct"].iloc[0]
    assert np.isfinite(resid) and resid >= 0.0


def test_sample_only_gpu_profile_recovers_per_op_power():
    a100 = get_preset("a100-like")
    w = BUILDERS["gpt3"]()
    coarse = SimulatedDevice.from_preset("a100-like").profile(w, [1410], iterations=2)
    fine_spec = a100.spec.with_changes(power_sample_period_ms=1.0)
    truth = SimulatedDevice(fine_spec, a100.twin).profile(w, [1410], iterations=2).ops
    assert "chip_power_w" not in coarse.ops
    cls = attribute_class_power(coarse.ops, coarse.samples, window_s=0.1)
    est = cls.set_index("type")["power_w"].reindex(coarse.ops["type"]).to_numpy()
    weights = coarse.ops["time_us"].to_numpy()
    err = np.average(np.abs(est / truth["chip_power_w"].to_numpy() - 1), weights=weights)
    naive = np.average(truth["chip_power_w"], weights=weights)
    naive_err = np.average(np.abs(naive / truth["chip_power_w"] - 1), weights=weights)
    assert err < 0.05 < naive_err  # 100 ms windows resolve per-op power to a few percent
    energy = (est * weights).sum() / (truth["chip_power_w"].to_numpy() * weights).sum()
    assert energy == pytest.approx(1.0, abs=0.005)


def test_cli_validate_power(tmp_path, bert_profile):
    _, profile = bert_profile
    path = tmp_path / "bert.parquet"
    profile.write(path)
    res = CliRunner().invoke(
        app, ["validate", "power", str(path), "--train-freqs", "min,max", "--json"]
    )
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert {
        "n_points",
        "mape_pct",
        "within1_pct",
        "within5_pct",
        "within10_pct",
        "mape_no_temperature_pct",
    } <= set(payload)
    res = CliRunner().invoke(
        app, ["validate", "power", str(path), "--train-freqs", "min,max", "--calibrate"]
    )
    assert res.exit_code == 2 and "--calibrate needs --device" in res.stderr


def test_profile_without_power_is_a_clear_error():
    ops = pd.DataFrame(
        {"op": [0, 0], "name": "a", "freq_mhz": [1000.0, 1800.0], "time_us": [10.0, 6.0]}
    )
    with pytest.raises(ValidationError, match="no per-op power columns"):
        PowerModel().fit(Profile(ops))


def kernel_rows(op: np.ndarray, freq_mhz: np.ndarray, chip_power_w: np.ndarray) -> pd.DataFrame:
    """Profile rows of GPU kernels with board power only (the chip rail)."""
    return pd.DataFrame(
        {
            "iteration": 0,
            "op": op,
            "name": [f"k{i}" for i in op],
            "type": "Kernel",
            "stream": "compute",
            "freq_mhz": freq_mhz,
            "time_us": 100.0,
            "chip_power_w": chip_power_w,
        }
    )


def test_chip_rail_fits_a_per_op_uncore_constant_jointly():
    """Board power = alpha_i f V^2 + u_i (memory power differs per kernel): two clocks pin the
    line, a third is predicted exactly (the old fit put u_i into alpha_i through the origin)."""
    rng = np.random.default_rng(5)
    n = 40
    alpha, u = rng.uniform(50, 200, n), rng.uniform(20, 120, n)
    freqs = np.array([705.0, 1087.0, 1380.0])
    op = np.repeat(np.arange(n), len(freqs))
    f = np.tile(freqs, n)
    volt = VF.voltage_v(f)
    rows = kernel_rows(op, f, alpha[op] * f / 1e3 * volt**2 + u[op])
    model = PowerModel(voltage=VF, temperature=False).fit(Profile(rows), [705.0, 1380.0])
    assert model.rail_ == "chip" and model.theta_ == 0.0
    np.testing.assert_allclose(model.alpha_, alpha, rtol=1e-9)
    np.testing.assert_allclose(model.uncore_w_, u, rtol=1e-9)
    mid = rows[rows["freq_mhz"] == 1087.0]["chip_power_w"].to_numpy()
    predicted = model.predict([1087.0])
    np.testing.assert_allclose(predicted["chip_w"][:, 0], mid, rtol=1e-9)
    # board power alone does not say what the core drew: no core prediction, not the chip's
    assert np.isnan(predicted["core_w"]).all()


def test_chip_rail_from_three_clocks_gives_each_kernel_its_static_term(tmp_path):
    rng = np.random.default_rng(6)
    n = 30
    alpha, theta, u = rng.uniform(50, 200, n), rng.uniform(-40, 40, n), rng.uniform(60, 120, n)
    freqs = np.array([705.0, 1087.0, 1237.0, 1380.0])  # V moves above the 1300 MHz knee
    curve = VoltageCurve(knee_mhz=1000, flat_v=0.71, slope_v_per_mhz=2.5e-4)
    op = np.repeat(np.arange(n), len(freqs))
    f = np.tile(freqs, n)
    volt = curve.voltage_v(f)
    power = alpha[op] * f / 1e3 * volt**2 + theta[op] * volt + u[op]
    rows = kernel_rows(op, f, power)
    model = PowerModel(voltage=curve, temperature=False).fit(Profile(rows), [705, 1087, 1380])
    np.testing.assert_allclose(model.alpha_, alpha, rtol=1e-6)
    held = rows["freq_mhz"] == 1237.0
    np.testing.assert_allclose(
        model.predict([1237.0])["chip_w"][:, 0], power[held.to_numpy()], rtol=1e-9
    )
    again = PowerModel.from_dict(json.loads(json.dumps(model.to_dict())))
    np.testing.assert_allclose(again.predict([1237.0])["chip_w"], model.predict([1237.0])["chip_w"])


def test_a_class_no_window_saw_gets_the_windows_mean_power():
    # two classes in the first second (sampled), a third only after the last complete window
    start = np.r_[np.arange(0, 1.0, 0.01), 1.0]
    dur = np.r_[np.full(100, 0.01), 0.02]
    kind = np.append(np.where(np.arange(100) % 2 == 0, "mm", "gelu"), "adamw")
    rows = pd.DataFrame({"wall_s": start, "time_us": dur * 1e6, "type": kind, "freq_mhz": 1410.0})
    samples = pd.DataFrame({"t_s": np.arange(0.1, 1.01, 0.1), "power_w": 250.0})
    cls = attribute_class_power(rows, samples, window_s=0.1).set_index("type")["power_w"]
    assert np.isfinite(cls).all()
    assert cls["adamw"] == pytest.approx(250.0)


# --------------------------------------------------------------------------- throughput form
THROUGHPUT_VF = VoltageCurve(knee_mhz=1000, flat_v=0.71, slope_v_per_mhz=2.5e-4)
IDLE_BETA_W, IDLE_THETA_W = 30.0, 20.0


def throughput_kernels(n: int, freqs: np.ndarray, seed: int = 7) -> tuple[pd.DataFrame, dict]:
    """Kernels whose board power is idle + (e V^2 + m) / t, with t = max(cycles / f, memory)."""
    rng = np.random.default_rng(seed)
    cycles = rng.uniform(2e5, 2e6, n)  # kcycles... times in us at f in MHz: cycles / f
    memory_us = cycles / rng.uniform(500, 2500, n)  # roughly half the kernels memory-bound
    e_uj, m_uj = rng.uniform(2e4, 2e5, n), rng.uniform(0, 1e5, n)
    op = np.repeat(np.arange(n), len(freqs))
    f = np.tile(freqs, n)
    time_us = np.maximum(cycles[op] / f, memory_us[op])
    volt = THROUGHPUT_VF.voltage_v(f)
    idle = IDLE_BETA_W * f / 1e3 * volt**2 + IDLE_THETA_W * volt
    power = idle + (e_uj[op] * volt**2 + m_uj[op]) / time_us
    rows = kernel_rows(op, f, power).assign(time_us=time_us)
    return rows, {"e": e_uj, "m": m_uj, "memory_bound": memory_us > cycles / freqs[-1]}


def idle_calibration(freqs) -> PowerCalibration:
    freqs = np.asarray(freqs, dtype=float)
    volt = THROUGHPUT_VF.voltage_v(freqs)
    idle = IDLE_BETA_W * freqs / 1e3 * volt**2 + IDLE_THETA_W * volt
    return PowerCalibration(idle=pd.DataFrame({"freq_mhz": freqs, "chip_power_w": idle}))


def test_fixed_effects_solver_recovers_per_op_and_shared_terms():
    rng = np.random.default_rng(8)
    n, k = 50, 4
    op = np.repeat(np.arange(n), k)
    per_op = rng.uniform(0.5, 2.0, (n * k, 2))
    shared = rng.uniform(0.5, 2.0, (n * k, 2))
    c, s = rng.uniform(1, 5, (n, 2)), np.array([3.0, 0.5])
    target = (per_op * c[op]).sum(1) + shared @ s
    coef, shared_coef = fit_fixed_effects(per_op, shared, target, op, n, weight=1 / target**2)
    np.testing.assert_allclose(coef, c, rtol=1e-8)
    np.testing.assert_allclose(shared_coef, s, rtol=1e-8)
    # two rows per op, two per-op columns: each op is fitted exactly and the shared terms are
    # not identified, so they are left out rather than fitted to noise
    two = np.isin(np.arange(n * k) % k, [0, 1])
    coef, shared_coef = fit_fixed_effects(per_op[two], shared[two], target[two], op[two], n)
    np.testing.assert_array_equal(shared_coef, 0.0)
    np.testing.assert_allclose((per_op[two] * coef[op[two]]).sum(1), target[two], rtol=1e-9)


def test_throughput_form_predicts_memory_bound_kernels_from_two_clocks():
    freqs = np.array([705.0, 900.0, 1087.0, 1237.0, 1380.0])
    rows, truth = throughput_kernels(60, freqs)
    profile = Profile(rows)
    train = [705.0, 1380.0]
    model = PowerModel(voltage=THROUGHPUT_VF, dynamic="throughput", temperature=False).fit(
        profile, train, calibration=idle_calibration([705.0, 1380.0])
    )
    assert (model.beta_, model.theta_) == pytest.approx((IDLE_BETA_W, IDLE_THETA_W))
    np.testing.assert_allclose(model.core_uj_per_v2_, truth["e"], rtol=1e-6)
    np.testing.assert_allclose(model.uncore_uj_, truth["m"], rtol=1e-6, atol=1e-3)
    test = np.array([900.0, 1087.0, 1237.0])
    _, clocks, time_us = profile.time_matrix_us()
    held_times = time_us[:, np.isin(clocks, test)]
    actual = rows.pivot_table(index="op", columns="freq_mhz", values="chip_power_w")[test]
    pred = model.predict(test, time_us=held_times)["chip_w"]
    np.testing.assert_allclose(pred, actual.to_numpy(), rtol=1e-6)
    # the paper's clock form through the same two points misses the memory-bound kernels
    clock = PowerModel(voltage=THROUGHPUT_VF, temperature=False).fit(profile, train)
    miss = np.abs(clock.predict(test)["chip_w"] / actual.to_numpy() - 1)
    assert miss[truth["memory_bound"]].mean() > 0.01
    with pytest.raises(ValidationError, match="needs each op's time"):
        model.predict(test)
    with pytest.raises(ValidationError, match="expected \\(60, 3\\)"):
        model.predict(test, time_us=held_times[:, :2])
    again = PowerModel.from_dict(json.loads(json.dumps(model.to_dict())))
    np.testing.assert_allclose(again.predict(test, time_us=held_times)["chip_w"], pred)


def test_characterise_device_recovers_the_voltage_curve_and_idle_power():
    freqs = np.array([705.0, 802.0, 945.0, 1087.0, 1237.0, 1380.0])
    rows, _ = throughput_kernels(80, freqs, seed=9)
    # grid: knee in linspace(705, 1380, 28) holds 1005; flat 0.71 V -> relative slope 2.5e-4/0.71
    curve, cal = characterise_device(Profile(rows), knees=28, slopes=31)
    relative = THROUGHPUT_VF.voltage_v(freqs) / THROUGHPUT_VF.flat_v
    np.testing.assert_allclose(curve.voltage_v(freqs), relative, rtol=0.03)
    expected = idle_calibration(freqs).idle["chip_power_w"].to_numpy()
    np.testing.assert_allclose(cal.idle["chip_power_w"].to_numpy(), expected, rtol=0.05)
    with pytest.raises(ValidationError, match="3 or more clocks"):
        characterise_device(Profile(rows[rows["freq_mhz"].isin([705.0, 1380.0])]))


def test_cli_fit_and_validate_the_throughput_form(tmp_path):
    freqs = np.array([705.0, 945.0, 1087.0, 1380.0])
    rows, _ = throughput_kernels(30, freqs, seed=10)
    app_path, micro_path = tmp_path / "app.parquet", tmp_path / "micro.parquet"
    Profile(rows).write(app_path)
    Profile(throughput_kernels(60, freqs, seed=11)[0]).write(micro_path)
    base = ["validate", "power", str(app_path), "--train-freqs", "705,1380", "--json"]
    res = CliRunner().invoke(
        app, [*base, "--dynamic", "throughput", "--characterise", str(micro_path)]
    )
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert payload["dynamic"] == "throughput" and payload["times"] == "perf model"
    res = CliRunner().invoke(
        app,
        [*base, "--dynamic", "throughput", "--characterise", str(micro_path), "--measured-times"],
    )
    measured = json.loads(res.stdout)
    assert measured["times"] == "measured"
    # the V-f curve comes from power alone (u_i + a_i f V^2 per kernel: one curve for both
    # forms), not from these kernels' own throughput shape: ~2%, not the grid's resolution
    assert measured["mape_pct"] < 2.5
    clock = json.loads(CliRunner().invoke(app, base).stdout)
    assert clock["times"] is None and clock["mape_pct"] > measured["mape_pct"]
    res = CliRunner().invoke(app, [*base, "--dynamic", "cubic"])
    assert res.exit_code == 2 and "--dynamic: expected one of clock, throughput" in res.stderr
    out = tmp_path / "models.json"
    res = CliRunner().invoke(
        app,
        [
            *("fit", str(app_path), "--train-freqs", "705,1380", "--out", str(out)),
            *("--dynamic", "throughput", "--characterise", str(micro_path)),
        ],
    )
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["power"]["dynamic"] == "throughput"


def test_clock_form_with_a_characterised_device_fits_gamma_jointly(bert_profile):
    """A device characterisation has no cool-down trace: gamma is then fitted with alpha."""
    _, profile = bert_profile
    voltage, calibration = characterise_device(profile, knees=15, slopes=16)
    assert calibration.cooldown is None
    model = PowerModel(voltage=voltage).fit(profile, [1000, 1400, 1800], calibration=calibration)
    assert model.use_temperature_ and model.gamma_ > 0
    result = validate_power(profile, [1000, 1800], voltage=voltage, calibration=calibration)
    assert result["mape_pct"] < 3.0
    with pytest.raises(ValidationError, match="no cool-down trace"):
        calibration.gamma(voltage)


def test_a_sample_only_profile_too_short_for_its_windows_is_refused():
    dev = SimulatedDevice.from_preset("a100-like")
    w = BUILDERS["resnet50"]()  # ~18 ms per iteration at 1410 MHz: 100 ms windows need ~228
    short = dev.profile(w, [1410.0], iterations=5)
    with pytest.raises(ValidationError, match="profile at least") as info:
        PowerModel().fit(short)
    assert info.value.field == "iterations"
    # the count is the rule's for the profile's own iterations: 4 s of 100 ms windows
    iteration_s = dev.run(w, freq_mhz=1410.0)[0].iteration_time_s
    needed = sensor_iterations(iteration_s, **dev.sensor_ms)
    said = int(str(info.value).split("at least ")[1].split()[0])
    assert said == pytest.approx(needed, rel=0.02)
    # without the profile's sensor period, the samples' spacing gives it
    bare = Profile(short.ops, short.samples, meta={**short.meta, "sensor": {"window_ms": 100}})
    with pytest.raises(ValidationError, match=f"fewer than the {MIN_WINDOWS}"):
        power_rows(bare)
    enough = dev.profile(w, [1410.0], iterations=80)  # 1.4 s: ~13 complete windows
    assert power_rows(enough)["chip_power_w"].notna().all()


@pytest.mark.parametrize("window_ms", [-5.0, 0.0, float("nan")])
def test_a_non_positive_window_is_refused(window_ms):
    profile = SimulatedDevice.from_preset("ascend-910b-like").profile(BUILDERS["vgg19"](), [1800])
    with pytest.raises(ValidationError, match="positive number of milliseconds"):
        PowerModel().fit(profile, window_ms=window_ms)
