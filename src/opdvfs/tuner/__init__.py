"""The closed loop, ``opdvfs tune``: profile, plan, apply and measure on a running job.

One run of the user's unchanged script goes through these phases, each between two of its
iterations (an iteration ends at an optimizer step):

1. **warm-up** at the top clock (the first iteration differs: allocations, optimizer state);
   the last warm-up iteration identifies the job for the
   :func:`~opdvfs.tuner.cache.cache_key`: on a simulated GPU its operator sequence, off it
   the optimizer step's :func:`~opdvfs.tuner.drive.step_signature` (its parameters) with the
   GPU's name. A cached schedule for it starts applying at once (phase ``steady``), skipping 2-4.
2. **profiling** at K clocks (:func:`~opdvfs.tuner.policy.profile_clocks`), through the clock
   sweep of :mod:`opdvfs.runtime.sweep` (:class:`~opdvfs.runtime.sweep.ClockSweep`: the iterations a
   switch disturbs discarded, thermal steadiness checked), into one profile
   (:func:`~opdvfs.runtime.sweep.sweep_profile`).
3. **planning** in a background thread while training goes on at the top clock: the models
   are fitted and the schedule planned by the same functions ``opdvfs plan`` uses on a swept
   profile (:mod:`opdvfs.tuner.planning`).
4. **A/B measurement**: the schedule is applied by the executor ``opdvfs run`` uses, in
   blocks that alternate with top-clock reference blocks: on a simulated GPU operator-triggered
   (:class:`~opdvfs.runtime.dispatch.ScheduleExecutor`: the swept profile's kernels map back
   onto the operators it counts, :func:`~opdvfs.schedule.on_launches`); on a real device
   (nvml, zeusd, a dry run measuring the GPU) time-triggered, as ``opdvfs run --trigger time``
   (:class:`~opdvfs.runtime.timed.TimedExecutor`: the trace's operators are CUDA kernels the
   operator count cannot match, and the stages' planned start times place the switches),
   paused between the blocks. The blocks alternate in ABBA order, so a linear drift such as a
   warming die cancels; each block's first iteration is discarded (a switch in flight), and so
   are the tuned iterations the time-triggered executor fell back to the top clock in (they do
   not measure the plan). Each pair of blocks gives one paired ratio of time and of energy
   (:func:`~opdvfs.tuner.ab.ab_pairs`); their mean and Student-t interval
   (:func:`~opdvfs.tuner.ab.paired_interval`) are the measured slowdown and saving. Off
   the simulated GPU a block spans enough iterations for the energy counter's updates
   (:func:`~opdvfs.tuner.policy.block_size`).
5. **re-plan** when the measured slowdown is not within the target:
   :func:`opdvfs.tuner.policy.fit_budget` plans at another budget and measures again (it runs
   in the planning thread; each ``measure`` waits for the training thread's A/B blocks).
   After the per-operator rounds, the **best static clock** (one stage: what ``nvidia-smi
   -lgc`` would lock, planned on the same models at the budget that measured within the
   target) is measured as one more round, the last of ``rounds``
   (:func:`~opdvfs.tuner.policy.split_rounds`): a contender like any other.
6. **steady**: the round with the surest saving (:func:`~opdvfs.tuner.policy.choose_round`:
   the highest lower bound of the saving's interval among the rounds within the target, not
   the highest mean, which over a few noisy rounds is the luckiest) applies for the rest of
   the run, and is
   cached.

Under ``torchrun`` (a process group exists when an iteration ends) every rank measures and
rank 0 leads: at each iteration end the ranks exchange the iteration's time and energy
through the group's key-value store (no tensor operator the executor or a trace would see),
and each takes the job's: the slowest rank's time and every rank's energy; rank 0
alone runs the phases above on those job-wide figures (its sweep, its planning thread, its
A/B blocks) and broadcasts what it decided: the phase, the clock it set, the schedule it
applies. So every rank moves through the same phases at the same iterations, the A/B blocks
start and end together, and data-parallel ranks share rank 0's plan. Rank 0's operator
sequence is the one profiled and planned: when the ranks' sequences differ (pipeline
stages; :class:`~opdvfs.runtime.distributed.JobView`) rank 0 warns in one line that the job
is planned as data-parallel on its sequence, and the ranks whose sequence differs stay at
the top clock (still measured). Only rank 0 reads and writes the cache.

What holds the program. On a simulated GPU the operator-counting executor, a dispatch mode,
drives the simulator: every aten operator becomes a launch, so a ``torch.compile``d model runs
eagerly there (:data:`~opdvfs.tuner.drive.SIM_COMPILED_HINT`). Off it tune holds no dispatch
mode: iterations end at the optimizer step (a global step hook, as ``opdvfs run --trigger
time``), the sweep is traced by torch.profiler (which sees compiled kernels), and the plans
apply by time, so a compiled model stays compiled through the whole run and what is profiled,
planned and measured is the job the user runs.

Where each part lives:

- :mod:`~opdvfs.tuner.context`: :class:`tune`, the public context and the one way the CLI and
  Python build a tuner;
- :mod:`~opdvfs.tuner.loop`: :class:`Tuner`, the phase machine;
- :mod:`~opdvfs.tuner.policy`: every decision (clocks, block length, budgets, the round that
  applies, whether a cached schedule applies), pure functions over what was measured;
- :mod:`~opdvfs.tuner.planning`: the planning thread and its hand-over of rounds;
- :mod:`~opdvfs.tuner.drive`: how the loop reaches the program, chosen once (simulated GPU or
  device);
- :mod:`~opdvfs.tuner.ranks`: torchrun, rank 0 leading;
- :mod:`~opdvfs.tuner.ab`: the A/B blocks and their intervals;
- :mod:`~opdvfs.tuner.generate`, :mod:`~opdvfs.tuner.phases`,
  :mod:`~opdvfs.tuner.generate_result`: ``mode="generate"``, a generation loop tuned per
  phase (prefill, decode), held to TTFT and TPOT targets;
- :mod:`~opdvfs.tuner.result`, :mod:`~opdvfs.tuner.report`, :mod:`~opdvfs.tuner.cache`: what a
  run measured (the whole run against the top clock and its break-even:
  :class:`~opdvfs.tuner.result.WholeRun`), the files it writes (the report leads with
  :func:`~opdvfs.tuner.report.headline_lines`), the schedules kept per job.

Every exit path ends with exactly one restore of the clock
(:class:`~opdvfs.runtime.actuators.ClockGuard`). Names load on first use (PEP 562).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opdvfs._lazy import attach

#: Exported name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    "tune": "opdvfs.tuner.context",
    "Tuner": "opdvfs.tuner.loop",
    "TuneResult": "opdvfs.tuner.result",
    "TuneCache": "opdvfs.tuner.cache",
    "summary_lines": "opdvfs.tuner.report",
    "write_tune": "opdvfs.tuner.report",
}

__all__ = ["TuneCache", "TuneResult", "Tuner", "summary_lines", "tune", "write_tune"]

if TYPE_CHECKING:  # what the lazy names are, for type checkers and IDEs
    from opdvfs.tuner.cache import TuneCache
    from opdvfs.tuner.context import tune
    from opdvfs.tuner.loop import Tuner
    from opdvfs.tuner.report import summary_lines, write_tune
    from opdvfs.tuner.result import TuneResult

__getattr__, __dir__ = attach(__name__, _EXPORTS)
