"""The issue's end-to-end check: capture a tiny GPT script, profile it on the simulator, plan it,
and run the unchanged script under `opdvfs run --actuator dry-run` (needs torch)."""

import json
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

from typer.testing import CliRunner

from opdvfs import Schedule
from opdvfs.cli import app

TRAIN = textwrap.dedent("""
    import sys
    import torch
    sys.path.insert(0, {tests!r})
    from tiny_gpt import TinyGPT

    steps = int(sys.argv[1])
    torch.manual_seed(0)
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 64, (steps, 2, 17))
    for i in range(steps):
        logits = model(data[i, :, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), data[i, :, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
""")


def test_capture_profile_plan_run(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN.format(tests=str(Path(__file__).parent)))
    runner = CliRunner()
    workload = tmp_path / "captured.json"
    res = runner.invoke(app, ["capture", "--out", str(workload), "--", "python", str(script), "3"])
    assert res.exit_code == 0, res.output
    profile = tmp_path / "p.parquet"
    res = runner.invoke(
        app,
        [
            "profile",
            "--device",
            "ascend-910b-like",
            "--workload",
            str(workload),
            "--freqs",
            "1000,1400,1800",
            "--out",
            str(profile),
        ],
    )
    assert res.exit_code == 0, res.output
    schedule = tmp_path / "s.json"
    res = runner.invoke(
        app,
        [
            "plan",
            str(profile),
            "--target",
            "0.1",
            "--objective",
            "core-energy",
            "--interval-ms",
            "0",
            "--workload",
            str(workload),
            "--out",
            str(schedule),
        ],
    )
    assert res.exit_code == 0, res.output
    plan = Schedule.read(schedule)
    assert plan.n_ops == len(json.loads(workload.read_text())["ops"]["name"])
    # The tiny model's ops are all launch-bound on the simulated NPU, so the plan puts the whole
    # iteration at one low clock (no switch inside it). Run a 3-stage schedule for the same
    # sequence instead, so the log has switches to check.
    n = plan.n_ops
    plan = Schedule.from_stage_freqs(
        [0, n // 3, 2 * n // 3],
        [1800.0, 1000.0, 1800.0],
        n_ops=n,
        target=0.1,
        solver="manual",
        device=plan.device,
    )
    plan.write(schedule)
    log = tmp_path / "calls.jsonl"
    with pytest.warns(UserWarning, match="falling back to the maximum clock"):
        res = runner.invoke(
            app,
            [
                "run",
                str(schedule),
                "--actuator",
                "dry-run",
                "--log",
                str(log),
                "--workload",
                str(workload),
                "--",
                "python",
                str(script),
                "4",
            ],
        )
    assert res.exit_code == 0, res.output
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert calls[-1]["kind"] == "restore" and sum(c["kind"] == "restore" for c in calls) == 1
    # only the first iteration diverges (AdamW creates its state there); the steady ones hold
    # exactly the planned clock changes at the planned trigger ops
    assert "ran 4 iterations; diverged in 1" in res.stdout
    for it in (1, 2, 3):
        got = [
            (c["op_index"], c["freq_mhz"])
            for c in calls
            if c["kind"] == "set" and c["iteration"] == it
        ]
        assert got[-2:] == [(n // 3, 1000.0), (2 * n // 3, 1800.0)]
        assert all(op in (0, n // 3, 2 * n // 3) for op, _ in got)
