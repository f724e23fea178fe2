"""Markdown tables of measured outcomes, beside the paper's figures where it has them."""

from __future__ import annotations

from collections.abc import Sequence

from opdvfs.experiments.bench import Outcome
from opdvfs.experiments.suites import SuiteResult, paper_figures

__all__ = ["outcome_table", "render"]


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.2f}%"


def outcome_table(rows: Sequence[Outcome], *, paper: bool = False) -> str:
    """One markdown table: the paper-style columns, energy beside power, predicted beside measured.

    With ``paper=True`` each row that the paper also reports gets its numbers in brackets.
    """
    head = [
        "workload",
        "plan",
        "iteration base -> DVFS (s)",
        "perf loss (pred.)",
        "chip power base -> DVFS (W)",
        "chip power saved",
        "core power saved",
        "chip energy saved (pred.)",
        "core energy saved (pred.)",
        "switches",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for o in rows:
        ref = paper_figures(o) if paper else None

        def cell(mine: str, key: str, ref: dict[str, float] | None = ref) -> str:
            return mine + (f" [{ref[key]:.2f}%]" if ref else "")

        lines.append(
            "| "
            + " | ".join(
                [
                    o.workload,
                    o.label + (f" (budget x{o.budget_scale:.2f})" if o.budget_scale < 1 else ""),
                    f"{o.iteration_time_base_s:.4g} -> {o.iteration_time_s:.4g}"
                    + (f" [{ref['base_s']:.4g}]" if ref and "base_s" in ref else ""),
                    cell(f"{o.perf_loss_pct:.2f}%", "perf_loss")
                    + f" ({_pct(o.predicted_perf_loss_pct)})",
                    f"{o.chip_power_base_w:.1f} -> {o.chip_power_w:.1f}",
                    cell(f"{o.chip_power_saving_pct:.2f}%", "soc_power"),
                    cell(f"{o.core_power_saving_pct:.2f}%", "core_power"),
                    f"{o.chip_energy_saving_pct:.2f}% ({_pct(o.predicted_chip_energy_saving_pct)})",
                    f"{o.core_energy_saving_pct:.2f}% ({_pct(o.predicted_core_energy_saving_pct)})",
                    str(o.switches),
                ]
            )
            + " |"
        )
    return "\n".join(lines)


_TITLES = {
    "plan": "The plan, executed",
    "static": "Best static clock within the same budget (measured sweep)",
    "table3": "Paper Table 3, measured on the simulator",
    "ablations": "Ablations (GPT-3, 2% target; paper Fig. 18)",
    "baselines": "Per-operator plan vs coarse baselines (GPT-3, 2% target)",
    "short iteration": "A 15 ms switch on a short iteration (BERT, 0.12 s, 2% target)",
    "inference": "Host-bound inference (llama2-infer)",
}


def render(result: SuiteResult, figures: Sequence[tuple[str, str]] = ()) -> str:
    """Return the whole report: setup, goals, one table per section, figures, notes."""
    out = [
        f"# opdvfs {result.suite} report",
        "",
        f"Device **{result.device}** (simulated: every number below is measured on opdvfs's "
        "simulated accelerator, not on hardware), objective **"
        f"{result.objective}**. Savings are against the top clock, in the same run; "
        "positive is saved. Predictions of the plan in parentheses"
        + (", the paper's figures in brackets." if result.suite == "paper" else "."),
        "",
        "## Goals",
        "",
        "| goal | met | measured |",
        "|---|---|---|",
    ]
    out += [f"| {g.goal} | {'yes' if g.met else '**no**'} | {g.detail} |" for g in result.goals]
    for key, rows in result.sections.items():
        if not rows:
            continue
        out += ["", f"## {_TITLES.get(key, key)}", ""]
        out.append(outcome_table(rows, paper=result.suite == "paper"))
    for path, caption in figures:
        out += ["", f"![{caption}]({path})", "", f"*{caption}*"]
    if result.notes:
        out += ["", "## Notes", ""] + [f"- {n}" for n in result.notes]
    out += ["", f"Ran in {result.seconds:.1f} s.", ""]
    return "\n".join(out)
