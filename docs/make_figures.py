"""Draw the README's figures from real measurements.

* ``perseus-a100-stage0.png``: time and energy vs clock of a GPT-3 pipeline stage on an A100 (the
  bundled Perseus profile).
* ``v100-power-forms.png``: board power vs SM clock of a compute-bound and a memory-heavy V100
  kernel (NV-DVFS-Benchmark, in ../shared): measured, and what ``PowerModel().fit`` predicts from
  705 and 1380 MHz on the default paths: with no device (the generic V-f prior), and with the
  device characterised on the 138 micro-benchmarks as ``opdvfs characterise`` writes it
  (``--device DEVICE.json``: V-f from power alone, the idle floor) in the paper's clock form and
  the throughput form (held-out times from the performance model). Skipped when the data is not
  there.

    .venv/bin/python docs/make_figures.py [--root ../shared/data/real]
"""

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from opdvfs import Profile
from opdvfs.datasets import dataset_path
from opdvfs.io import read_profile
from opdvfs.models.characterise import characterise_spec
from opdvfs.models.perf import PerfModel
from opdvfs.models.power import PowerModel

V100_KERNELS = ("matrixMul/matrixMulCUDA", "vectorAdd/vectorAdd")
V100_TRAIN = [705.0, 1380.0]


def finish(fig, axes, title: str, name: str, **legend) -> None:
    """Grid and legend (``legend``: its options) on every panel, the title, and the PNG."""
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(**legend)
    fig.suptitle(title)
    out = Path(__file__).with_name(name)
    fig.savefig(out, dpi=110)
    print(out)


def perseus_stage() -> None:
    """Time and energy vs clock of one GPT-3 pipeline stage on a real A100."""
    ops = read_profile(dataset_path("perseus-gpt3-175b-a100")).ops
    fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(9, 3.4), constrained_layout=True)
    for name, style in (("stage0.forward", "-"), ("stage0.backward", "--")):
        rows = ops[ops["name"] == name].sort_values("freq_mhz")
        top = rows.iloc[-1]
        energy = rows["time_us"] * rows["chip_power_w"]
        ax_t.plot(rows["freq_mhz"], rows["time_us"] / top["time_us"], style, label=name)
        top_energy = top["time_us"] * top["chip_power_w"]
        ax_e.plot(rows["freq_mhz"], energy / top_energy, style, label=name)
    ax_t.set(xlabel="SM clock (MHz)", ylabel="time / time at 1410 MHz", title="time")
    ax_e.set(xlabel="SM clock (MHz)", ylabel="energy / energy at 1410 MHz", title="energy")
    finish(
        fig,
        (ax_t, ax_e),
        "GPT-3 175B pipeline stage on a real A100 (Perseus SOSP'24 data, bundled)",
        "perseus-a100-stage0.png",
    )


def at_or_above_705(path: Path) -> Profile:
    """Read a profile, keeping the clocks >= 705 MHz (the V100 slows oddly below)."""
    ops = read_profile(path).ops
    return Profile(ops[ops["freq_mhz"] >= 705])


def v100_power_forms(root: Path) -> None:
    """Board power vs clock of two real V100 kernels: measured, clock and throughput forms."""
    app = at_or_above_705(root / "v100-dvfs-real-profile.csv")
    bench = at_or_above_705(root / "v100-dvfs-microbenchmark-profile.csv")
    device = characterise_spec(bench, name="v100")  # what `opdvfs characterise` writes
    clocks = np.linspace(705, 1380, 60)
    no_device = PowerModel(temperature=False).fit(app, V100_TRAIN)
    clock_form = PowerModel(temperature=False).fit(app, V100_TRAIN, device=device)
    throughput = PowerModel(dynamic="throughput", temperature=False).fit(
        app, V100_TRAIN, device=device
    )
    times = PerfModel().fit(app, V100_TRAIN).predict(clocks)
    pred_none = no_device.predict(clocks)["chip_w"]
    pred_clock = clock_form.predict(clocks)["chip_w"]
    pred_throughput = throughput.predict(clocks, time_us=times)["chip_w"]
    names = app.ops.drop_duplicates("op").set_index("op")["name"]
    fig, axes = plt.subplots(1, len(V100_KERNELS), figsize=(9, 3.4), constrained_layout=True)
    for ax, kernel in zip(axes, V100_KERNELS, strict=True):
        op = int(names[names.str.startswith(kernel)].index[0])
        row = int(np.searchsorted(clock_form.op_ids_, op))
        measured = app.ops[app.ops["op"] == op].sort_values("freq_mhz")
        ax.plot(measured["freq_mhz"], measured["chip_power_w"], "ko", label="measured")
        ax.plot(clocks, pred_none[row], ":", label="no device (V-f prior)")
        ax.plot(clocks, pred_clock[row], "--", label="characterised, clock form (paper)")
        ax.plot(clocks, pred_throughput[row], "-", label="characterised, throughput form")
        for train in V100_TRAIN:
            ax.axvline(train, color="0.8", zorder=0)
        ax.set(xlabel="SM clock (MHz)", ylabel="board power (W)", title=kernel.split("/")[1])
    finish(
        fig,
        axes,
        "Real V100 kernels, every model fitted at 705 and 1380 MHz (grey lines)",
        "v100-power-forms.png",
        loc="upper left",
        fontsize="small",
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("../shared/data/real"))
    v100 = parser.parse_args().root / "nv-dvfs-benchmark"
    perseus_stage()
    if (v100 / "v100-dvfs-real-profile.csv").exists():
        v100_power_forms(v100)
    else:
        print(f"skipped v100-power-forms.png: no {v100}")
