"""The tests' tiny GPT on a simulated GPU (``sim:PRESET``) at several locked clocks (#21 item 2).

For each preset and clock: the virtual time and the energy per training iteration that the
simulated GPU measures (its own timeline and energy counter, iterations after the first two),
beside the twin's own numbers for the same operator list (``SimulatedDevice.run``), and the
host's cost of launching every operator on the simulated GPU (per operator, best of 3).

    .venv/bin/python benchmarks/simgpu_tiny_gpt.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from opdvfs.runtime.actuators import SimGpuActuator
from opdvfs.runtime.simgpu_feed import SimGpuFeed
from opdvfs.sim import SimulatedDevice
from opdvfs.sim.gpu import SimulatedGpu
from opdvfs.workloads.workload import Workload

from tiny_gpt import LaunchLog, TinyGPT

STEPS = 8
#: The tests' tiny GPT, and a wider one whose matrix multiplies follow the clock.
MODELS = {
    "tiny (dim 32)": {"vocab": 64, "dim": 32, "heads": 2, "layers": 2, "seq": 16, "batch": 2},
    "wide (dim 256)": {"vocab": 256, "dim": 256, "heads": 4, "layers": 2, "seq": 64, "batch": 8},
}
CLOCKS = {"a100-like": (1410.0, 1005.0, 510.0), "h100-like": (1980.0, 1410.0, 705.0)}


def train(config: dict, steps: int) -> None:
    """Train ``steps`` steps of TinyGPT with ``config``."""
    torch.manual_seed(0)
    cfg = dict(config)
    batch = cfg.pop("batch")
    model = TinyGPT(**cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, cfg["vocab"], (steps, batch, cfg["seq"] + 1))
    for i in range(steps):
        logits = model(data[i, :, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, cfg["vocab"]), data[i, :, 1:].reshape(-1)
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def main() -> None:
    """Print the table."""
    rows = []
    for model, config in MODELS.items():
        launches = LaunchLog()
        with SimGpuFeed(launches):  # type: ignore[arg-type]
            train(config, 2)
        ops = Workload(pd.DataFrame(launches.iterations[1]), name=model)
        for preset, clocks in CLOCKS.items():
            twin = SimulatedDevice.from_preset(preset)
            for f in clocks:
                with SimGpuActuator(SimulatedGpu(preset, freq_mhz=f)) as act:
                    train(config, STEPS)
                got = act.gpu.per_iteration(skip=2)
                ref, _ = twin.run(ops, freq_mhz=f, iterations=STEPS - 3)
                rows.append(
                    {
                        "model": model,
                        "preset": preset,
                        "freq_mhz": f,
                        "kernels/iter": len(ops),
                        "time_ms": float(got["time_s"] or "nan") * 1e3,
                        "twin_time_ms": ref.iteration_time_s * 1e3,
                        "energy_mj": float(got["energy_j"] or "nan") * 1e3,
                        "twin_energy_mj": ref.chip_energy_j * 1e3,
                    }
                )
    table = pd.DataFrame(rows)
    top = table.groupby(["model", "preset"])[["time_ms", "energy_mj"]].transform("first")
    table["time_vs_top"] = table["time_ms"] / top["time_ms"] - 1
    table["energy_vs_top"] = table["energy_mj"] / top["energy_mj"] - 1
    with pd.option_context("display.width", 200, "display.float_format", "{:.4g}".format):
        print(table.to_string(index=False))
    # host cost of the feed: the tiny GPT with and without the simulated GPU
    config, steps = MODELS["tiny (dim 32)"], 20
    best = {"plain": float("inf"), "sim": float("inf")}
    for _ in range(3):
        t = time.perf_counter()
        train(config, steps)
        best["plain"] = min(best["plain"], time.perf_counter() - t)
        with SimGpuActuator(SimulatedGpu("a100-like")) as act:
            t = time.perf_counter()
            train(config, steps)
            best["sim"] = min(best["sim"], time.perf_counter() - t)
    n_ops = len(act.gpu.kernels()) / steps
    print(
        f"\nhost cost of sim:a100-like on the tiny GPT: {best['plain'] / steps * 1e3:.2f} -> "
        f"{best['sim'] / steps * 1e3:.2f} ms per step, "
        f"{(best['sim'] - best['plain']) / (steps * n_ops) * 1e6:.1f} us per kernel launched"
    )


if __name__ == "__main__":
    main()
