"""The thermal bias of static-clock profiles (benchmarks/thermal_bias.py) and its correction.

A static profile measures each clock with the die at that clock's own steady temperature; a
small-budget plan keeps the die near the top clock's. With ``gamma`` from a cool-down trace the
power model predicts (and the planner plans) every clock on the top clock's die. Tolerances of
1e-4 are the temperature fixed point's (0.01 C, models/thermal.py).
"""

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from opdvfs import Profile, ValidationError
from opdvfs.calibration import PowerCalibration
from opdvfs.devices.spec import VoltageCurve
from opdvfs.experiments.bench import calibrate
from opdvfs.models.bundle import ModelBundle
from opdvfs.models.perf import PerfModel
from opdvfs.models.power import PowerModel
from opdvfs.models.thermal import leakage_slope
from opdvfs.plan.measured import MeasuredTables, at_die
from opdvfs.plan.planner import PlanInputs, predict
from opdvfs.sim import SimulatedDevice
from opdvfs.sim.physics import leakage_scale
from opdvfs.workloads.library import BUILDERS

VF = VoltageCurve(knee_mhz=1000, flat_v=0.71, slope_v_per_mhz=2.5e-4)
T0_C, K_C_PER_W, GAMMA = 30.0, 0.12, 0.8  # ambient, thermal slope, chip leakage W/C/V
TRAIN = np.array([705.0, 1380.0])
TIME_US = 100.0


def die_rise(alpha: np.ndarray, u: np.ndarray, f_mhz: float) -> float:
    """The steady rise of eq. 15 at a static clock: dT = k (mean A(f) + g V dT), solved."""
    volt = float(VF.voltage_v(f_mhz))
    activity = float(np.mean(alpha * f_mhz / 1e3 * volt**2 + u))
    return K_C_PER_W * activity / (1.0 - K_C_PER_W * GAMMA * volt)


def board_power(alpha: np.ndarray, u: np.ndarray, f_mhz: float, rise_c: float) -> np.ndarray:
    """Board power of every kernel at ``f_mhz`` on a die ``rise_c`` over ambient."""
    volt = float(VF.voltage_v(f_mhz))
    return alpha * f_mhz / 1e3 * volt**2 + u + GAMMA * volt * rise_c


@pytest.fixture(scope="module")
def kernels():
    """A GPU-like chip-rail profile at two static clocks, each at its own die temperature."""
    rng = np.random.default_rng(11)
    n = 25
    alpha, u = rng.uniform(50, 200, n), rng.uniform(20, 120, n)
    frames = []
    for f in TRAIN:
        rise = die_rise(alpha, u, f)
        frames.append(
            pd.DataFrame(
                {
                    "iteration": 0,
                    "op": np.arange(n),
                    "name": [f"k{i}" for i in range(n)],
                    "type": "Kernel",
                    "stream": "compute",
                    "freq_mhz": f,
                    "time_us": TIME_US,
                    "chip_power_w": board_power(alpha, u, f, rise),
                    "temp_c": T0_C + rise,
                }
            )
        )
    top = float(TRAIN[-1])
    temps = np.linspace(T0_C + 5, T0_C + 40, 50)
    cooldown = pd.DataFrame(
        {
            "freq_mhz": top,
            "chip_power_w": 60.0 + GAMMA * float(VF.voltage_v(top)) * (temps - T0_C),
            "temp_c": temps,
        }
    )
    idle = pd.DataFrame({"freq_mhz": TRAIN, "chip_power_w": [50.0, 60.0]})
    return Profile(pd.concat(frames, ignore_index=True)), alpha, u, PowerCalibration(idle, cooldown)


def test_leakage_slope_reads_gamma_off_a_cool_down(kernels):
    *_, calibration = kernels
    assert leakage_slope(calibration.cooldown, "chip_power_w", VF) == pytest.approx(GAMMA)
    assert leakage_slope(calibration.cooldown, "core_power_w", VF) is None
    assert leakage_slope(None, "chip_power_w", VF) is None
    flat = calibration.cooldown.assign(temp_c=50.0)
    assert leakage_slope(flat, "chip_power_w", VF) is None


def test_a_chip_cool_down_gives_the_board_rail_its_temperature_term(kernels):
    profile, alpha, u, calibration = kernels
    model = PowerModel(voltage=VF).fit(profile, calibration=calibration)
    assert model.rail_ == "chip" and model.use_temperature_
    assert model.gamma_ == pytest.approx(GAMMA) and model.gamma_from_ == "cooldown"
    assert PowerModel.from_dict(model.to_dict()).gamma_from_ == "cooldown"
    np.testing.assert_allclose(model.alpha_, alpha, rtol=1e-6)
    np.testing.assert_allclose(model.uncore_w_, u, rtol=1e-6)
    # without a trace the board rail has no temperature term (gamma is not identified there)
    plain = PowerModel(voltage=VF).fit(profile)
    assert not plain.use_temperature_ and plain.gamma_ == 0.0 and plain.gamma_from_ == "none"


def test_die_at_the_top_clock_predicts_a_low_clock_on_the_top_clocks_die(kernels):
    profile, alpha, u, calibration = kernels
    model = PowerModel(voltage=VF).fit(profile, calibration=calibration)
    low, top = TRAIN
    own = model.predict(TRAIN)
    held = model.predict(TRAIN, die_at_mhz=top)
    hot = die_rise(alpha, u, top)
    # own clock: the static profile's values; held: the low clock on the top clock's die
    np.testing.assert_allclose(
        own["chip_w"][:, 0], board_power(alpha, u, low, die_rise(alpha, u, low)), rtol=1e-4
    )
    np.testing.assert_allclose(held["chip_w"][:, 0], board_power(alpha, u, low, hot), rtol=1e-4)
    np.testing.assert_allclose(held["chip_w"][:, 1], own["chip_w"][:, 1])
    np.testing.assert_allclose(held["temp_c"], T0_C + hot, atol=0.05)
    assert (held["chip_w"][:, 0] > own["chip_w"][:, 0]).all()  # the hotter die leaks more
    # the profile-only model cannot see it: its low clock stays at the cooler die's power
    plain = PowerModel(voltage=VF).fit(profile)
    np.testing.assert_allclose(
        plain.predict(TRAIN, die_at_mhz=top)["chip_w"], plain.predict(TRAIN)["chip_w"]
    )
    with pytest.raises(ValidationError, match="die_at_mhz"):
        model.predict(TRAIN, die_at_mhz=1000.0)


def test_temperature_shift_is_the_models_own_term(kernels):
    profile, *_, calibration = kernels
    model = PowerModel(voltage=VF).fit(profile, calibration=calibration)
    n = len(model.op_ids_)
    from_c = np.full((n, 2), 40.0)
    from_c[0, 1] = np.nan  # no temperature recorded: no shift
    shift = model.temperature_shift_w(TRAIN, from_c, 50.0)
    expected = GAMMA * VF.voltage_v(TRAIN)[None, :] * 10.0
    np.testing.assert_allclose(shift["chip_w"][1:], np.broadcast_to(expected, (n - 1, 2)))
    assert shift["chip_w"][0, 1] == 0.0
    assert (
        PowerModel(voltage=VF).fit(profile).temperature_shift_w(TRAIN, 40.0, 50.0)["chip_w"] == 0
    ).all()


def test_planner_moves_measured_cells_to_the_top_clocks_die(kernels):
    """Measured cells at a low clock are moved to the plan's die, not left at their own."""
    profile, alpha, u, calibration = kernels
    power = PowerModel(voltage=VF).fit(profile, calibration=calibration)
    models = ModelBundle(PerfModel().fit(profile), power)
    grid = np.array([705.0, 1087.0, 1380.0])  # 1087 MHz was not profiled
    inputs = replace(PlanInputs.from_profile(profile), freqs_mhz=grid)
    tables = predict(models, inputs)
    hot = die_rise(alpha, u, 1380.0)
    truth_j = np.stack([board_power(alpha, u, f, hot) for f in grid], axis=1) * TIME_US * 1e-6
    np.testing.assert_allclose(tables.chip_energy_j, truth_j, rtol=1e-4)
    # the static profile's own 705 MHz cell, unmoved, says less: the bias the shift removes
    measured = MeasuredTables.from_profile(profile)
    _, chip_m, _ = measured.at(grid)
    assert (chip_m[:, 0] < truth_j[:, 0] * (1 - 1e-3)).all()
    np.testing.assert_allclose(measured.temp_at(grid)[:, 1], np.nan)
    moved = at_die(
        power, grid, measured.at(grid)[0], chip_m, measured.temp_at(grid), T0_C + hot, rail="chip"
    )
    np.testing.assert_allclose(moved[:, [0, 2]], truth_j[:, [0, 2]], rtol=1e-6)


def test_simulated_cool_down_reads_the_twins_leakage_on_both_rails():
    """bench.calibrate on the Ascend-like twin: the core's gamma and the rest of the chip's."""
    sim = SimulatedDevice.from_preset("ascend-910b-like", seed=0)
    calibration = calibrate(sim)
    cool = calibration.cooldown
    top = float(sim.spec.max_freq_mhz)
    volt = float(sim.spec.voltage.voltage_v(top))
    p = sim.params
    temp = float(cool["temp_c"].mean())
    # the twin's leakage is exponential in T: its slope at the trace's mean temperature
    d_scale = float(leakage_scale(temp, p)) * np.log(2) / p.leak_doubling_c
    core = leakage_slope(cool, "core_power_w", sim.spec.voltage)
    chip = leakage_slope(cool, "chip_power_w", sim.spec.voltage)
    assert core == pytest.approx(p.leak_a * d_scale, rel=0.15)
    assert chip - core == pytest.approx(p.uncore_leak_w * d_scale / volt, rel=0.2)
    profile = sim.profile(BUILDERS["bert"](), [1000.0, 1400.0, 1800.0])
    model = PowerModel().fit(profile, device=sim.spec, calibration=calibration)
    assert model.gamma_ == pytest.approx(core)
    assert model.uncore_gamma_ == pytest.approx(chip - core)
    again = PowerModel.from_dict(model.to_dict())
    assert again.uncore_gamma_ == model.uncore_gamma_
    freqs = np.asarray(sim.spec.freqs_mhz, dtype=float)
    np.testing.assert_allclose(
        again.predict(freqs, die_at_mhz=top)["chip_w"],
        model.predict(freqs, die_at_mhz=top)["chip_w"],
    )


def test_a_fully_measured_profile_is_planned_on_the_top_clocks_die_too(kernels):
    profile, alpha, u, calibration = kernels
    power = PowerModel(voltage=VF).fit(profile, calibration=calibration)
    models = ModelBundle(PerfModel().fit(profile), power)
    inputs = PlanInputs.from_profile(profile)  # every op at every clock measured
    hot = die_rise(alpha, u, 1380.0)
    truth_j = np.stack([board_power(alpha, u, f, hot) for f in TRAIN], axis=1) * TIME_US * 1e-6
    np.testing.assert_allclose(predict(models, inputs).chip_energy_j, truth_j, rtol=1e-4)
    # values="measured" plans on the measurements as they are
    _, chip_m, _ = MeasuredTables.from_profile(profile).at(TRAIN)
    np.testing.assert_array_equal(predict(models, inputs, "measured").chip_energy_j, chip_m)


def test_a_gamma_fitted_on_static_profiles_moves_nothing():
    """Fitted jointly on static clocks (temperature follows the clock) gamma is not identified:
    the planner keeps each clock on its own die and the measured cells as measured."""
    sim = SimulatedDevice.from_preset("ascend-910b-like", seed=0)
    profile = sim.profile(BUILDERS["bert"](), [1000.0, 1400.0, 1800.0])
    power = PowerModel().fit(profile, device=sim.spec)
    assert power.gamma_from_ == "fit"
    models = ModelBundle(PerfModel().fit(profile), power)
    inputs = PlanInputs.from_profile(profile, sim.spec)
    tables = predict(models, inputs)
    measured = MeasuredTables.from_profile(profile)
    cols = np.searchsorted(tables.freqs_mhz, measured.freqs_mhz)
    np.testing.assert_array_equal(tables.chip_energy_j[:, cols], measured.chip_energy_j)
