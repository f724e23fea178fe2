import gzip
import json
import shutil

import numpy as np
import pandas as pd
import pytest

from opdvfs import ProfileFormatError
from opdvfs.datasets import DATASETS, dataset_path
from opdvfs.io import FORMATS, detect_format, read_profile

from kineto import training_trace


# ------------------------------------------------------------------ detection
@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("generic_profile.csv", "csv"),
        ("ascend_op_summary.csv", "ascend"),
        ("ascend_kernel_details.csv", "ascend"),
        ("nv_dvfs_layout.csv", "nv-dvfs"),
        ("nv_dvfs_legacy_layout.csv", "nv-dvfs-legacy"),
        ("torch_cpu_tinygpt.pt.trace.json.gz", "torch-trace"),
    ],
)
def test_detect_format(fixtures, name, fmt):
    assert detect_format(fixtures / name) == fmt


def test_detect_perseus_and_unknown(tmp_path):
    assert detect_format(dataset_path("perseus-gpt3-175b-a100")) == "perseus"
    odd = tmp_path / "odd.csv"
    odd.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(ProfileFormatError, match="line 1: header matches no known"):
        detect_format(odd)


# ------------------------------------------------------------------ generic CSV
def test_generic_csv(fixtures):
    p = read_profile(fixtures / "generic_profile.csv")
    ops = p.ops
    assert p.n_ops == 3 and list(p.freqs_mhz) == [1000.0, 1800.0]
    assert ops.loc[ops["name"] == "allreduce_1", "stream"].unique().tolist() == ["comm"]
    assert np.isnan(ops.loc[ops["name"] == "allreduce_1", "ratio_mte2"]).all()
    assert ops["chip_power_w"].iloc[0] == pytest.approx(231.0)


def test_generic_csv_errors_name_line_and_column(tmp_path, fixtures):
    lines = (fixtures / "generic_profile.csv").read_text().splitlines()
    lines[4] = lines[4].replace("460.1", "-460.1")
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(ProfileFormatError) as err:
        read_profile(bad)
    assert str(err.value) == (
        f"{bad}: line 5, column 'time_us': expected a finite number >= 0, got '-460.1'"
    )
    lines[4] = lines[4].replace("-460.1", "fast")
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(ProfileFormatError, match="line 5, column 'time_us'.*'fast'"):
        read_profile(bad)


@pytest.mark.parametrize(
    "body",
    [
        # empty ratio cells, a name that reads as a number, quoted fields, CRLF, a BOM
        "\ufeffop,name,type,freq_mhz,time_us,ratio_vec\r\n"
        '0,1.50,"Mat,Mul",1000,12.5,\r\n1,b ,B,1000,3e1,0.25\r\n',
        # a blank line, an all-empty float column, ops as floats, spaces in the header
        " op , name,freq_mhz,time_us,chip_power_w\n0.0,a,1800,1.0,\n\n1.0,b,1800,2,\n",
        # spaced numbers and a nan
        "op,name,freq_mhz,time_us,temp_c\n0,a,1000, 5.5,nan\n1,b,1000,6,40\n",
    ],
)
def test_generic_csv_typed_reader_matches_the_text_reader(tmp_path, monkeypatch, body):
    """Numbers converted as read (pyarrow) give the profile the text reader gives, bit for bit."""
    from opdvfs.io import generic_csv

    path = tmp_path / "p.csv"
    path.write_bytes(body.encode())
    typed = read_profile(path, format="csv")
    monkeypatch.setattr(generic_csv, "read_csv_typed", lambda *a: None)
    text = read_profile(path, format="csv")
    pd.testing.assert_frame_equal(typed.ops, text.ops, check_exact=True)
    assert typed.meta == text.meta


@pytest.mark.parametrize(
    "body",
    [
        "op,name,freq_mhz,time_us\n0,a,1000,fast\n",  # text where a number belongs
        "op,name,freq_mhz,time_us\n0,a,1000,1.0,7\n",  # a row longer than the header
        "op,name,op,time_us\n0,a,1000,1.0\n",  # a column twice
        "op,name,freq_mhz,time_us\n",  # no data rows
        "op,name,freq_mhz,time_us\n0,\xff,1000,1.0\n",  # not UTF-8
    ],
)
def test_generic_csv_typed_reader_declines_what_the_text_reader_must_name(tmp_path, body):
    from opdvfs.io import _common, generic_csv

    path = tmp_path / "p.csv"
    path.write_bytes(body.encode("latin-1"))
    assert _common.read_csv_typed(path, generic_csv._numeric) is None
    with pytest.raises(ProfileFormatError, match=str(path)):
        read_profile(path, format="csv")


def test_generic_csv_bad_cells_are_named_as_the_file_writes_them(tmp_path):
    """The typed reader reads them as numbers or blanks; the message still quotes the text."""
    path = tmp_path / "p.csv"
    path.write_text("op,name,freq_mhz,time_us\n0,a,1000,1.0\n1,b,1000,\n")
    with pytest.raises(ProfileFormatError) as err:
        read_profile(path, format="csv")
    assert (
        str(err.value) == f"{path}: line 3, column 'time_us': expected a finite number >= 0, got ''"
    )
    path.write_text("op,name,freq_mhz,time_us\n0,a,1000,1.0\n0,a,1000,2.0\n")
    with pytest.raises(ProfileFormatError, match="line 3, column 'freq_mhz': duplicate"):
        read_profile(path, format="csv")


# ------------------------------------------------------------------ Perseus (real data)
@pytest.mark.parametrize("name", sorted(k for k in DATASETS if k.startswith("perseus")))
def test_perseus_real_profiles(name):
    p = read_profile(dataset_path(name))
    raw = pd.read_csv(dataset_path(name))
    assert p.n_ops == 16  # 8 stages x forward/backward
    assert len(p.freqs_mhz) == raw["frequency"].nunique()
    ops = p.ops
    row = raw.iloc[0]
    mine = ops[
        (ops["name"] == f"stage{row.stage}.{row.instruction}") & (ops["freq_mhz"] == row.frequency)
    ]
    assert mine["time_us"].item() == pytest.approx(row.time * 1e6)
    assert mine["chip_power_w"].item() == pytest.approx(row.energy / row.time)
    # forward comes before backward of the same stage in the op order
    order = ops.drop_duplicates("op").sort_values("op")["name"].tolist()
    assert order[:2] == ["stage0.forward", "stage0.backward"]


# ------------------------------------------------------------------ NV-DVFS
def test_nv_dvfs_layout(fixtures):
    p = read_profile(fixtures / "nv_dvfs_layout.csv")
    ops = p.ops
    assert p.n_ops == 3  # (benchmark, kernel, input) triples
    assert list(p.freqs_mhz) == [405.0, 945.0, 1380.0]
    mm = ops[(ops["name"] == "matmul/mmKernel[input000]") & (ops["freq_mhz"] == 1380.0)]
    assert mm["time_us"].item() == pytest.approx(12000.0)  # ms -> us
    assert mm["chip_power_w"].item() == pytest.approx(210.0)
    assert mm["ratio_sm_active"].item() == pytest.approx(0.99)
    assert (ops["mem_freq_mhz"] == 877.0).all()


def test_nv_dvfs_legacy_layout(fixtures):
    p = read_profile(fixtures / "nv_dvfs_legacy_layout.csv")
    assert p.meta["format"] == "nv-dvfs-legacy"
    assert p.n_ops == 2 and list(p.freqs_mhz) == [802.0, 1380.0]


def test_nv_dvfs_several_memory_clocks_rejected(tmp_path, fixtures):
    text = (fixtures / "nv_dvfs_legacy_layout.csv").read_text().replace(",1380,877,", ",1380,900,")
    path = tmp_path / "grid.csv"
    path.write_text(text)
    with pytest.raises(ProfileFormatError, match="several memory clocks \\(877, 900\\)"):
        read_profile(path)


# ------------------------------------------------------------------ Ascend
def test_ascend_op_summary(fixtures):
    p = read_profile(fixtures / "ascend_op_summary.csv", freqs_mhz=[1800])
    ops = p.ops.set_index("name")
    assert list(p.freqs_mhz) == [1800.0]
    assert ops.loc["Default/MatMulV2-op1", "type"] == "MatMulV2"
    assert ops.loc["Default/MatMulV2-op1", "ratio_aic_mac"] == pytest.approx(0.87)
    assert np.isnan(ops.loc["Default/Gelu-op2", "ratio_aic_mac"])  # N/A
    assert ops.loc["hcom_allReduce__123_0_1", "stream"] == "comm"
    assert ops.loc["Default/Cast-op3", "task_type"] == "AI_CPU"
    assert ops.loc["Default/Gelu-op2", "start_us"] == pytest.approx(812.85, abs=1e-3)
    assert list(p.ops.sort_values("op")["name"])[0] == "Default/MatMulV2-op1"


def test_ascend_kernel_details_steps_and_tabs(fixtures):
    p = read_profile(fixtures / "ascend_kernel_details.csv", freqs_mhz=[1400])
    assert p.n_iterations == 2 and p.n_ops == 3
    ops = p.ops
    assert ops.loc[ops["iteration"] == 1, "start_us"].tolist() == pytest.approx(
        [0.0, 811.2, 933.5], abs=1e-3
    )


def test_ascend_needs_clock_and_one_device(tmp_path, fixtures):
    with pytest.raises(ProfileFormatError, match="pass --freq-mhz"):
        read_profile(fixtures / "ascend_op_summary.csv")
    lines = (fixtures / "ascend_op_summary.csv").read_text().splitlines()
    lines[2] = "1" + lines[2][1:]
    path = tmp_path / "two.csv"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ProfileFormatError, match="holds 2 devices"):
        read_profile(path, freqs_mhz=[1800])


def test_ascend_files_join_across_clocks(tmp_path, fixtures):
    a = tmp_path / "op_summary_1000.csv"
    b = tmp_path / "op_summary_1800.csv"
    shutil.copy(fixtures / "ascend_op_summary.csv", a)
    shutil.copy(fixtures / "ascend_op_summary.csv", b)
    p = read_profile([a, b], freqs_mhz=[1000, 1800])
    assert list(p.freqs_mhz) == [1000.0, 1800.0] and p.n_ops == 4
    assert p.meta["sources"] == [a.name, b.name]
    with pytest.raises(ProfileFormatError, match="2 clocks for 3 files"):
        read_profile([a, b, a], freqs_mhz=[1000, 1800])


def test_join_rejects_misaligned_sequences(tmp_path, fixtures):
    a = tmp_path / "a.csv"
    shutil.copy(fixtures / "ascend_op_summary.csv", a)
    b = tmp_path / "b.csv"
    b.write_text((fixtures / "ascend_op_summary.csv").read_text().replace("Gelu-op2", "Relu-op2"))
    with pytest.raises(ProfileFormatError, match="op 1 is 'Default/Relu-op2' here"):
        read_profile([a, b], freqs_mhz=[1000, 1800])


# ------------------------------------------------------------------ torch traces
def test_real_cpu_trace_fixture(fixtures):
    p = read_profile(fixtures / "torch_cpu_tinygpt.pt.trace.json.gz", freqs_mhz=[3000])
    assert p.n_iterations == 3
    ops = p.ops
    names = ops.loc[ops["iteration"] == 0].sort_values("op")["name"]
    assert names.str.startswith("aten::").all()
    for expected in ("aten::linear", "aten::layer_norm", "aten::mm", "aten::addcdiv_"):
        assert expected in set(names)
    # no op is nested in another (only the outermost aten ops are rows)
    assert "aten::addmm" not in set(names)  # inside aten::linear
    # same sequence in every iteration, starting at zero
    per_iter = ops.groupby("iteration")["name"].apply(tuple)
    assert per_iter.nunique() == 1
    assert (ops.groupby("iteration")["start_us"].min() == 0).all()


def write_trace(tmp_path, doc, gz=False):
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.mark.parametrize("gz", [False, True])
def test_gpu_trace_kernels_map_to_launching_op(tmp_path, gz):
    p = read_profile(write_trace(tmp_path, training_trace(), gz=gz))
    ops = p.ops
    assert list(p.freqs_mhz) == [1410.0]  # from the trace metadata
    assert p.meta["device"] == "NVIDIA H100"
    assert p.n_iterations == 3
    first = ops[ops["iteration"] == 0].set_index("name")
    # aten::view launched nothing: not an operator of the device sequence
    assert list(first.index) == ["aten::mm", "aten::gelu", "nccl:all_reduce"]
    assert first.loc["aten::mm", "time_us"] == pytest.approx(120.0)
    # gelu's kernels carry no External id: joined through the runtime launch's correlation
    assert first.loc["aten::gelu", "time_us"] == pytest.approx(40.0)
    assert first.loc["aten::gelu", "kernels"] == 2
    assert first.loc["nccl:all_reduce", "stream"] == "comm"
    assert ops.loc[ops["name"] == "aten::mm", "time_us"].tolist() == [120.0, 121.0, 122.0]
    # the orphan kernel and the op outside every ProfilerStep are counted, not silently lost
    assert p.dropped == {"device events with no launching operator": 1}


@pytest.mark.parametrize("bad_id", ["1e400", "-inf", 2.5, "9.3e18"])
def test_gpu_trace_ids_that_are_no_whole_number_drop_their_event_not_the_import(tmp_path, bad_id):
    # ids past int64, infinite or fractional (a mangled trace) raised OverflowError/TypeError
    doc = training_trace()
    kernel = next(
        ev
        for ev in doc["traceEvents"]
        if "External id" in ev.get("args", {}) and (ev.get("cat") == "kernel")
    )
    kernel["args"]["External id"] = bad_id
    kernel["args"].pop("correlation", None)
    p = read_profile(write_trace(tmp_path, doc))
    assert p.n_iterations >= 2
    assert p.dropped["device events with no launching operator"] == 2


def test_gpu_trace_drops_iterations_that_differ(tmp_path):
    p = read_profile(write_trace(tmp_path, training_trace(warmup_differs=True)))
    assert p.n_iterations == 2
    assert p.dropped["rows in iterations whose op sequence differs"] == 4


def test_trace_clock_from_option_overrides_metadata(tmp_path):
    path = write_trace(tmp_path, training_trace(freq_mhz=None))
    with pytest.raises(ProfileFormatError, match="pass --freq-mhz or add"):
        read_profile(path)
    assert list(read_profile(path, freqs_mhz=[1005]).freqs_mhz) == [1005.0]


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"", "empty file"),
        (b'{"traceEvents": [', "line 1, column 18: not valid JSON"),
        (b'{"events": []}', "'traceEvents' list"),
        (b'{"traceEvents": [1]}', "event 0: expected a JSON object"),
        (
            b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", '
            b'"ts": 0, "dur": -1}]}',
            "event 0, field 'dur': expected a finite number >= 0",
        ),
        (gzip.compress(b'{"traceEvents": []}', mtime=0)[:-6], "truncated or corrupt gzip"),
    ],
)
def test_bad_traces(tmp_path, content, needle):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(ProfileFormatError, match=needle.replace("(", "\\(")):
        read_profile(path, freqs_mhz=[1000])


def _odd_types(doc):
    """Kineto's fields in types only the generic reader takes: string pids and ids."""
    for ev in doc["traceEvents"]:
        if ev.get("cat") == "cpu_op":
            ev["pid"] = "host"
            ev["args"]["External id"] = str(ev["args"]["External id"])
    return doc


@pytest.mark.parametrize(
    ("name", "doc"),
    [
        ("fixture", None),
        ("gpu", training_trace()),
        ("gpu-list", training_trace()["traceEvents"]),
        ("warmup", training_trace(warmup_differs=True)),
        ("odd-types", _odd_types(training_trace())),
    ],
)
def test_trace_typed_reader_matches_generic_json(fixtures, tmp_path, monkeypatch, name, doc):
    """The msgspec reader (decoded in batches) imports what json.loads + a dict per event did."""
    from opdvfs.io import torch_trace

    if doc is None:
        path = fixtures / "torch_cpu_tinygpt.pt.trace.json.gz"
    else:
        path = tmp_path / "t.json"
        path.write_text(json.dumps(doc))
    typed = read_profile(path, format="torch-trace", freqs_mhz=[1000])
    assert (torch_trace._load_typed(path) is None) == (name == "odd-types")
    monkeypatch.setattr(torch_trace, "_BATCH", 7)  # batch edges inside iterations
    batched = read_profile(path, format="torch-trace", freqs_mhz=[1000])
    monkeypatch.setattr(torch_trace, "_load_typed", lambda path: None)
    generic = read_profile(path, format="torch-trace", freqs_mhz=[1000])
    for other in (batched, generic):
        pd.testing.assert_frame_equal(typed.ops, other.ops, check_exact=True)
        assert typed.meta == other.meta


def test_unknown_format_name(fixtures):
    with pytest.raises(ProfileFormatError, match="unknown format 'xls'"):
        read_profile(fixtures / "generic_profile.csv", format="xls")
    assert "csv" in FORMATS


@pytest.mark.parametrize(
    ("header", "needle"),
    [
        ("op,name,freq_mhz", "missing column 'time_us' of the csv format"),
        ("Name,foo", "missing column 'Task Duration(us)' or 'Duration(us)' or 'Task Duration' of"),
        ("stage,instruction,frequency,time", "missing column 'energy' of the perseus format"),
    ],
)
def test_header_near_a_format_names_the_missing_columns(tmp_path, header, needle):
    path = tmp_path / "near.csv"
    path.write_text(f"{header}\n" + ",".join("1" for _ in header.split(",")) + "\n")
    with pytest.raises(ProfileFormatError, match=needle.replace("(", "\\(").replace(")", "\\)")):
        detect_format(path)


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        (
            {"format": "opdvfs.schedule", "stages": []},
            "an opdvfs schedule, not a profile; opdvfs simulate and opdvfs run take it",
        ),
        (
            {"format": "opdvfs.models", "perf": {}},
            "MODELS file from opdvfs fit, not a profile; opdvfs plan takes it",
        ),
        ({"format": "opdvfs.workload", "ops": {}}, "an opdvfs workload, not a profile"),
        ({"suite": "demo", "sections": {}, "goals": []}, "results.json, not a profile"),
    ],
)
def test_other_opdvfs_files_are_named_not_misread_as_traces(tmp_path, doc, needle):
    path = tmp_path / "thing.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ProfileFormatError, match=needle) as err:
        read_profile(path)
    assert "traceEvents" not in str(err.value)


def test_workload_parquet_is_named_not_misread_as_a_profile(tmp_path):
    from opdvfs import load_workload

    path = tmp_path / "w.parquet"
    load_workload("vgg19").write(path)
    with pytest.raises(ProfileFormatError, match="an opdvfs workload, not a profile"):
        read_profile(path)
