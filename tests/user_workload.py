"""A user's own small workload (24 operators) and training loop, shared by the tests of the
user's path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

from opdvfs.workloads.workload import Workload


def write_mini_workload(path: Path) -> Path:
    """Write a 24-op workload (matmuls, Gelu, LayerNorm, Add; ~0.04-0.26 s per iteration at the
    top clock of the presets) to ``path`` and return it."""
    types = ["MatMul", "Gelu", "MatMul", "LayerNorm", "Add", "MatMul"] * 4
    flops = {"MatMul": 2e12, "Gelu": 2e9, "LayerNorm": 4e9, "Add": 1e9}
    moved = {"MatMul": 4e8, "Gelu": 2e9, "LayerNorm": 2e9, "Add": 3e9}
    ops = pd.DataFrame(
        {
            "name": [f"{t.lower()}{i}" for i, t in enumerate(types)],
            "type": types,
            "stream": "compute",
            "flops": [flops[t] for t in types],
            "bytes_loaded": [moved[t] for t in types],
            "bytes_stored": [moved[t] / 2 for t in types],
        }
    )
    Workload(ops, name="mini").write(path)
    return path


def train_mlp(steps: int, until: Callable[[], bool]) -> None:
    """Train a user's 2-layer MLP (64-256-64, AdamW, batch 32) up to ``steps`` steps, stopping
    after the first step at whose end ``until()`` holds (e.g. a tuner's phase)."""
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    opt = torch.optim.AdamW(net.parameters())
    for _ in range(steps):
        loss = net(torch.randn(32, 64)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if until():
            break
