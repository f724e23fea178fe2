"""The paper's genetic algorithm (§6.5), faithfully, vectorised over the population.

Genome: one clock index per stage. Initial population: the all-top-clock plan, the prior (LFC
stages at the lowest clock, HFC at the top) and random plans. Each generation: score every plan
(paper eq. 17: ``2 Per^2 / Power`` if the performance bound holds, else ``Per^2 / Power``, with
``Per = T_base / T`` and ``Power = E / T``), pick parents with probability proportional to the
score, cross them by swapping tails at a random point, mutate each gene with probability 0.15,
and keep the best plan seen. Defaults: population 200, 600 generations (paper settings). It has
no optimality guarantee: ``solve`` in :mod:`opdvfs.plan.dp` gives the certified optimum.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from opdvfs.plan.classify import LOW
from opdvfs.plan.dp import StageTables, evaluate_plans

__all__ = ["GAResult", "genetic_plan"]


@dataclass(frozen=True)
class GAResult:
    """Best feasible plan the GA found (or the best plan, if none was feasible)."""

    clock: np.ndarray
    time_s: float
    energy_j: float
    switches: int
    feasible: bool
    generations: int


def genetic_plan(
    tables: StageTables,
    budget_s: float,
    stage_class: np.ndarray,
    *,
    rng: np.random.Generator,
    population: int = 200,
    generations: int = 600,
    mutation: float = 0.15,
) -> GAResult:
    """Search per-stage clocks with the paper's GA; ``rng`` makes it reproducible.

    Parameters
    ----------
    tables
        Stage time/energy tables; clock index ``n_clocks - 1`` is the top clock.
    budget_s
        The performance bound as a time: ``Per >= Per_lb`` <=> ``T <= budget_s``.
    stage_class
        LOW/HIGH per stage, for the prior individual.
    """
    n_stages, n_clocks = tables.shape
    top = n_clocks - 1
    base_t = float(tables.time_s[:, top].sum())
    pop = rng.integers(0, n_clocks, (population, n_stages))
    pop[0] = top
    pop[1] = np.where(np.asarray(stage_class) == LOW, 0, top)
    best, best_key = pop[0].copy(), (False, -np.inf)
    for _ in range(generations):
        time, energy = evaluate_plans(tables, pop)
        per = base_t / time
        power = energy / time
        ok = time <= budget_s * (1 + 1e-12)
        score = np.where(ok, 2.0, 1.0) * per**2 / power
        # keep the lowest-energy feasible plan seen (the score is the paper's search signal)
        if ok.any():
            j = int(np.flatnonzero(ok)[np.argmin(energy[ok])])
            key = (True, -float(energy[j]))
            if key > best_key:
                best, best_key = pop[j].copy(), key
        # score-proportional selection of parent pairs
        prob = score / score.sum()
        parents = rng.choice(population, size=(population, 2), p=prob)
        a, b = pop[parents[:, 0]], pop[parents[:, 1]]
        cut = rng.integers(1, max(n_stages, 2), population)[:, None]
        child = np.where(np.arange(n_stages)[None, :] < cut, a, b)  # tail swap
        flip = rng.random(child.shape) < mutation
        child[flip] = rng.integers(0, n_clocks, int(flip.sum()))
        child[0] = best  # elitism: the best plan survives
        pop = child
    time, energy = evaluate_plans(tables, best[None, :])
    switches = int(np.count_nonzero(np.diff(best)))
    return GAResult(
        best,
        float(time[0]),
        float(energy[0]),
        switches,
        bool(time[0] <= budget_s * (1 + 1e-12)),
        generations,
    )
