"""Host overhead of the two trigger modes on this CPU, and what time mode keeps on the twin.

1. Per operator, op mode (goal <= 10 us): training steps of the tests' tiny GPT without a mode,
   under the WorkloadRecorder, and under the ScheduleExecutor with a dry-run actuator; overhead
   per op = extra time / ops counted. Best of 15 interleaved rounds of 10 steps.
2. Per iteration, both modes, on a synthetic loop of 1k, 10k and 100k aten ops per iteration:
   time mode's cost must not grow with the operator count (it has no per-operator hook).
3. ``--twin``: a GPT-3 plan on the simulated ``a100-like`` (15 ms switches, 2% budget) applied
   by each mode at the device's own pace (op mode: the loop reaches each trigger op when the
   planned run does; time mode: iterations of the planned length), the switches as issued
   replayed on the twin: the chip-energy saving each keeps, and their ratio (about 100 s).

    .venv/bin/python benchmarks/executor_overhead.py [--twin]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from torch.utils._python_dispatch import TorchDispatchMode

from opdvfs import Schedule
from opdvfs.runtime.actuators import DryRunActuator, TwinActuator
from opdvfs.runtime.dispatch import ScheduleExecutor, WorkloadRecorder
from opdvfs.runtime.timed import TimedExecutor

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


def synthetic(n_ops: int, iterations: int, mode=None) -> tuple[float, float]:
    """Seconds per iteration of ``n_ops`` in-place adds, and of ending each (by hand)."""
    x = torch.zeros(1)
    marking = 0.0
    t0 = time.perf_counter()
    with mode if mode is not None else _Null():
        for _ in range(iterations):
            for _ in range(n_ops):
                x.add_(1.0)
            if mode is not None:
                t1 = time.perf_counter()
                mode.mark_iteration()
                marking += time.perf_counter() - t1
    return (time.perf_counter() - t0) / iterations, marking / iterations


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def per_iteration(rounds: int = 3, iterations: int = 5) -> None:
    """Host cost per iteration of each mode at 1k, 10k, 100k ops (time mode: flat)."""
    freqs = [1005.0, 1410.0]
    print(f"\nsynthetic loop, best of {rounds} rounds of {iterations} iterations")
    print(
        f"{'ops/iteration':>14s} {'no mode ms':>11s} {'time mode: anchor us/it':>24s} "
        f"{'whole us/it':>12s} {'op mode us/it':>14s}"
    )
    for n in (1_000, 10_000, 100_000):
        base = min(synthetic(n, iterations)[0] for _ in range(rounds))
        plan = Schedule.from_stage_freqs(
            [0, n // 3, 2 * n // 3],
            [1410.0, 1005.0, 1410.0],
            n_ops=n,
            target=0.05,
            solver="bench",
            switch_latency_ms=0.1,
            predicted_time_s=base,
        )
        starts = [0.0, base / 3, 2 * base / 3]
        plan = plan.model_copy(
            update={
                "stages": tuple(
                    st.model_copy(update={"start_s": t})
                    for st, t in zip(plan.stages, starts, strict=True)
                )
            }
        )
        timed = [
            synthetic(
                n,
                iterations,
                TimedExecutor(plan, DryRunActuator(freqs), tolerance=0.9, optimizer_steps=False),
            )
            for _ in range(rounds)
        ]
        counted = min(
            synthetic(
                n, iterations, ScheduleExecutor(plan, DryRunActuator(freqs), optimizer_steps=False)
            )[0]
            for _ in range(rounds)
        )
        # the anchor (ending an iteration, arming the next) is all time mode adds to the
        # program's thread; the whole-iteration difference is that plus the machine's noise
        anchor = min(t[1] for t in timed)
        whole = min(t[0] for t in timed)
        print(
            f"{n:>14,d} {base * 1e3:>11.2f} {anchor * 1e6:>24.0f} "
            f"{(whole - base) * 1e6:>12.0f} {(counted - base) * 1e6:>14.0f}"
        )


def twin(iterations: int = 4) -> None:
    """Apply a GPT-3 plan on a100-like in both modes; replay each on the twin: what it saves."""
    from opdvfs.experiments.bench import prepare
    from opdvfs.plan.planner import plan_schedule

    bench = prepare("gpt3", "a100-like")
    device, work = bench.device, bench.workload
    plan = plan_schedule(
        bench.models, bench.inputs, target=0.02, switch_latency_ms=device.spec.switch_latency_ms
    )
    top, _ = device.run(work, iterations=2)
    planned, sim = device.run(work, plan, iterations=2)
    n = len(work)
    start_us = sim.execution.start_us[n:] - sim.execution.start_us[n]
    triggers = {sw.trigger_op for sw in plan.switches}

    def op_mode() -> TwinActuator:
        act = TwinActuator(device)
        ex = ScheduleExecutor(plan, act, optimizer_steps=False)
        x = torch.zeros(1)
        with ex:
            for _ in range(iterations - 1):
                t0 = time.perf_counter()
                for i in range(n):
                    if i in triggers:  # reach each trigger op when the planned run does
                        left = t0 + start_us[i] * 1e-6 - time.perf_counter()
                        if left > 0:
                            time.sleep(left)
                    x.add_(1.0)
                time.sleep(max(t0 + planned.iteration_time_s - time.perf_counter(), 0.0))
                ex.mark_iteration()
        return act

    def time_mode() -> TwinActuator:
        act = TwinActuator(device)
        ex = TimedExecutor(plan, act, device=device, workload=work, optimizer_steps=False)
        assert ex.timing is not None
        rng = torch.Generator().manual_seed(0)
        with ex:
            for _ in range(iterations):
                jitter = 1 + 0.003 * float(torch.randn(1, generator=rng))
                time.sleep(ex.timing.iteration_s * jitter)  # the device's iteration, +-0.3%
                ex.mark_iteration()
        return act

    def saving(act: TwinActuator) -> tuple[float, float]:
        issued, base = act.measure(work)
        return (
            1 - issued.chip_energy_j / base.chip_energy_j,
            issued.iteration_time_s / base.iteration_time_s - 1,
        )

    t0 = time.perf_counter()
    op_saving, op_loss = saving(op_mode())
    time_saving, time_loss = saving(time_mode())
    print(
        f"\ntwin: gpt3 on a100-like ({device.spec.switch_latency_ms:g} ms switches), 2% plan, "
        f"{len(plan.switches)} switches/iteration, planned run {planned.iteration_time_s:.3f} s"
    )
    print(
        f"  as planned (simulate): {1 - planned.chip_energy_j / top.chip_energy_j:+.2%} chip "
        f"energy saved, {planned.iteration_time_s / top.iteration_time_s - 1:+.2%} time"
    )
    print(f"  op mode, as issued:    {op_saving:+.2%} saved, {op_loss:+.2%} time")
    print(f"  time mode, as issued:  {time_saving:+.2%} saved, {time_loss:+.2%} time")
    print(
        f"  time mode keeps {time_saving / op_saving:.1%} of op mode's saving "
        f"({time.perf_counter() - t0:.0f} s)"
    )


if __name__ == "__main__":
    if "--twin" in sys.argv:
        twin()
    else:
        main()
        per_iteration()
