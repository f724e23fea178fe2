"""A trace captured live with torch.profiler imports (skipped only where torch is absent)."""

import pytest

torch = pytest.importorskip("torch")

from opdvfs.io import read_profile  # noqa: E402

from tiny_gpt import capture_training_trace  # noqa: E402


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_live_cpu_capture_imports(tmp_path, suffix):
    path = capture_training_trace(tmp_path / f"trace{suffix}", steps=2, freq_mhz=2100)
    profile = read_profile(path)
    assert list(profile.freqs_mhz) == [2100.0]  # the clock stamped into the trace metadata
    assert profile.n_iterations == 2
    ops = profile.ops
    names = set(ops["name"])
    assert {"aten::linear", "aten::layer_norm", "aten::mm"} <= names
    assert (ops["time_us"] > 0).mean() > 0.9
    # dispatch order is consistent across iterations
    assert ops.groupby("iteration")["name"].apply(tuple).nunique() == 1
