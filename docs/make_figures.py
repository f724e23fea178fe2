"""Draw the README figure from the bundled Perseus A100 profile (real measurements).

    .venv/bin/python docs/make_figures.py   # writes docs/perseus-a100-stage0.png
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from opdvfs.datasets import dataset_path  # noqa: E402
from opdvfs.io import read_profile  # noqa: E402

profile = read_profile(dataset_path("perseus-gpt3-175b-a100"))
ops = profile.ops
fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(9, 3.4), constrained_layout=True)
for name, style in (("stage0.forward", "-"), ("stage0.backward", "--")):
    rows = ops[ops["name"] == name].sort_values("freq_mhz")
    top = rows.iloc[-1]
    energy = rows["time_us"] * rows["chip_power_w"]
    ax_t.plot(rows["freq_mhz"], rows["time_us"] / top["time_us"], style, label=name)
    ax_e.plot(rows["freq_mhz"], energy / (top["time_us"] * top["chip_power_w"]), style, label=name)
ax_t.set(xlabel="SM clock (MHz)", ylabel="time / time at 1410 MHz", title="time")
ax_e.set(xlabel="SM clock (MHz)", ylabel="energy / energy at 1410 MHz", title="energy")
for ax in (ax_t, ax_e):
    ax.grid(alpha=0.3)
    ax.legend()
fig.suptitle("GPT-3 175B pipeline stage on a real A100 (Perseus SOSP'24 data, bundled)")
out = Path(__file__).with_name("perseus-a100-stage0.png")
fig.savefig(out, dpi=110)
print(out)
