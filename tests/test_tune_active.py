"""tune's active profiling (issue 31 item 2): after the ``auto`` clocks, the sweep measures one
more clock where the plan would use it and the models leave energy at stake.

On the simulated ``a100-like`` with the tiny GPT (in-process, a few dozen steps), and off the
simulator through a dry run (its trace read, the clock traced anew).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from opdvfs.plan.on_profile import auto_clocks
from opdvfs.runtime.actuators import make_actuator
from opdvfs.tuner import policy
from opdvfs.tuner.loop import Tuner
from opdvfs.tuner.report import summary_lines

sys.path.insert(0, str(Path(__file__).parent))
from conftest import gpu_like, read_log
from tiny_gpt import TinyGPT, train_step


def tune(target: float, steps: int, **options) -> Tuner:
    """Tune the tiny GPT on sim:a100-like for ``steps`` steps."""
    torch.manual_seed(0)
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 64, (steps, 2, 17))
    tuner = Tuner(make_actuator("sim:a100-like", work_scale=1e6), target=target, **options)
    with warnings.catch_warnings(), tuner:
        warnings.simplefilter("ignore")
        for i in range(steps):
            train_step(model, opt, data[i])
    return tuner


def train_until(tuner: Tuner, done: Callable[[], bool], steps: int = 600) -> None:
    """Train the tiny GPT under ``tuner`` on one batch until ``done()``, ``steps`` at most."""
    torch.manual_seed(0)
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 64, (2, 17))
    with warnings.catch_warnings(), tuner:
        warnings.simplefilter("ignore")
        for _ in range(steps):
            train_step(model, opt, data)
            if done():
                break


@pytest.fixture(scope="module")
def tuned_at_ten():
    return tune(0.10, 32)


def test_the_sweep_measures_the_clock_the_plan_would_use_and_says_why(tuned_at_ten):
    tuner = tuned_at_ten
    result = tuner.result
    grid = tuner.actuator.supported_freqs_mhz()
    auto = auto_clocks(grid, max_gap=None)  # tune's five
    assert result.added_clock is not None, result.error
    (added,) = set(result.clocks_mhz) - set(auto)
    assert len(result.clocks_mhz) == len(auto) + policy.ADDED_CLOCKS
    # in the gap between mid and the clocks below the top, where the plan at 10% goes
    low, high = sorted(auto)[1:3]
    assert low < added < high
    assert f"{added:g} MHz splits the {low:g}-{high:g} MHz gap" in result.added_clock
    # measured: the profile the plans were made on has every operator at it
    assert result.profile is not None
    freqs = result.profile.ops["freq_mhz"].to_numpy(dtype=float)
    assert np.isclose(freqs, added).any()
    counted = {r.freq_mhz for r in tuner.sweep.records if r.phase == "counted"}
    assert added in counted
    lines = summary_lines(result)
    assert any(line.startswith("active profiling added a clock") for line in lines)
    assert result.to_dict()["added_clock"] == result.added_clock
    assert tuner.guard.restored


def test_clocks_given_are_swept_as_given():
    tuner = tune(0.10, 20, clocks=[1410.0, 1200.0, 810.0, 210.0], iterations_per_clock=1)
    assert tuner.sweep.done
    assert tuner.result.added_clock is None
    assert tuner.sweep.freqs_mhz == (1410.0, 1200.0, 810.0, 210.0)


def test_plans_stay_within_the_clocks_the_sweep_measured(monkeypatch):
    """Clocks given down to 810 MHz: tune plans over the device's clocks from 810 MHz up (the
    models would extrapolate below; a pipeline's messages were planned at 210 MHz before)."""
    from opdvfs.plan import on_profile

    grids = []

    def spy(profile, spec=None):
        narrowed = on_profile.within_profiled(profile, spec)
        grids.append(narrowed.freqs_mhz)
        return narrowed

    monkeypatch.setattr(policy, "within_profiled", spy)
    tuner = tune(0.10, 32, clocks=[1410.0, 1110.0, 810.0])
    assert tuner.result.rounds, tuner.result.error
    (grid,) = grids
    assert grid[0] == 810.0 and grid[-1] == 1410.0 and len(grid) > 3  # (the clocks between)
    assert min(f for r in tuner.result.rounds for f in r.freqs_mhz) >= 810.0


def test_within_profiled_keeps_a_covered_device_as_it_is():
    from opdvfs.plan.on_profile import within_profiled
    from opdvfs.profile import Profile
    from opdvfs.sim.presets import preset_spec

    spec = preset_spec("a100-like")
    assert spec is not None
    ops = {"op": [0, 0], "name": ["mm", "mm"], "freq_mhz": [1410.0, 810.0], "time_us": [1.0, 2.0]}
    narrowed = within_profiled(Profile(pd.DataFrame(ops), meta={"device": "a100-like"}))
    assert narrowed is not None and narrowed.freqs_mhz[0] == 810.0
    assert narrowed.freqs_mhz[-1] == 1410.0 and narrowed.voltage == spec.voltage
    both = {**ops, "freq_mhz": [spec.freqs_mhz[0], spec.freqs_mhz[-1]]}
    assert within_profiled(Profile(pd.DataFrame(both), meta={"device": "a100-like"})) == spec


def test_the_clock_grid_is_the_preset_on_the_simulator_and_the_supported_clocks_off_it():
    """policy.clock_grid: a simulated GPU's as before (its preset within the swept range, the
    device's list unused); a real GPU's supported clocks within that range, the swept ones kept;
    none known: None (the swept clocks alone)."""
    from opdvfs.plan.on_profile import within_profiled
    from opdvfs.profile import Profile

    ops = pd.DataFrame(
        {"op": [0, 0], "name": ["mm", "mm"], "freq_mhz": [1410.0, 810.0], "time_us": [1.0, 2.0]}
    )
    sim = Profile(ops, meta={"device": "a100-like"})
    assert policy.clock_grid(sim, (1000.0, 1500.0), "gpu") == within_profiled(sim)
    real = Profile(ops, meta={"device": "NVIDIA A100"})
    grid = policy.clock_grid(real, (1500.0, 1405.0, 1000.0, 700.0), "gpu")
    assert grid is not None and grid.name == "NVIDIA A100"
    assert grid.freqs_mhz == (810.0, 1000.0, 1405.0, 1410.0)
    assert policy.clock_grid(real, (), "gpu") is None


def test_off_the_simulator_the_added_clock_is_traced_joined_and_planned_on(
    monkeypatch, cpu_only, tmp_path
):
    """A dry run (traced like a real GPU): the sweep's trace is read while the program trains
    at the top clock, the clock chosen on the device's own clocks, swept through the guarded
    clock path in a trace of its own, and the planning thread fits the traces joined."""
    import opdvfs.runtime.sweep as sweep_module

    monkeypatch.setattr(sweep_module, "traced_profile", gpu_like(sweep_module.traced_profile))
    monkeypatch.setattr(policy, "ADDED_CLOCK_MIN_GAIN", 0.0)  # any expected saving is worth it
    log = tmp_path / "calls.jsonl"
    act = make_actuator("dry-run", device="a100-like", log=str(log))
    tuner = Tuner(act, target=0.05, iterations_per_clock=1)
    result = tuner.result
    # until the planning thread has its profile
    train_until(tuner, lambda: result.profile is not None or tuner.phase == "top")
    auto = auto_clocks(act.supported_freqs_mhz(), max_gap=None)
    assert result.added_clock is not None, result.error
    (added,) = set(result.clocks_mhz) - set(auto)
    assert f"{added:g} MHz splits the" in result.added_clock
    assert any(line.startswith("active profiling added a clock") for line in summary_lines(result))
    assert result.to_dict()["added_clock"] == result.added_clock
    # chosen while the program trained on at the top clock, then swept as the others were
    phases = [(it.phase, it.freq_mhz) for it in result.iterations]
    first = phases.index(("planning", 1410.0))
    assert ("counted", added) in phases[first:] and ("counted", added) not in phases[:first]
    assert tuner.sweep.freqs_mhz[-1] == added
    # the plans are made on both traces joined: every operator at the added clock too
    profile = result.profile
    assert profile is not None, (tuner.phase, result.error)
    rows = profile.ops.groupby("freq_mhz")["name"].count()
    assert set(rows.index) == {*auto, added} and rows[added] == rows[1410.0]
    # the guarded clock path: the added clock set, then the top, and one restore, last
    sets = [c["freq_mhz"] for c in read_log(log) if c["kind"] == "set"]
    assert sets.index(added) > sets.index(min(auto)) and sets[sets.index(added) + 1] == 1410.0
    kinds = [c["kind"] for c in read_log(log)]
    assert kinds[-1] == "restore" and kinds.count("restore") == 1


def test_off_the_simulator_plans_use_the_device_clocks_between_the_swept_ones(
    monkeypatch, cpu_only
):
    """A dry run (traced like a real GPU) swept at 1410, 1110 and 810 MHz: the plans are made
    over the device's supported clocks between them, the models filling those not swept (a
    plan could only use the three before), and never outside the swept range."""
    import opdvfs.runtime.sweep as sweep_module
    from opdvfs.tuner import planning

    monkeypatch.setattr(sweep_module, "traced_profile", gpu_like(sweep_module.traced_profile))
    planned = []

    def spy(fitted, **options):
        schedule = planning_plan_fitted(fitted, **options)
        planned.append((fitted, options, schedule))
        return schedule

    planning_plan_fitted = planning.plan_fitted
    monkeypatch.setattr(planning, "plan_fitted", spy)
    act = make_actuator("dry-run", device="a100-like")
    swept = (1410.0, 1110.0, 810.0)
    tuner = Tuner(act, target=0.05, clocks=list(swept), iterations_per_clock=1)
    result = tuner.result
    train_until(tuner, lambda: bool(planned) or tuner.planning.finished.is_set())  # a plan made
    assert planned, result.error
    fitted, options, schedule = planned[0]
    assert options["conservative"] is False  # tune plans on point values (its A/B measures)
    grid = fitted.inputs.freqs_mhz
    supported = np.asarray(act.supported_freqs_mhz(), dtype=float)
    assert set(grid) == set(supported[(supported >= 810.0) & (supported <= 1410.0)])
    assert fitted.models is not None  # the clocks not swept are the models'
    assert all(810.0 <= st.freq_mhz <= 1410.0 for st in schedule.stages)
    # the plans between the top clock and the bottom of the range, at budgets set by the
    # slack the traced iteration leaves (its idle gaps are the host's)
    bottom = planning_plan_fitted(fitted, **{**options, "target": 1.0})
    assert [st.freq_mhz for st in bottom.stages] == [810.0]
    slack = bottom.predicted_time_s / bottom.baseline_time_s - 1
    clocks = {
        st.freq_mhz
        for share in (0.1, 0.25, 0.5, 0.75)
        for st in planning_plan_fitted(fitted, **{**options, "target": share * slack}).stages
    }
    assert clocks - set(swept), clocks  # supported clocks the sweep did not measure
    assert all(810.0 <= f <= 1410.0 for f in clocks)
