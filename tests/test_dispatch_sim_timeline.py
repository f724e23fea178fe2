"""`opdvfs run --actuator sim:PRESET` issues each switch on the device's virtual timeline (#21).

A CPU-light script (a 2-layer MLP) dispatches a ~770 ms virtual iteration of sim:h100-like at
``--work-scale 1e6`` in a few ms of host time. A switch planned ``delay_us`` after its trigger
op, waited out in host time by a worker thread, reached the device late (measured: op-6
switches issued 44.5 ms median after their op, 22.6 ms planned). The executor now requests each
one at once for the trigger op's start plus its delay on the device's timeline.
"""

import itertools

import pytest

pytest.importorskip("torch")

from typer.testing import CliRunner

from opdvfs import Schedule
from opdvfs.cli import app
from opdvfs.sim.gpu import SimulatedGpu

from conftest import captured_op_count, read_log

MLP = """
import sys
import torch
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
opt = torch.optim.AdamW(net.parameters())
for _ in range(int(sys.argv[1])):
    loss = net(torch.randn(32, 64)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""
STEPS = 12
#: Stage clocks (MHz) on h100-like and each stage's switch delay after its trigger op (us).
FREQS_MHZ, DELAYS_US = [1215.0, 1605.0, 1095.0], [52_000.0, 22_000.0, 12_700.0]


@pytest.fixture
def device_requests(monkeypatch):
    """Record each clock request on a simulated GPU: the device, and when it is issued (s)."""
    issued: list[tuple[SimulatedGpu, float, float]] = []
    request = SimulatedGpu.request_freq_mhz

    def record(self, freq_mhz, *, at_s=None):
        now_s = self.now_s()
        issued.append((self, freq_mhz, now_s if at_s is None else max(at_s, now_s)))
        request(self, freq_mhz, at_s=at_s)

    monkeypatch.setattr(SimulatedGpu, "request_freq_mhz", record)
    return issued


def test_run_issues_each_switch_at_its_trigger_op_start_plus_delay_on_the_device(
    tmp_path, device_requests
):
    script = tmp_path / "train.py"
    script.write_text(MLP)
    n = captured_op_count(script)
    schedule = Schedule.from_stage_freqs(
        [0, n // 10, n // 2],
        FREQS_MHZ,
        n_ops=n,
        lead_ops=[n // 8, 2, 3],  # the first stage's switch in the previous iteration's tail
        delay_us=DELAYS_US,
        target=0.0,
        solver="manual",
        device="h100-like",
    )
    path, log = tmp_path / "s.json", tmp_path / "calls.jsonl"
    schedule.write(path)
    device_requests.clear()
    argv = ["run", str(path), "--actuator", "sim:h100-like", "--work-scale", "1e6"]
    with pytest.warns(UserWarning, match="falling back"):  # the first step makes AdamW's state
        res = CliRunner().invoke(
            app, [*argv, "--log", str(log), "--", "python", str(script), str(STEPS)]
        )
    assert res.exit_code == 0, res.output
    delay_s = {sw.trigger_op: sw.delay_us * 1e-6 for sw in schedule.switches}
    sets = [r for r in read_log(log) if r["kind"] == "set"]
    gpu = device_requests[0][0]
    assert len(sets) == len(device_requests) - 1  # the restore's request is the last
    checked = 0
    for row, (_, freq_mhz, issued_s) in zip(sets, device_requests, strict=False):
        assert row["freq_mhz"] == freq_mhz
        if row["offset_s"] is None or row["iteration"] == 0:  # the fallback; the first op
            continue
        start_s = gpu.op_start_s(row["iteration"], row["op_index"])
        assert row["offset_s"] == pytest.approx(delay_s[row["op_index"]], abs=1e-9)
        assert issued_s == pytest.approx(start_s + delay_s[row["op_index"]], abs=1e-9), row
        checked += 1
    assert checked >= 3 * (STEPS - 2)
    # and each lands the switch latency later (unless a newer one replaced it while pending):
    # the first kernel from then on runs at its clock
    k = gpu.kernels()
    start = k["start_us"].to_numpy() * 1e-6
    latency_s = gpu.switch_latency_s
    requests = device_requests[-3 * STEPS : -1]  # (the restore's is last)
    landed = 0
    for (_, freq_mhz, issued_s), (_, _, next_s) in itertools.pairwise(requests):
        if next_s >= issued_s + latency_s:
            first = int((start < issued_s + latency_s).sum())
            assert k["freq_mhz"].iloc[first] == freq_mhz
            landed += 1
    assert landed >= STEPS


def test_leaving_the_executor_drops_the_switches_still_waiting_on_the_device():
    """As the worker's close: a switch due after the executor was left never lands."""
    import torch

    from opdvfs.runtime.actuators import make_actuator
    from opdvfs.runtime.dispatch import ScheduleExecutor
    from opdvfs.runtime.recorder import WorkloadRecorder

    torch.manual_seed(0)
    net = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)

    def step() -> None:
        loss = net(torch.randn(8, 64)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    act = make_actuator("sim:h100-like", work_scale=1e6)
    with act:
        with WorkloadRecorder() as recorder:
            step()
        n = len(recorder.iterations[-1])
        late = Schedule.from_stage_freqs(
            [0, n // 2], [1980.0, 1095.0], n_ops=n, delay_us=[0.0, 60e6], target=0.0, solver="m"
        )
        with ScheduleExecutor(late, act):
            step()  # the 1095 MHz switch is due a minute after its trigger op
        t_s = act.gpu.now_s()
        while act.gpu.now_s() < t_s + 61:
            step()
    assert 1095.0 not in set(act.gpu.kernels()["freq_mhz"])
