"""What ``opdvfs tune --mode generate`` measured, how a round's A/B is scored, and its files.

A generation loop's steps are prefill or decode (:mod:`opdvfs.tuner.phases`); each candidate
(a per-operator plan per phase, a static clock per phase, one static clock for both) is
measured in A/B blocks of whole requests that alternate with top-clock blocks (ABBA; a
block's first request is its switch, left out), so a tuned request pays its phase switches
as it would in steady state (:func:`score_round`). Per pair of blocks:

- **TTFT slowdown**: the tuned over the reference prefill time per prompt token, minus 1
  (prompts differ in length per request; the per-token time pairs them);
- **TPOT slowdown**: the tuned over the reference decode step time per row, minus 1;
- **energy per token saved**: 1 minus the tuned over the reference energy per generated
  token, every step of the requests counted (prefill, decode, the host's work between).

Each is a Student-t interval over the pairs (:func:`~opdvfs.tuner.ab.paired_interval`); the
upper bound of a slowdown is what the targets are held to (:func:`choose`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from opdvfs._files import write_text_atomic
from opdvfs.tuner.ab import paired_interval
from opdvfs.tuner.phases import PHASES, Phase
from opdvfs.tuner.result import Interval

__all__ = [
    "GenIteration",
    "GenRound",
    "GenerateResult",
    "choose",
    "headline_lines",
    "score_round",
    "write_generate",
]


@dataclass
class GenIteration:
    """One model forward (and the host work up to the next): its phase and what it cost."""

    iteration: int
    phase: Phase
    batch: int
    seq_len: int | None
    stage: str  # warmup, profiling, reference, tuned, extra, steady, top
    freq_mhz: float | None  # the clock set at its start (a plan's first stage)
    round: int | None = None
    pair: int | None = None
    time_s: float = math.nan
    energy_j: float | None = None
    n_launches: int = 0
    #: Whether it ran at the next prefill's clock (set ahead: :meth:`GenerateTuner.request`).
    lead: bool = False
    #: Where its new tokens start in the sequence (``cache_position``; None: not given).
    position: int | None = None


@dataclass
class GenRound:
    """One measured candidate: its clocks per phase and what its A/B blocks measured."""

    name: str
    clocks_mhz: dict[str, list[float]]
    ttft: Interval
    tpot: Interval
    saving: Interval
    ttft_s: float
    tpot_s: float
    j_per_token: float
    j_per_request: float
    ref_ttft_s: float
    ref_tpot_s: float
    ref_j_per_token: float
    #: The time-weighted mean clock its tuned steps ran at, per phase (MHz).
    mean_mhz: dict[str, float] = field(default_factory=dict)
    budgets: dict[str, float] = field(default_factory=dict)


@dataclass
class GenerateResult:
    """What a generate-mode tune measured (the file ``generate.json``)."""

    ttft_target: float
    tpot_target: float
    device: str | None
    clocks_mhz: list[float]
    top_mhz: float
    iterations: list[GenIteration] = field(default_factory=list)
    rounds: list[GenRound] = field(default_factory=list)
    chosen: int | None = None
    met: bool = False
    error: str | None = None
    #: Per-operator plans kept: ``"phase/n_launches"`` -> stages.
    buckets: dict[str, int] = field(default_factory=dict)
    fallbacks: int = 0
    #: Whether decode's short and long steps plan the same clocks (``GenerateTuner``).
    length_check: dict[str, Any] = field(default_factory=dict)
    #: Candidates not measured because they set the clocks of a round measured before:
    #: name -> (their clocks per phase, that round's index; None: the top clock).
    skipped: dict[str, tuple[dict[str, list[float]], int | None]] = field(default_factory=dict)
    command: list[str] = field(default_factory=list)

    def phase_counts(self) -> dict[str, int]:
        """Return how many steps of each phase ran."""
        return {p: sum(1 for it in self.iterations if it.phase == p) for p in PHASES}

    def to_dict(self) -> dict[str, Any]:
        """Return the result as JSON-ready data."""
        data = asdict(self)
        data["format"] = "opdvfs.tune-generate"
        return data


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else math.nan


def _per_unit(it: GenIteration) -> float:
    """Return what a step's time is divided by: its prompt tokens (prefill) or its rows (decode)."""
    if it.phase == "prefill":
        return float(it.batch * (it.seq_len or 1))
    return float(it.batch)


def _unit_time(rows: Sequence[GenIteration]) -> float:
    return _mean([r.time_s / _per_unit(r) for r in rows])


def _j_per_token(rows: Sequence[GenIteration]) -> float:
    """Return the energy over the tokens generated (each step generates one token per row)."""
    energy = [r.energy_j for r in rows if r.energy_j is not None]
    tokens = sum(r.batch for r in rows if r.energy_j is not None)
    return float(np.sum(energy)) / tokens if tokens else math.nan


def _ratio(tuned: Sequence[GenIteration], ref: Sequence[GenIteration], what: str) -> float:
    """Return the tuned over the reference mean of time or energy per unit (nan: a side empty)."""

    def per_unit(rows: Sequence[GenIteration]) -> float:
        if what == "time":
            return _mean([r.time_s / _per_unit(r) for r in rows])
        return _mean([r.energy_j / _per_unit(r) for r in rows if r.energy_j is not None])

    if not tuned or not ref:
        return math.nan
    return per_unit(tuned) / per_unit(ref)


def score_round(
    name: str,
    rows: Sequence[GenIteration],
    *,
    buckets: dict[str, int],
    clocks_mhz: dict[str, list[float]],
) -> GenRound:
    """Return a round's measurement from its A/B requests (see the module).

    ``rows``: the round's steps in reference and tuned blocks (not the switch requests),
    each with its pair; ``buckets``: each phase's planned operator count. The times are
    those of the steps of the planned bucket (a request's last step carries the host's work
    up to the next request); the energies are every step's. The energy per token saved
    weights the phases' energy ratios (per prompt token, per decode row) by the prefill share
    ``w`` of the reference's energy: ``1 - (w r_prefill + (1 - w) r_decode)``, the saving at
    the requests' mix of prompt and output lengths, whatever lengths each block drew.
    """
    ttft: list[float] = []
    tpot: list[float] = []
    saving: list[float] = []
    ref_all = [r for r in rows if r.stage == "reference" and r.energy_j is not None]
    e_prefill = sum(r.energy_j or 0.0 for r in ref_all if r.phase == "prefill")
    e_total = sum(r.energy_j or 0.0 for r in ref_all)
    w = e_prefill / e_total if e_total > 0 else 0.5
    for pair in sorted({r.pair for r in rows if r.pair is not None}):
        side = {
            k: {
                p: [r for r in rows if r.pair == pair and r.stage == k and r.phase == p]
                for p in PHASES
            }
            for k in ("reference", "tuned")
        }
        timed = {
            k: {p: [r for r in v[p] if r.n_launches == buckets[p]] for p in PHASES}
            for k, v in side.items()
        }
        t_p = _ratio(timed["tuned"]["prefill"], timed["reference"]["prefill"], "time")
        t_d = _ratio(timed["tuned"]["decode"], timed["reference"]["decode"], "time")
        e_p = _ratio(side["tuned"]["prefill"], side["reference"]["prefill"], "energy")
        e_d = _ratio(side["tuned"]["decode"], side["reference"]["decode"], "energy")
        ttft.append(t_p - 1)
        tpot.append(t_d - 1)
        saving.append(1 - (w * e_p + (1 - w) * e_d))

    def mean_time(kind: str, phase: str) -> float:
        return _mean(
            [
                r.time_s
                for r in rows
                if r.stage == kind and r.phase == phase and r.n_launches == buckets[phase]
            ]
        )

    def per_request(kind: str) -> float:
        mine = [r for r in rows if r.stage == kind and r.energy_j is not None]
        n = sum(1 for r in mine if r.phase == "prefill")
        return float(np.sum([r.energy_j for r in mine])) / n if n else math.nan

    return GenRound(
        name=name,
        clocks_mhz=clocks_mhz,
        ttft=paired_interval(ttft),
        tpot=paired_interval(tpot),
        saving=paired_interval(saving),
        ttft_s=mean_time("tuned", "prefill"),
        tpot_s=mean_time("tuned", "decode"),
        j_per_token=_j_per_token([r for r in rows if r.stage == "tuned"]),
        j_per_request=per_request("tuned"),
        ref_ttft_s=mean_time("reference", "prefill"),
        ref_tpot_s=mean_time("reference", "decode"),
        ref_j_per_token=_j_per_token([r for r in rows if r.stage == "reference"]),
    )


def _bound(iv: Interval) -> float:
    """Return a slowdown's upper bound (its mean with a single pair)."""
    return iv.high if math.isfinite(iv.high) else iv.mean


def within(r: GenRound, ttft_target: float, tpot_target: float) -> bool:
    """Whether both slowdowns' upper 95% bounds are within their targets."""
    return _bound(r.ttft) <= ttft_target and _bound(r.tpot) <= tpot_target


def choose(
    rounds: Sequence[GenRound], ttft_target: float, tpot_target: float
) -> tuple[int | None, bool]:
    """Return the round that applies and whether it is within both targets.

    Among the rounds whose TTFT and TPOT slowdowns' upper bounds are within their targets
    and whose energy per token saved is positive, the one with the highest lower bound of the
    saving (its mean with a single pair). None: none qualifies (the top clock applies).
    """
    best: int | None = None
    best_low = -math.inf
    for i, r in enumerate(rounds):
        if not within(r, ttft_target, tpot_target) or not r.saving.mean > 0:
            continue
        low = r.saving.low if math.isfinite(r.saving.low) else r.saving.mean
        if low > best_low:
            best, best_low = i, low
    return best, best is not None


def _pct(iv: Interval) -> str:
    if not math.isfinite(iv.mean):
        return "n/a"
    if not math.isfinite(iv.low):
        return f"{iv.mean * 100:+.1f}% (1 pair)"
    return f"{iv.mean * 100:+.1f}% [{iv.low * 100:+.1f}, {iv.high * 100:+.1f}]"


def _clocks(c: dict[str, list[float]]) -> str:
    def one(fs: list[float]) -> str:
        if not fs:
            return "?"
        return f"{fs[0]:g}" if len(fs) == 1 else f"{min(fs):g}-{max(fs):g}"

    return f"prefill {one(c.get('prefill', []))} / decode {one(c.get('decode', []))} MHz"


def round_lines(result: GenerateResult) -> list[str]:
    """One line per measured round: clocks, TTFT and TPOT slowdowns, energy per token saved."""
    lines = []
    for i, r in enumerate(result.rounds):
        mark = "*" if i == result.chosen else " "
        lines.append(
            f"{mark} {i + 1}. {r.name:<22} {_clocks(r.clocks_mhz)}: TTFT {_pct(r.ttft)}, "
            f"TPOT {_pct(r.tpot)}, energy/token saved {_pct(r.saving)}; unpaired means "
            f"TTFT {r.ttft_s * 1e3:.2f} ms, TPOT {r.tpot_s * 1e3:.2f} ms, "
            f"{r.j_per_token:.4g} J/token"
        )
    return lines


def headline_lines(result: GenerateResult) -> list[str]:
    """Return the report's first lines: what applies, energy per token beside the latencies."""
    counts = result.phase_counts()
    head = [
        f"tune --mode generate: {counts['prefill']} prefill and {counts['decode']} decode steps; "
        f"targets TTFT +{result.ttft_target * 100:g}%, TPOT +{result.tpot_target * 100:g}% "
        "(upper 95% bounds held to them)"
    ]
    if result.error:
        head.append(f"error: {result.error}")
    if result.chosen is None:
        head.append("applied: the top clock (no candidate measured a saving within the targets)")
    else:
        r = result.rounds[result.chosen]
        head.append(
            f"applied: {r.name}, {_clocks(r.clocks_mhz)}: energy per token saved "
            f"{_pct(r.saving)}, TTFT {_pct(r.ttft)} (per prompt token), TPOT {_pct(r.tpot)} "
            "(paired A/B ratios)"
        )
        # the blocks' plain means: reference and tuned blocks drew different requests, so
        # with lengths varying per request these do not compare as the paired ratios do
        head.append(
            f"  means over the blocks' requests, unpaired (top clock -> applied): "
            f"{r.ref_j_per_token:.4g} -> {r.j_per_token:.4g} J/token, TTFT "
            f"{r.ref_ttft_s * 1e3:.2f} -> {r.ttft_s * 1e3:.2f} ms, TPOT "
            f"{r.ref_tpot_s * 1e3:.2f} -> {r.tpot_s * 1e3:.2f} ms"
        )
    check = result.length_check
    if check.get("checked"):
        how = (
            "one plan for every length"
            if check["shared"]
            else f"planned apart from position {check['split_at']}"
        )
        head.append(
            f"decode lengths: steps before and after position {check['split_at']} plan "
            f"{check['short_mhz']} and {check['long_mhz']} MHz: {how}"
        )
    if result.fallbacks:
        head.append(
            f"{result.fallbacks} steps ran other operators than their phase's plan and ran "
            "at the phase's static clock"
        )
    same = [
        f"  {name}: {_clocks(clocks)}, "
        + ("the top clock" if index is None else f"the clocks of round {index + 1}")
        + ": not measured twice"
        for name, (clocks, index) in result.skipped.items()
    ]
    return [*head, "rounds (* applied):", *round_lines(result), *same]


def write_generate(result: GenerateResult, out: str | os.PathLike[str]) -> list[Path]:
    """Write ``generate.json`` and ``summary.txt`` into ``out`` (each atomically)."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    data = json.dumps(result.to_dict(), indent=1, default=float, allow_nan=True)
    paths = [folder / "generate.json", folder / "summary.txt"]
    write_text_atomic(paths[0], data + "\n")
    write_text_atomic(paths[1], "\n".join(headline_lines(result)) + "\n")
    return paths
