"""Lowtime's (Perseus's solver's) whole frontier on one graph; run in a scratch venv (issue 20).

Not part of opdvfs and never imported by it: ``benchmarks/pipeline_planning.py --lowtime-python
/tmp/lt/bin/python`` writes a graph to an ``.npz`` and runs this file with that interpreter
(``python3 -m venv /tmp/lt && /tmp/lt/bin/pip install lowtime``; lowtime 0.3.0, Apache-2.0).

The graph is solved as Perseus does (SOSP'24 §4-5): every instruction a lowtime
``Operation`` whose options are its measured (time, cost) pairs, cost = energy -
``p2p_power_w`` x time (effective energy), quantised to ``unit_time_s`` (1 ms), each operation
type's cost fitted by lowtime's ``ExponentialModel``; the Phillips-Dessouky iterations shorten the
makespan one quantum at a time from all-slowest to all-fastest, and every iteration's plan (its
clock per instruction) is recorded. The seconds timed are those of building the operations and
running the iterations (the plans are read back between iterations, as a frontier needs), as
wall time (``seconds``) and as this process's CPU time (``cpu_seconds``: comparable on a loaded
machine).

    /tmp/lt/bin/python benchmarks/_lowtime_frontier.py IN.npz OUT.npz
"""

from __future__ import annotations

import sys
import time

import networkx as nx
import numpy as np
from lowtime.cost_model import ExponentialModel
from lowtime.operation import (
    CandidateExecutionOptions,
    DummyOperation,
    ExecutionOption,
    Operation,
    OperationSpec,
)
from lowtime.solver import PhillipsDessouky


def main(src: str, dst: str) -> None:
    """Read the graph from ``src``, write every iteration's plan and the seconds to ``dst``."""
    data = np.load(src)
    time_s, cost_j = data["time_s"], data["cost_j"]
    edges, kind = data["edges"], data["kind"]
    unit = float(data["unit_time_s"])
    n = len(time_s)
    started, cpu_started = time.perf_counter(), time.process_time()
    specs: dict[int, OperationSpec] = {}
    for k in np.unique(kind):  # one spec (options + fitted cost model) per instruction type
        i = int(np.flatnonzero(kind == k)[0])
        cols = np.flatnonzero(np.isfinite(time_s[i]))
        options = CandidateExecutionOptions(
            options=[
                ExecutionOption(
                    real_time=float(time_s[i, c]),
                    unit_time=unit,
                    cost=float(cost_j[i, c]),
                    knob=int(c),
                )
                for c in cols
            ]
        )
        specs[int(k)] = OperationSpec(options=options, cost_model=ExponentialModel(options))
    dag = nx.DiGraph()
    ops = [Operation(spec=specs[int(kind[i])]) for i in range(n)]
    for i, op in enumerate(ops):
        dag.add_node(i, op=op)
    dag.add_edges_from((int(a), int(b)) for a, b in edges)
    source, sink = n, n + 1
    dag.add_node(source, op=DummyOperation())
    dag.add_node(sink, op=DummyOperation())
    indeg = np.bincount(edges[:, 1], minlength=n)
    outdeg = np.bincount(edges[:, 0], minlength=n)
    dag.add_edges_from((source, int(i)) for i in np.flatnonzero(indeg == 0))
    dag.add_edges_from((int(i), sink) for i in np.flatnonzero(outdeg == 0))
    dag.graph["source_node"], dag.graph["sink_node"] = source, sink
    plans = [[op.assigned_knob for op in ops]]
    for _ in PhillipsDessouky(dag).run():
        plans.append([op.assigned_knob for op in ops])
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_started
    np.savez(dst, plans=np.array(plans, dtype=np.int64), seconds=seconds, cpu_seconds=cpu_seconds)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
