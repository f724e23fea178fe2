"""`opdvfs tune` on a pipeline-parallel job: every stage profiled and planned together (#32 item 4).

A toy pipeline (examples/pipeline_toy.py: 1F1B over gloo send/recv) on simulated GPUs, one per
rank: tune profiles every stage, plans the job with the pipeline planner and each rank applies its
stage's schedule; then the same profiles are planned offline (``plan_ranks``, what ``opdvfs plan
--pipeline ranks`` runs) and run, and tune's measured job-wide saving is held against that run's.
"""

import json
import os
import socket
import sys
from pathlib import Path

import pandas as pd
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from conftest import read_log  # noqa: E402

#: Most iterations each rank trains (it stops 2 steady ones after tuning is done).
STEPS = 80
TARGET = 0.05
CLOCKS = [1410.0, 1110.0, 810.0]
#: The simulated GPU's work per operator: an iteration spans the power sensor's windows.
WORK_SCALE = 1e7
#: Iterations each rank runs offline, per schedule (the first two not counted: the first one
#: has more operators, so the executor runs it at the top clock).
OFFLINE_STEPS = 8
#: How far (absolute) the job's predicted saving and slowdown may be from what the simulated
#: GPUs measure. Before the power between swept clocks was taken from the measured ones and the
#: prediction was the job's, not rank 0's stage's: the 2-stage plan at 5% predicted a 25.8% job
#: saving (27.5% for rank 0) and +4.97%, measured 17.5% and +6.86%. Now 19.9-20.8% predicted
#: for 17.5-17.6% measured, +5.0% for +6.4-6.9%: the models' times between swept clocks are
#: 1.7-2.1% short and rank 0's attributed power 5-6% low (docs/guide/multi-gpu.md).
PREDICTION_TOLERANCE = 0.04


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _join(rank: int, port: int, world: int) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world)
    )
    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).parents[1] / "examples"))


def _tune_rank(
    rank: int,
    port: int,
    out: str,
    stages: int,
    replicas: int,
    uneven: bool = False,
    cache: str | None = None,
    offline_port: int | None = None,
) -> None:
    """One rank of the toy pipeline under a Tuner on its own simulated GPU.

    With ``offline_port``, the same process then runs the offline part (:func:`_offline_rank`,
    on fresh simulated GPUs and a process group of its own): a second spawn of the job's
    processes cost ~10 s of the test's ~45 s on two cores.
    """
    _join(rank, port, stages * replicas)
    from pipeline_toy import train

    from opdvfs.runtime.actuators import make_actuator
    from opdvfs.tuner.cache import TuneCache
    from opdvfs.tuner.loop import Tuner

    log = Path(out) / f"calls.rank{rank}.jsonl"
    act = make_actuator("sim:a100-like", work_scale=WORK_SCALE, log=str(log))
    tuner = Tuner(
        act,
        target=TARGET,
        clocks=CLOCKS,
        iterations_per_clock=1,
        block=2,
        pairs=2,
        rounds=3,
        cache=TuneCache(cache) if cache else None,
    )
    steady = []

    def stop(_: int) -> bool:
        steady.append(tuner.phase == "steady")
        return sum(steady) > 2

    with tuner:
        dist.init_process_group("gloo", rank=rank, world_size=stages * replicas)
        try:
            train(STEPS, stages, replicas, before_step=stop, uneven=uneven)
        finally:
            dist.destroy_process_group()
    result = tuner.result.to_dict()
    schedule = tuner.result.schedule
    result["schedule_json"] = schedule.to_json() if schedule is not None else None
    pipeline = tuner.planning.pipeline_of(schedule)
    result["pipeline_json"] = pipeline.to_json() if pipeline is not None else None
    result["abandoned"] = tuner.executor.abandoned
    if tuner.result.profile is not None:
        tuner.result.profile.write(Path(out) / f"profile.rank{rank}.parquet")
    result["n_launches"] = tuner.n_launches
    (Path(out) / f"result.rank{rank}.json").write_text(json.dumps(result))
    if offline_port is not None:
        _offline_rank(rank, offline_port, out, stages, replicas)


def _offline_rank(rank: int, port: int, out: str, stages: int, replicas: int) -> None:
    """One rank running its stage's offline schedule (or none: the top clock) on a fresh GPU.

    Rank 0 first plans the tuned profiles offline (:func:`_plan_offline`), once every rank has
    written its tuning result.
    """
    _join(rank, port, stages * replicas)
    from pipeline_toy import train

    from opdvfs.runtime.actuators import make_actuator
    from opdvfs.runtime.dispatch import ScheduleExecutor
    from opdvfs.schedule import PipelineSchedule

    figures = {}
    dist.init_process_group("gloo", rank=rank, world_size=stages * replicas)
    try:
        dist.barrier()  # every rank's result and profile written
        if rank == 0:
            _plan_offline(Path(out), stages, replicas, TARGET)
        dist.barrier()
        for name in ("top", "planned"):
            schedule = None
            if name == "planned":
                pipeline = PipelineSchedule.read(Path(out) / "offline.json")
                schedule = pipeline.for_rank(rank, stages * replicas)
            act = make_actuator("sim:a100-like", work_scale=WORK_SCALE)
            executor = ScheduleExecutor(schedule, act)
            with act, executor:
                train(OFFLINE_STEPS, stages, replicas)
            gpu = act.timeline
            assert gpu is not None
            figures[name] = {**gpu.per_iteration(skip=2), "abandoned": executor.abandoned}
    finally:
        dist.destroy_process_group()
    (Path(out) / f"offline.rank{rank}.json").write_text(json.dumps(figures))


def _tune(
    tmp_path: Path,
    stages: int,
    replicas: int = 1,
    uneven: bool = False,
    cache: str | None = None,
    offline: bool = False,
) -> list[dict]:
    """Tune the toy pipeline; with ``offline``, the same processes then run :func:`_offline`'s."""
    world = stages * replicas
    offline_port = _free_port() if offline else None
    args = (_free_port(), str(tmp_path), stages, replicas, uneven, cache, offline_port)
    mp.spawn(_tune_rank, args=args, nprocs=world, join=True)
    return [json.loads((tmp_path / f"result.rank{r}.json").read_text()) for r in range(world)]


def _plan_offline(tmp_path: Path, stages: int, replicas: int, budget: float) -> None:
    """Plan the stages' tuned profiles offline at ``budget`` into ``offline.json``."""
    from opdvfs.profile import Profile
    from opdvfs.tuner.stages import plan_stages

    world = stages * replicas
    leads = [s * replicas for s in range(stages)]
    profiles = [Profile.read(tmp_path / f"profile.rank{r}.parquet") for r in leads]
    results = [json.loads((tmp_path / f"result.rank{r}.json").read_text()) for r in leads]
    launches = [int(r["n_launches"]) for r in results]
    rank_map = [r // replicas for r in range(world)]
    plan_stages(profiles, launches, budget, rank_map=rank_map).write(tmp_path / "offline.json")


def _offline(tmp_path: Path, stages: int, replicas: int) -> dict:
    """The job's slowdown and saving in the offline run (``_tune(..., offline=True)``'s)."""
    world = stages * replicas
    rows = [json.loads((tmp_path / f"offline.rank{r}.json").read_text()) for r in range(world)]
    assert not any(row["planned"]["abandoned"] for row in rows)
    job = {
        name: (
            max(row[name]["time_s"] for row in rows),
            sum(row[name]["energy_j"] for row in rows),
        )
        for name in ("top", "planned")
    }
    return {
        "slowdown": job["planned"][0] / job["top"][0] - 1,
        "saving": 1 - job["planned"][1] / job["top"][1],
    }


def _check_tuned_together(tmp_path: Path, results: list[dict], stages: int, replicas: int) -> None:
    world = stages * replicas
    r0 = results[0]
    assert all(r["same_sequence"] is False for r in results)
    assert all(r["error"] is None for r in results), [r["error"] for r in results]
    phases = [
        [(i["iteration"], i["phase"], i["round"]) for i in r["per_iteration"]] for r in results
    ]
    assert all(p == phases[0] for p in phases)
    assert phases[0][-1][1] == "steady"
    # every stage runs its own planned schedule: the pipeline's, by the rank's stage
    from opdvfs.schedule import PipelineSchedule, Schedule

    pipeline = PipelineSchedule.from_json(r0["pipeline_json"], source="rank 0")
    assert len(pipeline.stages) == stages
    for rank, r in enumerate(results):
        mine = Schedule.from_json(r["schedule_json"], source=f"rank {rank}")
        assert mine == pipeline.stages[rank // replicas]
        assert mine.n_ops == r["n_launches"] and not r["abandoned"]
        assert r["rounds"] == r0["rounds"] or rank > 0
    # the stages' operators differ (a 4-stage pipeline's middle stages count as many, of
    # other sizes): each its own plan
    assert len({s.n_ops for s in pipeline.stages}) >= min(stages, 3)
    assert len({s.to_json() for s in pipeline.stages}) == stages
    # the simulated GPUs wait for each other at each receive, as the planner's graph has it:
    # the ranks' reference iterations last as long, and as long as the planned top-clock makespan
    refs = [i for i in r0["per_iteration"] if i["phase"] == "reference"]
    assert refs
    for it in refs:
        assert min(it["ranks_time_s"]) > 0.97 * max(it["ranks_time_s"])
        assert it["time_s"] == pytest.approx(pipeline.baseline_makespan_s, rel=0.03)
    # every rank swept the clocks, then set its own stage's plan; restored once, last
    for rank in range(world):
        calls = read_log(tmp_path / f"calls.rank{rank}.jsonl")
        kinds = [c["kind"] for c in calls]
        assert kinds[-1] == "restore" and kinds.count("restore") == 1
        sets = [c["freq_mhz"] for c in calls if c["kind"] == "set"]
        assert set(CLOCKS) <= set(sets), (rank, sorted(set(sets)))


def test_job_view_numbers_the_stages_by_their_first_rank():
    from opdvfs.runtime.distributed import JobView

    view = JobView(0, 4, ("a", "a", "b", "b"))
    assert view.rank_map == [0, 0, 1, 1] and view.stage_leads == [0, 2]
    view = JobView(1, 4, ("a", "b", "a", "b"))  # stages interleaved
    assert view.rank_map == [0, 1, 0, 1] and view.stage_leads == [0, 1]


def test_ranks_of_one_sequence_whose_work_differs_are_stages_of_their_own():
    from opdvfs.runtime.distributed import JobView, work_keys

    # ranks 0 and 1 alike (0.4%: noise), rank 2 twice the batch, rank 3 another sequence
    view = JobView(0, 4, work_keys(["a 1.0", "a 1.004", "a 2.0", "b 1.0"]))
    assert view.rank_map == [0, 0, 1, 2] and view.stage_leads == [0, 2, 3]
    assert work_keys(["a None", "a None"]) == ("a", "a")  # unknown work (a real GPU): one
    assert JobView(1, 2, work_keys(["a 2.0", "a 1.0"])).rank_map == [0, 1]  # rank 0 first


def test_a_simulated_gpu_idles_until_a_senders_time():
    from opdvfs.runtime.actuators import make_actuator

    gpu = make_actuator("sim:a100-like").timeline
    assert gpu is not None
    gpu.launch(
        {
            "name": "aten::mm",
            "type": "mm",
            "stream": "compute",
            "flops": 1e9,
            "bytes_loaded": 1e6,
            "bytes_stored": 1e6,
        }
    )
    busy_s, energy_j = gpu.now_s(), gpu.energy_j()
    gpu.idle_until(busy_s + 0.5)
    assert gpu.now_s() == pytest.approx(busy_s + 0.5) and gpu.energy_j() == energy_j
    gpu.idle_until(busy_s)  # an earlier time changes nothing
    assert gpu.now_s() == pytest.approx(busy_s + 0.5)


def test_a_stage_profile_travels_as_bytes_with_its_launches(tmp_path):
    from opdvfs.profile import Profile
    from opdvfs.tuner.stages import profile_bytes, profile_from_bytes

    ops = pd.DataFrame(
        {
            "iteration": [0, 0, 1, 1],
            "op": [0, 2, 0, 2],
            "name": ["aten::mm", "c10d::send", "aten::mm", "c10d::send"],
            "freq_mhz": [1410.0, 1410.0, 810.0, 810.0],
            "time_us": [10.0, 2.0, 17.0, 2.0],
        }
    )
    profile = Profile(ops, meta={"device": "a100-like"})
    back, n_launches = profile_from_bytes(profile_bytes(profile, 3))
    assert n_launches == 3
    pd.testing.assert_frame_equal(back.ops[ops.columns], profile.ops[ops.columns])
    assert back.meta["device"] == "a100-like"
    # off the simulated GPU no operators are counted: the stage's plan applies by time
    assert profile_from_bytes(profile_bytes(profile, None))[1] is None


def test_a_stage_applied_by_time_is_stretched_to_the_measured_step_its_messages_made_local():
    """A traced stage's plan times its operators alone: stretched to the job's measured step."""
    from opdvfs.profile import Profile
    from opdvfs.schedule import Schedule
    from opdvfs.tuner.stages import _messages_local, _on_iteration

    plan = Schedule.from_stage_freqs(
        [0, 4], [1410.0, 1005.0], n_ops=10, start_s=[0.0, 0.002], target=0.02, solver="manual"
    ).model_copy(update={"baseline_time_s": 0.004, "predicted_time_s": 0.0041})
    out = _on_iteration(plan, 0.02)  # the host's share: 5 times the operators' time
    assert [st.start_s for st in out.stages] == pytest.approx([0.0, 0.01])
    assert out.baseline_time_s == pytest.approx(0.02) and out.predicted_time_s == pytest.approx(
        0.0205
    )
    assert [st.freq_mhz for st in out.stages] == [1410.0, 1005.0]
    assert _on_iteration(plan, 0.003) is plan  # never shrunk
    ops = pd.DataFrame(
        {
            "iteration": [0, 0, 0],
            "op": [0, 1, 2],
            "name": ["aten::mm", "ncclDevKernel_SendRecv", "c10d::recv_"],
            "type": ["aten::mm", "ncclDevKernel_SendRecv", "c10d::recv_"],
            "freq_mhz": [1410.0] * 3,
            "time_us": [10.0, 2.0, 3.0],
        }
    )
    local = _messages_local(Profile(ops))
    assert local.ops["type"].tolist() == ["aten::mm", "message", "message"]
    assert local.ops["name"].tolist() == ops["name"].tolist()


@pytest.mark.slow
@pytest.mark.parametrize(("stages", "replicas"), [(2, 1), (2, 2), (4, 1)])
def test_pipeline_stages_tuned_together_save_as_the_offline_plan_run(tmp_path, stages, replicas):
    cache = str(tmp_path / "cache") if (stages, replicas) == (2, 1) else None
    results = _tune(tmp_path, stages, replicas, cache=cache, offline=True)
    _check_tuned_together(tmp_path, results, stages, replicas)
    r0 = results[0]
    first, chosen = r0["rounds"][0], r0["rounds"][r0["best_round"]]
    assert first["budget"] == TARGET  # round 1 plans at the target itself
    # the same profiles planned offline at the target (plan --pipeline ranks), run on fresh
    # simulated GPUs: tune's round 1 measured what running that plan measures
    offline = _offline(tmp_path, stages, replicas)
    print(
        f"stages {stages} x replicas {replicas}: tune round 1 (budget {TARGET:.0%}) measured "
        f"slowdown {first['slowdown']['mean']:+.2%}, saving {first['saving']['mean']:.2%}; "
        f"chosen round {r0['best_round'] + 1} (budget {chosen['budget']:.2%}) slowdown "
        f"{chosen['slowdown']['mean']:+.2%}, saving {chosen['saving']['mean']:.2%}; "
        f"plan_ranks offline at {TARGET:.0%}, run: slowdown {offline['slowdown']:+.2%}, "
        f"saving {offline['saving']:.2%}"
    )
    assert first["slowdown"]["mean"] == pytest.approx(offline["slowdown"], abs=0.01)
    assert first["saving"]["mean"] == pytest.approx(offline["saving"], abs=0.01)
    # what the plan predicted for the job is what the job measured: offline (every rank's GPU
    # on its own, the job's sums) and as tune's round 1 prints it beside its A/B intervals
    from opdvfs.schedule import PipelineSchedule
    from opdvfs.tuner.stages import job_saving

    planned = PipelineSchedule.read(tmp_path / "offline.json")
    predicted = {
        "slowdown": planned.predicted_makespan_s / planned.baseline_makespan_s - 1,
        "saving": job_saving(planned),
    }
    print(
        f"predicted offline: slowdown {predicted['slowdown']:+.2%}, saving "
        f"{predicted['saving']:.2%}; tune round 1: {first['predicted_slowdown']:+.2%}, "
        f"{first['predicted_saving']:.2%}"
    )
    for what in ("slowdown", "saving"):
        assert predicted[what] == pytest.approx(offline[what], abs=PREDICTION_TOLERANCE), what
        assert first[f"predicted_{what}"] == pytest.approx(
            first[what]["mean"], abs=PREDICTION_TOLERANCE
        ), what
    # the job-wide measured slowdown within the target (the budget rounds re-planned to it),
    # and at least 90% of the offline plan's saving
    assert r0["met"] is True and chosen["slowdown"]["mean"] <= TARGET
    assert offline["saving"] > 0.02
    assert chosen["saving"]["mean"] >= 0.9 * offline["saving"]
    if cache is not None:
        _check_rerun_from_cache(tmp_path / "rerun", cache, results)


def _check_rerun_from_cache(out: Path, cache: str, tuned: list[dict]) -> None:
    """The same job again: every rank applies its stage's schedule from the cache, no sweep."""
    from opdvfs.schedule import PipelineSchedule, Schedule

    out.mkdir()
    again = _tune(out, 2, 1, cache=cache)
    pipeline = PipelineSchedule.from_json(tuned[0]["pipeline_json"], source="rank 0")
    assert all(r["cache_hit"] is True and r["error"] is None for r in again), again[0]["error"]
    assert again[0]["cache_key"] == tuned[0]["cache_key"] == again[1]["cache_key"]
    for rank, r in enumerate(again):
        assert Schedule.from_json(r["schedule_json"], source="rerun") == pipeline.stages[rank]
        assert not {"counted", "planning"} & {i["phase"] for i in r["per_iteration"]}


def test_a_pipeline_jobs_cache_key_covers_every_stage():
    from opdvfs.runtime.distributed import JobView, work_keys
    from opdvfs.tuner.cache import cache_key

    def key(*stage_keys: str) -> str:
        view = JobView(0, len(stage_keys), work_keys([f"{k} 1.0" for k in stage_keys]))
        return cache_key(["aten::mm"], device="d", target=0.05, stages=list(view.keys))

    assert key("a", "b") == key("a", "b")
    assert key("a", "b") != key("a", "c")  # stage 1 changed: another job
    assert key("a", "b") != key("a", "b", "b")  # another layout of ranks


@pytest.mark.slow
def test_data_parallel_ranks_of_different_batch_sizes_are_planned_each_on_its_own_profile(
    tmp_path,
):
    """Rank 1 trains on twice rank 0's batch: the same operators, longer. Planned on rank 0's
    profile, the job (as slow as rank 1) ran rank 0's plan; each rank's own plan instead."""
    from opdvfs.schedule import PipelineSchedule, Schedule

    results = _tune(tmp_path, 1, 2, uneven=True)
    r0 = results[0]
    chosen = r0["rounds"][r0["best_round"]]
    print(
        f"data-parallel, batch 8 and 16: same_sequence {r0['same_sequence']}, rounds "
        + ", ".join(
            f"{r['budget']:.2%}: {r['slowdown']['mean']:+.2%} / {r['saving']['mean']:.2%}"
            for r in r0["rounds"]
        )
        + f"; chosen round {r0['best_round'] + 1}, met {r0['met']}"
    )
    assert all(r["error"] is None for r in results), [r["error"] for r in results]
    assert all(r["same_sequence"] is False and r["stages_together"] for r in results)
    pipeline = PipelineSchedule.from_json(r0["pipeline_json"], source="rank 0")
    assert len(pipeline.stages) == 2 and pipeline.stages[0] != pipeline.stages[1]
    for rank, r in enumerate(results):
        assert (
            Schedule.from_json(r["schedule_json"], source=f"rank {rank}") == pipeline.stages[rank]
        )
        assert not r["abandoned"]
    # the job's time is the slower rank's: within the target, and energy saved
    assert r0["met"] is True and chosen["slowdown"]["mean"] <= TARGET
    assert chosen["saving"]["mean"] > 0.02


@pytest.mark.slow
def test_torchrun_tune_on_the_example_pipeline_plans_its_stages_together(tmp_path):
    """The user's path: ``torchrun -m opdvfs tune ... -- python examples/pipeline_toy.py``."""
    import subprocess

    from conftest import torchrun_opdvfs

    script = Path(__file__).parents[1] / "examples" / "pipeline_toy.py"
    run = subprocess.run(
        torchrun_opdvfs(
            2,
            "tune",
            *("--target", str(TARGET), "--actuator", "sim:a100-like", "--work-scale", "1e7"),
            *("--clocks", ",".join(f"{f:g}" for f in CLOCKS), "--iterations-per-clock", "1"),
            *("--block", "2", "--pairs", "2", "--rounds", "3", "--no-cache"),
            *("--out", str(tmp_path / "out"), "--log-file", str(tmp_path / "calls.jsonl")),
            *("--", "python", str(script), "48"),
        ),
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"},
        timeout=300,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    said = "the ranks run 2 pipeline stages (or data-parallel groups whose work differs)"
    assert said in run.stdout, run.stdout
    result = json.loads((tmp_path / "out" / "tune.json").read_text())
    assert result["error"] is None and result["pipeline_stages"] == 2
    assert result["same_sequence"] is False and result["met"] is True
    assert result["measured_slowdown"]["mean"] <= TARGET
    assert result["per_iteration"][-1]["phase"] == "steady"
    from opdvfs.schedule import PipelineSchedule, Schedule

    pipeline = PipelineSchedule.read(tmp_path / "out" / "pipeline.json")
    assert Schedule.read(tmp_path / "out" / "schedule.json") == pipeline.stages[0]
    assert pipeline.stages[0].n_ops != pipeline.stages[1].n_ops
    for rank in (0, 1):
        calls = read_log(tmp_path / f"calls.rank{rank}.jsonl")
        kinds = [c["kind"] for c in calls]
        assert kinds[-1] == "restore" and kinds.count("restore") == 1
        # each rank ran its own stage's plan: the clocks it set since the last sweep clock
        # are its stage's
        sets = [c["freq_mhz"] for c in calls if c["kind"] == "set"]
        assert set(CLOCKS) <= set(sets)
        planned = {s.freq_mhz for s in pipeline.stages[rank].stages}
        assert set(sets[-len(planned) :]) <= planned | {max(CLOCKS)}, (rank, sets[-8:])


def test_traced_stages_whose_messages_have_no_direction_are_planned_each_on_its_own():
    """NCCL's one SendRecv kernel names no direction: one warning, each stage planned alone."""
    from opdvfs.profile import Profile
    from opdvfs.tuner.stages import plan_stages

    def traced(names: list[str]) -> Profile:  # 2 iterations at each of 2 clocks, with power
        rows = []
        for freq_mhz, first in ((1410.0, 0), (1005.0, 2)):
            for it in (first, first + 1):
                start_us = 0.0
                for k, name in enumerate(names):
                    time_us = 100.0 * (1410.0 / freq_mhz if name.startswith("aten") else 1.0)
                    rows.append(
                        {
                            "iteration": it,
                            "op": k,
                            "name": name,
                            "type": name,
                            "freq_mhz": freq_mhz,
                            "time_us": time_us,
                            "start_us": start_us,
                            "chip_power_w": 20.0 + 0.05 * freq_mhz,
                        }
                    )
                    start_us += time_us
        return Profile(pd.DataFrame(rows))

    msg = "ncclDevKernel_SendRecv"
    profiles = [traced(["aten::mm", msg, "aten::mm", msg]), traced([msg, "aten::mm", msg])]
    with pytest.warns(UserWarning, match="cannot be matched .*no direction"):
        pipeline = plan_stages(profiles, [None, None], 0.05, rank_map=[0, 1], iteration_s=0.01)
    assert [s.n_ops for s in pipeline.stages] == [4, 3]  # each on its traced operators
    assert [s.predicted_time_s for s in pipeline.stages] == pytest.approx([0.01, 0.01])
