"""A job's graph from each rank's own ops (sends, receives, barriers), and the whole pipeline
on the twin under each rank's own schedule."""

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

pytest.importorskip("highspy")

from opdvfs.cli import app
from opdvfs.exceptions import ValidationError
from opdvfs.experiments.pipeline import layout_of, run_pipeline
from opdvfs.plan.dag import solve_dag
from opdvfs.plan.pipeline import one_f_one_b, pipeline_graph
from opdvfs.plan.ranks import RECV, RankOps, rank_layout, rank_schedule, rank_tables
from opdvfs.schedule import PipelineSchedule
from opdvfs.sim.twin import SimulatedDevice
from opdvfs.workloads.library import gpt3, load_pipeline, load_workload
from opdvfs.workloads.pipeline import pipeline_workloads
from opdvfs.workloads.transformer import TransformerConfig

FREQS = np.array([1000.0, 1400.0, 1800.0])


def toy_ranks(n_stages: int, n_micro: int, *, torch_names: bool) -> list[list[str]]:
    """Each rank's ops of a 1F1B pipeline: per instruction a compute op and its messages.

    ``torch_names``: the p2p ops as a torch trace names them (``nccl:send``, ``c10d::recv_``;
    no direction in the name, as on 2 ranks); else with their direction (activation / grad).
    """
    send_a, recv_a = ("nccl:send", "c10d::recv_") if torch_names else ("send_act", "recv_act")
    send_g, recv_g = ("nccl:send", "c10d::recv_") if torch_names else ("send_grad", "recv_grad")
    ranks = []
    for s in range(n_stages):
        ops: list[str] = []
        f = b = 0
        for kind in one_f_one_b(s, n_stages, n_micro):
            if kind == "forward":
                ops += [recv_a] if s > 0 else []
                ops += [f"fwd{f}"] + ([send_a] if s < n_stages - 1 else [])
                f += 1
            else:
                ops += [recv_g] if s < n_stages - 1 else []
                ops += [f"bwd{b}"] + ([send_g] if s > 0 else [])
                b += 1
        ranks.append(ops)
    return ranks


def toy_tables(names: list[str], fwd_s: float, bwd_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-op time (s) at FREQS: compute ops slow as 1800/f, messages take no time."""
    base = np.array(
        [fwd_s if n.startswith("fwd") else bwd_s if n.startswith("bwd") else 0.0 for n in names]
    )
    time_s = base[:, None] * (FREQS.max() / FREQS)[None, :]
    energy = base[:, None] * (FREQS / FREQS.max())[None, :] ** 2 * 100.0 + time_s * 10.0
    return time_s, energy


def as_rank_ops(ranks: list[list[str]]) -> list[RankOps]:
    return [RankOps(np.array(r), np.array(r), None, f"rank{i}.csv") for i, r in enumerate(ranks)]


def test_two_ranks_with_torch_send_recv_give_the_1f1b_edges_and_makespan():
    s, m, fwd, bwd = 2, 3, 1.0, 2.0
    ranks = toy_ranks(s, m, torch_names=True)
    layout = rank_layout(as_rank_ops(ranks))
    assert layout.n_messages == 2 * m  # m activations down, m gradients back
    names = layout.names
    edges = {
        (names[a], int(layout.node_rank[a]), names[b], int(layout.node_rank[b]))
        for a, b in layout.edges
        if layout.node_rank[a] != layout.node_rank[b]
    }
    # consecutive computations are one node (named by its first op, +1 more op): rank 0 runs
    # fwd0 send fwd1 send recv [bwd0 fwd2] send recv bwd1 recv bwd2, rank 1 recv [fwd0 bwd0]
    # send recv [fwd1 bwd1] send ...; a message is posted when the node before its send ends
    assert edges == {
        ("fwd0", 0, "c10d::recv_", 1),
        ("fwd1", 0, "c10d::recv_", 1),
        ("bwd0+1", 0, "c10d::recv_", 1),
        ("fwd0+1", 1, "c10d::recv_", 0),
        ("fwd1+1", 1, "c10d::recv_", 0),
        ("fwd2+1", 1, "c10d::recv_", 0),
    }
    # the k-th send pairs with the k-th receive
    recv1 = np.flatnonzero((layout.node_rank == 1) & (layout.node_kind == RECV))
    fed = {int(b): names[a] for a, b in layout.edges if layout.node_rank[a] == 0 and b in recv1}
    assert [fed[int(r)] for r in recv1] == ["fwd0", "fwd1", "bwd0+1"]
    tables = [toy_tables(r, fwd, bwd) for r in ranks]
    problem = layout.problem([t for t, _ in tables], [e for _, e in tables], FREQS)
    makespan = float(problem.evaluate(problem.top_clock())[0])
    assert makespan == pytest.approx((m + s - 1) * (fwd + bwd))


@pytest.mark.parametrize(("n_stages", "n_micro"), [(3, 4), (4, 6)])
def test_the_graph_from_ranks_matches_the_stage_builder_at_every_plan(n_stages, n_micro):
    rng = np.random.default_rng(n_stages)
    fwd, bwd = rng.uniform(1, 2, n_stages), rng.uniform(2, 4, n_stages)
    ranks = toy_ranks(n_stages, n_micro, torch_names=False)
    layout = rank_layout(as_rank_ops(ranks))
    tables = [toy_tables(r, fwd[s], bwd[s]) for s, r in enumerate(ranks)]
    mine = layout.problem([t for t, _ in tables], [e for _, e in tables], FREQS)
    stage_t = np.stack([fwd, bwd])[:, :, None] * (FREQS.max() / FREQS)[None, None, :]
    ref = pipeline_graph(stage_t[0], stage_t[0], stage_t[1], stage_t[1], FREQS, n_micro)
    # a random clock per stage: the same durations in both graphs
    for _ in range(5):
        stage_clock = rng.integers(0, len(FREQS), n_stages)
        ref_clock = stage_clock[ref.rank]
        full = stage_clock[layout.node_rank]
        assert mine.evaluate(full)[0] == pytest.approx(ref.evaluate(ref_clock)[0])
    assert mine.evaluate(mine.top_clock())[0] == pytest.approx(ref.evaluate(ref.top_clock())[0])


def test_a_barrier_joins_every_rank():
    ranks = [["a", "all_reduce", "c"], ["a", "all_reduce", "c"]]
    times = [np.array([1.0, 0.0, 5.0]), np.array([3.0, 0.0, 1.0])]
    tabs = [np.repeat(t[:, None], 3, axis=1) for t in times]
    for barrier, makespan in ((None, 6.0), ("all_reduce", 8.0)):
        layout = rank_layout(as_rank_ops(ranks), barrier=barrier)
        problem = layout.problem(tabs, tabs, FREQS)
        assert problem.evaluate(problem.top_clock())[0] == pytest.approx(makespan)
    with pytest.raises(ValidationError, match="rank1.csv: reaches 1 barrier"):
        rank_layout(as_rank_ops([["all_reduce", "all_reduce"], ["all_reduce"]]), barrier="all_")


@pytest.mark.parametrize(
    ("ranks", "message"),
    [
        (
            [["f", "nccl:send", "f", "nccl:send"], ["c10d::recv_", "f"]],
            r"rank0\.csv: op 3 \(nccl:send\) sends to rank 1 with no matching receive",
        ),
        (
            [["f"], ["c10d::recv_", "f"]],
            r"rank1\.csv: op 0 \(c10d::recv_\) receives from rank 0 with no matching send",
        ),
        (
            [["f", "send_act"], ["recv_act", "f", "send_act"]],
            r"rank1\.csv: op 2 \(send_act\) sends to rank 2, but 2 rank file",
        ),
        (
            [["f", "send_act"], ["recv_act", "f", "nccl:send"], ["recv_act"]],
            r"rank1\.csv: op 2 \(nccl:send\): cannot tell the peer",
        ),
        ([["ncclDevKernel_SendRecv"], ["f"]], r"rank0\.csv: op 0 .* no direction"),
        ([["c10d::recv_", "f", "nccl:send"], ["c10d::recv_", "f", "nccl:send"]], "deadlock"),
    ],
)
def test_bad_messages_name_the_file_and_the_op(ranks, message):
    with pytest.raises(ValidationError, match=message):
        rank_layout(as_rank_ops(ranks))


def write_csv(path, names, time_s, energy_j):
    rows = ["op,name,type,freq_mhz,time_us,chip_power_w"]
    for i, name in enumerate(names):
        for c, f in enumerate(FREQS):
            t_us = max(time_s[i, c] * 1e6, 1.0)  # a message takes 1 us
            power = energy_j[i, c] / time_s[i, c] if time_s[i, c] > 0 else 50.0
            rows.append(f"{i},{name},{name},{f:g},{t_us:.6g},{power:.6g}")
    path.write_text("\n".join(rows) + "\n")


def test_plan_ranks_cli_writes_one_schedule_per_rank(tmp_path):
    ranks = toy_ranks(2, 4, torch_names=True)
    paths = []
    for r, names in enumerate(ranks):
        t, e = toy_tables(names, 0.01 * (1 + r), 0.02)
        paths.append(tmp_path / f"rank{r}.csv")
        write_csv(paths[-1], names, t, e)
    out = tmp_path / "pipe.json"
    res = CliRunner().invoke(
        app,
        [
            "plan",
            *map(str, paths),
            "--pipeline",
            "ranks",
            "--target",
            "0.05",
            "--blocking-power-w",
            "10",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    pipe = PipelineSchedule.read(out)
    assert summary["stages"] == 2 and pipe.pipeline == "ranks" and pipe.n_microbatches == 4
    assert [s.n_ops for s in pipe.stages] == [len(r) for r in ranks]
    assert pipe.predicted_makespan_s is not None and pipe.baseline_makespan_s is not None
    assert pipe.predicted_energy_j is not None and pipe.baseline_energy_j is not None
    assert pipe.predicted_makespan_s <= 1.05 * pipe.baseline_makespan_s * (1 + 1e-9)
    assert pipe.predicted_energy_j < pipe.baseline_energy_j
    # rank 0 (the shorter stage) has slack rank 1 has not: their schedules differ
    assert pipe.stages[0].freq_per_op_mhz().tolist() != pipe.stages[1].freq_per_op_mhz().tolist()


def test_plan_ranks_cli_refuses_a_send_without_a_receive(tmp_path):
    ranks = [["f", "nccl:send", "f", "nccl:send"], ["c10d::recv_", "f"]]
    paths = []
    for r, names in enumerate(ranks):
        t, e = toy_tables(["fwd"] * len(names), 0.01, 0.02)
        paths.append(tmp_path / f"rank{r}.csv")
        write_csv(paths[-1], names, t, e)
    out = tmp_path / "pipe.json"
    res = CliRunner().invoke(
        app,
        ["plan", *map(str, paths), "--pipeline", "ranks", "--target", "0.05", "--out", str(out)],
    )
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.output
    assert f"{paths[0]}: op 3 (nccl:send) sends to rank 1 with no matching receive" in lines[0]
    assert not out.exists()
    res = CliRunner().invoke(
        app,
        ["plan", str(paths[0]), "--pipeline", "ranks", "--target", "0.05", "--out", str(out)],
    )
    assert res.exit_code == 2 and "one PROFILE per pipeline rank" in res.output


def test_gpt3_pp8_is_the_gpt3_device_on_every_stage_without_waits():
    stages = load_pipeline("gpt3-pp8")
    assert len(stages) == 8
    one = gpt3()
    three = load_workload("gpt3-pp8@3")
    assert three.ops["name"].astype(str).tolist() == one.ops["name"].astype(str).tolist()
    assert one.ops["wait_us"].sum() > 0 and three.ops["wait_us"].sum() == 0
    assert "lm_head" in stages[7].ops["name"].astype(str).str.split(".").str[-1].tolist()
    with pytest.raises(ValidationError, match="stages 0-7"):
        load_workload("gpt3-pp8@8")
    layout = layout_of(stages)
    assert layout.n_messages == 2 * 7 * 32  # activations and gradients on 7 links


def small_pipeline(pp: int, microbatches: int):
    cfg = TransformerConfig(
        name="toy",
        layers=2,
        hidden=4096,
        heads=32,
        ffn=16384,
        seq=2048,
        micro_batch=1,
        microbatches=microbatches,
        pp=pp,
    )
    return pipeline_workloads(cfg, name="toy-pp", description="toy")


def exact_twin():
    """The Ascend-like twin without noise, and messages that take no time."""
    dev = SimulatedDevice.from_preset("ascend-910b-like")
    params = dev.params.model_copy(
        update={"noise_rel": 0.0, "jitter_us": 0.0, "comm_latency_us": 0.0, "comm_link_gbs": 1e12}
    )
    return SimulatedDevice(dev.spec, params)


def test_whole_pipeline_at_all_max_reproduces_the_1f1b_makespan():
    s, m = 4, 6
    stages = small_pipeline(s, m)
    dev = exact_twin()
    run = run_pipeline(dev, stages)
    # one stage's forward, backward and optimizer, timed on the twin on its own
    ops = stages[0].ops
    _, sim = dev.run(stages[0])
    name = ops["name"].astype(str)
    compute = (ops["stream"] == "compute").to_numpy()
    mb0 = name.str.startswith("mb0.").to_numpy() & compute
    fwd = sim.dur_us[mb0 & (ops["phase"] == "forward").to_numpy()].sum() * 1e-6
    bwd = sim.dur_us[mb0 & (ops["phase"] == "backward").to_numpy()].sum() * 1e-6
    opt = sim.dur_us[(ops["phase"] == "optimizer").to_numpy()].sum() * 1e-6
    assert run.makespan_s == pytest.approx((m + s - 1) * (fwd + bwd) + opt, rel=1e-6)
    # every rank runs the whole makespan: computing and waiting
    assert run.rank_busy_s + run.rank_wait_s == pytest.approx(np.full(s, run.makespan_s))
    assert run.rank_wait_s.min() > 0 and run.residual_s < 1e-6


def test_a_planned_pipeline_meets_its_deadline_on_the_twin_and_saves_energy():
    stages = small_pipeline(4, 4)
    dev = exact_twin()
    base = run_pipeline(dev, stages)
    tables = [rank_tables(dev.profile(w, dev.spec.freqs_mhz), source=w.name) for w in stages]
    layout = rank_layout(
        [replace(t.ops, source=w.name) for t, w in zip(tables, stages, strict=True)]
    )
    problem = layout.problem(
        [t.time_s for t in tables],
        [t.energy_j for t in tables],
        tables[0].freqs_mhz,
        idle_before_s=[t.idle_before_s for t in tables],
        blocking_power_w=base.wait_power_w,
    )
    for target in (0.02, 0.05):
        plan = solve_dag(problem, target)
        pipe = rank_schedule(
            layout, problem, plan, target=target, switch_latency_s=dev.spec.switch_latency_ms * 1e-3
        )
        got = run_pipeline(dev, stages, pipe)
        assert got.makespan_s <= (1 + target) * base.makespan_s * (1 + 1e-6)
        assert got.energy_j < base.energy_j
        assert got.switches.sum() > 0
        # each rank its own clocks
        assert len({tuple(s.freq_per_op_mhz()) for s in pipe.stages}) > 1
        assert pipe.stages[0].n_ops == len(stages[0])
        assert_switches_up_lead_by(layout, problem, plan, pipe, dev.spec.switch_latency_ms * 1e-3)


def replay(layout, problem, pipe, latency_s):
    """Run each rank's schedule on the graph as a simulated GPU does: each node wholly at the
    clock in effect when it starts, a switch landing ``latency_s`` after its trigger node's
    start plus its delay. Return each node's start (s) and clock index."""
    from opdvfs.plan.dag import topological_levels

    freq_index = {float(f): i for i, f in enumerate(problem.freqs_mhz)}
    start = np.zeros(layout.n_nodes)
    clock = problem.top_clock().copy()
    landings = {r: [] for r in range(layout.n_ranks)}  # (land_s, freq index)
    by_op = {}
    for rank, schedule in enumerate(pipe.stages):
        for sw in schedule.switches:
            by_op.setdefault((rank, sw.trigger_op), []).append(sw)
        landings[rank].append((-np.inf, freq_index[schedule.stages[0].freq_mhz]))
    levels = topological_levels(layout.n_nodes, layout.edges)
    end = np.zeros(layout.n_nodes)
    for node in np.argsort(levels, kind="stable"):
        before = layout.edges[layout.edges[:, 1] == node, 0]
        start[node] = end[before].max() if before.size else 0.0
        rank = int(layout.node_rank[node])
        if rank < 0:
            end[node] = start[node]
            continue
        landed = [c for t, c in sorted(landings[rank]) if t <= start[node]]
        clock[node] = landed[-1]
        end[node] = start[node] + problem.time_s[node, clock[node]]
        for sw in by_op.get((rank, int(layout.node_first_op[node])), []):
            if sw.stage:
                at_s = start[node] + sw.delay_us * 1e-6 + latency_s
                landings[rank].append((at_s, freq_index[sw.freq_mhz]))
    return start, clock


def assert_switches_up_lead_by(layout, problem, plan, pipe, latency_s):
    """A switch up is triggered before its stage (timed a latency ahead on the timeline as run,
    whose stages below the one before end early: the twin run and :func:`assert_runs_as_planned`
    check it lands in time); a switch down at its stage."""
    checked = 0
    for schedule in pipe.stages:
        for sw in schedule.switches[1:]:
            stage = schedule.stages[sw.stage]
            before = schedule.stages[sw.stage - 1]
            if stage.freq_mhz > before.freq_mhz and stage.start_s >= 2 * latency_s:
                assert sw.trigger_op < stage.first_op
                checked += 1
            elif stage.freq_mhz < before.freq_mhz:
                assert sw.trigger_op == stage.first_op and sw.delay_us == 0
    assert checked > 0


def assert_runs_as_planned(layout, problem, pipe, latency_s):
    """Replayed as a simulated GPU runs it (:func:`replay`), no node runs below its planned
    clock and the makespan is the plan's at most."""
    _, clock = replay(layout, problem, pipe, latency_s)
    for rank, schedule in enumerate(pipe.stages):
        mine = layout.node_rank == rank
        planned = np.asarray(schedule.freq_per_op_mhz())[layout.node_first_op[mine]]
        assert (problem.freqs_mhz[clock[mine]] >= planned).all(), rank
    assert float(problem.evaluate(clock)[0]) <= pipe.predicted_makespan_s * (1 + 1e-9)


def test_a_switch_up_after_a_dip_lands_before_its_stage_as_a_simulated_gpu_runs_it():
    """A message at a low clock between two computations (a dip) runs its start at the clock
    before, so it ends before its planned end: a switch up timed on the planned timeline
    landed after the next stage began, whose first node then ran at the dip's clock."""
    freqs = np.array([600.0, 900.0, 1200.0, 1500.0, 1800.0])
    ranks = toy_ranks(2, 3, torch_names=True)
    ranks[1].append("opt_step")  # a computation after the last message
    layout = rank_layout(as_rank_ops(ranks))
    time_s, energy_j = [], []
    for names in ranks:
        compute = np.array([0.0 if ("send" in n or "recv" in n) else 0.2 for n in names])
        slow = freqs.max() / freqs
        # messages of 50 ms, a little longer at low clocks; computations as 1800 / f
        t = np.where(compute[:, None] > 0, compute[:, None] * slow, 0.05 * (1 + 0.1 * (slow - 1)))
        time_s.append(t)
        energy_j.append(t * (20.0 + 80.0 * (freqs / freqs.max()) ** 2))
    problem = layout.problem(time_s, energy_j, freqs)
    plan = solve_dag(problem, 0.05)
    latency_s = 0.015
    pipe = rank_schedule(layout, problem, plan, target=0.05, switch_latency_s=latency_s)
    # the plan dips a message below the computations around it
    dips = [
        k
        for s in pipe.stages
        for k in range(1, len(s.stages) - 1)
        if s.stages[k].freq_mhz < min(s.stages[k - 1].freq_mhz, s.stages[k + 1].freq_mhz)
    ]
    assert dips
    assert_switches_up_lead_by(layout, problem, plan, pipe, latency_s)
    assert_runs_as_planned(layout, problem, pipe, latency_s)


def test_simulate_runs_the_whole_gpt3_pipeline_and_refuses_a_one_device_schedule(tmp_path):
    res = CliRunner().invoke(
        app, ["simulate", "--device", "ascend-910b-like", "--workload", "gpt3-pp8", "--json"]
    )
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)["all_max"]
    assert len(got["rank_energy_j"]) == 8 and got["switches"] == 0
    # every stage waits for the pipeline to fill and drain, and the energy counts it
    assert min(got["rank_wait_s"]) > 0 and got["energy_j"] > got["compute_energy_j"]
    one = tmp_path / "one.json"
    one.write_text(
        '{"format": "opdvfs.schedule", "version": 1, "n_ops": 3, "target": 0.0,'
        ' "solver": "dp", "stages": [{"first_op": 0, "last_op": 2, "freq_mhz": 1800}],'
        ' "switches": [{"trigger_op": 0, "stage": 0, "freq_mhz": 1800}]}'
    )
    res = CliRunner().invoke(
        app, ["simulate", str(one), "--device", "ascend-910b-like", "--workload", "gpt3-pp8"]
    )
    assert res.exit_code == 2
    assert "runs a pipeline schedule" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(app, ["workloads", "--json"])
    assert "gpt3-pp8" in {row["workload"] for row in json.loads(res.stdout)}


def test_rank_tables_take_the_measurements_and_the_power_between_from_them():
    stage = small_pipeline(2, 2)[1]
    dev = exact_twin()
    measured = [1000.0, 1400.0, 1800.0]
    tables = rank_tables(dev.profile(stage, measured), source="rank1.parquet")
    assert tables.values == "auto" and tables.freqs_mhz.tolist() == list(dev.spec.freqs_mhz)
    assert np.isfinite(tables.time_s).all() and np.isfinite(tables.energy_j).all()
    full = rank_tables(dev.profile(stage, dev.spec.freqs_mhz), source="rank1.parquet")
    assert full.values == "measured"
    cols = np.searchsorted(full.freqs_mhz, measured)
    # measured clocks: the measurements themselves (the twin is noise-free here)
    assert tables.time_s[:, cols] == pytest.approx(full.time_s[:, cols], rel=1e-9)
    assert tables.energy_j[:, cols] == pytest.approx(full.energy_j[:, cols], rel=1e-9)
    # between them: each op's power rises from one measured power to the next, close to what
    # the twin measures there
    f = tables.freqs_mhz
    between = np.flatnonzero((f > measured[0]) & (f < measured[-1]) & ~np.isin(f, measured))
    busy = full.time_s[:, -1] > 1e-4
    power = tables.energy_j[busy] / tables.time_s[busy]
    hi = np.searchsorted(np.asarray(measured), f[between])
    assert (power[:, between] >= power[:, cols[hi - 1]] * (1 - 1e-9)).all()
    assert (power[:, between] <= power[:, cols[hi]] * (1 + 1e-9)).all()
    for name in ("time_s", "energy_j"):
        ours, twin = getattr(tables, name)[busy][:, between], getattr(full, name)[busy][:, between]
        err = ours.sum(0) / twin.sum(0) - 1
        assert (np.abs(err) < 0.03).all(), (name, err)


def test_a_power_fit_bent_below_the_measured_ends_is_taken_from_them():
    from opdvfs.devices.spec import VoltageCurve
    from opdvfs.plan.ranks import _power_between

    freqs = np.array([810.0, 900.0, 1020.0, 1110.0, 1410.0])
    time_us = np.array([[120.0, 110.0, 100.0, 95.0, 80.0]])
    # the models' power (W) dips at 900 MHz below the power measured at 810 (the V-f knee)
    power_w = np.array([[200.0, 160.0, 230.0, 240.0, 300.0]])
    measured = np.array([810.0, 1110.0, 1410.0])
    held = _power_between(freqs, time_us, power_w * time_us, measured, None) / time_us
    assert held[0, [0, 3, 4]] == pytest.approx(power_w[0, [0, 3, 4]])  # measured: as they are
    assert held[0, 1] == pytest.approx(200.0) and held[0, 2] == pytest.approx(230.0)
    # on a V-f curve: linear in f V^2 between the measured powers (paper Eq. 6's variable)
    volts = VoltageCurve.model_validate(
        {"knee_mhz": 1000.0, "flat_v": 0.7, "slope_v_per_mhz": 0.0005}
    )
    x = freqs * np.asarray(volts.voltage_v(freqs)) ** 2
    on = _power_between(freqs, time_us, power_w * time_us, measured, volts) / time_us
    w = (x[1:3] - x[0]) / (x[3] - x[0])
    assert on[0, 1:3] == pytest.approx(200.0 * (1 - w) + 240.0 * w)
    assert on[0, 0] == pytest.approx(200.0) and on[0, 4] == pytest.approx(300.0)


def test_a_model_cell_with_a_negative_energy_is_not_planned_on(monkeypatch):
    import opdvfs.plan.planner as planner

    stage = small_pipeline(2, 2)[1]
    dev = exact_twin()
    profile = dev.profile(stage, [1000.0, 1400.0, 1800.0])
    real_predict = planner.predict

    def predict(*args, **kwargs):  # a power fit gone below zero at the lowest clock of op 0
        tables = real_predict(*args, **kwargs)
        tables.chip_energy_j[0, 0] = -1.0
        return tables

    monkeypatch.setattr(planner, "predict", predict)
    tables = rank_tables(profile, source="rank1.parquet")
    assert np.isnan(tables.energy_j[0, 0]) and np.isnan(tables.time_s[0, 0])
    assert np.isfinite(tables.energy_j[1:]).all() and np.isfinite(tables.energy_j[0, 1:]).all()


def with_peers(ranks: list[list[str]]) -> list[RankOps]:
    """The direction-named toy ranks as torch records them: no direction, each op's peer."""
    out = []
    for s, ops in enumerate(ranks):
        # an activation comes from s - 1 and goes to s + 1, a gradient the other way
        step = {"send_act": 1, "recv_act": -1, "send_grad": -1, "recv_grad": 1}
        peers = np.array([s + step[n] if n in step else -1 for n in ops])
        rename = {"send": "nccl:send", "recv": "c10d::recv_"}
        torch_names = np.array([rename.get(n[:4], n) for n in ops])
        out.append(RankOps(torch_names, torch_names, None, f"rank{s}.csv", peers))
    return out


def test_recorded_peers_give_a_middle_ranks_messages_their_direction():
    ranks = toy_ranks(4, 6, torch_names=False)
    named = rank_layout(as_rank_ops(ranks))
    recorded = with_peers(ranks)
    # without the peers, a middle rank's torch send has no direction
    bare = [replace(r, peers=None) for r in recorded]
    with pytest.raises(ValidationError, match=r"rank1\.csv: op \d+ \(.*\): cannot tell the peer"):
        rank_layout(bare)
    layout = rank_layout(recorded)
    assert layout.n_messages == named.n_messages == 2 * 3 * 6
    assert np.array_equal(layout.edges, named.edges)
    # a rank cannot message itself
    wrong = recorded[1]
    with pytest.raises(ValidationError, match=r"rank1\.csv: op 0 .* has itself"):
        rank_layout([recorded[0], replace(wrong, peers=np.r_[1, wrong.peers[1:]]), *recorded[2:]])


def test_files_of_a_pipeline_x_data_parallel_job_are_placed_by_the_ranks_they_message():
    """Recorded peers are the job's ranks: one file per stage of a 3 x 2 job is ranks 0, 2, 4;
    the files of stage 0's two replicas message ranks 2 and 3, whose files were not given."""
    import warnings

    from opdvfs.plan.ranks import files_as_ranks

    recorded = with_peers(toy_ranks(3, 4, torch_names=False))
    leads = [replace(r, peers=np.where(r.peers >= 0, 2 * r.peers, -1)) for r in recorded]
    with pytest.raises(ValidationError, match=r"sends to rank 4, but 3 rank file"):
        rank_layout(leads)  # (as the files' positions: what plan did before)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # placed, not warned about
        placed = files_as_ranks(leads)
    assert np.array_equal(rank_layout(placed).edges, rank_layout(recorded).edges)
    stage0 = with_peers(toy_ranks(2, 4, torch_names=False))[0]
    replicas = [replace(stage0, peers=np.where(stage0.peers >= 0, 2 + r, -1)) for r in (0, 1)]
    with pytest.warns(UserWarning, match=r"messages to rank\(s\) 2, 3 \(no file of the 2 given"):
        local = files_as_ranks(replicas)
    layout = rank_layout(local)
    assert layout.n_messages == 0 and (layout.node_kind != RECV).all()
    assert all((r.types == "message").sum() == 8 for r in local)


def test_plan_ranks_cli_plans_files_whose_messages_name_absent_ranks_with_one_warning(tmp_path):
    from opdvfs.profile import Profile

    stage0 = toy_ranks(2, 4, torch_names=True)[0]
    t, e = toy_tables(stage0, 0.01, 0.02)
    paths = []
    for replica in (0, 1):  # stage 0's replicas of a 2 x 2 job: ranks 0 and 1, peers 2 and 3
        rows = [
            {
                "iteration": c,
                "op": i,
                "name": name,
                "type": name,
                "peer": 2 + replica if "send" in name or "recv" in name else -1,
                "freq_mhz": f,
                "time_us": max(t[i, c] * 1e6, 1.0),
                "chip_power_w": e[i, c] / t[i, c] if t[i, c] > 0 else 50.0,
            }
            for c, f in enumerate(FREQS)
            for i, name in enumerate(stage0)
        ]
        paths.append(tmp_path / f"rank{replica}.parquet")
        Profile(pd.DataFrame(rows)).write(paths[-1])
    out = tmp_path / "pipe.json"
    args = ["plan", *map(str, paths), "--pipeline", "ranks", "--target", "0.05", "--out", str(out)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    said = [line for line in res.stderr.splitlines() if "planned as operators" in line]
    assert said == [
        "opdvfs: messages to rank(s) 2, 3 (no file of the 2 given: ranks 0, 1) are planned as "
        "operators of their own rank"
    ]
    pipe = PipelineSchedule.read(out)
    assert [s.n_ops for s in pipe.stages] == [len(stage0)] * 2


def _lead_files(n_stages: int, replicas: int) -> list[RankOps]:
    """Each stage's first rank of an n_stages x replicas job, rank = stage * replicas + replica
    (examples/pipeline_toy.py's layout): its messages name ranks 0, R, 2R, ..."""
    recorded = with_peers(toy_ranks(n_stages, 4, torch_names=False))
    return [replace(r, peers=np.where(r.peers >= 0, replicas * r.peers, -1)) for r in recorded]


def _local_to(ops: RankOps, rank: int) -> RankOps:
    """``ops`` with its messages to job rank ``rank`` planned as its own operators."""
    away = ops.peers == rank
    return replace(
        ops, types=np.where(away, "message", ops.types), peers=np.where(away, -1, ops.peers)
    )


@pytest.mark.parametrize(("stages", "absent"), [((0, 1), 4), ((1, 2), 0)])
def test_files_of_consecutive_stages_of_a_3x2_job_are_placed_by_the_ranks_they_message(
    stages, absent
):
    """Two consecutive stages' first ranks of a 3 x 2 job (ranks 0 and 2, or 2 and 4): each
    names a rank whose file was not given. Placed as files 0 and 1 (ranks 0 and 2: rank 2's
    receives from rank 0 were read as from file 1, "no matching send"; ranks 2 and 4: rank 2's
    messages to rank 0 as to itself), their messages to each other were lost."""
    from opdvfs.plan.ranks import files_as_ranks

    leads = _lead_files(3, 2)
    files = [leads[s] for s in stages]
    ranks = ", ".join(str(2 * s) for s in stages)
    with pytest.warns(
        UserWarning, match=rf"rank\(s\) {absent} \(no file of the 2 given: ranks {ranks}\)"
    ):
        placed = files_as_ranks(files)
    layout = rank_layout(placed)
    assert layout.n_messages == 2 * 4  # 4 activations and 4 gradients between the two
    # the same graph as the two files given their positions as peers, the third stage's
    # messages their own operators
    a, b = (2 * s for s in stages)
    expected = [
        replace(local, peers=np.where(local.peers == a, 0, np.where(local.peers == b, 1, -1)))
        for local in (_local_to(f, absent) for f in files)
    ]
    assert np.array_equal(layout.edges, rank_layout(expected).edges)
    assert [(p.types == "message").sum() for p in placed] == [
        (f.peers == absent).sum() for f in files
    ]
