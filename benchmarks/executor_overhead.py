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


def main(rounds: int = 15) -> None:
    recorder = WorkloadRecorder()
    run(recorder)
    names = [op["name"] for op in recorder.iterations[-1]]
    n = len(names)
    plan = Schedule.from_stage_freqs(
        [0, n // 3, 2 * n // 3], [1410.0, 1005.0, 1410.0], n_ops=n, target=0.05, solver="bench"
    )
    doc = plan.model_dump()
    for sw in doc["switches"][1:]:
        sw["delay_us"] = 100.0  # through the worker thread
    delayed = Schedule.model_validate(doc)
    modes = {
        "none (baseline)": lambda: None,
        "empty dispatch mode": EmptyMode,
        "WorkloadRecorder": WorkloadRecorder,
        "ScheduleExecutor": lambda: ScheduleExecutor(
            plan, DryRunActuator([1005.0, 1410.0]), names=names
        ),
        "  + worker thread": lambda: ScheduleExecutor(
            delayed, DryRunActuator([1005.0, 1410.0]), names=names
        ),
    }
    best = dict.fromkeys(modes, float("inf"))
    for _ in range(rounds):  # interleaved, so a slow moment of the machine hits every mode
        for name, make in modes.items():
            best[name] = min(best[name], run(make()))
    ops = n * STEPS
    base, empty = best["none (baseline)"], best["empty dispatch mode"]
    print(f"tiny GPT, {n} counted ops per step, {STEPS} steps, best of {rounds} interleaved rounds")
    print(f"{'mode':24s} {'s':>8s} {'us/op':>8s} {'us/op beyond the empty mode':>28s}")
    for name, t in best.items():
        per_op = (t - base) / ops * 1e6
        beyond = (t - empty) / ops * 1e6
        print(
            f"{name:24s} {t:8.4f} {per_op if t != base else 0.0:8.1f} "
            f"{beyond if t not in (base, empty) else float('nan'):28.1f}"
        )


if __name__ == "__main__":
    main()
