"""Optional extras (matplotlib: ``plot``, highspy: ``pipeline``): when missing, one line names it.

A missing package is simulated the way Python itself sees one: ``sys.modules[name] = None``
makes ``import name`` raise ImportError. The modules that import it are dropped from
``sys.modules`` first, so they import afresh under the simulation (monkeypatch puts all back).
"""

import sys

import pytest
from typer.testing import CliRunner

from opdvfs.cli import app
from opdvfs.datasets import dataset_path
from opdvfs.exceptions import MissingExtraError, OpdvfsError

runner = CliRunner()


def without(monkeypatch: pytest.MonkeyPatch, package: str, *importers: str) -> None:
    """Make ``import package`` (and its submodules) fail; forget the modules that import it."""
    for name in list(sys.modules):
        if name == package or name.startswith(package + "."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, package, None)
    for name in importers:
        monkeypatch.delitem(sys.modules, name, raising=False)


def test_the_error_names_the_package_what_needs_it_and_the_extra():
    err = MissingExtraError("matplotlib", "plot", "drawing figures")
    assert str(err) == (
        "matplotlib is not installed; drawing figures needs it: pip install 'opdvfs[plot]'"
    )
    assert isinstance(err, OpdvfsError) and isinstance(err, ImportError)
    assert err.name == "matplotlib" and err.extra == "plot"


def test_plots_without_matplotlib_raise_the_extra(monkeypatch):
    without(monkeypatch, "matplotlib", "opdvfs.report.plots")
    with pytest.raises(MissingExtraError, match=r"pip install 'opdvfs\[plot\]'"):
        import opdvfs.report.plots  # noqa: F401


def test_demo_without_matplotlib_reports_and_skips_only_the_figures(monkeypatch, tmp_path):
    without(monkeypatch, "matplotlib", "opdvfs.report.plots")
    out = tmp_path / "demo"
    done = runner.invoke(app, ["demo", "--workload", "resnet50", "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert (out / "report.md").is_file() and (out / "results.json").is_file()
    assert not list(out.glob("*.png"))
    assert "figures skipped: matplotlib is not installed" in done.output
    assert "pip install 'opdvfs[plot]'" in done.output
    assert "timeline.png" not in (out / "report.md").read_text()


def test_evaluate_without_matplotlib_fails_first_in_one_line(monkeypatch, tmp_path):
    without(monkeypatch, "matplotlib", "opdvfs.report.plots")
    done = runner.invoke(app, ["evaluate", "--out", str(tmp_path / "ev")])
    assert done.exit_code == 2
    lines = done.output.strip().splitlines()
    assert lines == [
        "opdvfs: error: matplotlib is not installed; drawing figures needs it: "
        "pip install 'opdvfs[plot]'"
    ]
    assert not (tmp_path / "ev").exists()


def test_pipeline_planning_without_highspy_fails_in_one_line(monkeypatch, tmp_path):
    without(monkeypatch, "highspy", "opdvfs.plan._dag_lp", "opdvfs.plan.milp")
    out = tmp_path / "pipe.json"
    done = runner.invoke(
        app,
        [
            "plan",
            str(dataset_path("perseus-gpt3-175b-a100")),
            "--pipeline",
            "1f1b",
            "--microbatches",
            "2",
            "--target",
            "0.02",
            "--out",
            str(out),
        ],
    )
    assert done.exit_code == 2, done.output
    assert done.output.strip().splitlines()[-1] == (
        "opdvfs: error: highspy is not installed; the pipeline planner needs it: "
        "pip install 'opdvfs[pipeline]'"
    )
    assert not out.exists()


def test_milp_without_highspy_raises_the_extra(monkeypatch):
    without(monkeypatch, "highspy", "opdvfs.plan.milp")
    import numpy as np

    from opdvfs.plan.dp import StageTables
    from opdvfs.plan.milp import milp_solve

    tables = StageTables(time_s=np.array([[1.0, 2.0]]), energy_j=np.array([[2.0, 1.0]]))
    with pytest.raises(MissingExtraError, match=r"opdvfs\[pipeline\]"):
        milp_solve(tables, 3.0)


def _tune_result():
    from opdvfs.tuner.result import TuneIteration, TuneResult

    iterations = [
        TuneIteration(i, phase, 1410.0, 0.1, 30.0) for i, phase in enumerate(["warmup", "steady"])
    ]
    timeline = {"start_s": [0.0, 0.05], "time_s": [0.05, 0.05], "freq_mhz": [1410.0, 1200.0]}
    return TuneResult(0.02, "sim:a100-like", None, (1410.0, 1200.0), iterations, timeline=timeline)


def test_tune_writes_its_figures_with_matplotlib(tmp_path):
    from opdvfs.tuner.report import write_tune

    written = write_tune(_tune_result(), tmp_path)
    assert {"clock.png", "phases.png"} <= set(written)
    assert (tmp_path / "clock.png").is_file()


def test_tune_without_matplotlib_writes_its_files_and_skips_the_figures(monkeypatch, tmp_path):
    without(monkeypatch, "matplotlib")
    from opdvfs.tuner.report import write_tune

    with pytest.warns(UserWarning, match=r"figures skipped: .*pip install 'opdvfs\[plot\]'"):
        written = write_tune(_tune_result(), tmp_path)
    assert "tune.json" in written and "report.md" in written
    assert not [name for name in written if name.endswith(".png")]
    assert not list(tmp_path.glob("*.png"))
