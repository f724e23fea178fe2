"""Per-operator time and power at any core clock: the paper's timeline physics, vectorised.

Everything here is a pure function over arrays of shape ``(n_ops,)`` and ``(n_ops, n_freqs)``.
The timeline follows the paper's §4 (eqs. 1-8): load/store cycles ``max(a f, c) + T0 f`` per tile
and four PingPong/dependency scenarios built from them, so ``cycles(f)`` is convex and piecewise
linear in ``f`` and ``time(f) = cycles(f) / f``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd

from opdvfs.sim.params import TwinParams

__all__ = [
    "ATEN_TYPES",
    "FAMILIES",
    "Family",
    "OpArrays",
    "Timing",
    "core_power_w",
    "coupled_power_w",
    "leakage_scale",
    "op_arrays",
    "op_timing",
]

# Unit codes: which engine runs an op.
CUBE, VECTOR, COMM, FIXED = 0, 1, 2, 3


@dataclass(frozen=True)
class Family:
    """How one operator type runs: engine, double buffering, load/store dependency, efficiency."""

    unit: int
    pingpong: bool
    dependent: bool
    efficiency: float
    #: a convolution: the cube unit's img2col (Ascend's Load3D, L1 -> L0) expands each input
    #: tile on chip, so it re-reads less from L2/HBM per FLOP than a plain matmul
    img2col: bool = False


# The four timeline scenarios of the paper (eqs. 5-8), by how an op overlaps its loads,
# compute and stores.
_CUBE = Family(CUBE, pingpong=True, dependent=False, efficiency=0.85)  # eq. (7)
_CONV = Family(CUBE, pingpong=True, dependent=False, efficiency=0.85, img2col=True)  # eq. (7)
_VECTOR = Family(VECTOR, pingpong=True, dependent=False, efficiency=0.7)  # eq. (7)
_REDUCE = Family(VECTOR, pingpong=True, dependent=True, efficiency=0.6)  # eq. (8)
_MOVE = Family(VECTOR, pingpong=False, dependent=False, efficiency=0.6)  # eq. (5)
_GATHER = Family(VECTOR, pingpong=False, dependent=True, efficiency=0.3)  # eq. (6)
_COMM = Family(COMM, pingpong=False, dependent=False, efficiency=1.0)
_FIXED = Family(FIXED, pingpong=False, dependent=False, efficiency=1.0)

#: Operator type -> family. Types are Ascend-style names, which the workload builders emit;
#: unknown types run as pipelined vector ops.
_TYPES_BY_FAMILY = (
    (_CUBE, "MatMul BatchMatMul FlashAttention"),
    (_CONV, "Conv2D Conv2DBackpropInput Conv2DBackpropFilter"),
    (_VECTOR, "Add Mul RealDiv Gelu GeluGrad Relu ReluGrad Dropout DropoutGrad Cast AdamW"),
    (_VECTOR, "BiasAdd BiasAddGrad SiLU SiLUGrad RotaryEmb"),
    (_REDUCE, "Softmax SoftmaxGrad LayerNorm LayerNormGrad RMSNorm RMSNormGrad BNTraining"),
    (_REDUCE, "BNTrainingGrad ReduceSum ReduceMean MaxPool MaxPoolGrad AvgPool AvgPoolGrad"),
    (_REDUCE, "CrossEntropy CrossEntropyGrad"),
    (_MOVE, "Transpose Concat Split ChannelShuffle"),
    (_GATHER, "Gather GatherGrad Embedding EmbeddingGrad KVCacheWrite"),
    (_COMM, "AllReduce AllGather ReduceScatter Send Recv Broadcast"),
    (_FIXED, "AICPU Host"),
)
FAMILIES: dict[str, Family] = {
    name: family for family, names in _TYPES_BY_FAMILY for name in names.split()
}


#: aten operator (name without namespace and overload, as a captured workload's ``type``) -> the
#: Ascend-style type whose family it runs in, so a workload captured from a PyTorch script runs
#: its matmuls on the matrix units; other aten names run as pipelined vector operators.
ATEN_TYPES: dict[str, str] = {
    **dict.fromkeys(("mm", "addmm", "matmul", "linear", "_scaled_mm"), "MatMul"),
    **dict.fromkeys(("bmm", "baddbmm"), "BatchMatMul"),
    **dict.fromkeys(
        (
            "_scaled_dot_product_flash_attention",
            "_scaled_dot_product_efficient_attention",
            "_scaled_dot_product_cudnn_attention",
            "_flash_attention_forward",
            "_flash_attention_backward",
            "_efficient_attention_forward",
            "_efficient_attention_backward",
            "_scaled_dot_product_flash_attention_backward",
            "_scaled_dot_product_efficient_attention_backward",
        ),
        "FlashAttention",
    ),
    "convolution": "Conv2D",
    "convolution_backward": "Conv2DBackpropInput",
    "native_layer_norm": "LayerNorm",
    "native_layer_norm_backward": "LayerNormGrad",
    "_fused_rms_norm": "RMSNorm",
    "_softmax": "Softmax",
    "_softmax_backward_data": "SoftmaxGrad",
    "_log_softmax": "Softmax",
    "_log_softmax_backward_data": "SoftmaxGrad",
    "nll_loss_forward": "CrossEntropy",
    "nll_loss_backward": "CrossEntropyGrad",
    "embedding": "Embedding",
    "embedding_dense_backward": "EmbeddingGrad",
    "gelu": "Gelu",
    "gelu_backward": "GeluGrad",
    "relu": "Relu",
    "threshold_backward": "ReluGrad",
    "silu": "SiLU",
    "silu_backward": "SiLUGrad",
    **dict.fromkeys(("add", "add_", "sub", "sub_", "_foreach_add", "_foreach_add_"), "Add"),
    **dict.fromkeys(("mul", "mul_", "_foreach_mul", "_foreach_mul_"), "Mul"),
    **dict.fromkeys(("div", "div_", "_foreach_div", "_foreach_div_"), "RealDiv"),
    "sum": "ReduceSum",
    "mean": "ReduceMean",
    **dict.fromkeys(("cat", "stack"), "Concat"),
    **dict.fromkeys(("split_with_sizes", "unbind"), "Split"),
    **dict.fromkeys(("clone", "copy_", "_to_copy", "contiguous"), "Transpose"),
    **dict.fromkeys(("native_dropout", "native_dropout_backward"), "Dropout"),
    "_fused_adamw_": "AdamW",
    "_fused_adam_": "AdamW",
}


@dataclass(frozen=True)
class OpArrays:
    """Per-operator inputs of the physics, shape (n_ops,) each."""

    flops: np.ndarray
    bytes_ld: np.ndarray
    bytes_st: np.ndarray
    unit: np.ndarray
    pingpong: np.ndarray
    dependent: np.ndarray
    efficiency: np.ndarray
    img2col: np.ndarray
    activity: np.ndarray
    wait_us: np.ndarray

    def __len__(self) -> int:
        return len(self.flops)


def op_arrays(ops: pd.DataFrame) -> OpArrays:
    """Look up every operator's family (by ``type``; comm stream forces COMM) as arrays."""
    # looked up once per distinct type (a workload's types are categorical), then taken per op
    types = pd.Categorical(ops["type"])
    fam = [FAMILIES.get(ATEN_TYPES.get(t, t), _VECTOR) for t in types.categories]
    codes = types.codes
    comm = (ops["stream"] == "comm").to_numpy()
    host = (ops["stream"] == "host").to_numpy()
    unit = np.array([f.unit for f in fam], dtype=np.int8)[codes]
    unit[comm] = COMM
    unit[host] = FIXED
    return OpArrays(
        flops=ops["flops"].to_numpy(dtype=float),
        bytes_ld=ops["bytes_loaded"].to_numpy(dtype=float),
        bytes_st=ops["bytes_stored"].to_numpy(dtype=float),
        unit=unit,
        pingpong=np.array([f.pingpong for f in fam], dtype=bool)[codes],
        dependent=np.array([f.dependent for f in fam], dtype=bool)[codes],
        efficiency=np.array([f.efficiency for f in fam], dtype=float)[codes],
        img2col=np.array([f.img2col for f in fam], dtype=bool)[codes],
        activity=(
            ops["activity"] if "activity" in ops else pd.Series(1.0, index=ops.index)
        ).to_numpy(dtype=float),
        wait_us=(ops["wait_us"] if "wait_us" in ops else pd.Series(0.0, index=ops.index)).to_numpy(
            dtype=float
        ),
    )


@dataclass(frozen=True)
class Timing:
    """Clean (noise-free) timing of every op at every clock, shape (n_ops, n_freqs) each.

    ``core_busy``, ``ld_busy`` and ``st_busy`` are the shares of the op's cycles the compute
    unit and the load/store paths are busy: the pipeline ratios a CANN profiler reports.
    """

    time_us: np.ndarray
    cycles: np.ndarray
    core_busy: np.ndarray
    ld_busy: np.ndarray
    st_busy: np.ndarray


#: Rows per block of the elementwise (ops, clocks) tables: a million-op run would otherwise hold
#: a dozen full-size temporaries at once; a block's are ~8 MB each at 9 clocks.
_ROW_BLOCK = 1 << 17


def _row_blocks(n_rows: int) -> Iterator[slice]:
    """Slices of at most ``_ROW_BLOCK`` rows covering ``range(n_rows)``."""
    for start in range(0, n_rows, _ROW_BLOCK):
        yield slice(start, start + _ROW_BLOCK)


def op_timing(ops: OpArrays, freqs_mhz: np.ndarray, p: TwinParams) -> Timing:
    """Return the execution time of every op at every clock (paper eqs. 1-8), vectorised.

    Parameters
    ----------
    ops
        Per-op work, shape (n_ops,).
    freqs_mhz
        Core clocks, shape (n_freqs,).
    p
        Device constants.

    Returns
    -------
    Timing
        Arrays of shape (n_ops, n_freqs).
    """
    f = np.asarray(freqs_mhz, dtype=float)[None, :] * 1e6  # Hz
    cube = ops.unit == CUBE
    # A matmul re-reads its operand panels from L2/HBM once per output tile: its load volume is
    # at least its FLOPs times the re-read bytes per FLOP (eq. 3's M counts every byte moved),
    # which makes the largest matmuls load-bound at the top clocks (not perfectly clock-bound).
    # A convolution expands its input tiles on chip (img2col), so it re-reads less.
    reread = (
        p.cube_bytes_per_flop
        if p.conv_bytes_per_flop is None
        else np.where(ops.img2col, p.conv_bytes_per_flop, p.cube_bytes_per_flop)
    )
    bytes_ld = np.where(cube, np.maximum(ops.bytes_ld, ops.flops * reread), ops.bytes_ld)
    moved = bytes_ld + ops.bytes_st
    n = np.clip(np.round(moved / p.tile_bytes), 1, p.max_tiles)
    n = np.where(ops.pingpong, np.maximum(n, 2), n)[:, None]
    bw = p.uncore_bw_gbs * 1e9
    # eq. (1)-(2): the vector units' narrower load/store paths give them a higher f_s
    port_c = (
        p.ldst_bytes_per_cycle
        if p.vector_ldst_bytes_per_cycle is None
        else p.vector_ldst_bytes_per_cycle
    )
    port = np.where(ops.unit == VECTOR, port_c, p.ldst_bytes_per_cycle)[:, None] * p.core_num
    m_ld, m_st = (bytes_ld / n[:, 0])[:, None], (ops.bytes_st / n[:, 0])[:, None]
    # eq. (4): cycles of one tile's load/store, flat below f_s = BW / (C core_num), linear above
    ld, st = m_ld * f, m_st * f  # then / bw and max with the port's cycles, in place
    for cycles_tile, m in ((ld, m_ld), (st, m_st)):
        cycles_tile /= bw
        np.maximum(cycles_tile, m / port, out=cycles_tile)
    t0 = p.access_overhead_ns * 1e-9 * f
    per_cycle = np.where(cube, p.cube_flops_per_cycle, p.vector_flops_per_cycle)
    core = (ops.flops / (n[:, 0] * p.core_num * per_cycle * ops.efficiency))[:, None]
    pp, dep = ops.pingpong[:, None], ops.dependent[:, None]
    # the overlapped stage of a double-buffered tile: max(Cycle(Ld), Cycle(St), Cycle(core))
    other = st + t0
    np.maximum(other, core, out=other)
    other -= t0
    overlap = _mean_max(ld, other, p.tile_spread)
    del other
    overlap += t0
    # Each op takes one of eqs. (5)-(8) by its own flags, by row blocks: a million-op table
    # holds one (ops, clocks) result rather than four full-size candidates.
    cycles = np.empty(np.broadcast_shapes(ld.shape, core.shape))
    for b in _row_blocks(len(cycles)):
        ld_b, st_b, core_b, n_b, pp_b, dep_b = ld[b], st[b], core[b], n[b], pp[b], dep[b]
        cycles[b] = np.select(
            [~pp_b & ~dep_b, ~pp_b & dep_b, pp_b & ~dep_b],
            [
                ld_b
                + st_b
                + n_b * core_b
                + (n_b - 1) * np.maximum(ld_b, st_b)
                + (n_b + 1) * t0,  # eq. (5)
                n_b * (ld_b + st_b + core_b + 2 * t0),  # eq. (6)
                ld_b + core_b + st_b + (n_b - 1) * overlap[b] + 2 * t0,  # eq. (7)
            ],
            (n_b / 2) * (ld_b + core_b + st_b) + overlap[b] + n_b * t0,  # eq. (8)
        )
    # Per-tile synchronisation between the load, compute and store pipes (flag set/wait on the
    # scalar unit) is serial and counted in core cycles: even a load-bound op keeps a little
    # clock sensitivity (the paper's Gelu gives up ~2% at a lower clock).
    cycles = cycles + n * p.tile_overhead_cycles
    cycles = np.maximum(cycles, 1.0)
    time_us = cycles / f * 1e6 + p.launch_overhead_us
    # Collectives run on their own engine and links; fixed ops on the AI CPU / host: neither
    # depends on the core clock.
    # A collective or point-to-point op first waits for its peer (a pipeline bubble shows up as
    # a long Recv), then moves its bytes.
    raw = ops.bytes_ld + ops.bytes_st
    comm_us = p.comm_latency_us + raw / (p.comm_link_gbs * 1e3) + ops.wait_us
    fixed_us = p.launch_overhead_us + raw / 1e4 + ops.flops / 1e4
    off_core = ops.unit >= COMM
    comm, fixed = ops.unit == COMM, ops.unit == FIXED
    time_us[comm] = comm_us[comm, None]
    time_us[fixed] = fixed_us[fixed, None]
    del overlap

    def busy_share(work: np.ndarray) -> np.ndarray:
        """``min(work / cycles, 1)``, 0 off the core, in ``work`` when it is a full table."""
        share = np.divide(work, cycles, out=work if work.shape == cycles.shape else None)
        np.minimum(share, 1.0, out=share)
        share[off_core] = 0.0
        return share

    core_busy = busy_share(n * core)
    # n (ld + t0) / cycles, in the tile tables themselves (not needed after this)
    for tile in (ld, st):
        tile += t0
        tile *= n
    return Timing(
        time_us=time_us,
        cycles=cycles,
        core_busy=core_busy,
        ld_busy=busy_share(ld),
        st_busy=busy_share(st),
    )


def _mean_max(load: np.ndarray, other: np.ndarray, spread: float) -> np.ndarray:
    """``E[max(L, other)]`` with ``L`` uniform on ``load * [1 - spread, 1 + spread]``.

    With ``spread`` 0 this is eq. (7)-(8)'s ``max``. Real tiles do not all load alike (L2 hits
    vary), so an op's move from compute-bound to load-bound is gradual: the mean of the max is
    convex in the clock (a mean of convex functions) but not piecewise linear.
    """
    if spread == 0.0:
        return np.maximum(load, other)
    out = np.empty(np.broadcast_shapes(load.shape, other.shape))
    for b in _row_blocks(len(out)):
        load_b, other_b = np.broadcast_arrays(load[b], other[b])
        lo, hi = load_b * (1.0 - spread), load_b * (1.0 + spread)
        # wholly above the spread, or wholly below it; inside it, the blend
        out[b] = np.where(other_b >= hi, other_b, load_b)
        mid = (other_b > lo) & (other_b < hi)
        c, lo, hi = other_b[mid], lo[mid], hi[mid]
        out[b][mid] = (c * (c - lo) + 0.5 * (hi * hi - c * c)) / np.maximum(hi - lo, 1e-300)
    return out


def activity(ops: OpArrays, timing: Timing, p: TwinParams) -> np.ndarray:
    """Switching activity of the core rail while each op runs, shape (n_ops, n_freqs).

    A memory-bound op's compute units idle more at a high clock (their busy share falls), so its
    activity falls with the clock: a constant alpha per op is only an approximation of this.
    Stalled cycles are not free: a stalled unit draws ``stall_activity`` of its busy power.
    """
    unit_weight = np.where(ops.unit == CUBE, 1.0, p.vector_activity)[:, None]
    on_core = (ops.unit < COMM)[:, None]
    out = np.empty_like(timing.core_busy)
    for b in _row_blocks(len(out)):
        core_busy = timing.core_busy[b]
        # a stalled unit (waiting on its loads) still clocks: it costs f V^2 at stall_activity
        busy = core_busy + p.stall_activity * (1.0 - core_busy)
        a = (
            unit_weight[b] * busy
            + p.mte_activity * 0.5 * (timing.ld_busy[b] + timing.st_busy[b])
            + p.base_activity
        )
        out[b] = np.where(on_core[b], a * ops.activity[b, None], 0.0)
    return out


def core_power_w(
    act: np.ndarray | float,
    freq_mhz: np.ndarray | float,
    volt_v: np.ndarray | float,
    temp_c: np.ndarray | float,
    p: TwinParams,
    *,
    leak_scale: np.ndarray | None = None,
) -> np.ndarray:
    """Core-rail power: ``beta f V^2 + I_leak(T) V + cdyn a f V^2`` (f in GHz), broadcasting.

    Leakage is exponential in temperature (doubling every ``leak_doubling_c``), unlike the
    paper's linear model (eq. 10): the twin must not be the model it is used to test.
    ``leak_scale`` is :func:`leakage_scale` of ``temp_c`` when the caller already has it.
    """
    f_ghz = np.asarray(freq_mhz) / 1e3
    fv2 = f_ghz * np.asarray(volt_v) ** 2
    leak = p.leak_a * (leakage_scale(temp_c, p) if leak_scale is None else leak_scale)
    return p.core_beta_w * fv2 + leak * np.asarray(volt_v) + p.core_cdyn_w * np.asarray(act) * fv2


def leakage_scale(temp_c: np.ndarray | float, p: TwinParams) -> np.ndarray:
    """Leakage relative to ``leak_ref_c``: doubling every ``leak_doubling_c`` (exponential)."""
    return np.exp2((np.asarray(temp_c) - p.leak_ref_c) / p.leak_doubling_c)


def coupled_power_w(
    freq_mhz: np.ndarray | float,
    volt_v: np.ndarray | float,
    temp_c: np.ndarray | float,
    p: TwinParams,
    *,
    leak_scale: np.ndarray | None = None,
) -> np.ndarray:
    """Non-AICore chip power that follows the AI cores' clock and the chip's temperature.

    ``uncore_coupled_w f V^2`` (f in GHz) is the logic outside the metered AICore rail that runs
    on the AI cores' clock and voltage (on a 910B-class chip: the vector cores, the task
    scheduler, the L1/L2 interconnect slices); it is drawn whether or not an op runs, so it falls
    in gaps and bubbles too when the clock is lowered. The paper's Table 3 shows non-AICore SoC
    power falling 0.65-1x as much as AICore power, which stretched time alone cannot give.
    ``uncore_leak_w`` is the rest of the chip's leakage, with the same temperature law as the
    core's: a cooler chip (lower power) leaks less everywhere.
    """
    f_ghz = np.asarray(freq_mhz) / 1e3
    fv2 = f_ghz * np.asarray(volt_v) ** 2
    scale = leakage_scale(temp_c, p) if leak_scale is None else leak_scale
    return p.uncore_coupled_w * fv2 + p.uncore_leak_w * scale


def uncore_power_w(ops: OpArrays, time_us: np.ndarray, p: TwinParams) -> np.ndarray:
    """Uncore/HBM rail while each op runs: idle plus energy per byte moved; no clock scaling.

    The bytes are the op's own HBM traffic; a matmul's operand re-reads
    (``cube_bytes_per_flop``) are served mostly by L2 and are not charged here.
    The clock- and temperature-dependent non-AICore part is :func:`coupled_power_w`.
    """
    moved = (ops.bytes_ld + ops.bytes_st)[:, None]
    comm = np.where((ops.unit == COMM)[:, None], p.comm_w, 0.0)
    out = np.empty(np.broadcast_shapes(moved.shape, time_us.shape))
    for b in _row_blocks(len(out)):
        dynamic = p.uncore_pj_per_byte * 1e-12 * moved[b] / (time_us[b] * 1e-6)
        out[b] = p.uncore_idle_w + dynamic + comm[b]
    return out
