"""Throw mutated and truncated versions of every fixture at every importer.

Whatever the bytes, an importer either returns a valid Profile or raises InputFormatError with
one line that names the file; any other exception is a bug.
"""

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opdvfs import InputFormatError, Profile
from opdvfs.datasets import dataset_path
from opdvfs.io import FORMATS, read_profile

from kineto import training_trace

FIXTURES = Path(__file__).parent / "fixtures"
PERSEUS_HEAD = b"".join(dataset_path("perseus-gpt3-175b-a100").read_bytes().splitlines(True)[:40])

CASES = {
    "csv": ("generic_profile.csv", (FIXTURES / "generic_profile.csv").read_bytes()),
    "ascend-op-summary": ("op_summary.csv", (FIXTURES / "ascend_op_summary.csv").read_bytes()),
    "ascend-kernel-details": (
        "kernel_details.csv",
        (FIXTURES / "ascend_kernel_details.csv").read_bytes(),
    ),
    "nv-dvfs": ("nv.csv", (FIXTURES / "nv_dvfs_layout.csv").read_bytes()),
    "nv-dvfs-legacy": ("legacy.csv", (FIXTURES / "nv_dvfs_legacy_layout.csv").read_bytes()),
    "perseus": ("perseus.csv", PERSEUS_HEAD),
    "torch-trace": ("trace.json", json.dumps(training_trace(), indent=1).encode()),
    "torch-trace-gz": (
        "cpu.pt.trace.json.gz",
        (FIXTURES / "torch_cpu_tinygpt.pt.trace.json.gz").read_bytes(),
    ),
}


@st.composite
def mutated(draw, data: bytes) -> bytes:
    kind = draw(st.sampled_from(["truncate", "delete", "replace", "insert", "duplicate_line"]))
    n = len(data)
    i = draw(st.integers(0, n))
    if kind == "truncate":
        return data[:i]
    if kind == "delete":
        return data[:i] + data[i + draw(st.integers(1, 64)) :]
    if kind == "replace":
        junk = draw(
            st.sampled_from(
                [
                    b"-",
                    b"nan",
                    b"inf",
                    b",",
                    b"\n",
                    b'"',
                    b"x",
                    b"\x00",
                    b"\xff",
                    b"1e400",
                    b"{",
                    b"]",
                    b"-1",
                    b"N/A",
                    b"",
                ]
            )
        )
        return data[:i] + junk + data[i + draw(st.integers(0, 8)) :]
    if kind == "insert":
        return data[:i] + draw(st.binary(min_size=1, max_size=16)) + data[i:]
    lines = data.splitlines(True)
    if not lines:
        return data
    k = draw(st.integers(0, len(lines) - 1))
    return b"".join(lines[: k + 1] + lines[k:])


def check_one(name: str, content: bytes, fmt: str | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(content)
        try:
            profile = read_profile(path, format=fmt, freqs_mhz=[1500])
        except InputFormatError as exc:
            message = str(exc)
            assert "\n" not in message, message
            assert message.startswith(str(path)), message
        else:
            assert isinstance(profile, Profile)
            assert len(profile) > 0


@pytest.mark.parametrize("case", sorted(CASES))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_importers_survive_mutations(case, data):
    name, content = CASES[case]
    check_one(name, data.draw(mutated(content)), None)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_every_importer_on_every_fixture(fmt, data):
    """Forcing the wrong importer onto a file must fail cleanly too."""
    name, content = CASES[data.draw(st.sampled_from(sorted(CASES)))]
    check_one(name, content, fmt)
