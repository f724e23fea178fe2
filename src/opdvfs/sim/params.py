"""Hidden physics of the simulated accelerator ("twin").

These constants are what the simulator knows and the models must *not* see: the models fit only
the profiles the simulator produces. Every preset's numbers name their source in
:mod:`opdvfs.sim.presets`.
"""

from __future__ import annotations

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt

from opdvfs._model import FrozenModel

__all__ = ["TwinParams"]


class TwinParams(FrozenModel):
    """Constants of the simulator's timeline, power, thermal and sensor models.

    Timeline (paper §4, eqs. 1-8): load/store throughput ``Tp(f) = min(C f core_num, BW)``,
    per-access overhead ``T0``, core compute at ``flops_per_cycle`` per core, an operator split
    into ``n`` tiles of about ``tile_bytes``.

    Power: core rail ``beta f V^2 + I_leak(T) V + cdyn a(f) f V^2`` with leakage exponential in
    temperature (``I_leak = leak_a * 2**((T - leak_ref_c) / leak_doubling_c)``; the paper's model
    is linear in T, so the twin is not the model) and activity ``a(f)`` from how busy the units
    really are at that clock; uncore rail ``uncore_idle_w`` plus energy per byte moved, plus
    non-AICore logic clocked with the AI cores (``uncore_coupled_w f V^2``, in gaps too) and
    non-AICore leakage with the same temperature law; chip = core + uncore + misc. Thermal:
    first-order RC, ``T_ss = ambient_c + k_c_per_w P_chip``.

    The parameters added for issue 18 default to the old physics (0 / None), so a preset that
    does not set them behaves as before; ``docs/twin-calibration.md`` says where the Ascend-like
    values come from.
    """

    # --- timeline
    core_num: PositiveInt
    ldst_bytes_per_cycle: PositiveFloat = Field(description="C of eq. (1), per core")
    uncore_bw_gbs: PositiveFloat = Field(description="BW_uncore of eq. (1), GB/s")
    access_overhead_ns: NonNegativeFloat = Field(description="T0 of eq. (3), per tile access")
    cube_flops_per_cycle: PositiveFloat = Field(description="matrix-unit FLOP/cycle per core")
    vector_flops_per_cycle: PositiveFloat = Field(description="vector-unit FLOP/cycle per core")
    tile_bytes: PositiveFloat = Field(description="bytes moved per tile (sets n)")
    max_tiles: PositiveInt = 64
    vector_ldst_bytes_per_cycle: PositiveFloat | None = Field(
        default=None,
        description="C of eq. (1) for vector-unit ops (None: as the cube's). Narrower vector "
        "load/store paths put the vector ops' saturation clock f_s inside the clock range",
    )
    tile_overhead_cycles: NonNegativeFloat = Field(
        default=0.0,
        description="core-domain cycles per tile (synchronisation, scalar set-up): "
        "clock-sensitive time even in a memory-bound op",
    )
    tile_spread: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="relative spread of a tile's load time around its mean (L2 hits vary tile "
        "to tile): 0 gives eq. (7)-(8)'s sharp max; > 0 blends the load- and compute-bound "
        "regimes smoothly (still convex)",
    )
    cube_bytes_per_flop: NonNegativeFloat = Field(
        default=0.0,
        description="operand re-reads from L2/HBM per matrix FLOP (tiling): a large matmul "
        "moves at least flops * this, so some are load-bound at the top clocks",
    )
    conv_bytes_per_flop: NonNegativeFloat | None = Field(
        default=None,
        description="operand re-reads per FLOP of a convolution (None: cube_bytes_per_flop). "
        "The cube's img2col (Load3D, L1 -> L0) expands input tiles on chip, so a convolution "
        "re-reads less from L2/HBM than a plain matmul of the same FLOPs",
    )
    launch_overhead_us: NonNegativeFloat = Field(description="fixed per-op launch cost")
    noise_rel: NonNegativeFloat = Field(description="multiplicative time noise (sigma)")
    jitter_us: NonNegativeFloat = Field(description="absolute time jitter (sigma)")
    comm_link_gbs: PositiveFloat = Field(description="collective bandwidth per device, GB/s")
    comm_latency_us: NonNegativeFloat = Field(description="collective start-up latency")
    # --- power
    core_beta_w: NonNegativeFloat = Field(description="beta: load-independent W per GHz V^2")
    core_cdyn_w: PositiveFloat = Field(description="W per GHz V^2 at full matrix-unit activity")
    vector_activity: PositiveFloat = Field(description="vector-unit power relative to matrix")
    mte_activity: NonNegativeFloat = Field(description="load/store-unit power relative to matrix")
    base_activity: NonNegativeFloat = Field(description="activity of an op's control overhead")
    stall_activity: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="share of a unit's busy power it still draws while stalled inside an op "
        "(clock tree, ungated pipeline registers): stalled cycles cost f V^2 too",
    )
    leak_a: NonNegativeFloat = Field(description="core leakage current at leak_ref_c (A)")
    leak_ref_c: float = 25.0
    leak_doubling_c: PositiveFloat = Field(description="leakage doubles every this many deg C")
    uncore_idle_w: NonNegativeFloat
    uncore_coupled_w: NonNegativeFloat = Field(
        default=0.0,
        description="non-AICore logic on the AI cores' clock and voltage, W per GHz V^2: "
        "chip rail, drawn in gaps too",
    )
    uncore_leak_w: NonNegativeFloat = Field(
        default=0.0,
        description="non-AICore leakage (W) at leak_ref_c, doubling every leak_doubling_c",
    )
    uncore_pj_per_byte: NonNegativeFloat = Field(description="HBM/L2 energy per byte moved")
    comm_w: NonNegativeFloat = Field(description="extra uncore power while a collective runs")
    misc_w: NonNegativeFloat = Field(description="rest of the chip/board (W)")
    # --- thermal (first-order RC)
    ambient_c: float
    k_c_per_w: PositiveFloat
    tau_s: PositiveFloat
    # --- sensors
    power_window_ms: PositiveFloat = Field(description="averaging window of one power sample")
    power_noise_w: NonNegativeFloat = 0.5
    temp_resolution_c: PositiveFloat = 1.0
