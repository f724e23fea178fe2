"""A pipeline-parallel job's dependency graph from each rank's own operator sequence.

Given one operator sequence per pipeline rank (a captured workload or a profile of it, rank 0
first, in pipeline order), the point-to-point operators give the cross-rank edges (DESIGN §4
"Many ranks"):

- **Kinds.** An op is a *send* or a *receive* when its type (its name, where the type is the
  name, as in torch traces: ``nccl:send``, ``c10d::send``, ``c10d::recv_``, ``Send``/``Recv``)
  contains ``send`` or ``recv``; one that names both (a batched ``ncclDevKernel_SendRecv``
  kernel) has no direction and is refused. A collective whose name matches ``barrier`` (a
  regular expression) is a barrier across every rank; other collectives (tensor- or
  data-parallel all-reduces, whose peers are outside this pipeline and run the same schedule)
  stay rank-local operators.
- **Peers.** Where the sequence recorded each message's other rank (the ``peer`` column: the
  recorder and a simulated GPU's profile keep the ``torch.distributed`` rank a send or receive
  names), that rank is the peer. Otherwise the ranks are a linear pipeline: activations go
  from rank ``r`` to ``r + 1``,
  gradients from ``r + 1`` back to ``r``. A message is a gradient when its op is in the
  ``backward`` phase (workloads) or its name says ``grad``/``backward``/``bwd``, an activation
  when its phase is ``forward`` or its name says ``activation``/``act``/``forward``/``fwd``; on the
  first and last rank the one neighbour decides. A middle rank's message with no such hint is
  refused (its peer is unknown).
- **Matching.** The k-th send from rank ``a`` to rank ``b`` is the k-th receive on ``b`` from
  ``a`` (NCCL and gloo match point-to-point messages in order per pair); a send or receive left
  over is an error naming its rank's file and the op.
- **Nodes.** Each send, receive and barrier op is a node of its own; each run of other ops
  between them is one node (it runs at one clock), its time and energy per clock the sums of
  its ops'. Edges: the rank's own order; from the node *before* a send (the moment the send is
  posted) to the matching receive (an eager send: the receiver's transfer starts once the
  sender posts it, so a message's transfer is on the path once, as the receive's time); each
  rank's node before a barrier into the barrier node (zero time, no rank), and the barrier into
  the rank's barrier op.

:class:`RankLayout` is the graph's structure alone (what the twin's whole-pipeline run needs
to compose the ranks); :meth:`RankLayout.problem` adds per-clock tables, and
:func:`rank_tables` makes them from a profile, measurements first (:mod:`opdvfs.plan.measured`).
:func:`plan_ranks` is the use case ``opdvfs plan --pipeline ranks``: the whole job planned from
one profile per rank, into one :class:`~opdvfs.schedule.PipelineSchedule`.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from opdvfs.devices.spec import DeviceSpec, VoltageCurve
from opdvfs.exceptions import InfeasibleError, ValidationError
from opdvfs.plan.dag import TIME_LIMIT_S, DagPlan, DagProblem, solve_dag
from opdvfs.plan.pipeline import PipelinePlan, pipeline_file, rank_energy_j
from opdvfs.profile import Profile
from opdvfs.schedule import PipelineSchedule, Schedule, Values

__all__ = [
    "BARRIER",
    "COMPUTE",
    "LAND_EARLY",
    "RECV",
    "SEND",
    "RankLayout",
    "RankOps",
    "RankTables",
    "RanksPlan",
    "files_as_ranks",
    "op_kinds",
    "plan_ranks",
    "rank_layout",
    "rank_schedule",
    "rank_tables",
]

#: How much earlier than its switch latency a switch up is issued, as a fraction of it
#: (:func:`rank_schedule`): the stretch before the stage runs with its kernels' noise (0.6% of
#: a 50 ms message is 0.3 ms; a tenth of a 15 ms latency is 1.5 ms), and a switch a little early
#: costs a little energy where one a little late runs a whole kernel at the lower clock.
LAND_EARLY = 0.1

#: Op kinds (:func:`op_kinds`).
COMPUTE, SEND, RECV, BARRIER = 0, 1, 2, 3

_GRADIENT = re.compile(r"grad|backward|bwd", re.IGNORECASE)
_ACTIVATION = re.compile(r"activation|forward|fwd|(?<![a-z])act(?![a-z])", re.IGNORECASE)


@dataclass(frozen=True)
class RankOps:
    """One rank's operator sequence, as the graph builder reads it.

    Parameters
    ----------
    names, types
        Each op's name and type (the type defaults to the name), shape (n_ops,).
    phases
        Each op's training phase (``forward``/``backward``/...), or None when unknown
        (profiles): then names give the messages' direction.
    source
        Where the sequence came from (a file name), named in error messages.
    peers
        Each op's recorded other rank (a send's destination, a receive's source; -1 for other
        ops or where not recorded), or None: then names and phases give the direction.
    """

    names: np.ndarray
    types: np.ndarray
    phases: np.ndarray | None = None
    source: str = "rank"
    peers: np.ndarray | None = None

    @classmethod
    def from_frame(cls, ops: pd.DataFrame, source: str) -> RankOps:
        """Read names, types and (when present) phases and peers from an op table."""
        names = ops["name"].astype(str).to_numpy()
        types = ops["type"].astype(str).to_numpy() if "type" in ops else names
        phases = ops["phase"].astype(str).to_numpy() if "phase" in ops else None
        peers = ops["peer"].to_numpy(dtype=np.int64) if "peer" in ops else None
        return cls(names, types, phases, source, peers)


def op_kinds(ops: RankOps, barrier: str | None = None) -> np.ndarray:
    """Return each op's kind: :data:`COMPUTE`, :data:`SEND`, :data:`RECV` or :data:`BARRIER`.

    Raises
    ------
    ValidationError
        For an op whose type names both a send and a receive (no direction).
    """
    types = pd.Series(ops.types, dtype="string")
    send = types.str.contains("send", case=False, regex=False).to_numpy(dtype=bool)
    recv = types.str.contains("recv", case=False, regex=False).to_numpy(dtype=bool)
    both = send & recv
    if both.any():
        i = int(np.flatnonzero(both)[0])
        raise ValidationError(
            f"{ops.source}: op {i} ({ops.names[i]}) is a batched send/receive with no direction: "
            "capture the host ops (nccl:send / nccl:recv) that launch it",
            field="name",
        )
    kind = np.where(send, SEND, np.where(recv, RECV, COMPUTE))
    if barrier is not None:
        names = pd.Series(ops.names, dtype="string")
        hit = names.str.contains(barrier, regex=True).to_numpy(dtype=bool)
        kind = np.where(hit & (kind == COMPUTE), BARRIER, kind)
    return kind.astype(np.int8)


def _peers(ops: RankOps, kind: np.ndarray, rank: int, n_ranks: int) -> np.ndarray:
    """Return the peer rank of each send/receive (-1 for other ops); see the module's rules."""
    p2p = (kind == SEND) | (kind == RECV)
    names = pd.Series(ops.names, dtype="string")
    gradient = names.str.contains(_GRADIENT).to_numpy(dtype=bool)
    activation = names.str.contains(_ACTIVATION).to_numpy(dtype=bool) & ~gradient
    if ops.phases is not None:
        gradient = np.where(ops.phases == "backward", True, gradient)
        activation = np.where(ops.phases == "forward", ~gradient, activation)
    # +1: the message flows down the pipeline (activations), -1: back up (gradients)
    flow = np.where(gradient, -1, np.where(activation, 1, 0))
    recorded = p2p & (ops.peers >= 0) if ops.peers is not None else np.zeros_like(p2p)
    if recorded.any():
        assert ops.peers is not None
        # a recorded peer is the direction itself: (peer - rank) for a send, against it for a
        # receive, so that ``rank +/- flow`` below gives the peer back
        flow = np.where(recorded, np.where(kind == SEND, 1, -1) * (ops.peers - rank), flow)
    if rank == 0:
        # rank 0 receives gradients from rank 1 and sends activations to it
        flow = np.where((flow == 0) & ~recorded, np.where(kind == SEND, 1, -1), flow)
    elif rank == n_ranks - 1:
        flow = np.where((flow == 0) & ~recorded, np.where(kind == SEND, -1, 1), flow)
    own = p2p & recorded & (flow == 0)
    if own.any():
        i = int(np.flatnonzero(own)[0])
        raise ValidationError(
            f"{ops.source}: op {i} ({ops.names[i]}) has itself (rank {rank}) as its peer",
            field="peer",
        )
    unknown = p2p & (flow == 0)
    if unknown.any():
        i = int(np.flatnonzero(unknown)[0])
        raise ValidationError(
            f"{ops.source}: op {i} ({ops.names[i]}): cannot tell the peer of a send/receive on "
            f"middle rank {rank}: name it with grad/backward (to rank {rank - 1} for a send) or "
            f"activation/forward (to rank {rank + 1}), or give the workload's phases",
            field="name",
        )
    # a send goes along the flow, a receive comes from against it
    peer = np.where(kind == SEND, rank + flow, rank - flow)
    bad = p2p & ((peer < 0) | (peer >= n_ranks))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        verb = "sends to" if kind[i] == SEND else "receives from"
        raise ValidationError(
            f"{ops.source}: op {i} ({ops.names[i]}) {verb} rank {int(peer[i])}, but {n_ranks} "
            f"rank file(s) were given (ranks 0-{n_ranks - 1}, in pipeline order)",
            field="rank",
        )
    return np.where(p2p, peer, -1)


@dataclass(frozen=True)
class RankLayout:
    """The dependency graph of a multi-rank job: its nodes (runs of ops) and edges.

    Attributes
    ----------
    n_ops
        Ops of each rank, shape (n_ranks,).
    node_rank
        Rank of each node, -1 for a barrier node, shape (n_nodes,).
    node_first_op, node_last_op
        First and last op (position on its rank) of each node; -1 for barrier nodes.
    node_kind
        Each node's kind (:data:`COMPUTE`, :data:`SEND`, :data:`RECV`, :data:`BARRIER`).
    names
        Each node's name (its first op's name, ``+k`` when it holds k more ops).
    edges
        Precedence pairs ``(before, after)`` of node indices, shape (n_edges, 2).
    n_messages
        Matched send/receive pairs.
    """

    n_ops: np.ndarray
    node_rank: np.ndarray
    node_first_op: np.ndarray
    node_last_op: np.ndarray
    node_kind: np.ndarray
    names: np.ndarray
    edges: np.ndarray
    n_messages: int

    @property
    def n_ranks(self) -> int:
        """Ranks of the job."""
        return len(self.n_ops)

    @property
    def n_nodes(self) -> int:
        """Nodes of the graph (barrier nodes included)."""
        return len(self.node_rank)

    def node_sums(self, rank: int, per_op: np.ndarray) -> np.ndarray:
        """Sum a per-op array of ``rank`` (shape (n_ops, ...)) over each of its nodes.

        NaN in any op of a node makes the node's sum NaN (an unavailable clock stays so).
        """
        starts = self.node_first_op[self.node_rank == rank]
        return np.add.reduceat(np.asarray(per_op, dtype=float), starts, axis=0)

    def problem(
        self,
        time_s: Sequence[np.ndarray],
        energy_j: Sequence[np.ndarray],
        freqs_mhz: np.ndarray,
        *,
        idle_before_s: Sequence[np.ndarray] | None = None,
        blocking_power_w: float = 0.0,
    ) -> DagProblem:
        """Return the planning problem: each node's time and energy at every clock.

        Parameters
        ----------
        time_s, energy_j
            Per rank, each op's time (s) and energy (J) at each clock, (n_ops, n_clocks); NaN
            where a clock is unavailable.
        freqs_mhz
            The clocks, ascending (MHz).
        idle_before_s
            Per rank, the idle time before each op (s), the same at every clock; a node's time
            includes it and its energy charges it at ``blocking_power_w``.
        blocking_power_w
            Power of a waiting rank (W), :mod:`opdvfs.plan.dag`'s energy definition.
        """
        n_clocks = len(freqs_mhz)
        time_rows, energy_rows = [], []
        for rank in range(self.n_ranks):
            t = np.asarray(time_s[rank], dtype=float)
            e = np.asarray(energy_j[rank], dtype=float)
            if t.shape != (int(self.n_ops[rank]), n_clocks) or e.shape != t.shape:
                raise ValidationError(
                    f"rank {rank}: tables {t.shape} / {e.shape}, expected "
                    f"({int(self.n_ops[rank])}, {n_clocks})",
                    field="time_s",
                )
            if idle_before_s is not None:
                gap = np.asarray(idle_before_s[rank], dtype=float)[:, None]
                t, e = t + gap, e + blocking_power_w * gap
            time_rows.append(self.node_sums(rank, t))
            energy_rows.append(self.node_sums(rank, e))
        time_tab = np.zeros((self.n_nodes, n_clocks))
        energy_tab = np.zeros((self.n_nodes, n_clocks))
        for rank in range(self.n_ranks):
            mine = self.node_rank == rank
            time_tab[mine], energy_tab[mine] = time_rows[rank], energy_rows[rank]
        return DagProblem(
            time_s=time_tab,
            energy_j=energy_tab,
            freqs_mhz=np.asarray(freqs_mhz, dtype=float),
            edges=self.edges,
            rank=self.node_rank,
            names=self.names,
            blocking_power_w=blocking_power_w,
        )

    def start_times(self, node_time_s: np.ndarray) -> np.ndarray:
        """Earliest start of every node (s) given each node's duration (barriers: 0)."""
        duration = np.asarray(node_time_s, dtype=float)[:, None]
        problem = DagProblem(
            time_s=duration,
            energy_j=np.zeros_like(duration),
            freqs_mhz=np.ones(1),
            edges=self.edges,
            rank=self.node_rank,
            names=self.names,
        )
        return problem.start_times(np.zeros(self.n_nodes, dtype=np.int64))


def _match(
    sends: pd.DataFrame, recvs: pd.DataFrame, sources: Sequence[str], names: Sequence[np.ndarray]
) -> pd.DataFrame:
    """Pair the k-th send of each (src, dst) with the k-th receive; error on a left-over one."""
    for frame in (sends, recvs):
        frame["k"] = frame.groupby(["src", "dst"], sort=False).cumcount()
    pairs = sends.merge(recvs, on=["src", "dst", "k"], how="outer", suffixes=("_s", "_r"))
    lost = pairs[pairs["node_r"].isna() | pairs["node_s"].isna()]
    if len(lost):
        row = lost.sort_values(["src", "dst", "k"]).iloc[0]
        src, dst = int(row["src"]), int(row["dst"])
        n_sent = int((sends["src"].eq(src) & sends["dst"].eq(dst)).sum())
        n_recv = int((recvs["src"].eq(src) & recvs["dst"].eq(dst)).sum())
        if pd.isna(row["node_r"]):
            op = int(row["op_s"])
            raise ValidationError(
                f"{sources[src]}: op {op} ({names[src][op]}) sends to rank {dst} with no "
                f"matching receive: rank {dst} ({sources[dst]}) receives {n_recv} message(s) "
                f"from rank {src}, which sends {n_sent}",
                field="name",
            )
        op = int(row["op_r"])
        raise ValidationError(
            f"{sources[dst]}: op {op} ({names[dst][op]}) receives from rank {src} with no "
            f"matching send: rank {src} ({sources[src]}) sends {n_sent} message(s) to rank "
            f"{dst}, which receives {n_recv}",
            field="name",
        )
    return pairs


def rank_layout(ranks: Sequence[RankOps], *, barrier: str | None = None) -> RankLayout:
    """Build the dependency graph of a job from each rank's op sequence (module rules).

    Parameters
    ----------
    ranks
        Each rank's ops, rank 0 first, in pipeline order.
    barrier
        Regular expression: collectives whose names match are barriers across every rank
        (matched in order: the k-th on each rank is barrier k). None: no barrier.

    Raises
    ------
    ValidationError
        A send or receive with no match, a peer outside the ranks given, a middle rank's
        message with no direction, ranks that reach a different number of barriers, or a
        graph with a cycle; each names the rank's source and the op.
    """
    n_ranks = len(ranks)
    if n_ranks < 2:
        raise ValidationError(
            f"a multi-rank graph needs >= 2 ranks' op sequences, got {n_ranks}", field="rank"
        )
    if barrier is not None:
        try:
            re.compile(barrier)
        except re.error as exc:
            raise ValidationError(
                f"barrier {barrier!r}: not a regular expression ({exc})"
            ) from None
    sources = [r.source for r in ranks]
    node_rank, first, last, kinds, names = [], [], [], [], []
    sends, recvs, barriers = [], [], []
    offset = 0
    for rank, ops in enumerate(ranks):
        kind = op_kinds(ops, barrier)
        peer = _peers(ops, kind, rank, n_ranks)
        n = len(kind)
        special = kind != COMPUTE
        opens = np.r_[True, special[1:] | special[:-1]]
        starts = np.flatnonzero(opens)
        ends = np.r_[starts[1:] - 1, n - 1]
        node_of_op = np.cumsum(opens) - 1 + offset
        node_rank.append(np.full(len(starts), rank))
        first.append(starts)
        last.append(ends)
        kinds.append(kind[starts])
        extra = ends - starts
        names.append(
            np.where(
                extra > 0,
                pd.Series(ops.names[starts], dtype=object) + "+" + pd.Series(extra).astype(str),
                ops.names[starts],
            )
        )
        is_send, is_recv = kind == SEND, kind == RECV
        # a send is posted when the node before it ends (-1: at the rank's start)
        node_before = node_of_op - 1
        node_before[node_of_op == offset] = -1
        sends.append(
            pd.DataFrame(
                {
                    "src": rank,
                    "dst": peer[is_send],
                    "op": np.flatnonzero(is_send),
                    "node": node_before[is_send],
                }
            )
        )
        recvs.append(
            pd.DataFrame(
                {
                    "src": peer[is_recv],
                    "dst": rank,
                    "op": np.flatnonzero(is_recv),
                    "node": node_of_op[is_recv],
                }
            )
        )
        at = np.flatnonzero(kind == BARRIER)
        barriers.append((node_of_op[at], node_before[at], at))
        offset += len(starts)
    ops_names = [r.names for r in ranks]
    pairs = _match(
        pd.concat(sends, ignore_index=True), pd.concat(recvs, ignore_index=True), sources, ops_names
    )
    counts = [len(b[0]) for b in barriers]
    if len(set(counts)) > 1:
        rank = int(np.argmin(counts))
        raise ValidationError(
            f"{sources[rank]}: reaches {counts[rank]} barrier(s) matching {barrier!r}, rank "
            f"{int(np.argmax(counts))} ({sources[int(np.argmax(counts))]}) {max(counts)}: every "
            "rank must reach every barrier",
            field="name",
        )
    node_rank_a = np.concatenate(node_rank)
    rank_nodes = len(node_rank_a)
    same = np.flatnonzero(node_rank_a[1:] == node_rank_a[:-1])
    own = np.c_[same, same + 1]
    posted = pairs[pairs["node_s"] >= 0]
    msg = np.c_[posted["node_s"].to_numpy(np.int64), posted["node_r"].to_numpy(np.int64)]
    n_barriers = counts[0]
    barrier_ids = rank_nodes + np.arange(n_barriers)
    into = [np.c_[b[1], barrier_ids][b[1] >= 0] for b in barriers]
    out = [np.c_[barrier_ids, b[0]] for b in barriers]
    edges = np.unique(np.r_[own, msg, *into, *out].reshape(-1, 2).astype(np.int64), axis=0)
    minus = np.full(n_barriers, -1)
    layout = RankLayout(
        n_ops=np.array([len(r.names) for r in ranks]),
        node_rank=np.r_[node_rank_a, minus],
        node_first_op=np.r_[np.concatenate(first), minus],
        node_last_op=np.r_[np.concatenate(last), minus],
        node_kind=np.r_[np.concatenate(kinds), np.full(n_barriers, BARRIER)].astype(np.int8),
        names=np.r_[np.concatenate(names), [f"barrier{k}" for k in range(n_barriers)]].astype(
            object
        ),
        edges=edges,
        n_messages=len(pairs),
    )
    from opdvfs.plan.dag import topological_levels

    try:
        topological_levels(layout.n_nodes, edges)
    except ValidationError:
        raise ValidationError(
            f"the ranks' sends, receives and barriers deadlock (a cycle in the graph of "
            f"{', '.join(sources)}): check the rank order and the message directions",
            field="name",
        ) from None
    return layout


@dataclass(frozen=True)
class RankTables:
    """One rank's per-op tables for planning (:func:`rank_tables`).

    Attributes
    ----------
    ops
        The rank's op sequence.
    freqs_mhz
        The clocks, ascending (MHz).
    time_s, energy_j
        Each op's time (s) and chip energy (J) at each clock, (n_ops, n_clocks).
    idle_before_s
        Idle time before each op (s).
    values
        ``measured`` (every cell measured) or ``auto`` (models filled some).
    device
        Device name, when known.
    """

    ops: RankOps
    freqs_mhz: np.ndarray
    time_s: np.ndarray
    energy_j: np.ndarray
    idle_before_s: np.ndarray
    values: Values
    device: str | None = None


def rank_tables(profile: Profile, spec: DeviceSpec | None = None, *, source: str) -> RankTables:
    """Return one rank's per-op time and energy at every clock, measurements first.

    Where the profile measured an op at a clock its median is used; models fitted on the
    profile fill only the clocks it did not measure, corrected through the measured points
    (:mod:`opdvfs.plan.measured`, as :func:`~opdvfs.plan.planner.predict` does for one rank);
    between two measured clocks an op's power comes from its measured ones
    (:func:`_power_between`). A cell the models fill with a negative
    time or energy is NaN (not planned on).

    Parameters
    ----------
    profile
        The rank's profile (one iteration's op sequence at one or more clocks, with power).
    spec
        The device planned for (its clocks); by default the profile's preset, else its clocks.
    source
        The profile's file name, for error messages.
    """
    from opdvfs.plan.planner import PlanInputs, predict

    # the raw medians, as the stage profiles' graph (pipeline_dag): a deadline on measured times
    inputs = PlanInputs.from_profile(profile, spec, shrink=False)
    assert inputs.measured is not None
    models = None
    values: Values = "measured"
    if not inputs.measured.covers(inputs.freqs_mhz):
        from opdvfs.models.bundle import ModelBundle
        from opdvfs.models.perf import PerfModel
        from opdvfs.models.power import PowerModel
        from opdvfs.sim.presets import preset_spec

        device = spec or preset_spec(inputs.device)
        models = ModelBundle(PerfModel().fit(profile), PowerModel().fit(profile, device=device))
        values = "auto"
    tables = predict(models, inputs, "auto")
    time_us, energy_j = tables.time_us, tables.chip_energy_j
    if models is not None:
        voltage = device.voltage if device is not None else None
        energy_j = _power_between(tables.freqs_mhz, time_us, energy_j, profile.freqs_mhz, voltage)
    first = profile.ops.drop_duplicates("op").sort_values("op")
    # a model's negative energy (a power fit on few, noisy sensor windows, off its data) is
    # no figure to plan on: that clock is unavailable to the op, as an unsupported one is
    unusable = (energy_j < 0) | (time_us < 0)
    return RankTables(
        ops=RankOps.from_frame(first, source),
        freqs_mhz=tables.freqs_mhz,
        time_s=np.where(unusable, np.nan, time_us * 1e-6),
        energy_j=np.where(unusable, np.nan, energy_j),
        idle_before_s=np.asarray(inputs.idle_before_us, dtype=float) * 1e-6,
        values=values,
        device=inputs.device,
    )


def _power_between(
    freqs_mhz: np.ndarray,
    time_us: np.ndarray,
    energy_j: np.ndarray,
    measured_mhz: np.ndarray,
    voltage: VoltageCurve | None,
) -> np.ndarray:
    """Return each op's energy with its power between two measured clocks taken from theirs.

    ``freqs_mhz``: the tables' clocks (ascending), ``time_us``/``energy_j`` each op's time and
    chip energy at them, (n_ops, n_clocks); ``measured_mhz``: the clocks the profile measured
    (their cells are measurements, left as they are, as are cells outside them). At a clock
    strictly between two measured ones, an op's power is interpolated between its measured
    powers linearly in ``f V(f)^2`` (the dynamic power's variable, paper Eq. 6; exact for
    ``u + alpha f V^2``) on the device's V-f curve; without one, the models' power held between
    the two. Either way it rises with the clock, as on every GPU measured, where a fit through
    few points need not: on the pipeline toy swept at 1410/1110/810 MHz (sim:a100-like) the
    power model (``u + theta V + alpha f V^2`` through each op's 3 points) bent at the V-f knee
    to 11% below the power measured at 810 MHz, a 900 MHz the stage plans chose for a saving
    that was not there. Not linear in ``f`` (a chord): power is convex in the clock, and across
    a wide gap its chord is far above it (a job of two ranks swept at 1410/1380/210 MHz then
    saved 2.1% where the models found 8.1%). The models' times are kept (1.7-2.1% short of the
    toy's kernels at 900 and 1020 MHz; a chord in ``1/f`` is far over them across a wide gap:
    the budget rounds measure it). An op without a positive power at both ends keeps the
    models'.
    """
    freqs = np.asarray(freqs_mhz, dtype=float)
    cols = np.flatnonzero(np.isin(np.round(freqs, 3), np.round(measured_mhz, 3)))
    if len(cols) < 2:
        return energy_j
    f_cols = freqs[cols]
    hi = np.clip(np.searchsorted(f_cols, freqs), 1, len(cols) - 1)
    lo = hi - 1
    inside = (freqs > f_cols[0]) & (freqs < f_cols[-1]) & ~np.isin(freqs, f_cols)
    with np.errstate(divide="ignore", invalid="ignore"):
        power_w = energy_j[:, cols] / time_us[:, cols]
        power_w[~(power_w > 0)] = np.nan  # nothing to take from a cell without a positive power
        if voltage is not None:
            x = freqs * np.asarray(voltage.voltage_v(freqs), dtype=float) ** 2
            w = (x - x[cols][lo]) / (x[cols][hi] - x[cols][lo])
            between_w = power_w[:, lo] * (1 - w) + power_w[:, hi] * w
        else:
            low_w = np.minimum(power_w[:, lo], power_w[:, hi])
            high_w = np.maximum(power_w[:, lo], power_w[:, hi])
            between_w = np.clip(energy_j / time_us, low_w, high_w)
        between_j = between_w * time_us
    return np.where(inside & np.isfinite(between_j), between_j, energy_j)


#: Most choices :func:`files_as_ranks` tries while placing files among a job's ranks (each a
#: file's rank checked against the files before it); past it, the best placement found so far.
PLACE_STEPS = 100_000


def files_as_ranks(ranks: Sequence[RankOps], barrier: str | None = None) -> list[RankOps]:
    """Return the ranks' ops with their recorded peers as positions among the files given.

    A recorded peer is the job's rank of the other end. File ``i`` is rank ``i`` where every
    peer is one of ``0 .. n-1``. Else the files are some of a larger job's ranks (one file per
    pipeline stage of a pipeline x data-parallel job: ranks 0, 2 and 4 of a 3 x 2 one; or a few
    consecutive stages' files: ranks 0 and 2), each placed at the rank the other files'
    messages name for it (:func:`_place_files`): file ``j`` is rank ``r`` only where every file
    that names ``r`` is one that ``j``'s own messages name, the files in ascending rank order;
    as many files placed as can be. A file no other file's messages name stays unplaced.
    A message whose peer is none of the placed files' is planned as an operator of its own
    rank (its type ``message``: no edge, no wait), with one warning naming the ranks absent.
    Peers not recorded (-1) are left to the direction rules.
    """
    n = len(ranks)
    kinds = [op_kinds(ops, barrier) for ops in ranks]
    recorded = [
        ((k == SEND) | (k == RECV)) & (ops.peers >= 0)
        if ops.peers is not None
        else np.zeros(len(ops.names), dtype=bool)
        for ops, k in zip(ranks, kinds, strict=True)
    ]
    peers = [
        np.where(rec, ops.peers, -1) if ops.peers is not None else np.full(len(rec), -1)
        for ops, rec in zip(ranks, recorded, strict=True)
    ]
    named = np.unique(np.concatenate([p[p >= 0] for p in peers]))
    if not named.size or named.max() < n:
        return list(ranks)
    job_rank = _place_files([set(np.unique(p[p >= 0]).tolist()) for p in peers])
    placed = [(r, i) for i, r in enumerate(job_rank) if r is not None]
    known = np.array([r for r, _ in placed] + [-1], dtype=np.int64)  # ascending, then a stop
    file_of = np.array([i for _, i in placed] + [-1], dtype=np.int64)
    out: list[RankOps] = []
    absent: set[int] = set()
    for ops, p, rec in zip(ranks, peers, recorded, strict=True):
        pos = np.minimum(np.searchsorted(known[:-1], p), len(known) - 1)
        away = rec & (known[pos] != p)
        absent.update(int(r) for r in np.unique(p[away]))
        types = np.where(away, "message", ops.types)
        out.append(replace(ops, types=types, peers=np.where(rec & ~away, file_of[pos], -1)))
    if absent:
        names = set(named.tolist())
        label = [
            str(r) if r is not None else str(i) if i not in names else "?"
            for i, r in enumerate(job_rank)
        ]
        warnings.warn(
            f"opdvfs: messages to rank(s) {', '.join(map(str, sorted(absent)))} (no file of "
            f"the {n} given: ranks {', '.join(label)}) are planned as operators of their own "
            "rank",
            stacklevel=3,
        )
    return out


def _place_files(names: Sequence[set[int]], limit: int = PLACE_STEPS) -> list[int | None]:
    """Return each file's job rank (None: unplaced) from the ranks its messages name.

    ``names[i]``: the ranks file ``i``'s sends and receives name. File ``i`` may be a rank
    another file names and it does not. Two placed files name each other or neither (a
    message has two ends); an unplaced file names no placed file's rank (its message would
    have no other end); placed ranks ascend with the files. Of the placements that hold, the
    first with the most files placed (a depth-first search, ranks ascending, unplaced last;
    at most ``limit`` choices tried).
    """
    n = len(names)
    domains = [sorted(set().union(*names[:i], *names[i + 1 :]) - names[i]) for i in range(n)]

    def fits(i: int, p: int | None, j: int, q: int | None) -> bool:
        """Whether file ``i`` at rank ``p`` and file ``j`` at ``q`` can both hold."""
        if p is None or q is None:
            return (p is None or p not in names[j]) and (q is None or q not in names[i])
        return p != q and (q in names[i]) == (p in names[j])

    best: list[int | None] = [None] * n
    best_placed = 0
    chosen: list[int | None] = []
    # each level: the choices left for its file; a choice is a rank or None (unplaced), and
    # -1 says the level's choices are all tried
    stack: list[Iterator[int | None]] = [iter([*domains[0], None])]
    steps = 0
    while stack and steps < limit:
        i = len(stack) - 1
        placed = sum(r is not None for r in chosen)
        p = next(stack[-1], -1)
        if p == -1 or placed + n - i <= best_placed:
            stack.pop()
            if chosen:
                chosen.pop()
            continue
        steps += 1
        if not all(fits(j, chosen[j], i, p) for j in range(i)):
            continue
        chosen.append(p)
        if i + 1 == n:
            total = placed + (p is not None)
            if total > best_placed:
                best, best_placed = list(chosen), total
            chosen.pop()
            continue
        last = max((r for r in chosen if r is not None), default=-1)
        stack.append(iter([*(r for r in domains[i + 1] if r > last), None]))
    return best


@dataclass(frozen=True)
class RanksPlan(PipelinePlan):
    """A job planned from one profile per rank (:func:`plan_ranks`).

    Attributes
    ----------
    layout
        The job's graph structure: ranks, nodes, messages.
    values
        ``measured`` (every rank measured every clock) or ``auto`` (models filled some).
    """

    layout: RankLayout
    values: Values


def plan_ranks(
    profiles: Sequence[Profile],
    target: float,
    *,
    sources: Sequence[str] | None = None,
    spec: DeviceSpec | None = None,
    blocking_power_w: float = 0.0,
    barrier: str | None = None,
    switch_latency_ms: float | None = None,
    time_limit_s: float | None = None,
) -> RanksPlan:
    """Plan every rank of a job together from one profile per rank: ``plan --pipeline ranks``.

    Each rank's tables come from its profile, measurements first (:func:`rank_tables`); its
    sends, receives and ``barrier`` collectives give the graph's edges (:func:`rank_layout`;
    recorded peers name the job's ranks, :func:`files_as_ranks` places them among the files);
    the graph is planned at once (:func:`~opdvfs.plan.dag.solve_dag`). Switches up are issued
    the switch latency ahead (:func:`rank_schedule`).

    Parameters
    ----------
    profiles
        One profile per pipeline rank, rank 0 first, all on the same device's clocks.
    target
        The allowed slowdown of the makespan (0.02 = 2%).
    sources
        The profiles' files, named in errors and (their names) in the schedule's workload
        (default ``rank0``, ``rank1``, ...).
    spec
        The device planned for (its clocks); by default each profile's preset.
    blocking_power_w
        Power (W) a rank draws while it waits, charged in the energy.
    barrier
        Regular expression of the collectives that are barriers across every rank.
    switch_latency_ms
        Default: the device's (``spec``, else rank 0's preset; 0 when unknown).
    time_limit_s
        Seconds the planner may search (default :data:`~opdvfs.plan.dag.TIME_LIMIT_S`).

    Raises
    ------
    ValidationError
        When the ranks were planned over different clocks, or their messages do not match.
    InfeasibleError
        When no plan meets the slowdown.
    """
    names = [str(s) for s in sources] if sources is not None else []
    names += [f"rank{r}" for r in range(len(names), len(profiles))]
    ranks = [rank_tables(p, spec, source=name) for p, name in zip(profiles, names, strict=True)]
    freqs = ranks[0].freqs_mhz
    for name, rank in zip(names, ranks, strict=True):
        if not np.array_equal(rank.freqs_mhz, freqs):
            raise ValidationError(
                f"{name}: planned over {rank.freqs_mhz.tolist()} MHz but {names[0]} over "
                f"{freqs.tolist()} MHz: profile every rank on the same device",
                field="freq_mhz",
            )
    ranks = [
        replace(r, ops=ops)
        for r, ops in zip(ranks, files_as_ranks([r.ops for r in ranks], barrier), strict=True)
    ]
    layout = rank_layout([r.ops for r in ranks], barrier=barrier)
    # the idle time a profile shows before a receive or a barrier is the wait for the other
    # ranks, which the graph's own edges give: not fixed idle time on top of them
    waits = [np.isin(op_kinds(r.ops, barrier), (RECV, BARRIER)) for r in ranks]
    problem = layout.problem(
        [r.time_s for r in ranks],
        [r.energy_j for r in ranks],
        freqs,
        idle_before_s=[
            np.where(w, 0.0, r.idle_before_s) for w, r in zip(waits, ranks, strict=True)
        ],
        blocking_power_w=blocking_power_w,
    )
    plan = solve_dag(problem, target, time_limit_s=time_limit_s or TIME_LIMIT_S)
    if plan.status == "infeasible":
        raise InfeasibleError(f"no plan of {len(ranks)} ranks meets a {target:.2%} slowdown")
    if switch_latency_ms is None:
        from opdvfs.sim.presets import preset_spec

        device_spec = spec or preset_spec(ranks[0].device)
        switch_latency_ms = device_spec.switch_latency_ms if device_spec is not None else 0.0
    values: Values = "measured" if all(r.values == "measured" for r in ranks) else "auto"
    schedule = rank_schedule(
        layout,
        problem,
        plan,
        target=target,
        values=values,
        device=ranks[0].device,
        workload=", ".join(Path(name).name for name in names),
        switch_latency_s=switch_latency_ms * 1e-3,
    )
    return RanksPlan(schedule, problem, plan, layout, values)


def rank_schedule(
    layout: RankLayout,
    problem: DagProblem,
    plan: DagPlan,
    *,
    target: float,
    values: Values = "measured",
    device: str | None = None,
    workload: str | None = None,
    n_microbatches: int | None = None,
    switch_latency_s: float = 0.0,
) -> PipelineSchedule:
    """Return each rank's own schedule of a plan of :meth:`RankLayout.problem`.

    Rank ``r``'s schedule covers its ops (``n_ops`` = the rank's op count, so an op-counting
    executor can apply it): one stage per run of equal clocks over its nodes, each with its
    planned start. Its time and energy fields are the rank's share of one iteration: the
    makespan, and the rank's computation plus its waiting at the blocking power.
    ``n_microbatches`` defaults to the messages rank 0 sends to rank 1.

    The graph's plan switches clocks instantly. A switch *up* that landed
    ``switch_latency_s`` late would run the start of its stage at the lower clock, on the
    critical path as likely as not; so it is issued that much ahead of the stage's start, and
    :data:`LAND_EARLY` of the latency more: triggered at the first op of the last node that
    starts by then, delayed by the rest (further back than one node when the nodes before are
    short messages). What runs in that last stretch before the stage runs at the higher clock
    (faster, a little more energy). A switch down is issued at its stage: its start runs at the
    old, higher clock (faster again), so the stage ends before its planned end; the switches up
    are timed on the timeline as run (:func:`_as_applied`), not the planned one: timed on the
    planned one, a switch up after a dip (a message at the lowest clock, planned 55 ms, run in
    51 ms at the clock before) landed after its stage began, and the stage's first kernel ran
    at the dip's clock (on the simulated GPU a kernel runs wholly at the clock it starts at: an
    optimizer step's 100 ms at 900 MHz took 455 ms at 210 MHz: the toy 1F1B pipeline's plan at
    5% measured +8.4%, +6.7% timed as run; the rest is the models' error at clocks the sweep did
    not measure). A stage shorter than the latency before a higher clock takes that
    clock (:func:`_without_short_dips`); the predictions are the adjusted plan's.
    """
    top = problem.top_clock()
    base_makespan = problem.evaluate(top)[0]
    clock = _without_short_dips(layout, problem, plan, switch_latency_s)
    makespan_s = float(problem.evaluate(clock)[0])
    start_s = problem.start_times(clock)
    freq_mhz = problem.freqs_mhz[clock]
    # the switches are timed on the timeline the schedule runs, not the planned one
    run_s = layout.start_times(_as_applied(layout, problem, clock, start_s, switch_latency_s))

    schedules = []
    for rank in range(layout.n_ranks):
        mine = layout.node_rank == rank
        freqs = freq_mhz[mine]
        change = np.flatnonzero(np.r_[True, freqs[1:] != freqs[:-1]])
        first_op = layout.node_first_op[mine]
        starts = run_s[mine]
        up = np.r_[False, freqs[change[1:]] > freqs[change[1:] - 1]]
        # issue at (stage start - latency - margin) on the timeline as run: triggered by the
        # last node that starts by then (a rank's starts ascend), delayed by the rest
        issue_s = starts[change] - switch_latency_s * (1 + LAND_EARLY)
        trigger = np.searchsorted(starts, issue_s, side="right") - 1
        # never before the stage before's own switch (issued later, it would replace this one)
        trigger = np.clip(trigger, np.r_[0, change[:-1]], np.maximum(change - 1, 0))
        lead = np.where(up, first_op[change] - first_op[trigger], 0)
        delay_us = np.where(up, np.maximum(issue_s - starts[trigger], 0.0) * 1e6, 0.0)
        schedules.append(
            Schedule.from_stage_freqs(
                first_op[change],
                freqs[change],
                n_ops=int(layout.n_ops[rank]),
                lead_ops=lead,
                delay_us=delay_us,
                start_s=start_s[mine][change],
                target=target,
                solver="dag",
                device=device,
                workload=f"{workload or 'job'}: rank {rank} of {layout.n_ranks}",
                values=values,
                baseline_time_s=float(base_makespan),
                predicted_time_s=makespan_s,
                baseline_energy_j=rank_energy_j(problem, top, float(base_makespan), mine),
                predicted_energy_j=rank_energy_j(problem, clock, makespan_s, mine),
                plan_seconds=plan.plan_seconds,
            )
        )
    if n_microbatches is None:
        n_microbatches = max(1, int(_messages(layout, 0, 1)))
    return pipeline_file(
        problem,
        plan,
        schedules,
        pipeline="ranks",
        n_microbatches=n_microbatches,
        target=target,
        device=device,
        workload=workload,
        clock=clock,
    )


def _as_applied(
    layout: RankLayout,
    problem: DagProblem,
    clock: np.ndarray,
    start_s: np.ndarray,
    latency_s: float,
) -> np.ndarray:
    """Return each node's time (s) as the schedule runs it: a switch down lands a latency late.

    In a stage below the one before, what starts before its switch lands (the stage's start
    plus ``latency_s`` on the planned timeline ``start_s``) runs at the clock before: a node of
    one op wholly (an op runs at the clock it starts at), a node of several ops its work up to
    the landing. The stage ends that much before its planned end.
    """
    rows = np.arange(layout.n_nodes)
    time_s = problem.time_s[rows, clock]
    if latency_s <= 0:
        return time_s
    applied = time_s.copy()
    for rank in range(layout.n_ranks):
        idx = np.flatnonzero(layout.node_rank == rank)
        c, starts = clock[idx], start_s[idx]
        first = np.flatnonzero(np.r_[True, c[1:] != c[:-1]])
        stage = np.repeat(np.arange(len(first)), np.diff(np.r_[first, len(idx)]))
        before = np.r_[c[0], c[first[1:] - 1]][stage]  # the clock before each node's stage
        old_s = problem.time_s[idx, before]
        left_s = starts[first][stage] + latency_s - starts  # until the switch lands
        early = (before > c) & (left_s > 0) & ~np.isnan(old_s)
        one_op = layout.node_first_op[idx] == layout.node_last_op[idx]
        at_old_s = np.where(one_op, old_s, np.minimum(left_s, old_s))
        done = np.divide(at_old_s, old_s, out=np.ones_like(old_s), where=old_s > 0)
        mixed = at_old_s + (1 - done) * time_s[idx]
        applied[idx] = np.where(early, mixed, time_s[idx])
    return applied


def _without_short_dips(
    layout: RankLayout, problem: DagProblem, plan: DagPlan, latency_s: float
) -> np.ndarray:
    """Return the plan's clocks with every stage shorter than the latency raised to the next's.

    A stage (run of equal clocks on a rank) that lasts less than the switch latency on the
    planned timeline, followed by a higher clock, is mostly never reached (its request is
    superseded by the next, issued a latency early) and forces the next switch up to be issued
    late; it runs at the next stage's clock instead (only ever faster, a little more energy).
    """
    clock = plan.clock.copy()
    if latency_s <= 0:
        return clock
    makespan = plan.makespan_s
    for rank in range(layout.n_ranks):
        idx = np.flatnonzero(layout.node_rank == rank)
        starts = plan.start_s[idx]
        while True:
            c = clock[idx]
            change = np.flatnonzero(np.r_[True, c[1:] != c[:-1]])
            length = np.r_[starts[change[1:]], makespan] - starts[change]
            nxt = np.r_[c[change[1:]], -1]
            dip = (length < latency_s) & (nxt > c[change])
            if not dip.any():
                break
            stage_clock = np.where(dip, nxt, c[change])
            clock[idx] = np.repeat(stage_clock, np.diff(np.r_[change, len(idx)]))
    return clock


def _messages(layout: RankLayout, src: int, dst: int) -> int:
    """Return the number of receive nodes on ``dst`` fed by a send of ``src``."""
    recv_nodes = np.flatnonzero((layout.node_rank == dst) & (layout.node_kind == RECV))
    if not recv_nodes.size:
        return 0
    from_src = layout.node_rank[layout.edges[:, 0]] == src
    feeds = np.isin(layout.edges[:, 1], recv_nodes) & from_src
    return int(feeds.sum())
