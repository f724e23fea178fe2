import json

import jsonschema
import numpy as np
import pandas as pd
import pydantic
import pytest

from opdvfs import (
    DeviceSpec,
    InputFormatError,
    RunResult,
    Schedule,
    ScheduleFormatError,
    ValidationError,
    VoltageCurve,
    Workload,
)
from opdvfs.schedule import op_signature

ASCEND_CLOCKS = tuple(float(f) for f in range(1000, 1801, 100))


# ------------------------------------------------------------------ DeviceSpec
def test_device_clocks_must_ascend():
    with pytest.raises(pydantic.ValidationError, match="strictly ascending"):
        DeviceSpec(name="x", freqs_mhz=(1000.0, 900.0))
    with pytest.raises(pydantic.ValidationError):
        DeviceSpec(name="x", freqs_mhz=(1000.0, 1000.0))
    with pytest.raises(pydantic.ValidationError):
        DeviceSpec(name="x", freqs_mhz=())


def test_voltage_curve_flat_below_knee_linear_above():
    v = VoltageCurve(knee_mhz=1300, flat_v=0.75, slope_v_per_mhz=0.0001)
    volts = v.voltage_v(np.array([1000.0, 1300.0, 1800.0]))
    np.testing.assert_allclose(volts, [0.75, 0.75, 0.80])


def test_nearest_clock_snaps_to_grid():
    spec = DeviceSpec(name="ascend", freqs_mhz=ASCEND_CLOCKS)
    snapped = spec.nearest_freqs_mhz([990.0, 1049.0, 1051.0, 1799.0, 5000.0])
    np.testing.assert_array_equal(snapped, [1000.0, 1000.0, 1100.0, 1800.0, 1800.0])
    assert spec.max_freq_mhz == 1800.0 and spec.min_freq_mhz == 1000.0


def test_device_round_trip_and_immutability(tmp_path):
    spec = DeviceSpec(
        name="ascend-910b-like",
        freqs_mhz=ASCEND_CLOCKS,
        simulated=True,
        voltage=VoltageCurve(knee_mhz=1300, flat_v=0.75, slope_v_per_mhz=1.4e-4),
        switch_latency_ms=1.0,
        source="paper Fig. 9",
    )
    spec.write(tmp_path / "d.json")
    assert DeviceSpec.read(tmp_path / "d.json") == spec
    with pytest.raises(pydantic.ValidationError):
        spec.name = "other"  # frozen
    assert spec.with_changes(switch_latency_ms=15.0).switch_latency_ms == 15.0


def test_device_read_errors_are_one_line(tmp_path):
    path = tmp_path / "d.json"
    path.write_text('{"name": "x", "freqs_mhz": [1, -2]}')
    with pytest.raises(InputFormatError) as err:
        DeviceSpec.read(path)
    assert "freqs_mhz.1" in str(err.value) and "\n" not in str(err.value)
    path.write_text("{not json")
    with pytest.raises(InputFormatError, match="not valid JSON"):
        DeviceSpec.read(path)


# ------------------------------------------------------------------ Schedule
def make_schedule(**fields):
    base = {"target": 0.02, "solver": "dp"}
    return Schedule.from_stage_freqs(
        [0, 3, 5, 9], [1800, 1200, 1200, 1800], n_ops=12, **{**base, **fields}
    )


def test_schedule_switches_only_where_clock_changes():
    s = make_schedule()
    assert [(w.stage, w.freq_mhz) for w in s.switches] == [(0, 1800), (1, 1200), (3, 1800)]
    assert s.n_switches == 2
    freq = s.freq_per_op_mhz()
    assert freq.shape == (12,)
    np.testing.assert_array_equal(freq, [1800] * 3 + [1200] * 6 + [1800] * 3)


def test_predictive_triggers_precede_stage():
    s = Schedule.from_stage_freqs(
        [0, 3, 5, 9],
        [1800, 1200, 1500, 1800],
        n_ops=12,
        lead_ops=[0, 2, 4, 1],
        target=0.02,
        solver="dp",
    )
    assert [w.trigger_op for w in s.switches] == [0, 1, 1, 8]


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda d: d["stages"].pop(1), "expected 3"),
        (lambda d: d["switches"].pop(1), "switches serve stages"),
        (lambda d: d["switches"][1].update(trigger_op=7), "trigger_op"),
        (lambda d: d["switches"][1].update(freq_mhz=1500.0), "runs at 1200"),
        (lambda d: d.update(n_ops=13), "n_ops - 1 = 12"),
        (lambda d: d.update(extra_field=1), "extra_field"),
    ],
)
def test_schedule_rejects_inconsistent_files(tmp_path, change, needle):
    doc = json.loads(make_schedule().to_json())
    change(doc)
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ScheduleFormatError, match=needle):
        Schedule.read(path)


def test_schedule_round_trip_and_json_schema(tmp_path):
    s = make_schedule(
        op_signature=op_signature(["a", "b"]),
        gap_pct=0.01,
        lower_bound_energy_j=10.0,
        predicted_energy_j=10.001,
    )
    s.write(tmp_path / "s.json")
    back = Schedule.read(tmp_path / "s.json")
    assert back == s
    schema = Schedule.model_json_schema()
    jsonschema.validate(json.loads(s.to_json()), schema)
    bad = json.loads(s.to_json())
    bad["stages"][0]["freq_mhz"] = -5
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_op_signature_is_order_sensitive():
    assert op_signature(["a", "b"]) != op_signature(["b", "a"])
    assert op_signature(["a", "b"]) == op_signature(("a", "b"))


# ------------------------------------------------------------------ RunResult
def test_run_result_energy_must_match_power_times_time():
    ok = RunResult(
        device="d",
        workload="w",
        simulated=True,
        iterations=3,
        iteration_time_s=2.0,
        chip_power_w=250.0,
        chip_energy_j=500.0,
    )
    assert RunResult.from_json(ok.to_json()) == ok
    with pytest.raises(pydantic.ValidationError, match="chip_energy_j"):
        RunResult(
            device="d",
            workload="w",
            simulated=True,
            iterations=3,
            iteration_time_s=2.0,
            chip_power_w=250.0,
            chip_energy_j=0.5,
        )  # a kJ/J slip


# ------------------------------------------------------------------ Workload
def workload_frame():
    return pd.DataFrame(
        {
            "name": ["aten::mm", "aten::gelu", "nccl:all_reduce"],
            "stream": ["compute", "compute", "comm"],
            "phase": ["forward", "forward", "backward"],
            "flops": [2 * 1024**3, 0.0, 0.0],
            "bytes_loaded": [8e6, 4e6, 4e6],
            "bytes_stored": [4e6, 4e6, 4e6],
            "ratio_mte2": [0.3, 0.9, np.nan],
        }
    )


@pytest.mark.parametrize("suffix", [".json", ".parquet"])
def test_workload_round_trip(tmp_path, suffix):
    w = Workload(workload_frame(), name="tiny", meta={"layers": 2})
    path = tmp_path / f"w{suffix}"
    w.write(path)
    back = Workload.read(path)
    assert back.equals(w)
    assert back.total_flops == pytest.approx(2 * 1024**3)
    assert list(back.ops["gap_before_us"]) == [0.0, 0.0, 0.0]


def test_workload_validation():
    with pytest.raises(ValidationError, match="column 'phase'"):
        Workload(workload_frame().assign(phase="sideways"), name="x")
    with pytest.raises(ValidationError, match="column 'flops'"):
        Workload(workload_frame().assign(flops=-1.0), name="x")
    with pytest.raises(ValidationError, match="at least one operator"):
        Workload(workload_frame().iloc[:0], name="x")


def test_workload_read_errors(tmp_path):
    path = tmp_path / "w.json"
    path.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(InputFormatError, match="opdvfs.workload"):
        Workload.read(path)
    path.write_text(
        json.dumps({"format": "opdvfs.workload", "name": "x", "ops": {"name": ["a", ""]}})
    )
    with pytest.raises(InputFormatError, match="row 1, column 'name'"):
        Workload.read(path)


def test_atomic_outputs_get_the_usual_file_mode(tmp_path):
    import os
    import stat

    from opdvfs._files import write_text_atomic

    old = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "out.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "out.txt").stat().st_mode) == 0o644


def test_a_lead_beyond_the_stage_reaches_into_the_previous_iteration():
    plan = Schedule.from_stage_freqs(
        [0, 3, 6], [1000.0, 1800.0, 1400.0], n_ops=10, lead_ops=[2, 4, 1], target=0.02, solver="t"
    )
    first, second, third = plan.switches
    assert first.previous_iteration and first.trigger_op == 8  # 10 + 0 - 2
    assert second.previous_iteration and second.trigger_op == 9  # 10 + 3 - 4
    assert not third.previous_iteration and third.trigger_op == 5
    round_trip = Schedule.from_json(plan.to_json())
    assert round_trip == plan


def test_previous_iteration_switches_must_come_first_and_after_the_last_trigger():
    ok = Schedule.from_stage_freqs(
        [0, 3, 6], [1000.0, 1800.0, 1400.0], n_ops=10, lead_ops=[2, 0, 1], target=0.0, solver="t"
    )
    doc = ok.model_dump()
    doc["switches"][2]["previous_iteration"] = True  # after a regular one: not a prefix
    with pytest.raises(ScheduleFormatError, match="must come first"):
        Schedule.from_json(json.dumps(doc))
    doc = ok.model_dump()
    doc["switches"][0]["trigger_op"] = 2  # before the iteration's last regular trigger (5)
    with pytest.raises(ScheduleFormatError, match="previous iteration"):
        Schedule.from_json(json.dumps(doc))


def test_writers_refuse_a_folder_and_leave_nothing_behind(tmp_path):
    from opdvfs._files import write_atomic, write_text_atomic
    from opdvfs.exceptions import OutputPathError

    folder = tmp_path / "out"
    folder.mkdir()
    with pytest.raises(OutputPathError, match="is a directory; expected a file"):
        write_text_atomic(folder, "x")
    blocker = tmp_path / "file.txt"
    blocker.write_text("keep")
    with pytest.raises(OutputPathError, match="file.txt is a file, not a folder"):
        write_text_atomic(blocker / "sub" / "out.json", "x")

    def disk_full(tmp):
        tmp.write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OutputPathError, match="cannot write \\(No space left on device\\)"):
        write_atomic(tmp_path / "new.txt", disk_full)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt", "out"]
    assert blocker.read_text() == "keep" and not any(folder.iterdir())


def test_report_folders_may_exist_but_not_be_files(tmp_path):
    from opdvfs._files import check_output_folder
    from opdvfs.exceptions import OutputPathError

    check_output_folder(tmp_path)  # an existing folder is re-used
    check_output_folder(tmp_path / "new" / "deeper")  # a new one is made when written
    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputPathError, match="is a file; expected a folder"):
        check_output_folder(tmp_path / "f")
    with pytest.raises(OutputPathError, match="is a file, not a folder"):
        check_output_folder(tmp_path / "f" / "sub")


def test_validation_errors_are_one_line_with_the_value_found():
    with pytest.raises(ScheduleFormatError) as err:
        Schedule.from_json('{"format": "opdvfs.schedule", "n_ops": -1}', source="s.json")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("s.json: field 'n_ops': ") and ", got -1" in message
