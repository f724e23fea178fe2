"""Per-phase clocks for a generation loop against static clocks, on a simulated GPU (#36).

One run of the tiny GPT-2 of ``examples/generate_gpt2.py`` (random weights, bfloat16,
Hugging Face ``generate()`` with a KV cache; prompts of 256 tokens and 10 new ones, or with
``--vary`` 192-256 and 6-14) under ``opdvfs.tune(mode="generate")`` on ``sim:a100-like``, its
work scaled (``--work-scale``, default 800) so that a prefill is compute-bound (~23 ms) and a
decode step memory-bound (~7.6 ms). Every candidate is measured the same way, in A/B blocks of
whole requests against the top clock (ABBA, the first request of a block left out), and the
table prints, for each: the clocks per phase, TTFT and TPOT (ms, and their slowdown with the 95%
interval), energy per token (J) and the energy per token saved (95% interval):

- **top clock**: the reference blocks (of the applied round);
- **best static clock**: one clock for both phases (what ``nvidia-smi -lgc`` would lock);
- **static per phase**: each phase's best static clock, switched at the phase boundary;
- **per-op per-phase**: per-operator plans per phase (and their re-plans).

A candidate that sets the clocks of one measured before is not measured twice (on
``a100-like`` a clock switch takes 15 ms, longer than a decode step, so a per-operator plan
of a step has one stage: the per-phase static clocks).

    .venv/bin/python benchmarks/generate_vs_static.py [--requests 90] [--vary] [--target 0.05]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))


def _pct(mean: float, low: float, high: float) -> str:
    if not math.isfinite(mean):
        return "n/a"
    if not math.isfinite(low):
        return f"{mean * 100:+.1f}%"
    return f"{mean * 100:+.1f}% [{low * 100:+.1f}, {high * 100:+.1f}]"


def _mhz(fs: list[float]) -> str:
    return f"{fs[0]:g}" if len(fs) == 1 else f"{min(fs):g}-{max(fs):g}"


def main() -> None:
    """Run the loop tuned per phase and print every candidate's measured figures."""
    from generate_gpt2 import serve, tiny_gpt2

    import opdvfs

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=90)
    parser.add_argument("--vary", action="store_true")
    parser.add_argument("--target", type=float, default=0.05)
    parser.add_argument("--work-scale", type=float, default=800.0)
    parser.add_argument("--preset", default="a100-like")
    args = parser.parse_args()

    model = tiny_gpt2()
    t0 = time.perf_counter()
    with opdvfs.tune(
        args.target,
        actuator=f"sim:{args.preset}",
        work_scale=args.work_scale,
        mode="generate",
    ) as t:
        serve(model, args.requests, vary=args.vary)
    wall_s = time.perf_counter() - t0
    res = t.result
    counts = res.phase_counts()
    print(
        f"sim:{args.preset}, work scale {args.work_scale:g}, {args.requests} requests "
        f"({'varied' if args.vary else 'fixed'} lengths: {counts['prefill']} prefill, "
        f"{counts['decode']} decode steps), targets TTFT/TPOT +{args.target * 100:g}%; "
        f"{wall_s:.0f} s of CPU"
    )
    if res.error:
        print(f"error: {res.error}")
    header = (
        f"{'candidate':<28} {'prefill MHz':>11} {'decode MHz':>10} {'TTFT ms':>8} "
        f"{'TTFT slowdown':>22} {'TPOT ms':>8} {'TPOT slowdown':>22} {'J/token':>8} "
        f"{'energy/token saved':>24}"
    )
    print(header)
    ref = res.rounds[res.chosen] if res.chosen is not None else res.rounds[0]
    print(
        f"{'top clock (reference)':<28} {res.top_mhz:>11g} {res.top_mhz:>10g} "
        f"{ref.ref_ttft_s * 1e3:>8.2f} {'':>22} {ref.ref_tpot_s * 1e3:>8.2f} {'':>22} "
        f"{ref.ref_j_per_token:>8.4f} {'':>24}"
    )
    for i, r in enumerate(res.rounds):
        name = ("* " if i == res.chosen else "") + f"{i + 1}. {r.name}"
        print(
            f"{name:<28} {_mhz(r.clocks_mhz['prefill']):>11} {_mhz(r.clocks_mhz['decode']):>10} "
            f"{r.ttft_s * 1e3:>8.2f} {_pct(r.ttft.mean, r.ttft.low, r.ttft.high):>22} "
            f"{r.tpot_s * 1e3:>8.2f} {_pct(r.tpot.mean, r.tpot.low, r.tpot.high):>22} "
            f"{r.j_per_token:>8.4f} {_pct(r.saving.mean, r.saving.low, r.saving.high):>24}"
        )
    for name, (clocks, index) in res.skipped.items():
        same = "the top clock" if index is None else f"round {index + 1}'s clocks"
        print(
            f"{name:<28} {_mhz(clocks['prefill']):>11} {_mhz(clocks['decode']):>10}  "
            f"= {same}: not measured twice"
        )
    check = res.length_check
    if check.get("checked"):
        print(
            f"decode steps before / from position {check['split_at']} plan "
            f"{check['short_mhz']} / {check['long_mhz']} MHz: "
            + ("one plan for every length" if check["shared"] else "two length buckets")
        )
    else:
        print(f"decode lengths not checked: {check.get('why')}")
    print("* applied for the rest of the run; time-weighted mean clock of its tuned steps:")
    if res.chosen is not None:
        mean = res.rounds[res.chosen].mean_mhz
        print("  " + ", ".join(f"{p} {f:.0f} MHz" for p, f in mean.items()))


if __name__ == "__main__":
    main()
