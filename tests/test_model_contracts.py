"""The estimator contract, checked once over every model (scikit-learn's ``tests/test_common.py``).

Every fitting path of :class:`PerfModel` and :class:`PowerModel`, and :class:`ModelBundle` where
it applies: using an unfitted model raises :class:`NotFittedError`; ``fit`` returns the model and
leaves the profile as it was; the same input gives the same output; a file round trip predicts
identically; bad input raises an :class:`OpdvfsError`; degenerate input (a repeated training
clock, an operator missing or with a time <= 0 at a training clock) raises a
:class:`ValidationError` naming the reason; nothing fitted is NaN.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pytest

from opdvfs import Profile
from opdvfs.calibration import PowerCalibration
from opdvfs.devices.spec import IdlePower
from opdvfs.exceptions import InputFormatError, NotFittedError, OpdvfsError, ValidationError
from opdvfs.models import ModelBundle, PerfModel, PowerModel
from opdvfs.sim import SimulatedDevice
from opdvfs.sim.presets import get_preset
from opdvfs.workloads.library import BUILDERS

CLOCKS_MHZ = [1000.0, 1400.0, 1800.0]
TRAIN_MHZ = [1000.0, 1800.0]
TEST_MHZ = [1200.0, 1400.0, 1600.0]
#: Idle core power at two clocks: what the paper's procedure (eq. 12) reads beta and theta from.
IDLE = PowerCalibration(
    idle=pd.DataFrame({"freq_mhz": [1000.0, 1800.0], "core_power_w": [40.0, 75.0]})
)


DEVICE = get_preset("ascend-910b-like").spec
#: The same device characterised: its V-f curve and an idle chip power floor.
CHARACTERISED = DEVICE.with_changes(
    idle=IdlePower(rail="chip", beta_w_per_ghz_v2=20.0, theta_w_per_v=60.0)
)


def simulated_profile(seed: int = 0) -> Profile:
    """A small profile (vgg19, 129 ops) with per-op core and chip power, three clocks."""
    device = SimulatedDevice.from_preset("ascend-910b-like", seed=seed)
    return device.profile(BUILDERS["vgg19"](), CLOCKS_MHZ)


def chip_only(profile: Profile) -> Profile:
    """The profile as a GPU would give it: chip power per op, no core rail."""
    return Profile(profile.ops.drop(columns=["core_power_w"]), profile.samples, meta=profile.meta)


@pytest.fixture(scope="module")
def profiles() -> dict[str, Profile]:
    core = simulated_profile()
    return {"core": core, "chip": chip_only(core)}


def fixed_times_us(model: PowerModel) -> np.ndarray:
    """Each op's time at the test clocks for the throughput form: T = 100 us at 1 GHz, ~ 1/f."""
    n_ops = len(getattr(model, "op_ids_", []))  # unfitted: predict raises before it looks
    return np.outer(np.full(n_ops, 100.0), 1e3 / np.asarray(TEST_MHZ))


@dataclass(frozen=True)
class Case:
    """One fitting path: how to build, fit and query the model, and on which profile."""

    id: str
    make: Callable[[], Any]
    fit: Callable[[Any, Profile], Any]
    predict: Callable[[Any], dict[str, np.ndarray]]
    profile: str = "core"
    train: tuple[float, ...] = tuple(TRAIN_MHZ)


def perf_case(id: str, train: list[float] = TRAIN_MHZ, **params: Any) -> Case:
    return Case(
        id,
        lambda: PerfModel(**params),
        lambda model, profile: model.fit(profile, train),
        lambda model: {"time_us": model.predict(TEST_MHZ)},
        train=tuple(train),
    )


def power_case(
    id: str,
    profile: str = "core",
    train: list[float] = TRAIN_MHZ,
    fit: dict[str, Any] | None = None,
    **params: Any,
) -> Case:
    throughput = params.get("dynamic") == "throughput"
    return Case(
        id,
        lambda: PowerModel(**params),
        lambda model, data: model.fit(data, train, **(fit or {})),
        lambda model: model.predict(
            TEST_MHZ, time_us=fixed_times_us(model) if throughput else None
        ),
        profile,
        tuple(train),
    )


CASES = [
    perf_case("perf-auto-2-clocks"),
    perf_case("perf-auto-3-clocks", train=CLOCKS_MHZ),
    perf_case("perf-func2", form="func2"),
    perf_case("perf-func3", train=CLOCKS_MHZ, form="func3"),
    perf_case("perf-pwl", form="pwl"),
    # the four fitting paths of PowerModel.fit, with each source of the V-f curve
    power_case("power-clock-core"),
    power_case("power-clock-core-device-vf", fit={"device": DEVICE}),
    power_case("power-clock-core-fitted-vf", train=CLOCKS_MHZ),
    power_case("power-clock-core-op-thermal", thermal="op"),
    power_case("power-paper-procedure", fit={"calibration": IDLE, "device": DEVICE}),
    power_case("power-clock-chip", profile="chip"),
    power_case("power-clock-chip-fitted-vf", profile="chip", train=CLOCKS_MHZ),
    # the throughput form's idle floor: idle runs, a characterised device, or 3 clocks (joint)
    power_case("power-throughput-core", dynamic="throughput", fit={"calibration": IDLE}),
    power_case(
        "power-throughput-chip-characterised",
        profile="chip",
        dynamic="throughput",
        fit={"device": CHARACTERISED},
    ),
    power_case(
        "power-throughput-chip-joint",
        profile="chip",
        train=CLOCKS_MHZ,
        dynamic="throughput",
        fit={"device": DEVICE},
    ),
]
ids = [case.id for case in CASES]


def fitted(case: Case, profiles: dict[str, Profile]) -> Any:
    return case.fit(case.make(), profiles[case.profile])


def assert_same_predictions(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


# ------------------------------------------------------------------ every estimator
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_unfitted_use_raises_not_fitted(case):
    model = case.make()
    with pytest.raises(NotFittedError):
        case.predict(model)
    with pytest.raises(NotFittedError):
        model.to_dict()


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_fit_returns_the_model_and_leaves_the_profile_alone(case, profiles):
    profile = profiles[case.profile]
    before = Profile(profile.ops, profile.samples, meta=profile.meta)
    model = case.make()
    assert case.fit(model, profile) is model
    assert profile.equals(before)


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_same_input_gives_the_same_output(case, profiles):
    model = fitted(case, profiles)
    assert_same_predictions(case.predict(model), case.predict(fitted(case, profiles)))
    # refitting the same object starts afresh: nothing carries over from the first fit
    assert_same_predictions(
        case.predict(model), case.predict(case.fit(model, profiles[case.profile]))
    )


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_a_file_round_trip_predicts_identically(case, profiles, tmp_path):
    model = fitted(case, profiles)
    model.write(tmp_path / "model.json")
    back = type(model).read(tmp_path / "model.json")
    assert_same_predictions(case.predict(model), case.predict(back))
    assert back.to_dict() == model.to_dict()


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_bad_input_raises_an_opdvfs_error(case, profiles, tmp_path):
    profile = profiles[case.profile]
    with pytest.raises(OpdvfsError, match="1100 MHz"):
        case.make().fit(profile, [1100.0, 1800.0])  # a clock the profile does not have
    cls = type(case.make())
    with pytest.raises(InputFormatError):
        cls.from_dict({"format": "something else"})
    doc = fitted(case, profiles).to_dict()
    del doc["op_ids"]
    with pytest.raises(InputFormatError):
        cls.from_dict(doc)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(InputFormatError):
        cls.read(tmp_path / "bad.json")


def _with_ops(profile: Profile, ops: pd.DataFrame) -> Profile:
    return Profile(ops, profile.samples, meta=profile.meta)


def _missing_op(profile: Profile) -> Profile:
    ops = profile.ops
    return _with_ops(profile, ops[~((ops["op"] == 5) & (ops["freq_mhz"] == 1000.0))])


def _times(value: float, only_op: int | None = None) -> Callable[[Profile], Profile]:
    def degrade(profile: Profile) -> Profile:
        ops = profile.ops
        hit = np.full(len(ops), True) if only_op is None else (ops["op"] == only_op).to_numpy()
        return _with_ops(profile, ops.assign(time_us=np.where(hit, value, ops["time_us"])))

    return degrade


#: Degenerate inputs: how to degrade the profile, whether to repeat the first training clock,
#: and what the error says.
DEGENERATE = {
    "repeated-clock": (lambda p: p, True, "1000 MHz is given twice"),
    "op-missing-at-a-clock": (_missing_op, False, "operator 5 (.*) has no time at 1000 MHz"),
    "one-zero-time": (_times(0.0, only_op=7), False, "operator 7 (.*) has a time <= 0 us"),
    "all-zero-times": (_times(0.0), False, "operator 0 (.*) has a time <= 0 us"),
}


@pytest.mark.parametrize("kind", DEGENERATE)
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_degenerate_input_is_refused_with_the_reason(case, kind, profiles):
    degrade, repeat, reason = DEGENERATE[kind]
    train = [case.train[0], *case.train] if repeat else list(case.train)
    with pytest.raises(ValidationError, match=reason):
        case.make().fit(degrade(profiles[case.profile]), train)


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_nothing_fitted_is_nan(case, profiles):
    doc = fitted(case, profiles).to_dict()
    numbers = {k: v for k, v in doc.items() if isinstance(v, int | float | list) and k != "names"}
    for key, value in numbers.items():  # a NaN is written as None, read here as NaN
        assert np.isfinite(np.asarray(value, dtype=float)).all(), key


@pytest.mark.parametrize(
    "model",
    [PerfModel(form="func9"), PowerModel(dynamic="bogus")],
    ids=["perf", "power"],
)
def test_an_unknown_form_is_an_opdvfs_error(model, profiles):
    with pytest.raises(OpdvfsError, match="unknown"):
        model.fit(profiles["core"], TRAIN_MHZ)


def test_the_same_seed_gives_the_same_models():
    """Simulated twice from one seed, the profile and every model fitted on it are the same."""
    a, b = simulated_profile(seed=3), simulated_profile(seed=3)
    assert a.equals(b)
    for case in CASES:
        if case.profile == "core":
            assert case.fit(case.make(), a).to_dict() == case.fit(case.make(), b).to_dict()


# ------------------------------------------------------------------ the bundle
@pytest.fixture(scope="module")
def bundle(profiles) -> ModelBundle:
    core = profiles["core"]
    return ModelBundle(
        perf=PerfModel().fit(core, TRAIN_MHZ), power=PowerModel().fit(core, TRAIN_MHZ)
    )


def test_a_bundle_of_unfitted_models_raises_not_fitted(bundle, tmp_path):
    with pytest.raises(NotFittedError):
        ModelBundle(perf=PerfModel()).to_dict()
    with pytest.raises(NotFittedError):
        ModelBundle(perf=bundle.perf, power=PowerModel()).write(tmp_path / "models.json")
    assert not (tmp_path / "models.json").exists()


@pytest.mark.parametrize("with_power", [True, False], ids=["perf+power", "perf"])
def test_a_bundle_file_round_trip_predicts_identically(bundle, with_power, tmp_path):
    original = bundle if with_power else ModelBundle(perf=bundle.perf)
    original.write(tmp_path / "models.json")
    back = ModelBundle.read(tmp_path / "models.json")
    np.testing.assert_array_equal(back.perf.predict(TEST_MHZ), original.perf.predict(TEST_MHZ))
    if with_power:
        assert original.power is not None and back.power is not None
        assert_same_predictions(back.power.predict(TEST_MHZ), original.power.predict(TEST_MHZ))
    else:
        assert back.power is None
    assert back.to_dict() == original.to_dict()


@pytest.mark.parametrize(
    "doc",
    [
        None,
        {"format": "opdvfs.perf-model"},
        {"format": "opdvfs.models"},
        {"format": "opdvfs.models", "perf": {"format": "opdvfs.models"}},
    ],
    ids=["not-a-dict", "wrong-format", "no-perf", "malformed-perf"],
)
def test_a_bad_bundle_document_raises_an_input_format_error(doc):
    with pytest.raises(InputFormatError):
        ModelBundle.from_dict(doc)


def test_a_bundle_records_its_device_and_reads_files_without_one(bundle, tmp_path):
    with_device = ModelBundle(bundle.perf, bundle.power, device=DEVICE)
    with_device.write(tmp_path / "models.json")
    assert ModelBundle.read(tmp_path / "models.json").device == DEVICE
    old = with_device.to_dict()
    del old["device"]  # a MODELS file written before the device was recorded
    back = ModelBundle.from_dict(old)
    assert back.device is None
    np.testing.assert_array_equal(back.perf.predict(TEST_MHZ), bundle.perf.predict(TEST_MHZ))
    bad = {**with_device.to_dict(), "device": {"name": "x", "freqs_mhz": [1800.0, 1000.0]}}
    with pytest.raises(InputFormatError, match=r"\(device\): field 'freqs_mhz'"):
        ModelBundle.from_dict(bad, source="m.json")
