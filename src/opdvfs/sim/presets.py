"""Simulated device presets: the public ``DeviceSpec`` and the simulator's hidden ``TwinParams``.

Every preset is a simulated device, so presets live with the simulator;
:meth:`opdvfs.sim.SimulatedDevice.from_preset` builds one.

Presets are labelled *-like*: their numbers come from datasheets, the ASPLOS'25 paper and real
measurements, and every result on them is simulated. Sources, by constant:

* ascend-910b-like: 9 AI Core clocks 1000-1800 MHz, V flat below 1300 MHz (paper §5.1, Fig. 9),
  1 ms switch and ~1 ms power sensor (paper §7, lpmi_tool), SoC ~250 W / AICore ~46 W on GPT-3
  at 1800 MHz (paper Table 3, used to calibrate power), thermal slope k from paper Fig. 10
  (50 -> 85 deg C over 200 -> 400 W: 0.175 deg C/W). 24 AI cores with a 16x16x16 cube (8192
  FLOP/cycle), ~1.6 TB/s HBM (public 910B figures). The issue-18 constants (clock-coupled
  non-AICore power, per-cycle AICore share, vector f_s inside the range, per-tile overhead,
  matmul re-reads, tile spread, uncore leakage) are calibrated on facts that involve no DVFS
  outcome: ``docs/twin-calibration.md`` names each fact and ``benchmarks/twin_calibration.py``
  prints the twin beside it.
* a100-like: 108 SMs, NVML clock list 210-1410 MHz in 15 MHz steps, 312 TFLOP/s dense FP16
  tensor (2048 FLOP/cycle/SM), 2.0 TB/s HBM2e, 400 W TDP (NVIDIA A100 datasheet); ~15 ms clock
  switch (paper §5.3, V100 measurement); NVML power averaged over 100 ms.
* h100-like: 132 SMs, 210-1980 MHz, ~990 TFLOP/s dense BF16 (4096 FLOP/cycle/SM), 3.35 TB/s
  HBM3, 700 W TDP (NVIDIA H100 SXM datasheet); NVML power is a 1 s average on Hopper.
* v100-like: 80 SMs, NVML clocks floor(135 + 7.5 k) MHz up to 1530, 900 GB/s HBM2, 250 W; the
  load/store saturation clock (~960 MHz) and power split are calibrated so that the kernels'
  time-vs-clock and power-vs-clock shapes match the real V100 measurements of
  NV-DVFS-Benchmark (``benchmarks/v100_calibration.py`` prints the comparison); the V-f curve
  (flat to ~1040 MHz, then +0.25 mV/MHz) is fitted on the board power of its 138
  micro-benchmark kernels (``fit_voltage_curve``; ``benchmarks/power_models.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from opdvfs.devices.spec import DeviceSpec, VoltageCurve
from opdvfs.exceptions import ValidationError
from opdvfs.sim.params import TwinParams

__all__ = ["PRESETS", "Preset", "get_preset", "preset_spec"]


@dataclass(frozen=True)
class Preset:
    """A device preset: what the device exposes and what the simulator hides."""

    spec: DeviceSpec
    twin: TwinParams
    description: str


def _clocks(start: float, stop: float, step: float) -> tuple[float, ...]:
    return tuple(float(f) for f in np.arange(start, stop + step / 2, step))


_ASCEND = Preset(
    DeviceSpec(
        name="ascend-910b-like",
        vendor="ascend",
        simulated=True,
        freqs_mhz=_clocks(1000, 1800, 100),
        voltage=VoltageCurve(knee_mhz=1300, flat_v=0.75, slope_v_per_mhz=1.3e-4),
        switch_latency_ms=1.0,
        power_sample_period_ms=1.0,
        tdp_w=400.0,
        ambient_c=15.0,
        source="ASPLOS'25 paper (clocks, V-f, Table 3 power, Fig. 10 thermal); 910B public specs",
    ),
    TwinParams(
        core_num=24,
        ldst_bytes_per_cycle=80.0,
        uncore_bw_gbs=1600.0,
        access_overhead_ns=300.0,
        cube_flops_per_cycle=8192.0,
        vector_flops_per_cycle=512.0,
        tile_bytes=1 << 20,
        vector_ldst_bytes_per_cycle=46.0,
        tile_overhead_cycles=300.0,
        tile_spread=0.3,
        cube_bytes_per_flop=0.0062,
        conv_bytes_per_flop=0.0,
        launch_overhead_us=3.0,
        noise_rel=0.006,
        jitter_us=1.0,
        comm_link_gbs=150.0,
        comm_latency_us=15.0,
        core_beta_w=18.0,
        core_cdyn_w=17.2,
        vector_activity=0.45,
        mte_activity=0.25,
        base_activity=0.05,
        stall_activity=0.6,
        leak_a=5.0,
        leak_doubling_c=30.0,
        uncore_idle_w=91.0,
        uncore_coupled_w=28.0,
        uncore_leak_w=4.6,
        uncore_pj_per_byte=30.0,
        comm_w=15.0,
        misc_w=55.0,
        ambient_c=15.0,
        k_c_per_w=0.175,
        tau_s=4.0,
        power_window_ms=1.0,
    ),
    "Ascend 910B-like NPU (the paper's platform): 9 AI Core clocks, 1 ms switch, 1 ms sensor",
)

_A100 = Preset(
    DeviceSpec(
        name="a100-like",
        vendor="nvidia",
        simulated=True,
        freqs_mhz=_clocks(210, 1410, 15),
        voltage=VoltageCurve(knee_mhz=900, flat_v=0.70, slope_v_per_mhz=3.9e-4),
        switch_latency_ms=15.0,
        power_sample_period_ms=100.0,
        tdp_w=400.0,
        ambient_c=25.0,
        source="NVIDIA A100 SXM4 datasheet; 15 ms switch (paper §5.3); NVML 100 ms power",
    ),
    TwinParams(
        core_num=108,
        ldst_bytes_per_cycle=16.0,
        uncore_bw_gbs=1900.0,
        access_overhead_ns=200.0,
        cube_flops_per_cycle=2048.0,
        vector_flops_per_cycle=128.0,
        tile_bytes=1 << 20,
        launch_overhead_us=4.0,
        noise_rel=0.006,
        jitter_us=1.0,
        comm_link_gbs=200.0,
        comm_latency_us=10.0,
        core_beta_w=25.0,
        core_cdyn_w=200.0,
        vector_activity=0.4,
        mte_activity=0.3,
        base_activity=0.05,
        leak_a=18.0,
        leak_doubling_c=35.0,
        uncore_idle_w=30.0,
        uncore_pj_per_byte=25.0,
        comm_w=20.0,
        misc_w=25.0,
        ambient_c=25.0,
        k_c_per_w=0.12,
        tau_s=8.0,
        power_window_ms=100.0,
    ),
    "NVIDIA A100-like GPU: 81 SM clocks 210-1410 MHz, 15 ms switch, NVML 100 ms power",
)

_H100 = Preset(
    DeviceSpec(
        name="h100-like",
        vendor="nvidia",
        simulated=True,
        freqs_mhz=_clocks(210, 1980, 15),
        voltage=VoltageCurve(knee_mhz=1000, flat_v=0.70, slope_v_per_mhz=2.55e-4),
        switch_latency_ms=15.0,
        power_sample_period_ms=100.0,
        tdp_w=700.0,
        ambient_c=25.0,
        source="NVIDIA H100 SXM5 datasheet; 15 ms switch; NVML 1 s average power on Hopper",
    ),
    TwinParams(
        core_num=132,
        ldst_bytes_per_cycle=20.0,
        uncore_bw_gbs=3000.0,
        access_overhead_ns=150.0,
        cube_flops_per_cycle=4096.0,
        vector_flops_per_cycle=256.0,
        tile_bytes=1 << 20,
        launch_overhead_us=3.0,
        noise_rel=0.006,
        jitter_us=1.0,
        comm_link_gbs=400.0,
        comm_latency_us=8.0,
        core_beta_w=30.0,
        core_cdyn_w=300.0,
        vector_activity=0.4,
        mte_activity=0.3,
        base_activity=0.05,
        leak_a=30.0,
        leak_doubling_c=35.0,
        uncore_idle_w=45.0,
        uncore_pj_per_byte=22.0,
        comm_w=30.0,
        misc_w=35.0,
        ambient_c=25.0,
        k_c_per_w=0.08,
        tau_s=8.0,
        power_window_ms=1000.0,
    ),
    "NVIDIA H100-like GPU: 119 SM clocks 210-1980 MHz, 15 ms switch, NVML 1 s average power",
)

_V100 = Preset(
    DeviceSpec(
        name="v100-like",
        vendor="nvidia",
        simulated=True,
        freqs_mhz=tuple(float(np.floor(135 + 7.5 * k)) for k in range(187)),
        voltage=VoltageCurve(knee_mhz=1042.5, flat_v=0.712, slope_v_per_mhz=2.52e-4),
        switch_latency_ms=15.0,
        power_sample_period_ms=100.0,
        tdp_w=250.0,
        ambient_c=25.0,
        source="NVIDIA V100 SXM2 datasheet; calibrated on NV-DVFS-Benchmark V100 kernels",
    ),
    TwinParams(
        core_num=80,
        ldst_bytes_per_cycle=11.7,
        uncore_bw_gbs=900.0,
        access_overhead_ns=200.0,
        cube_flops_per_cycle=1024.0,
        vector_flops_per_cycle=128.0,
        tile_bytes=1 << 20,
        launch_overhead_us=5.0,
        noise_rel=0.006,
        jitter_us=1.0,
        comm_link_gbs=120.0,
        comm_latency_us=12.0,
        core_beta_w=8.0,
        core_cdyn_w=130.0,
        vector_activity=0.45,
        mte_activity=0.3,
        base_activity=0.05,
        leak_a=5.0,
        leak_doubling_c=35.0,
        uncore_idle_w=10.0,
        uncore_pj_per_byte=30.0,
        comm_w=15.0,
        misc_w=8.0,
        ambient_c=25.0,
        k_c_per_w=0.2,
        tau_s=6.0,
        power_window_ms=100.0,
    ),
    "NVIDIA V100-like GPU: 187 SM clocks 135-1530 MHz, calibrated on real V100 kernel data",
)

PRESETS: dict[str, Preset] = {p.spec.name: p for p in (_ASCEND, _A100, _H100, _V100)}


def get_preset(name: str) -> Preset:
    """Return the preset called ``name``.

    Raises
    ------
    ValidationError
        If there is none, naming the presets that exist.
    """
    if name not in PRESETS:
        raise ValidationError(
            f"unknown device {name!r}; expected one of {', '.join(PRESETS)}", field="device"
        )
    return PRESETS[name]


def preset_spec(name: str | None) -> DeviceSpec | None:
    """Return the ``DeviceSpec`` of preset ``name``, or None when ``name`` names no preset.

    For names that come from data (a profile's ``device`` field): a device opdvfs has no preset
    for is not an error, it just brings no clocks or V-f curve of its own.
    """
    preset = PRESETS.get(name) if name is not None else None
    return preset.spec if preset is not None else None
