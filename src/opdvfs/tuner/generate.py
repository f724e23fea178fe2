"""``opdvfs tune --mode generate``: a generation loop tuned per phase, prefill and decode.

An LLM generation loop has two phases with opposite needs: **prefill** (one forward over the
prompt) is compute-bound and wants the top clock; **decode** (one token per forward over the
KV cache) is memory-bound and barely notices a lower one. :class:`GenerateTuner` runs the
user's unchanged loop (``model.generate(...)``, a serving loop) on a simulated GPU
(``sim:PRESET``) and:

1. marks an **iteration at each model forward** (the outermost ``nn.Module`` call, or only
   ``model``'s when given) and classifies it (:func:`~opdvfs.tuner.phases.classify_phase`:
   the first forward of a request or more than one new token: prefill; else decode). The
   host work after a forward (sampling the token) belongs to its step, so a prefill step's
   time is the time to the first token (**TTFT**) and a decode step's the time per output
   token (**TPOT**);
2. **warms up** at the top clock, then **profiles** both phases at a few clocks
   (:func:`~opdvfs.tuner.policy.profile_clocks`); every change happens at a request's start
   (its prefill), and the first request at a clock is its switch, left out;
3. **plans per phase**, on each phase's own profile (:meth:`GenerateTuner._phase_profile`:
   its kernels, at its steps' power from the exact energy counter; the models and the
   planner ``opdvfs plan`` uses): a per-operator plan per phase at the phase's target, each
   phase's best static clock, and the best *single* static clock for both (the lowest clock
   both phases' models keep within their budgets). Decode steps whose operators are the same
   share one plan whatever their sequence length (:func:`~opdvfs.tuner.phases.bucket_key`),
   unless the short and the long half of them plan other clocks
   (:meth:`GenerateTuner._check_lengths`: then two buckets, split by position); a step whose
   operators differ runs at its phase's static clock, with no warning per step;
4. **measures** each candidate in A/B blocks of whole requests alternating with top-clock
   blocks (ABBA; a block's first request is its switch, left out), so a tuned request pays
   its phase switches as in steady state; scored by
   :func:`~opdvfs.tuner.generate_result.score_round` (TTFT and TPOT slowdowns, energy per
   token saved, each with its 95% interval). A per-operator round whose slowdown's upper
   bound misses a target is planned again at a tighter budget for that phase; the static
   candidates are planned, when their turn comes, at the budgets of the best per-operator
   round within the targets;
5. applies the **chosen** candidate (:func:`~opdvfs.tuner.generate_result.choose`) for the
   rest of the run.

A clock switch takes the device's latency (15 ms on ``a100-like``, more than a decode step):
where a request's length is known (:meth:`GenerateTuner.request`, which Hugging Face
``generate()`` calls by itself while tuning), the next prefill's clock is set during the
request's last decode steps (:meth:`GenerateTuner._lead`).

The clock is restored on every exit (:class:`~opdvfs.runtime.actuators.ClockGuard`); a failure
of the tuner's own becomes the result's error and the loop runs on at the top clock.
Planning runs on the thread that ends the profiling step: on a simulated GPU its time is the
host's, not the device's (the device's timeline waits).
"""

from __future__ import annotations

import logging
import math
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

import opdvfs.tuner.policy as policy
from opdvfs.exceptions import ValidationError
from opdvfs.runtime.actuators import Actuator, ClockGuard
from opdvfs.schedule import Objective, Schedule
from opdvfs.tuner.ab import abba_blocks
from opdvfs.tuner.generate_result import (
    GenerateResult,
    GenIteration,
    GenRound,
    choose,
    score_round,
)
from opdvfs.tuner.phases import PHASES, ForwardTokens, Phase, classify_phase, forward_tokens

__all__ = ["GenerateTuner", "PhasePlan"]

log = logging.getLogger("opdvfs")

#: The shortest stage (ms) a per-operator plan of a generation step may have: a decode step
#: lasts milliseconds, so the training default (20 ms) would plan it as one stage.
GEN_INTERVAL_MS = 1.0


@dataclass
class PhasePlan:
    """What one phase runs in a candidate: per-operator plans by operator count, or a clock.

    ``static_mhz``: the clock a step runs at when no plan of its operator count exists (the
    whole candidate, for a static clock).
    """

    static_mhz: float
    plans: dict[int, Schedule] = field(default_factory=dict)
    #: Decode only, where the sequence length changes the plan: the position (tokens in the
    #: KV cache) from which ``long_plans`` apply (None: one plan for every length).
    split_at: int | None = None
    long_plans: dict[int, Schedule] = field(default_factory=dict)

    def clocks(self) -> list[float]:
        """Return the clocks this plan sets (MHz), lowest first."""
        if not self.plans:
            return [self.static_mhz]
        every = [*self.plans.values(), *self.long_plans.values()]
        return sorted({st.freq_mhz for s in every for st in s.stages})

    def for_position(self, position: int | None) -> dict[int, Schedule]:
        """Return the plans (by operator count) for a step at ``position`` in its sequence."""
        if self.split_at is not None and position is not None and position >= self.split_at:
            return self.long_plans
        return self.plans


@dataclass
class _Candidate:
    name: str
    phases: dict[str, PhasePlan]
    budgets: dict[str, float] = field(default_factory=dict)
    per_op: bool = False
    #: A static candidate planned when its turn comes: ``"phase"`` or ``"single"``.
    static: str | None = None


@dataclass
class _Step:
    """The step in progress: what its start decided."""

    iteration: int
    tokens: ForwardTokens
    phase: Phase
    stage: str
    freq_mhz: float | None
    round: int | None = None
    pair: int | None = None
    plan_n: int | None = None  # the operator count of the plan applied (None: a clock)
    lead: bool = False  # a decode step at the next prefill's clock (switched ahead)


def _phase_executor(actuator: Actuator) -> Any:
    """Return the operator-counting executor, with per-step plans or a clock set directly."""
    from opdvfs.runtime.dispatch import ScheduleExecutor
    from opdvfs.tuner.drive import SIM_COMPILED_HINT

    class PhaseExecutor(ScheduleExecutor):
        """:class:`ScheduleExecutor` whose plan changes at each step's start (its phase's)."""

        compiled_hint = SIM_COMPILED_HINT

        def use_clock(self, freq_mhz: float) -> None:
            """Apply no plan; run the step that starts now at ``freq_mhz``."""
            with self._lock:
                self.schedule, self._switch_at, self._first = None, {}, []
            self._set_now(freq_mhz)

        def use_step_plan(self, schedule: Schedule) -> None:
            """Apply ``schedule`` to the step that starts now: its first stage's clock at once.

            The switches a plan issues at its last operators for the next iteration's first
            stage are left out: the next step may be of the other phase, and sets its own.
            """
            own = tuple(sw for sw in schedule.switches if not sw.previous_iteration)
            self._set_now(schedule.stages[0].freq_mhz)
            if own:
                self.use_schedule(schedule.model_copy(update={"switches": own}))
            else:
                with self._lock:
                    self.schedule, self._switch_at, self._first = None, {}, []

        def _set_now(self, freq_mhz: float) -> None:
            self.actuator.cancel_pending()
            gpu = self._timeline
            if gpu is not None:
                self._issued_s = gpu.now_s()
            if self.actuator.current_mhz != freq_mhz:
                self.actuator.at(self.iteration, 0)
                self.actuator.set_freq_mhz(freq_mhz)

    # a step whose operators are not its plan's runs at the top clock for that step only: the
    # plan is never abandoned (lengths vary per request; one warning, not one per step)
    return PhaseExecutor(None, actuator, max_diverged=1 << 30, optimizer_steps=False)


class _ForwardHooks:
    """Call ``begin(tokens, first)`` at the start of each outermost model forward.

    Global module hooks count the nesting (an iteration is the outermost call only). The
    outermost module gets a hook of its own that sees its keyword arguments (``input_ids``,
    ``cache_position``): from its second call on the step is classified from them; its first
    call, seen before that hook existed, is the first forward of a request (prefill).
    With ``model`` only that module's calls are iterations.
    """

    def __init__(self, begin: Any, model: Any = None) -> None:
        self._begin = begin
        self._model = model
        self._depth = 0
        self._begun = False
        self._hooked: set[int] = set()
        self._handles: list[Any] = []

    def __enter__(self) -> _ForwardHooks:
        import torch

        if self._model is not None:
            m = self._model
            self._hooked.add(id(m))
            self._handles += [
                m.register_forward_pre_hook(self._pre, prepend=True),
                m.register_forward_pre_hook(self._kwargs_pre, with_kwargs=True),
                m.register_forward_hook(self._post, always_call=True),
            ]
            return self
        mod = torch.nn.modules.module
        self._handles += [
            mod.register_module_forward_pre_hook(self._pre),
            mod.register_module_forward_hook(self._post, always_call=True),
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _pre(self, module: Any, args: Any) -> None:
        if self._depth == 0:
            self._begun = False
            if id(module) not in self._hooked:
                self._hooked.add(id(module))
                self._handles.append(
                    module.register_forward_pre_hook(self._kwargs_pre, with_kwargs=True)
                )
                self._begun = True
                self._begin(forward_tokens(args, {}), True)
        self._depth += 1

    def _kwargs_pre(self, module: Any, args: Any, kwargs: Any) -> None:
        if self._depth == 1 and not self._begun:
            self._begun = True
            self._begin(forward_tokens(args, kwargs), False)

    def _post(self, module: Any, args: Any, output: Any) -> None:
        self._depth = max(self._depth - 1, 0)


class _GenerateCalls:
    """Tell the tuner each Hugging Face ``generate()`` call's ``max_new_tokens`` (patched).

    Only when ``transformers`` is imported; the method is restored on exit.
    """

    def __init__(self, request: Any) -> None:
        self._request = request
        self._saved: Any = None

    @property
    def patched(self) -> bool:
        """Whether ``generate()`` is patched (``transformers`` was imported)."""
        return self._saved is not None

    def __enter__(self) -> _GenerateCalls:
        import functools

        if self._saved is not None:
            return self
        module = sys.modules.get("transformers.generation.utils")
        mixin = getattr(module, "GenerationMixin", None)
        if mixin is None:
            return self
        original = mixin.generate
        request = self._request

        @functools.wraps(original)
        def generate(model: Any, *args: Any, **kwargs: Any) -> Any:
            config = kwargs.get("generation_config") or getattr(model, "generation_config", None)
            n = kwargs.get("max_new_tokens", getattr(config, "max_new_tokens", None))
            if isinstance(n, int) and n > 0:
                request(n)
            return original(model, *args, **kwargs)

        self._saved = (mixin, original)
        mixin.generate = generate
        return self

    def __exit__(self, *exc: object) -> None:
        if self._saved is not None:
            mixin, original = self._saved
            mixin.generate = original
            self._saved = None


class GenerateTuner:
    """Tune a generation loop per phase (see the module): enter it around the loop.

    Parameters
    ----------
    actuator
        A simulated GPU's (``sim:PRESET``; its energy counter is exact). Entered and closed
        here.
    ttft_target, tpot_target
        Allowed slowdowns of the time to first token and per output token (0.05 = 5%).
    clocks
        Clocks to profile (MHz) or ``"auto"`` (:func:`~opdvfs.tuner.policy.profile_clocks`).
    warmup
        Top-clock steps of each phase before profiling (the first forward differs).
    per_clock
        Profiled steps of each phase per clock (more decode steps run meanwhile; all count).
    pairs
        A/B pairs per phase per round (>= 2 for an interval).
    block
        Requests per A/B block (>= 2: its first request is the switch, left out).
    rounds
        Most candidates measured (the per-operator plan, its re-plans, the static clocks).
    model
        Only this module's forwards are steps (None: every outermost module call).
    objective, interval_ms
        As ``opdvfs plan`` (a generation step lasts milliseconds: :data:`GEN_INTERVAL_MS`).
    label, command
        The actuator's name and the command, for the result.
    """

    def __init__(
        self,
        actuator: Actuator,
        *,
        ttft_target: float,
        tpot_target: float,
        clocks: Sequence[float] | Literal["auto"] = "auto",
        warmup: int = 1,
        per_clock: int = 2,
        pairs: int = 3,
        block: int = 2,
        rounds: int = 5,
        model: Any = None,
        objective: Objective = policy.OBJECTIVE,
        interval_ms: float = GEN_INTERVAL_MS,
        label: str | None = None,
        command: Sequence[str] | None = None,
    ) -> None:
        for name, value in (("ttft_target", ttft_target), ("tpot_target", tpot_target)):
            if not value > 0:
                raise ValidationError(f"{name} {value}: expected a slowdown > 0", field=name)
        for name, n in (
            ("warmup", warmup),
            ("per_clock", per_clock),
            ("pairs", pairs),
            ("block", block - 1),
            ("rounds", rounds),
        ):
            if n < 1:
                raise ValidationError(f"{name} {n}: expected at least 1", field=name)
        if actuator.timeline is None:
            raise ValidationError(
                f"tune --mode generate runs on a simulated GPU (sim:PRESET); {actuator.kind} "
                "is not one yet (see docs/guide/generate.md)",
                field="actuator",
            )
        self.actuator = actuator
        self.gpu = actuator.timeline
        self.targets = {"prefill": ttft_target, "decode": tpot_target}
        self.top_mhz = float(max(actuator.supported_freqs_mhz()))
        self.clocks = [
            float(f) for f in policy.profile_clocks(actuator.supported_freqs_mhz(), clocks)
        ]
        for f in self.clocks:
            actuator.check_freq_mhz(f)
        if self.top_mhz not in self.clocks:
            self.clocks.insert(0, self.top_mhz)
        self.warmup, self.per_clock, self.pairs = warmup, per_clock, pairs
        self.block = block
        self.max_rounds = rounds
        self.objective: Objective = objective
        self.interval_ms = interval_ms
        self.result = GenerateResult(
            ttft_target,
            tpot_target,
            getattr(actuator, "preset", None) or actuator.kind,
            list(self.clocks),
            self.top_mhz,
            command=list(sys.argv if command is None else command),
        )
        self.label = label or actuator.kind
        actuator.optimizer_steps = False  # type: ignore[attr-defined]  # (steps end at forwards)
        self.executor = _phase_executor(actuator)
        self.guard = ClockGuard(actuator, before_restore=self.executor.halt)
        self.hooks = _ForwardHooks(self._begin, model)
        self.stage = "warmup"
        self._stack = ExitStack()
        self._step: _Step | None = None
        self._seen: Counter[str] = Counter()
        self._clock_i = 0
        self._at_clock: Counter[str] = Counter()
        self._clock_since = 0  # the first iteration at the sweep's clock (a switch: left out)
        self._last_n: dict[str, int] = {}
        self._queue: list[_Candidate] = []
        self._candidate: _Candidate | None = None
        self._run: list[_Candidate] = []  # the candidates measured, in the rounds' order
        self._blocks: list[Any] = []  # the round's A/B blocks still to run (ABBA)
        self._block_requests = 0  # requests run in the current block
        self._requests = 0
        self._calls: _GenerateCalls | None = None
        self._left: int | None = None  # decode steps left in the request (None: not known)
        self._pending_left: int | None = None  # the next request's (:meth:`request`)
        self._round_i = 0
        self._models: dict[str, Any] = {}
        self._long: tuple[int, Any] | None = None  # decode's long steps: (split, models)
        self._chosen: _Candidate | None = None
        self._last_end_s = 0.0
        self._last_energy_j = 0.0

    # ------------------------------------------------------------------------- entering
    def __enter__(self) -> GenerateTuner:
        """Enter the actuator, its guard, the executor and the forward hooks (top clock)."""
        stack = self._stack
        try:
            stack.enter_context(self.actuator)
            stack.enter_context(self.guard)
            stack.enter_context(self.executor)
            self.actuator.set_freq_mhz(self.top_mhz)
            stack.enter_context(self.hooks)
            self._calls = _GenerateCalls(self.request)
            stack.callback(self._calls.__exit__)
            self._calls.__enter__()  # (again at the first forward: a script imports it later)
            self._last_end_s = self.gpu.now_s()
            self._last_energy_j = float(self.actuator.read_energy_j() or 0.0)
        except BaseException:
            stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        """End the last step, leave the hooks and the executor, restore the clock once."""
        try:
            self.hooks.__exit__()
            if self._step is not None:
                self._mark()
        except Exception as e:
            self._fail(e)
        finally:
            self._stack.close()
        r = self.result
        if r.error is None and self.stage in ("warmup", "profiling"):
            r.error = (
                f"the loop ended after {len(r.iterations)} steps, while tuning was "
                f"{self.stage}: profiling needs {self.warmup} warm-up and {self.per_clock} "
                f"steps of each phase per clock at {len(self.clocks)} clocks; run more requests"
            )
        elif r.error is None and self.stage == "ab":
            r.error = (
                f"the loop ended after {len(r.iterations)} steps, while round "
                f"{len(r.rounds) + 1} was measured: run more requests"
            )

    # ------------------------------------------------------------------------- per step
    def _fail(self, exc: BaseException) -> None:
        self.result.error = self.result.error or f"tuning stopped: {type(exc).__name__}: {exc}"
        self.stage = "top"

    def _begin(self, tokens: ForwardTokens, first: bool) -> None:
        """Start a step at a model forward: end the one before, classify it, apply its plan."""
        try:
            if self._calls is not None and not self._calls.patched:
                self._calls.__enter__()
            self._mark()  # (the operators before the first forward: no step recorded)
            phase = classify_phase(
                tokens.seq_len, first_of_request=first, first_position=tokens.first_position
            )
            if phase == "prefill":
                self._left, self._pending_left = self._pending_left, None
            elif self._left is not None:
                self._left -= 1  # decode steps of the request after this one
            step = self._apply(_Step(self.executor.iteration, tokens, phase, self.stage, None))
            self._step = self._lead(step) if phase == "decode" else step
        except Exception as exc:  # the tuner's own failure never reaches the program
            self._fail(exc)
            self.executor.use_clock(self.top_mhz)

    def _mark(self, record: bool = True) -> None:
        """End the iteration on the executor and the device; record the step that ran."""
        n_ops = self.executor.op_index
        self.executor.mark_iteration()
        self.actuator.mark_iteration()
        step, self._step = self._step, None
        end_s = self.gpu.iteration_ends_s[-1]
        energy = self.gpu.iteration_energy_j[-1]
        time_s, used_j = end_s - self._last_end_s, energy - self._last_energy_j
        self._last_end_s, self._last_energy_j = end_s, energy
        if step is None or not record:
            return
        row = GenIteration(
            step.iteration,
            step.phase,
            step.tokens.batch,
            step.tokens.seq_len,
            step.stage,
            step.freq_mhz,
            step.round,
            step.pair,
            time_s,
            used_j,
            int(n_ops),
            step.lead,
            step.tokens.first_position,
        )
        if step.plan_n is not None and step.plan_n != row.n_launches:
            self.result.fallbacks += 1
        self.result.iterations.append(row)
        self._ended(row)

    # ------------------------------------------------------------------------- applying
    def _apply(self, step: _Step) -> _Step:
        """Decide what the step that starts runs, and apply it.

        Every change of what runs (the sweep's next clock, planning, the next A/B block, the
        steady phase) happens at a request's start, its prefill: a request runs one thing.
        """
        if step.phase == "prefill":
            self._request_starts()
        step.stage = self.stage
        if self.stage in ("warmup", "profiling"):
            freq = self.top_mhz if self.stage == "warmup" else self.clocks[self._clock_i]
            self.executor.use_clock(freq)
            step.freq_mhz = freq
            return step
        if self.stage == "ab" and self._candidate is not None and self._blocks:
            block = self._blocks[0]
            step.round, step.pair = self._round_i, block.pair
            # a block's first request is the switch (left out): its clock lands during it
            step.stage = "switch" if self._block_requests == 1 else block.kind
            if block.kind == "reference":
                self.executor.use_clock(self.top_mhz)
                step.freq_mhz = self.top_mhz
                return step
            return self._run_plan(step, self._candidate.phases[step.phase])
        if self.stage == "steady" and self._chosen is not None:
            return self._run_plan(step, self._chosen.phases[step.phase])
        self.executor.use_clock(self.top_mhz)
        step.freq_mhz = self.top_mhz
        return step

    def _request_starts(self) -> None:
        """Move the run on at a request's start (the prefill about to run)."""
        self._requests += 1
        if self.stage == "warmup" and all(self._seen[p] >= self.warmup for p in PHASES):
            self.stage = "profiling"
            self._clock_i, self._at_clock = 0, Counter()
            self._clock_since = self.executor.iteration
        elif self.stage == "profiling" and all(self._at_clock[p] >= self.per_clock for p in PHASES):
            self._clock_i += 1
            self._at_clock = Counter()
            self._clock_since = self.executor.iteration
            if self._clock_i >= len(self.clocks):
                self._plan()  # (the first round starts with this request)
        if self.stage == "ab" and self._blocks:
            if self._block_requests >= self.block:
                self._blocks.pop(0)
                self._block_requests = 0
            if not self._blocks:
                self._close_round()  # (the next round, or the steady phase, starts here)
            if self.stage == "ab" and self._blocks:
                self._block_requests += 1

    # ------------------------------------------------------------------------- switching ahead
    def request(self, max_new_tokens: int) -> None:
        """Say that a request of at most ``max_new_tokens`` new tokens starts next.

        With it, the clock of the next request's prefill is set ahead, during the request's
        last decode steps (:meth:`_lead`): a switch takes the device's latency (15 ms on
        ``a100-like``, longer than a decode step), and a prefill that starts at a decode clock
        runs that long slower. Hugging Face ``generate()`` calls it by itself (its
        ``max_new_tokens``); a serving loop calls it from its scheduler, which knows what it
        batches next. A request that stops early (an end-of-sequence token) only misses it.
        """
        self._pending_left = max(int(max_new_tokens) - 1, 0)

    def _ahead(self) -> int:
        """Return the decode steps a switch takes to land: latency over the decode step time."""
        times = [r.time_s for r in self.result.iterations[-64:] if r.phase == "decode"]
        step_s = float(np.median(times)) if times else 0.0
        if not step_s > 0:
            return 0
        return math.ceil(self.gpu.switch_latency_s / step_s)

    def _next_prefill_mhz(self) -> float | None:
        """Return the clock the next request's prefill starts at (None: not known yet)."""
        if self.stage == "steady" and self._chosen is not None:
            return self._first_mhz(self._chosen.phases["prefill"])
        if self.stage != "ab" or self._candidate is None or not self._blocks:
            return None
        if self._block_requests < self.block:
            kind = self._blocks[0].kind
        elif len(self._blocks) > 1:
            kind = self._blocks[1].kind
        else:
            return self.top_mhz  # the next round starts with a reference block
        if kind == "reference":
            return self.top_mhz
        return self._first_mhz(self._candidate.phases["prefill"])

    def _first_mhz(self, plan: PhasePlan) -> float:
        n = self._last_n.get("prefill")
        schedule = plan.plans.get(n) if n is not None else None
        return schedule.stages[0].freq_mhz if schedule is not None else plan.static_mhz

    def _lead(self, step: _Step) -> _Step:
        """Set the next prefill's clock during the request's last decode steps, if higher."""
        if self._left is None or self._left >= self._ahead():
            return step
        lead = self._next_prefill_mhz()
        if lead is None or step.freq_mhz is None or lead <= step.freq_mhz:
            return step
        self.executor.use_clock(lead)
        step.freq_mhz, step.plan_n, step.lead = lead, None, True
        return step

    def _run_plan(self, step: _Step, plan: PhasePlan) -> _Step:
        n = self._last_n.get(step.phase)
        plans = plan.for_position(step.tokens.first_position)
        schedule = plans.get(n) if n is not None else None
        if schedule is None:
            self.executor.use_clock(plan.static_mhz)
            step.freq_mhz = plan.static_mhz
        else:
            self.executor.use_step_plan(schedule)
            step.freq_mhz = schedule.stages[0].freq_mhz
            step.plan_n = schedule.n_ops
        return step

    # ------------------------------------------------------------------------- the phases
    def _ended(self, row: GenIteration) -> None:
        self._last_n[row.phase] = row.n_launches
        self._seen[row.phase] += 1
        # the prefill that starts a sweep clock is its switch: left out
        if self.stage == "profiling" and row.iteration > self._clock_since:
            self._at_clock[row.phase] += 1

    # ------------------------------------------------------------------------- planning
    def _profiled(self, phase: str) -> tuple[dict[int, float], int]:
        """Return a phase's profiled steps (iteration -> MHz) of its commonest operator count."""
        rows = [
            r
            for r in self.result.iterations
            if r.stage == "profiling" and r.phase == phase and r.freq_mhz is not None
        ]
        n = Counter(r.n_launches for r in rows).most_common(1)[0][0]
        counted = {r.iteration: float(r.freq_mhz) for r in rows if r.n_launches == n}  # type: ignore[arg-type]
        kernels = self.gpu.kernels()
        k = kernels[kernels["iteration"].isin(list(counted))]
        set_mhz = k["iteration"].map(counted).to_numpy(dtype=float)
        off = set(k["iteration"].to_numpy()[set_mhz != k["freq_mhz"].to_numpy(dtype=float)])
        return {i: f for i, f in counted.items() if i not in off}, n

    def _phase_profile(self, counted: Mapping[int, float]) -> Any:
        """Return a phase's profile: its kernels, each at its step's mean power.

        The simulated GPU's power sensor (100 ms windows) averages across both phases, which
        alternate every few milliseconds, so its windows cannot attribute power to one phase's
        operators. The device's energy counter is exact per step: each operator is given its
        step's mean power (energy over time) at the clock the step ran at, and the time models
        are the kernels' own.
        """
        from opdvfs.profile import Profile
        from opdvfs.runtime.sweep import sim_profile

        profile = sim_profile(self.gpu, counted)
        power = {
            r.iteration: r.energy_j / r.time_s
            for r in self.result.iterations
            if r.iteration in counted and r.energy_j is not None and r.time_s > 0
        }
        ops = profile.ops.assign(chip_power_w=profile.ops["iteration"].map(power))
        return Profile(ops.dropna(subset=["chip_power_w"]), None, meta=profile.meta)

    def _plan(self) -> None:
        """Fit each phase's models on its profile; queue the candidates to measure."""
        from opdvfs.plan.on_profile import fit_profile

        self.stage = "planning"
        per_op: dict[str, PhasePlan] = {}
        for phase in PHASES:
            counted, n = self._profiled(phase)
            missing = set(self.clocks) - set(counted.values())
            if missing:
                raise ValidationError(
                    f"{phase}: no step profiled cleanly at {sorted(missing)} MHz; raise per_clock"
                )
            fitted = fit_profile(
                self._phase_profile(counted), objective=self.objective, n_launches=n
            )
            self._models[phase] = (fitted, n)
        self._check_lengths()
        statics = self._statics(self.targets)
        for phase in PHASES:
            per_op[phase] = self._phase_plan(phase, self.targets[phase], statics[phase])
        # the contenders: per-operator plans per phase (re-planned where they miss), then a
        # static clock per phase and one static clock for both, planned when their turn comes
        # at the budgets of the per-operator round that measured best within the targets
        self._queue += [
            _Candidate("per-op per-phase", per_op, dict(self.targets), per_op=True),
            _Candidate("static per phase", {}, static="phase"),
            _Candidate("best static clock", {}, static="single"),
        ]
        log.info(
            "tune generate: planned; static clocks prefill %g, decode %g MHz",
            statics["prefill"],
            statics["decode"],
        )
        self._next_round()

    def _statics(self, budgets: Mapping[str, float]) -> dict[str, float]:
        """Return each phase's best static clock at its budget (one stage, its models)."""
        from opdvfs.plan.on_profile import plan_fitted

        out: dict[str, float] = {}
        for phase in PHASES:
            plan = plan_fitted(
                self._models[phase][0],
                target=budgets[phase],
                objective=self.objective,
                interval_ms=policy.STATIC_INTERVAL_MS,
            )
            out[phase] = float(plan.stages[0].freq_mhz)
        return out

    def _static_candidate(self, cand: _Candidate) -> _Candidate:
        """Plan a static candidate at the budgets of the best per-operator round within target.

        (Else at the targets.) ``single``: one clock for both phases, the lowest both phases'
        models keep within their budgets (the higher of the two).
        """
        per_op = [(i, r) for i, r in enumerate(self.result.rounds) if self._run[i].per_op]
        best, _ = choose([r for _, r in per_op], *self.targets.values())
        budgets = (
            dict(self._run[per_op[best][0]].budgets) if best is not None else dict(self.targets)
        )
        statics = self._statics(budgets)
        if cand.static == "single":
            single = max(statics.values())
            statics = {p: single for p in PHASES}
        phases: dict[str, PhasePlan] = {p: PhasePlan(statics[p]) for p in PHASES}
        return _Candidate(cand.name, phases, budgets)

    def _phase_plan(self, phase: str, budget: float, static_mhz: float) -> PhasePlan:
        """Return a phase's per-operator plans at ``budget`` (decode: by length, if apart)."""
        n = self._models[phase][1]
        plan = PhasePlan(static_mhz, {n: self._plan_phase(phase, budget)})
        if phase == "decode" and self._long is not None:
            split, fitted = self._long
            plan.split_at = split
            plan.long_plans = {n: self._plan_phase(phase, budget, fitted, suffix="/long")}
        return plan

    def _check_lengths(self) -> None:
        """Plan decode's short and long steps apart; keep two buckets only if they differ.

        The profiled decode steps are split at their median position (tokens in the KV
        cache); each half gets its own models and plan at the TPOT target. The same clocks:
        one plan for every length (``length_check["shared"]``); other clocks: steps from the
        split on apply the long half's plan. Not checked when the positions are unknown or
        a half lacks a clock.
        """
        from opdvfs.plan.on_profile import fit_profile, plan_fitted

        self._long = None
        counted, n = self._profiled("decode")
        position = {
            r.iteration: r.position
            for r in self.result.iterations
            if r.iteration in counted and r.position is not None
        }
        if len(set(position.values())) < 4:
            self.result.length_check = {"checked": False, "why": "too few positions profiled"}
            return
        split = int(np.median(list(position.values())))
        halves = [
            {i: f for i, f in counted.items() if i in position and (position[i] >= split) == long}
            for long in (False, True)
        ]
        if any(set(h.values()) != set(self.clocks) for h in halves):
            self.result.length_check = {"checked": False, "why": "a half lacks a clock"}
            return
        fits = [
            fit_profile(self._phase_profile(h), objective=self.objective, n_launches=n)
            for h in halves
        ]
        clocks = [
            sorted(
                {
                    st.freq_mhz
                    for st in plan_fitted(
                        f,
                        target=self.targets["decode"],
                        objective=self.objective,
                        interval_ms=self.interval_ms,
                    ).stages
                }
            )
            for f in fits
        ]
        shared = clocks[0] == clocks[1]
        self.result.length_check = {
            "checked": True,
            "split_at": split,
            "short_mhz": clocks[0],
            "long_mhz": clocks[1],
            "shared": shared,
        }
        if not shared:
            self._long = (split, fits[1])

    def _plan_phase(
        self, phase: str, budget: float, fitted: Any = None, *, suffix: str = ""
    ) -> Schedule:
        from opdvfs.plan.on_profile import plan_fitted

        own, n = self._models[phase]
        plan = plan_fitted(
            own if fitted is None else fitted,
            target=budget,
            objective=self.objective,
            interval_ms=self.interval_ms,
        )
        self.result.buckets[f"{phase}/{n}{suffix}"] = len(plan.stages)
        return plan

    def _next_round(self) -> None:
        """Start measuring the next candidate (one that sets new clocks), or finish."""
        while self._queue and len(self.result.rounds) < self.max_rounds:
            cand = self._queue.pop(0)
            if cand.static is not None:
                cand = self._static_candidate(cand)
            clocks = [cand.phases[p].clocks() for p in PHASES]
            same = [
                i
                for i, c in enumerate(self._run)
                if clocks == [c.phases[p].clocks() for p in PHASES]
            ]
            if not cand.per_op and (clocks == [[self.top_mhz]] * 2 or same):
                log.info("tune generate: %s sets clocks measured already: skipped", cand.name)
                self.result.skipped[cand.name] = (
                    dict(zip(PHASES, clocks, strict=True)),
                    same[0] if same else None,
                )
                continue
            self._candidate = cand
            self._run.append(cand)
            self._blocks = abba_blocks(self.pairs, self.block)
            self._block_requests = 0
            self._round_i = len(self.result.rounds)
            self.stage = "ab"
            return
        self._finish()

    def _close_round(self) -> None:
        cand = self._candidate
        assert cand is not None
        # the steps of each phase's planned bucket: a request's last step carries the host's
        # work up to the next request (other operators, another time) and is not paired
        buckets: dict[str, int] = {p: self._models[p][1] for p in PHASES}
        rows = [r for r in self.result.iterations if r.round == self._round_i]
        measured = score_round(
            cand.name,
            [r for r in rows if r.stage in ("reference", "tuned")],
            buckets=buckets,
            clocks_mhz={p: cand.phases[p].clocks() for p in PHASES},
        )
        measured.budgets = dict(cand.budgets)
        measured.mean_mhz = self._mean_clocks([r for r in rows if r.stage == "tuned"])
        self.result.rounds.append(measured)
        log.info("tune generate: round %d %s measured", len(self.result.rounds), cand.name)
        self._candidate = None
        if cand.per_op:
            self._replan(cand, measured)
        self._next_round()

    def _replan(self, cand: _Candidate, measured: GenRound) -> None:
        """Plan a per-operator round again where a phase's slowdown missed its target."""
        got = {"prefill": measured.ttft, "decode": measured.tpot}
        budgets = dict(cand.budgets)
        missed = False
        for p in PHASES:
            iv = got[p]
            high = iv.high if math.isfinite(iv.high) else iv.mean
            if math.isfinite(high) and high > self.targets[p]:
                missed = True
                budgets[p] = cand.budgets[p] * max(0.1, 0.8 * self.targets[p] / max(high, 1e-9))
        if not missed or len(self.result.rounds) + len(self._queue) >= self.max_rounds:
            # (the static candidates keep their rounds)
            return
        phases: dict[str, PhasePlan] = {
            p: (
                self._phase_plan(p, budgets[p], cand.phases[p].static_mhz)
                if budgets[p] != cand.budgets[p]
                else cand.phases[p]
            )
            for p in PHASES
        }
        self._queue.insert(
            0, _Candidate("per-op per-phase (re-plan)", phases, budgets, per_op=True)
        )

    def _mean_clocks(self, rows: Sequence[GenIteration]) -> dict[str, float]:
        """Return the time-weighted mean clock the steps ``rows`` ran at, per phase (MHz)."""
        kernels = self.gpu.kernels()
        out: dict[str, float] = {}
        for p in PHASES:
            its = [r.iteration for r in rows if r.phase == p]
            k = kernels[kernels["iteration"].isin(its)]
            t = k["time_us"].to_numpy(dtype=float)
            if t.sum() > 0:
                out[p] = float(np.dot(t, k["freq_mhz"].to_numpy(dtype=float)) / t.sum())
        return out

    def _finish(self) -> None:
        index, met = choose(self.result.rounds, *self.targets.values())
        self.result.chosen, self.result.met = index, met
        if index is None:
            self.stage = "top"
            return
        self._chosen = self._run[index]
        log.info("tune generate: applying %s for the rest of the run", self._chosen.name)
        self.stage = "steady"
