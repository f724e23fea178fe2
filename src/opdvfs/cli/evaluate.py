"""End-to-end commands on the simulator: demo, evaluate, report."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer
from rich.table import Table

from opdvfs._files import check_output_folder, write_text_atomic
from opdvfs.cli._app import (
    DeviceOption,
    JsonOption,
    ObjectiveOption,
    SeedOption,
    app,
    reports_errors,
    spinner,
    stderr,
    stdout,
)
from opdvfs.exceptions import InputFormatError, MissingExtraError
from opdvfs.schedule import Objective

# The experiments (the simulator, the models, the planner) load inside the commands.
if TYPE_CHECKING:
    from opdvfs.experiments.bench import Outcome
    from opdvfs.experiments.suites import DemoData, SuiteResult

_RESULTS = "results.json"
_REPORT = "report.md"


def _steps(total: int):
    """Return a progress bar over the suite's steps (stderr; hidden when not a terminal)."""
    progress = spinner()
    task = progress.add_task("starting", total=total)

    def step(description: str) -> None:
        progress.update(task, description=description, advance=1)

    return progress, step


def _write_report(out: Path, result: SuiteResult, figures: list[tuple[str, str]]) -> Path:
    from opdvfs.report.markdown import render

    write_text_atomic(out / _RESULTS, result.model_dump_json(indent=2) + "\n")
    report = out / _REPORT
    write_text_atomic(report, render(result, figures))
    return report


_DEMO_FIGURES = (
    ("timeline.png", "Core clock over one iteration, above the operator classes"),
    ("savings.png", "Measured energy saved vs measured slowdown"),
    ("model_error_cdf.png", "Model error on held-out clocks"),
)


def _demo_figures(out: Path, data: DemoData, title: str, target: float) -> str:
    """Draw the demo's figures into ``out``; return why they were skipped, or "" if drawn.

    matplotlib is an optional extra: without it the demo still measures and writes its report,
    and says in one line on stderr which extra draws the figures.
    """
    try:
        from opdvfs.report.plots import plot_error_cdf, plot_savings, plot_timeline
    except MissingExtraError as e:
        stderr.print(f"opdvfs: note: figures skipped: {e}", markup=False, highlight=False)
        return "figures skipped"
    caption = f"{title}: the {target:.0%} plan as executed"
    plot_timeline(data.timeline, out / "timeline.png", caption)
    plot_savings(data.sweep, data.static, out / "savings.png")
    plot_error_cdf(
        {"time": data.perf_errors_pct, f"{data.power_rail} power": data.power_errors_pct},
        out / "model_error_cdf.png",
        "model error on held-out clocks",
    )
    return ""


def _summary_table(
    rows: list[Outcome], title: str, paper: Callable[[Outcome], dict[str, float] | None]
) -> Table:
    """Return one row per outcome: measured change vs the top clock (report.md has base -> DVFS).

    Where the paper reports the same row (Table 3, Fig. 18), a cell reads ``twin/paper`` (%);
    the paper's energies are derived (power x time).
    """
    table = Table(title=title, title_justify="left")
    for name in ("plan", "perf loss", "chip P", "core P", "chip E", "core E", "pred. chip E", "sw"):
        table.add_column(name, justify="left" if name == "plan" else "right")

    def cell(value: float, ref: float | None, sign: float = -1.0) -> str:
        return f"{sign * value:+.2f}%" if ref is None else f"{sign * value:+.2f}/{sign * ref:+.2f}"

    for o in rows:
        ref = paper(o)
        loss = ref["perf_loss"] if ref else None
        soc = ref["soc_power"] if ref else None
        core = ref["core_power"] if ref else None

        def energy(power_saving: float | None, loss=loss) -> float | None:
            if power_saving is None or loss is None:
                return None
            return (1 - (1 - power_saving / 100) * (1 + loss / 100)) * 100

        table.add_row(
            f"{o.workload} {o.label}",
            cell(o.perf_loss_pct, loss, sign=1.0),
            cell(o.chip_power_saving_pct, soc),
            cell(o.core_power_saving_pct, core),
            cell(o.chip_energy_saving_pct, energy(soc)),
            cell(o.core_energy_saving_pct, energy(core)),
            f"{-(o.predicted_chip_energy_saving_pct or 0.0):+.2f}%",
            str(o.switches) + ("/821" if ref and o.label.startswith("reference") else ""),
        )
    return table


def _paper_style(main: Outcome, static: Outcome | None, title: str) -> Table:
    """Return the paper's Table 3 layout for one plan: base -> DVFS, energy beside power."""
    table = Table(title=title, title_justify="left")
    for name in ("", "top clock", "per-operator plan", "predicted"):
        table.add_column(name, justify="left" if not name else "right")
    if static is not None:
        table.add_column(f"best {static.label}", justify="right")

    def change(base: float, value: float) -> str:
        return f"{value:.4g} ({value / base - 1:+.2%})" if base else f"{value:.4g}"

    def chip_j(o: Outcome) -> float:
        return o.chip_power_w * o.iteration_time_s

    def core_j(o: Outcome) -> float:
        return o.core_power_w * o.iteration_time_s

    base_s = main.iteration_time_base_s
    # quantity, its value in an outcome, at the top clock, the plan's prediction, base format
    quantities: list[tuple[str, Callable[[Outcome], float], float, str, str]] = [
        (
            "iteration time (s)",
            lambda o: o.iteration_time_s,
            base_s,
            _predicted(main.predicted_perf_loss_pct),
            "{:.4g}",
        ),
        ("chip power (W)", lambda o: o.chip_power_w, main.chip_power_base_w, "", "{:.1f}"),
        ("core power (W)", lambda o: o.core_power_w, main.core_power_base_w, "", "{:.1f}"),
        (
            "chip energy (J)",
            chip_j,
            main.chip_power_base_w * base_s,
            _predicted(main.predicted_chip_energy_saving_pct, -1),
            "{:.1f}",
        ),
        (
            "core energy (J)",
            core_j,
            main.core_power_base_w * base_s,
            _predicted(main.predicted_core_energy_saving_pct, -1),
            "{:.1f}",
        ),
    ]
    for label, value, base, predicted, fmt in quantities:
        cells = [label, fmt.format(base), change(base, value(main)), predicted]
        table.add_row(*cells, *([change(base, value(static))] if static is not None else []))
    switches = [str(static.switches)] if static is not None else []
    table.add_row("switches / iteration", "0", str(main.switches), "", *switches)
    return table


def _predicted(pct: float | None, sign: int = 1) -> str:
    """Format a predicted change; blank where the models predict none (a GPU's core rail)."""
    return "" if pct is None else f"{sign * pct:+.2f}%"


def _print_goals(result: SuiteResult) -> None:
    for g in result.goals:
        mark = "met" if g.met else "NOT met"
        stdout.print(f"  [{mark}] {g.goal}: {g.detail}", highlight=False, markup=False)


@app.command()
@reports_errors
def demo(
    workload: Annotated[
        str, typer.Option("--workload", "-w", help="Workload (see `opdvfs workloads`).")
    ] = "gpt3",
    device_name: DeviceOption = "ascend-910b-like",
    target: Annotated[
        float, typer.Option("--target", min=0.0, help="Allowed slowdown (0.02 = 2%).")
    ] = 0.02,
    objective: Annotated[
        Objective | None,
        typer.Option(
            "--objective",
            help="energy (chip), core-energy, power (mean chip) or paper; default: core-energy "
            "where the device measures core power per op (Ascend), else energy (a GPU's board).",
        ),
    ] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Report folder.")] = Path("demo-out"),
    seed: SeedOption = 0,
    as_json: JsonOption = False,
) -> None:
    """Profile, fit, plan and execute one workload on the simulator; measure and report."""
    from opdvfs.experiments.suites import run_demo

    check_output_folder(out)  # before the run, not after it
    started = time.perf_counter()
    progress, step = _steps(5)
    with progress:
        result, data = run_demo(
            workload, device_name, target=target, objective=objective, seed=seed, step=step
        )
        skipped = _demo_figures(out, data, f"{workload} on {device_name} (simulated)", target)
        if data.schedule is not None:
            data.schedule.write(out / "schedule.json")
    result = result.model_copy(update={"seconds": time.perf_counter() - started})
    figures = [] if skipped else list(_DEMO_FIGURES)
    report = _write_report(out, result, figures)
    main = result.sections["plan"][0]
    if as_json:
        print(
            json.dumps(
                {
                    "perf_loss_pct": main.perf_loss_pct,
                    "core_power_saving_pct": main.core_power_saving_pct,
                    "chip_power_saving_pct": main.chip_power_saving_pct,
                    "core_energy_saving_pct": main.core_energy_saving_pct,
                    "chip_energy_saving_pct": main.chip_energy_saving_pct,
                    "predicted_perf_loss_pct": main.predicted_perf_loss_pct,
                    "predicted_chip_energy_saving_pct": main.predicted_chip_energy_saving_pct,
                    "switches": main.switches,
                    "report": str(report),
                }
            )
        )
        return
    static = result.sections["static"][0] if result.sections["static"] else None
    stdout.print(
        _paper_style(
            main,
            static,
            f"{workload} on {device_name} (simulated), {target:.0%} target, objective "
            f"{result.objective}: "
            "measured",
        )
    )
    _print_goals(result)
    stdout.print(
        f"wrote {report} ({skipped or '+ figures'}) in {result.seconds:.1f} s", highlight=False
    )


@app.command()
@reports_errors
def evaluate(
    out: Annotated[Path, typer.Option("--out", "-o", help="Report folder.")],
    suite: Annotated[Literal["paper"], typer.Option("--suite", help="Which suite.")] = "paper",
    device_name: DeviceOption = "ascend-910b-like",
    objective: ObjectiveOption = "core-energy",
    seed: SeedOption = 0,
    as_json: JsonOption = False,
) -> None:
    """Paper Table 3 and ablations, measured on the simulator beside the paper's numbers."""
    from opdvfs.experiments.suites import paper_figures, run_paper_suite
    from opdvfs.report.plots import plot_paper_comparison  # its figure is the point: fail early

    del suite  # one suite so far: the option is there for scripts that name it
    check_output_folder(out)  # before the run, not after it
    started = time.perf_counter()
    progress, step = _steps(11)
    with progress:
        result = run_paper_suite(device_name, objective=objective, seed=seed, step=step)

    table = result.sections["table3"]
    plot_paper_comparison(
        table,
        [paper_figures(o) for o in table],
        out / "table3.png",
    )
    result = result.model_copy(update={"seconds": time.perf_counter() - started})
    figures = [("table3.png", "Table 3: power and energy saved, simulated, beside the paper")]
    report = _write_report(out, result, figures)
    if as_json:
        print(json.dumps({"report": str(report), **result.model_dump(mode="json")}))
        return
    for key in result.sections:
        title = f"{key}: change vs the top clock (twin/paper where the paper reports the row)"
        stdout.print(_summary_table(result.sections[key], title, paper_figures))
    _print_goals(result)
    for note in result.notes:
        stdout.print(f"  note: {note}", highlight=False, markup=False)
    stdout.print(f"wrote {report} in {result.seconds:.1f} s", highlight=False)


@app.command()
@reports_errors
def report(
    folder: Annotated[Path, typer.Argument(help="A folder written by demo or evaluate.")],
) -> None:
    """Re-render a report folder's report.md from its results.json."""
    from opdvfs.experiments.suites import SuiteResult

    if not folder.is_dir():
        what = "no such folder" if not folder.exists() else "is a file"
        raise InputFormatError(f"{folder}: {what}; expected a folder written by demo or evaluate")
    result = SuiteResult.read(folder / _RESULTS)
    figures = [(p.name, p.stem.replace("_", " ")) for p in sorted(folder.glob("*.png"))]
    path = _write_report(folder, result, figures)
    stdout.print(f"wrote {path}", highlight=False)
