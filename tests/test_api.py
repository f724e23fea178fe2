"""The package face: the pipeline in Python from ``import opdvfs`` alone, loaded lazily."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import opdvfs


def docstring_example() -> str:
    """The indented code block of the package docstring (after its ``::``)."""
    block = opdvfs.__doc__.split("::\n", 1)[1].split("\n\n", 2)
    lines = "\n\n".join(block[:2]).splitlines()
    return textwrap.dedent("\n".join(line for line in lines if line.startswith("    ") or not line))


def test_the_pipeline_from_the_package_face():
    """The package docstring's example runs as written and plans within its budget."""
    scope: dict = {}
    exec(docstring_example(), scope)
    schedule, result, device = scope["schedule"], scope["result"], scope["device"]
    baseline, _ = device.run(scope["workload"])
    assert isinstance(schedule, opdvfs.Schedule) and isinstance(result, opdvfs.RunResult)
    assert schedule.predicted_time_s <= 1.02 * schedule.baseline_time_s * (1 + 1e-9)
    assert result.iteration_time_s <= 1.03 * baseline.iteration_time_s


def test_the_guide_pipeline_block_runs_as_written():
    guide = (Path(__file__).resolve().parents[1] / "docs" / "guide" / "pipeline.md").read_text()
    after = guide.split("In Python each stage is one verb", 1)[1]
    code = after.split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict = {}
    exec(code, scope)
    assert isinstance(scope["result"], opdvfs.RunResult)


def test_every_exported_name_resolves_and_unknown_names_raise():
    assert set(opdvfs.__all__) == {*opdvfs._EXPORTS, "__version__"}
    for name in opdvfs.__all__:
        assert getattr(opdvfs, name) is not None
    assert set(opdvfs.__all__) <= set(dir(opdvfs))
    with pytest.raises(AttributeError, match="no attribute 'plan_everything'"):
        _ = opdvfs.plan_everything


def test_import_opdvfs_loads_nothing_heavy():
    code = (
        "import sys, opdvfs; "
        "print(sorted(m for m in ('pandas', 'scipy', 'torch', 'matplotlib', 'pyarrow') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
