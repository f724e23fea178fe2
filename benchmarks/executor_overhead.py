"""Per-operator overhead of the dispatch-mode executor and recorder on this CPU (goal <= 10 us).

Times training steps of the tests' tiny GPT without a mode, under the WorkloadRecorder, and
under the ScheduleExecutor with a dry-run actuator; overhead per op = extra time / ops counted.
Best of 5 runs of 10 steps each. Needs torch.

    .venv/bin/python benchmarks/executor_overhead.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from torch.utils._python_dispatch import TorchDispatchMode

from opdvfs import Schedule
from opdvfs.runtime.actuators import DryRunActuator
from opdvfs.runtime.dispatch import ScheduleExecutor, WorkloadRecorder

from tiny_gpt import TinyGPT

STEPS = 10


class EmptyMode(TorchDispatchMode):
    """The floor: a dispatch mode that only calls the op."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def run(mode=None) -> float:
    torch.manual_seed(0)
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 64, (STEPS + 1, 2, 17))

    def step(i: int) -> None:
        logits = model(data[i, :, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), data[i, :, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    step(STEPS)  # warm-up outside the timing
    t0 = time.perf_counter()
    if mode is None:
        for i in range(STEPS):
            step(i)
    else:
        with mode:
            for i in range(STEPS):
                step(i)
    return time.perf_counter() - t0


def main() -> None:
    recorder = WorkloadRecorder()
    run(recorder)
    names = [op["name"] for op in recorder.iterations[-1]]
    n = len(names)
    plan = Schedule.from_stage_freqs(
        [0, n // 3, 2 * n // 3], [1410.0, 1005.0, 1410.0], n_ops=n, target=0.05, solver="bench"
    )
    base = min(run() for _ in range(5))
    empty = min(run(EmptyMode()) for _ in range(5))
    rec = min(run(WorkloadRecorder()) for _ in range(5))
    exe = min(
        run(ScheduleExecutor(plan, DryRunActuator([1005.0, 1410.0]), names=names)) for _ in range(5)
    )
    ops = n * STEPS
    print(f"tiny GPT, {n} counted ops per step, {STEPS} steps, best of 5")
    print(f"{'mode':24s} {'s':>8s} {'us/op overhead':>15s}")
    print(f"{'none (baseline)':24s} {base:8.4f} {'-':>15s}")
    print(f"{'empty dispatch mode':24s} {empty:8.4f} {(empty - base) / ops * 1e6:15.1f}")
    print(f"{'WorkloadRecorder':24s} {rec:8.4f} {(rec - base) / ops * 1e6:15.1f}")
    print(f"{'ScheduleExecutor':24s} {exe:8.4f} {(exe - base) / ops * 1e6:15.1f}")


if __name__ == "__main__":
    main()
