"""`opdvfs tune` under torchrun: two CPU ranks on gloo, each on its own simulated GPU (#21)."""

import json
import os
import socket
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from conftest import read_log  # noqa: E402

#: Every test here starts two ranks (torch.multiprocessing or torchrun): end to end, slow.
pytestmark = pytest.mark.slow

#: Most iterations each rank trains: 2 warm-up, the sweep (3 clocks, 1 each, a settle after
#: each switch), planning (its iterations depend on the machine's load), one round of 2 pairs of
#: 2-blocks, then 2 steady ones (the ranks stop together: their phases are the same).
STEPS = 60


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _in_turn(rank: int, jobs: list[tuple]) -> None:
    """Run ``jobs`` (a rank function and its arguments after ``rank``) one after the other."""
    for run, *args in jobs:
        run(rank, *args)


def _spawn_jobs(*jobs: tuple) -> None:
    """Two ranks that run each job in turn, each with its process group on its own port.

    One spawn for several jobs: starting the two processes (torch imported in each) and
    joining them took ~8 s a job on two busy cores.
    """
    mp.spawn(_in_turn, args=(list(jobs),), nprocs=2, join=True)


def _results(out: Path) -> list[dict]:
    return [json.loads((out / f"result.rank{r}.json").read_text()) for r in (0, 1)]


def _rank(rank: int, port: int, out: str, steps: int, diverge: bool) -> None:
    """One rank: the tiny GPT under a Tuner on sim:a100-like; its result and log into ``out``."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2"
    )
    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).parent))
    from opdvfs.runtime.actuators import make_actuator
    from opdvfs.tuner.loop import Tuner

    from tiny_gpt import TinyGPT

    log = Path(out) / f"calls.rank{rank}.jsonl"
    act = make_actuator("sim:a100-like", work_scale=1e6 * (1 + rank), log=str(log))
    tuner = Tuner(
        act,
        target=0.02,
        clocks=[1410.0, 1380.0, 210.0],
        iterations_per_clock=1,
        block=2,
        pairs=2,
        rounds=1,
    )
    torch.manual_seed(rank)  # data-parallel: the same model, this rank's data
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 64, (steps, 2, 17))
    with tuner:
        dist.init_process_group("gloo", rank=rank, world_size=2)
        try:
            steady = 0
            for i in range(steps):
                steady += tuner.phase == "steady"
                if steady > 2:
                    break
                logits = model(data[i, :, :-1])
                if diverge and rank == 1:
                    logits = logits * 1.0  # one more operator: a pipeline-like stage
                loss = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, 64), data[i, :, 1:].reshape(-1)
                )
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        finally:
            dist.destroy_process_group()
    result = tuner.result.to_dict()
    result["schedule_json"] = tuner.result.schedule.to_json() if tuner.result.schedule else None
    (Path(out) / f"result.rank{rank}.json").write_text(json.dumps(result))


@pytest.fixture(scope="module")
def simulated(tmp_path_factory) -> dict[str, Path]:
    """Two jobs of two ranks on simulated GPUs: the same model ("same"), and rank 1's steps
    with one more operator ("diverged", 12 steps); each one's results and logs."""
    outs = {name: tmp_path_factory.mktemp(name) for name in ("same", "diverged")}
    _spawn_jobs(
        (_rank, _free_port(), str(outs["same"]), STEPS, False),
        (_rank, _free_port(), str(outs["diverged"]), 12, True),
    )
    return outs


def test_two_ranks_tune_together_on_the_jobs_time_and_energy(simulated):
    tmp_path = simulated["same"]
    r0, r1 = _results(tmp_path)
    assert r0["world_size"] == r1["world_size"] == 2
    # rank 1 does twice rank 0's work: the same operators, each rank planned on its own profile
    assert r0["same_sequence"] is False and r1["same_sequence"] is False
    assert r0["error"] is None and r1["error"] is None, (r0["error"], r1["error"])
    it0, it1 = r0["per_iteration"], r1["per_iteration"]
    # the same phases at the same iterations on both ranks, A/B blocks included
    assert [(i["iteration"], i["phase"], i["round"]) for i in it0] == [
        (i["iteration"], i["phase"], i["round"]) for i in it1
    ]
    phases = [i["phase"] for i in it0]
    assert phases.count("counted") == 3 and phases.count("reference") == 2
    assert phases.count("tuned") == 2 and phases[-1] == "steady"
    # every iteration's figures are the job's: the slowest rank's time, the ranks' energy summed
    for a, b in zip(it0, it1, strict=True):
        assert a["time_s"] == b["time_s"] == pytest.approx(max(a["rank_time_s"], b["rank_time_s"]))
        assert a["energy_j"] == b["energy_j"]
        assert a["energy_j"] == pytest.approx(a["rank_energy_j"] + b["rank_energy_j"])
    # rank 1 does twice rank 0's work: its iterations are the job's, and its energy counts
    assert it1[0]["rank_time_s"] > it0[0]["rank_time_s"] * 1.5
    ab = [i for i in it0 if i["phase"] in ("reference", "tuned")]
    assert all(i["energy_j"] > 1.5 * i["rank_energy_j"] for i in ab)
    # the round was measured on those job-wide figures, and each rank applies its own plan
    (rnd,) = r0["rounds"]
    print(
        f"rank 1 twice rank 0's work: {rnd['slowdown']['mean']:+.2%}, {rnd['saving']['mean']:.2%}"
    )
    assert rnd["saving"]["mean"] > 0.03 and r0["met"] is True
    assert None not in (r0["schedule_json"], r1["schedule_json"])
    assert r0["schedule_json"] != r1["schedule_json"]
    # each rank set the sweep's clocks itself, and restored its clock exactly once, last
    for rank in (0, 1):
        calls = read_log(tmp_path / f"calls.rank{rank}.jsonl")
        kinds = [c["kind"] for c in calls]
        assert kinds[-1] == "restore" and kinds.count("restore") == 1, (rank, kinds[-3:])
        sets = [c["freq_mhz"] for c in calls if c["kind"] == "set"]
        assert sets[:4] == [1410.0, 1380.0, 210.0, 1410.0], (rank, sets[:6])
        assert len(set(sets)) > 3, (rank, sorted(set(sets)))  # the plan's clocks too


def test_ranks_with_different_operators_on_simulated_gpus_are_swept_as_stages(simulated):
    tmp_path = simulated["diverged"]
    r0, r1 = _results(tmp_path)
    assert r0["same_sequence"] is False and r1["same_sequence"] is False
    assert [i["phase"] for i in r0["per_iteration"]] == [i["phase"] for i in r1["per_iteration"]]
    # pipeline stages on simulated GPUs (test_tune_stages.py): rank 1 follows rank 0's sweep
    # to profile its own operators, not the top clock alone
    sets1 = {c["freq_mhz"] for c in read_log(tmp_path / "calls.rank1.jsonl") if c["kind"] == "set"}
    assert {1410.0, 1380.0, 210.0} <= sets1
    sets0 = {c["freq_mhz"] for c in read_log(tmp_path / "calls.rank0.jsonl") if c["kind"] == "set"}
    assert {1380.0, 210.0} <= sets0
    for rank in (0, 1):
        kinds = [c["kind"] for c in read_log(tmp_path / f"calls.rank{rank}.jsonl")]
        assert kinds[-1] == "restore" and kinds.count("restore") == 1


def _traced_rank(rank: int, port: int, out: str, wider: bool = False) -> None:
    """One rank tuning through a device without the simulator (dry run: traced, no power).

    ``wider``: rank 1 trains a wider model (a job whose ranks run other steps).
    """
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2"
    )
    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).parent))
    from opdvfs.runtime.actuators import make_actuator
    from opdvfs.tuner.loop import Tuner

    from tiny_gpt import TinyGPT

    act = make_actuator("dry-run", device="a100-like")
    tuner = Tuner(act, target=0.02, clocks=[1410.0, 1005.0], iterations_per_clock=1)
    model = TinyGPT(dim=48) if wider and rank == 1 else TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    traced_at_end = []
    with tuner:
        dist.init_process_group("gloo", rank=rank, world_size=2)
        try:
            # long enough for rank 0's planning thread to import its trace and fail (no
            # power) while the ranks still train, so its error reaches rank 1
            for _ in range(200):
                model(torch.randint(0, 64, (2, 16))).sum().backward()
                opt.step()
            traced_at_end.append(tuner.drive._trace_stack is not None)
        finally:
            dist.destroy_process_group()
    result = tuner.result.to_dict()
    result["traced_at_end"] = traced_at_end[0]
    result["profiled"] = tuner.result.profile is not None
    (Path(out) / f"result.rank{rank}.json").write_text(json.dumps(result))


#: The swept clocks of the traced pipeline (the plan's clock below them is the model's).
PIPE_CLOCKS = [1410.0, 1110.0]


def _traced_pipeline_rank(rank: int, port: int, out: str) -> None:
    """One stage of the 2-stage toy pipeline tuned off the simulator (dry run: traced).

    A dry run measures no power: as a sensor would, each traced operator is given a power
    that falls with its clock (``chip_power_w``, the per-op column a profile may carry), so
    the stages can be planned; the CPU's times do not change with the clock.
    """
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2"
    )
    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).parents[1] / "examples"))
    from pipeline_toy import train

    import opdvfs.runtime.sweep as sweep_module
    from opdvfs.profile import Profile
    from opdvfs.runtime.actuators import make_actuator
    from opdvfs.tuner import drive as drive_module
    from opdvfs.tuner.loop import Tuner

    real = sweep_module.traced_profile

    def powered(*args: object) -> Profile:
        p = real(*args)  # type: ignore[arg-type]
        ops = p.ops.assign(chip_power_w=20.0 + 0.05 * p.ops["freq_mhz"])
        return Profile(ops, p.samples, meta=p.meta)

    sweep_module.traced_profile = powered  # type: ignore[assignment]
    # a loaded 2-core host's steps vary more than a GPU's: the time-anchored executor's
    # tolerance as the off-the-simulator tests of test_tune.py
    timed = drive_module._timed_executor
    drive_module._timed_executor = lambda act: timed(act, tolerance=0.95)  # type: ignore[assignment]
    log = Path(out) / f"calls.rank{rank}.jsonl"
    act = make_actuator("dry-run", device="a100-like", log=str(log))
    # the CPU's step times do not change with the clock: a lower clock saves only the power
    # given below, so it must save more than the host's noise on a step (1380 MHz, 1.7% less
    # power, left a stage at the top clock in 2 of 4 runs), and fit a budget the noise allows
    tuner = Tuner(
        act, target=0.10, clocks=PIPE_CLOCKS, iterations_per_clock=2, block=2, pairs=2, rounds=1
    )
    steady: list[int] = []

    def stop(i: int) -> bool:  # both ranks see the same phase at the same step
        if tuner.phase == "steady" and not steady:
            steady.append(i)
        return (bool(steady) and i >= steady[0] + 4) or tuner.phase == "top" or i >= 400

    with tuner:
        dist.init_process_group("gloo", rank=rank, world_size=2)
        try:
            train(400, 2, before_step=stop)
        finally:
            dist.destroy_process_group()
    result = tuner.result.to_dict()
    profile = tuner.result.profile
    result["profile_names"] = None if profile is None else sorted(set(profile.ops["name"]))
    # rank 0: the pipeline it planned (and measured, whether or not it met the target)
    pipes = list(tuner.planning._pipelines.values())
    result["stage_mhz"] = (
        [sorted({st.freq_mhz for st in s.stages}) for s in pipes[0].stages] if pipes else None
    )
    calls = read_log(log)  # what the dry run would have set, and its restore
    result["set_mhz"] = sorted({c["freq_mhz"] for c in calls if c["kind"] == "set"})
    # the time-anchored executor's sets: at an offset into their iteration
    result["timed_mhz"] = sorted(
        {c["freq_mhz"] for c in calls if c["kind"] == "set" and c.get("offset_s") is not None}
    )
    result["last_call"] = calls[-1]["kind"]
    (Path(out) / f"result.rank{rank}.json").write_text(json.dumps(result))


def _traced_active_rank(rank: int, port: int, out: str) -> None:
    """One data-parallel rank tuning ``auto`` clocks off the simulator (dry run: traced).

    Traced operators are given a GPU's times and powers (``conftest.gpu_like``), and any
    expected saving is worth a clock, so rank 0 adds one after reading its sweep's trace.
    Both ranks stop together once the added clock is swept (their phases are rank 0's).
    """
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2"
    )
    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).parent))
    import opdvfs.runtime.sweep as sweep_module
    from opdvfs.runtime.actuators import make_actuator
    from opdvfs.tuner import policy
    from opdvfs.tuner.loop import Tuner

    from conftest import gpu_like
    from tiny_gpt import TinyGPT, train_step

    sweep_module.traced_profile = gpu_like(sweep_module.traced_profile)  # type: ignore[assignment]
    policy.ADDED_CLOCK_MIN_GAIN = 0.0  # type: ignore[misc]
    log = Path(out) / f"calls.rank{rank}.jsonl"
    act = make_actuator("dry-run", device="a100-like", log=str(log))
    tuner = Tuner(act, target=0.05, iterations_per_clock=1)
    torch.manual_seed(0)
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 64, (2, 17))
    with tuner:
        dist.init_process_group("gloo", rank=rank, world_size=2)
        try:
            for _ in range(800):
                train_step(model, opt, data)
                done = tuner.result.added_clock is not None and tuner.phase == "planning"
                if done or tuner.phase == "top":
                    break
        finally:
            dist.destroy_process_group()
    result = tuner.result.to_dict()
    result["sets"] = [(c["iteration"], c["freq_mhz"]) for c in read_log(log) if c["kind"] == "set"]
    result["last_call"] = read_log(log)[-1]["kind"]
    (Path(out) / f"result.rank{rank}.json").write_text(json.dumps(result))


@pytest.fixture(scope="module")
def traced(tmp_path_factory) -> dict[str, list[dict]]:
    """Four jobs of two ranks off the simulator: one model ("same"), rank 1's wider
    ("wider"), the 2-stage toy pipeline ("pipeline"), one model on ``auto`` clocks ("active")."""
    names = ("same", "wider", "pipeline", "active")
    outs = {name: tmp_path_factory.mktemp(name) for name in names}
    _spawn_jobs(
        (_traced_rank, _free_port(), str(outs["same"]), False),
        (_traced_rank, _free_port(), str(outs["wider"]), True),
        (_traced_pipeline_rank, _free_port(), str(outs["pipeline"])),
        (_traced_active_rank, _free_port(), str(outs["active"])),
    )
    return {name: _results(out) for name, out in outs.items()}


def test_off_the_simulator_only_rank0_traces_its_sweep_and_its_error_reaches_every_rank(
    traced, cpu_only
):
    r0, r1 = traced["same"]
    # rank 0 traced the sweep and closed its trace; rank 1 dropped its own at the first step
    assert r0["profiled"] and not r1["profiled"]
    assert not r0["traced_at_end"] and not r1["traced_at_end"]
    # the dry run measures no power: rank 0 cannot plan, and says so on every rank
    assert "measures no power" in r0["error"] and r1["error"] == r0["error"]
    assert [i["phase"] for i in r0["per_iteration"]] == [i["phase"] for i in r1["per_iteration"]]
    # no dispatch mode off the simulator: the ranks compare their optimizer steps' signatures
    assert r0["same_sequence"] is True and r1["same_sequence"] is True


def test_off_the_simulator_ranks_whose_steps_differ_are_told_apart(traced, cpu_only):
    """The ranks' step signatures (parameter shapes) differ: the job is not one sequence (#21)."""
    r0, r1 = traced["wider"]
    assert r0["same_sequence"] is False and r1["same_sequence"] is False
    assert [i["phase"] for i in r0["per_iteration"]] == [i["phase"] for i in r1["per_iteration"]]


def test_off_the_simulator_pipeline_stages_are_traced_planned_together_applied_by_time(
    traced, cpu_only
):
    """Each stage lead loads its own sweep trace; rank 0 plans both; each applies its own."""
    r0, r1 = traced["pipeline"]
    assert r0["error"] is None and r1["error"] is None, (r0["error"], r1["error"])
    assert r0["stages_together"] and r1["stages_together"] and r0["pipeline_stages"] == 2
    # rank 1's profile is its own trace's: the last stage's loss, which rank 0 never runs
    assert "aten::square" in r1["profile_names"] and "aten::square" not in r0["profile_names"]
    phases = [i["phase"] for i in r0["per_iteration"]]
    assert phases == [i["phase"] for i in r1["per_iteration"]] and "tuned" in phases
    # the whole job planned on rank 0 below the top clock (the CPU's times do not change with
    # it, its power does), and each rank set its own stage's plan by time, then restored
    planned = r0["stage_mhz"]
    assert len(planned) == 2 and all(min(s) < max(PIPE_CLOCKS) for s in planned), planned
    for rank, r in enumerate((r0, r1)):
        assert set(PIPE_CLOCKS) <= set(r["set_mhz"]), (rank, r["set_mhz"])  # the sweep
        assert set(planned[rank]) <= set(r["timed_mhz"]), (rank, planned, r["timed_mhz"])
        assert r["last_call"] == "restore"


def test_off_the_simulator_data_parallel_ranks_sweep_the_clock_rank0_added(traced, cpu_only):
    """Rank 0 reads its sweep's trace and adds a clock; both ranks sweep it in the same
    iterations (the others follow its clock), and every rank's result says which and why."""
    r0, r1 = traced["active"]
    assert r0["same_sequence"] is True and r1["same_sequence"] is True
    assert r0["added_clock"] is not None, (r0["error"], r0["per_iteration"][-1])
    assert r1["added_clock"] == r0["added_clock"] and r1["clocks_mhz"] == r0["clocks_mhz"]
    added = r0["clocks_mhz"][-1]
    assert r0["added_clock"].startswith(f"{added:g} MHz splits the")
    it0, it1 = r0["per_iteration"], r1["per_iteration"]
    at = [(i["iteration"], i["phase"], i["freq_mhz"]) for i in it0]
    assert at == [(i["iteration"], i["phase"], i["freq_mhz"]) for i in it1]
    assert any(p == "counted" and f == added for _, p, f in at), at[-12:]
    # the same switch at the same iteration on both ranks, then back to the top; one restore
    assert [s for s in r0["sets"] if s[1] == added] == [s for s in r1["sets"] if s[1] == added]
    for r in (r0, r1):
        (i,) = [n for n, (_, f) in enumerate(r["sets"]) if f == added]
        assert r["sets"][i + 1][1] == 1410.0 and r["last_call"] == "restore"


#: A data-parallel script for torchrun (`STEPS CRASH_AT`: rank 1 raises at that step).
DP_SCRIPT = Path(__file__).with_name("train_dp.py")


def test_torchrun_tune_then_a_rerun_from_rank0s_cache(tmp_path):
    import subprocess

    from conftest import torchrun_opdvfs

    script = DP_SCRIPT
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OPDVFS_CACHE_DIR": str(tmp_path / "cache")}

    def tune(name: str, *steps: int, cache: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            torchrun_opdvfs(
                2,
                "tune",
                *("--target", "0.02", "--actuator", "sim:a100-like", "--work-scale", "1e6"),
                *("--clocks", "1410,1380,210", "--iterations-per-clock", "1"),
                *("--block", "2", "--pairs", "2", "--rounds", "1"),
                *("--out", str(tmp_path / name), "--log-file", str(tmp_path / f"{name}.jsonl")),
                *(() if cache else ("--no-cache",)),
                *("--", "python", str(script), *map(str, steps)),
            ),
            capture_output=True,
            text=True,
            env=env,
            timeout=240,
            cwd=tmp_path,
        )

    first = tune("first", 48)
    assert first.returncode == 0, first.stdout + first.stderr
    # rank 0 alone printed the summary and wrote the job's files
    assert first.stdout.count("tuned on sim:a100-like") == 1, first.stdout
    assert "a job of 2 ranks" in first.stdout and "rank 0's plan (data-parallel)" in first.stdout
    result = json.loads((tmp_path / "first" / "tune.json").read_text())
    assert result["world_size"] == 2 and result["same_sequence"] is True and result["met"]
    for it in result["per_iteration"]:  # the job's energy: more than rank 0's own
        assert it["energy_j"] > it["rank_energy_j"] > 0
    second = tune("second", 14)
    assert second.returncode == 0, second.stdout + second.stderr
    again = json.loads((tmp_path / "second" / "tune.json").read_text())
    assert again["cache_hit"] is True and again["cache_key"] == result["cache_key"]
    # re-measured in one brief A/B round (2 pairs of 2-blocks), then steady (#33)
    phases = [i["phase"] for i in again["per_iteration"]]
    assert phases[:2] == ["warmup"] * 2 and phases[-4:] == ["steady"] * 4, phases
    assert set(phases[2:-4]) == {"switch", "reference", "tuned"}, phases
    for name in ("first", "second"):
        for rank in (0, 1):
            calls = read_log(tmp_path / f"{name}.rank{rank}.jsonl")
            kinds = [c["kind"] for c in calls]
            assert kinds[-1] == "restore" and kinds.count("restore") == 1, (name, rank)
            # rank 1 applies rank 0's cached plan from the cache hit on: clocks below the top
            assert {c["freq_mhz"] for c in calls if c["kind"] == "set"} - {1410.0}, (name, rank)
    # rank 1 crashes during the sweep: torchrun fails, rank 0 is stopped, each restores once
    crash = tune("crash", 48, 7, cache=False)
    assert crash.returncode != 0 and "boom on rank 1 at step 7" in crash.stderr
    for rank in (0, 1):
        calls = read_log(tmp_path / f"crash.rank{rank}.jsonl")
        kinds = [c["kind"] for c in calls]
        assert kinds[-1] == "restore" and kinds.count("restore") == 1, (rank, kinds[-3:])
        sets = [c["freq_mhz"] for c in calls if c["kind"] == "set"]
        assert 1380.0 in sets, (rank, sets)  # the sweep had gone below the top
