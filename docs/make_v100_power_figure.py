"""Draw the README's power-form figure from the real V100 kernels in ../shared (NV-DVFS-Benchmark).

Board power vs SM clock for a compute-bound and a memory-heavy kernel: measured, the paper's clock
form and the throughput form (device characterised on the 138 micro-benchmarks, held-out times
from the performance model), both from 705 and 1380 MHz.

    .venv/bin/python docs/make_v100_power_figure.py [--root ../shared/data/real]
"""

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from opdvfs import Profile
from opdvfs.io import read_profile
from opdvfs.models.perf import PerfModel
from opdvfs.models.power import PowerModel, characterise_device

KERNELS = ("matrixMul/matrixMulCUDA", "vectorAdd/vectorAdd")
TRAIN = [705.0, 1380.0]

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--root", type=Path, default=Path("../shared/data/real"))
root = parser.parse_args().root / "nv-dvfs-benchmark"


def at_or_above_705(path: Path) -> Profile:
    """Read a profile, keeping the clocks >= 705 MHz (the V100 slows oddly below)."""
    ops = read_profile(path).ops
    return Profile(ops[ops["freq_mhz"] >= 705])


app = at_or_above_705(root / "v100-dvfs-real-profile.csv")
voltage, idle = characterise_device(at_or_above_705(root / "v100-dvfs-microbenchmark-profile.csv"))
clocks = np.linspace(705, 1380, 60)
clock_form = PowerModel(voltage=voltage, temperature=False).fit(app, TRAIN)
throughput = PowerModel(voltage=voltage, dynamic="throughput", temperature=False).fit(
    app, TRAIN, calibration=idle
)
times = PerfModel().fit(app, TRAIN).predict(clocks)
pred_clock = clock_form.predict(clocks)["chip_w"]
pred_throughput = throughput.predict(clocks, time_us=times)["chip_w"]
names = app.ops.drop_duplicates("op").set_index("op")["name"]

fig, axes = plt.subplots(1, len(KERNELS), figsize=(9, 3.4), constrained_layout=True)
for ax, kernel in zip(axes, KERNELS, strict=True):
    op = int(names[names.str.startswith(kernel)].index[0])
    row = int(np.searchsorted(clock_form.op_ids_, op))
    measured = app.ops[app.ops["op"] == op].sort_values("freq_mhz")
    ax.plot(measured["freq_mhz"], measured["chip_power_w"], "ko", label="measured")
    ax.plot(clocks, pred_clock[row], "--", label="clock form (paper)")
    ax.plot(clocks, pred_throughput[row], "-", label="throughput form")
    ax.axvline(TRAIN[0], color="0.8", zorder=0)
    ax.axvline(TRAIN[1], color="0.8", zorder=0)
    ax.set(xlabel="SM clock (MHz)", ylabel="board power (W)", title=kernel.split("/")[1])
    ax.grid(alpha=0.3)
    ax.legend()
fig.suptitle("Real V100 kernels, both models fitted at 705 and 1380 MHz (grey lines)")
out = Path(__file__).with_name("v100-power-forms.png")
fig.savefig(out, dpi=110)
print(out)
