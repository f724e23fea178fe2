import json

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import lsq_linear, nnls
from typer.testing import CliRunner

from opdvfs import Profile, ValidationError
from opdvfs.cli import app
from opdvfs.datasets import dataset_path
from opdvfs.io import read_profile
from opdvfs.models._lsq import constrained_wls, nonneg_wls2
from opdvfs.models.bundle import ModelBundle
from opdvfs.models.perf import (
    VIOLATION_CONCAVE,
    VIOLATION_FASTER_THAN_1_OVER_F,
    VIOLATION_SLOWER_AT_HIGHER_CLOCK,
    PerfModel,
    check_physics,
    fit_times,
    predict_times,
)
from opdvfs.models.validation import validate_perf

F_MHZ = np.array([1000.0, 1200.0, 1400.0, 1600.0, 1800.0])
F_GHZ = F_MHZ / 1e3


def profile_from(times: np.ndarray, freqs=F_MHZ) -> Profile:
    n, k = times.shape
    rows = [
        {"op": i, "name": f"op{i}", "freq_mhz": freqs[j], "time_us": times[i, j]}
        for i in range(n)
        for j in range(k)
    ]
    return Profile(pd.DataFrame(rows))


def truth(form: str, n: int = 40, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    if form == "func2":
        coef = np.c_[rng.uniform(0, 50, n), rng.uniform(10, 500, n)]
    elif form == "func1":
        coef = np.c_[rng.uniform(0, 50, n), rng.uniform(0, 100, n), rng.uniform(10, 500, n)]
    elif form == "func3":
        coef = np.c_[rng.uniform(1, 20, n), np.full(n, 2.0), rng.uniform(10, 500, n)]
    elif form == "knee":  # the knee between the middle and the top training clocks
        b, c = rng.uniform(0, 100, n), rng.uniform(10, 500, n)
        coef = np.c_[b, c, b + c / rng.uniform(1.45, 1.75, n)]
    else:  # roofline, p on the fitting grid
        coef = np.c_[rng.uniform(10, 500, n) ** 4, rng.uniform(10, 300, n) ** 4, np.full(n, 4.0)]
    return coef, predict_times(form, coef, F_GHZ, F_GHZ)


# ------------------------------------------------------------------ the forms
@pytest.mark.parametrize("form", ["func1", "func2", "func3", "roofline", "knee"])
def test_each_form_recovers_its_own_curves(form):
    _, times = truth(form)
    train = [0, 2, 4]
    coef = fit_times(form, F_GHZ[train], times[:, train])
    pred = predict_times(form, coef, F_GHZ, F_GHZ[train])
    np.testing.assert_allclose(pred, times, rtol=2e-6)


def test_pwl_is_exact_on_convex_piecewise_linear_cycles():
    # cycles = max(a f, c) + d f: the paper's Ld/St shape with one breakpoint at 1.3 GHz
    a, c, d = 300.0, 390.0, 20.0
    dense = np.linspace(1.0, 1.8, 9)
    cycles = np.maximum(a * dense, c) + d * dense
    times = (cycles / dense)[None, :]
    knots = [0, 3, 8]  # 1.0, 1.3 (the breakpoint), 1.8 GHz
    coef = fit_times("pwl", dense[knots], times[:, knots])
    np.testing.assert_allclose(predict_times("pwl", coef, dense, dense[knots]), times, rtol=1e-12)


def test_func2_two_points_is_the_papers_closed_form():
    f1, f2 = 1.0, 1.8
    t1, t2 = np.array([300.0, 120.0]), np.array([180.0, 100.0])
    coef = fit_times("func2", np.array([f1, f2]), np.c_[t1, t2])
    # paper notes: a = (T1 f1 - T2 f2) / (f1^2 - f2^2), c = T1 f1 - a f1^2
    a = (t1 * f1 - t2 * f2) / (f1**2 - f2**2)
    c = t1 * f1 - a * f1**2
    np.testing.assert_allclose(coef, np.c_[np.maximum(a, 0), c], rtol=1e-9)


def test_func1_matches_an_unconstrained_per_op_solve_when_feasible():
    _, times = truth("func1", n=30, seed=4)
    noisy = times * np.random.default_rng(1).lognormal(0, 0.002, times.shape)
    coef = fit_times("func1", F_GHZ, noisy)
    design = np.stack([F_GHZ, np.ones(5), 1 / F_GHZ], axis=1)
    for i in range(30):
        w = 1 / noisy[i]
        ref, *_ = np.linalg.lstsq(design * w[:, None], noisy[i] * w, rcond=None)
        if ref[0] >= 0 and ref[2] >= 0:
            np.testing.assert_allclose(coef[i], ref, rtol=1e-6, atol=1e-9)


def test_constraints_keep_cycles_convex_and_coefficients_nonnegative():
    rng = np.random.default_rng(2)
    times = rng.uniform(50, 500, (200, 5))  # arbitrary data, much of it unphysical
    # func1: a >= 0 (convex cycles) and c >= 0; b is free
    for form, cols in (("func1", [0, 2]), ("func2", [0, 1]), ("func3", [0, 1, 2])):
        coef = fit_times(form, F_GHZ, times)
        assert (np.nan_to_num(coef[:, cols]) >= -1e-9).all(), form


def test_nonneg_wls2_matches_scipy_nnls():
    rng = np.random.default_rng(3)
    x1, x2 = F_GHZ, 1 / F_GHZ
    y = rng.uniform(-50, 400, (300, 5))
    w = rng.uniform(0.1, 2.0, (300, 5))
    coef, _ = nonneg_wls2(x1, x2, y, w)
    for i in range(300):
        sw = np.sqrt(w[i])
        ref, _ = nnls(np.c_[x1, x2] * sw[:, None], y[i] * sw)
        np.testing.assert_allclose(coef[i], ref, rtol=1e-7, atol=1e-7)


def test_constrained_wls_matches_scipy_bounded_lsq():
    rng = np.random.default_rng(5)
    design = np.stack([F_GHZ, np.ones(5), 1 / F_GHZ], axis=1)
    y = rng.uniform(-100, 400, (200, 5))
    w = np.ones_like(y)
    coef, _ = constrained_wls(design, y, w, nonneg=(0, 2))
    for i in range(200):
        ref = lsq_linear(design, y[i], bounds=([0, -np.inf, 0], [np.inf] * 3)).x
        np.testing.assert_allclose(coef[i], ref, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ physics flags
def test_flags_a_slowdown_faster_than_1_over_f():
    good = 1000.0 / F_MHZ  # compute bound: cycles flat
    bad = good.copy()
    bad[0] *= 1.2  # at 1000 MHz 20% slower than 1/f allows
    flags = check_physics(F_MHZ, np.vstack([good, bad]))
    assert flags[0] == 0
    assert flags[1] & VIOLATION_FASTER_THAN_1_OVER_F


def test_flags_concave_cycles_and_tolerates_noise():
    cycles = np.array([1.0, 1.0, 1.0, 1.0, 1.0]) * 1000
    bump = cycles.copy()
    bump[2] *= 1.1
    noisy = cycles * np.array([1.0, 1.005, 0.995, 1.004, 1.0])
    flags = check_physics(F_MHZ, np.vstack([bump, noisy]) / F_MHZ)
    assert flags[0] & VIOLATION_CONCAVE
    assert flags[1] == 0


def test_model_flags_instead_of_absorbing():
    times = np.vstack([1e5 / F_MHZ, 1e5 / F_MHZ])
    times[1, 0] *= 1.5  # super-linear slowdown at the lowest clock
    model = PerfModel(form="func2").fit(profile_from(times), [1000.0, 1800.0])
    assert model.violation_.tolist() == [0, VIOLATION_FASTER_THAN_1_OVER_F]
    # func2 cannot bend to it: a is pinned at 0, the op is predicted as pure 1/f
    assert model.coef_[1, 0] == 0.0


# ------------------------------------------------------------------ estimator contract
@pytest.mark.parametrize(("clocks", "form"), [(2, "roofline"), (3, "func1")])
def test_auto_form_by_number_of_clocks(clocks, form):
    _, times = truth("func1", n=5)
    train = [1000.0, 1800.0] if clocks == 2 else [1000.0, 1400.0, 1800.0]
    assert PerfModel().fit(profile_from(times), train).form_ == form


def test_round_trip_predicts_identically(tmp_path):
    _, times = truth("roofline", n=20)
    model = PerfModel().fit(profile_from(times), [1000, 1400, 1800])
    model.write(tmp_path / "m.json")
    back = PerfModel.read(tmp_path / "m.json")
    np.testing.assert_array_equal(back.predict(F_MHZ), model.predict(F_MHZ))
    np.testing.assert_array_equal(
        back.predict([1300.0], op_ids=np.array([3, 7])), model.predict([1300.0])[[3, 7]]
    )


def test_fit_errors():
    _, times = truth("func1", n=3)
    profile = profile_from(times)
    with pytest.raises(ValidationError, match="1100 MHz is not in the profile"):
        PerfModel().fit(profile, [1100, 1800])
    with pytest.raises(ValidationError, match="needs at least 3 training clocks"):
        PerfModel(form="func1").fit(profile, [1000, 1800])
    with pytest.raises(ValidationError, match="unknown form 'func9'"):
        PerfModel(form="func9").fit(profile, [1000, 1800])


# ------------------------------------------------------------------ validation
def test_validate_reports_paper_style_metrics_and_exclusions():
    _, times = truth("func2", n=10)
    times = times * 10  # every op well above 20 us ...
    times[0] = 5.0  # ... but this one
    result = validate_perf(profile_from(times), [1000, 1800], form="func2", min_us=20)
    assert result["excluded_ops"] == 1
    assert result["excluded_time_pct"] == pytest.approx(5 * 5 / times.sum() * 100)
    assert result["mape_pct"] < 1e-6  # func2 data, func2 model
    assert result["n_points"] == 9 * 3
    assert result["within5_pct"] == 100.0


def test_validate_on_real_perseus_data():
    profile = read_profile(dataset_path("perseus-gpt3-175b-a100"))
    two = validate_perf(profile, [855, 1410], form="func2")
    three = validate_perf(profile, [855, 1125, 1410])
    assert 1.0 < two["mape_pct"] < 2.5  # the paper's form, about as on Ascend (1.96%)
    assert three["mape_pct"] < 1.0  # goal: <= 1% from 3 clocks
    assert three["flagged_ops"] == 0


def test_cli_fit_and_validate(tmp_path):
    runner = CliRunner()
    src = dataset_path("perseus-gpt3-175b-a100")
    res = runner.invoke(app, ["validate", "perf", str(src), "--train-freqs", "min,max", "--json"])
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert {
        "form",
        "n_points",
        "mape_pct",
        "median_pct",
        "within5_pct",
        "within10_pct",
        "excluded_ops",
        "excluded_time_pct",
    } <= set(payload)
    assert payload["train_freqs_mhz"] == [855.0, 1410.0]
    out = tmp_path / "models.json"
    res = runner.invoke(app, ["fit", str(src), "--train-freqs", "855,1125,1410", "--out", str(out)])
    assert res.exit_code == 0, res.output
    bundle = ModelBundle.read(out)
    assert bundle.perf.form_ == "func1"
    assert bundle.power is not None and bundle.power.rail_ == "chip"  # Perseus: energy per stage
    res = runner.invoke(app, ["validate", "perf", str(src), "--train-freqs", "905,1410"])
    assert res.exit_code == 2 and "905 MHz is not in the profile" in res.stderr


# ------------------------------------------------------------------ a knee, a capped top (#16)
DENSE_MHZ = np.arange(855.0, 1741.0, 15.0)  # the Perseus A40 grid


def knee_truth(kind: str, n: int = 30, seed: int = 7) -> np.ndarray:
    """Times on DENSE_MHZ that stop falling at a knee between the middle and top clocks."""
    rng = np.random.default_rng(seed)
    f = DENSE_MHZ[None, :] / 1e3
    b, c = rng.uniform(5, 60, (n, 1)), rng.uniform(50, 300, (n, 1))
    knee = rng.uniform(1.35, 1.65, (n, 1))
    if kind == "cap":  # a power cap: the clock delivered is min(asked, cap)
        return b + c / np.minimum(f, knee)
    # memory-bound above the knee (the memory clock fixed): time flat there
    return np.maximum(b + c / f, b + c / knee)


@pytest.mark.parametrize("kind", ["cap", "memory"])
def test_knee_form_follows_a_knee_between_the_training_clocks(kind, tmp_path):
    times = knee_truth(kind)
    profile = profile_from(times, DENSE_MHZ)
    train = [855.0, 1305.0, 1740.0]  # lowest, middle, top: the knee lies between the last two
    knee = PerfModel(form="knee").fit(profile, train)
    np.testing.assert_allclose(knee.predict(DENSE_MHZ), times, rtol=1e-9)
    knee.write(tmp_path / "knee.json")
    back = PerfModel.read(tmp_path / "knee.json")
    np.testing.assert_array_equal(back.predict(DENSE_MHZ), knee.predict(DENSE_MHZ))
    # the 3-parameter smooth form smears the corner (the complaint)
    func1 = PerfModel(form="func1").fit(profile, train)
    assert np.abs(func1.predict(DENSE_MHZ) / times - 1).max() > 0.01
    # and neither is flagged: a flat top is physics (the clock not delivered, or memory-bound)
    assert (knee.violation_ == 0).all()
    assert (check_physics(DENSE_MHZ, times) == 0).all()


def test_knee_form_from_more_clocks_is_a_least_squares_fit():
    times = knee_truth("cap", n=50, seed=3)
    noisy = times * np.random.default_rng(0).lognormal(0, 0.002, times.shape)
    train = [855.0, 1095.0, 1305.0, 1515.0, 1740.0]
    model = PerfModel(form="knee").fit(profile_from(noisy, DENSE_MHZ), train)
    err = np.abs(model.predict(DENSE_MHZ) / times - 1)
    assert err.mean() < 0.004  # within the noise, not the corner
    # a compute-bound op (no knee in the range): the flat level never binds
    pure = 1e5 / DENSE_MHZ[None, :]
    coef = fit_times("knee", DENSE_MHZ[[0, 30, 59]] / 1e3, pure[:, [0, 30, 59]])
    assert coef[0, 2] <= pure[0, -1] * (1 + 1e-9)
    np.testing.assert_allclose(
        predict_times("knee", coef, DENSE_MHZ / 1e3, DENSE_MHZ[[0, 30, 59]] / 1e3), pure, rtol=1e-9
    )


def test_flags_an_op_slower_at_a_higher_clock_but_not_a_flat_noisy_top():
    capped = knee_truth("cap", n=1)[0]
    noise = np.random.default_rng(4).uniform(-0.005, 0.005, capped.shape)
    flat_noisy = capped * (1 + noise)  # the plateau scatters by 0.5%: within tolerance
    step = capped.copy()
    step[DENSE_MHZ >= 975] *= 1.06  # 6% slower from 975 MHz on (the A40 GPT-3 backward)
    flags = check_physics(DENSE_MHZ, np.vstack([capped, flat_noisy, step]))
    assert flags[0] == 0 and flags[1] == 0
    assert flags[2] & VIOLATION_SLOWER_AT_HIGHER_CLOCK
    # a top training clock slower than the one below it is flagged on the training points
    throttled = capped.copy()
    throttled[-1] *= 1.05
    train = [855.0, 1305.0, 1725.0, 1740.0]  # two clocks on the plateau
    model = PerfModel().fit(profile_from(throttled[None, :], DENSE_MHZ), train)
    assert model.violation_[0] & VIOLATION_SLOWER_AT_HIGHER_CLOCK


def test_validate_scores_ops_that_break_the_physics_at_held_out_clocks_apart():
    rng = np.random.default_rng(5)
    f = DENSE_MHZ / 1e3
    coef = np.c_[rng.uniform(0, 20, 6), rng.uniform(0, 50, 6), rng.uniform(100, 300, 6)]
    times = predict_times("func1", coef, f, f)
    times[0, DENSE_MHZ >= 975] *= 1.06  # a step at a held-out clock: training cannot see it
    result = validate_perf(profile_from(times, DENSE_MHZ), [855.0, 1305.0, 1740.0])
    assert result["flagged_ops"] == 0
    assert result["measured_flagged_ops"] == 1
    assert result["physics_mape_pct"] < 1e-6  # func1 data, func1 model
    assert result["measured_flagged_mape_pct"] > 1.0
    assert result["mape_pct"] == pytest.approx(result["measured_flagged_mape_pct"] / 6, rel=1e-6)


@pytest.mark.parametrize("name", ["perseus-gpt3-175b-a40", "perseus-bloom-a40"])
def test_a40_stages_slower_at_a_higher_clock_are_flagged_and_the_rest_held_to_1pct(name):
    # the A40 runs some stages 3.6-10.5% slower at one clock than at the clock below (GPT-3
    # backward at 975 MHz, BLOOM forward at 1065): those 8 of 16 are counted apart; the rest,
    # from 3 clocks, is within issue 16's 1%
    runner = CliRunner()
    src = str(dataset_path(name))
    args = ["validate", "perf", src, "--train-freqs", "min,mid,max"]
    res = runner.invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert payload["measured_flagged_ops"] == 8
    assert payload["physics_mape_pct"] < 1.0 < payload["measured_flagged_mape_pct"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "8 ops break the physics at some clock" in res.stdout


def test_knee_form_speed_is_vectorised():
    rng = np.random.default_rng(0)
    f = np.array([1.0, 1.4, 1.8])
    t = rng.uniform(10, 500, (100_000, 1)) / f * rng.lognormal(0, 0.01, (100_000, 3))
    coef = fit_times("knee", f, t)
    assert np.isfinite(coef).all()
