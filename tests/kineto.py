"""Build small Kineto-layout GPU traces (field names per Kineto output_json.cpp) for tests."""

from __future__ import annotations

import itertools
from typing import Any


class TraceBuilder:
    """Append host ops, launches and kernels with consistent External id / correlation links."""

    def __init__(self, pid: int = 100, tid: int = 100) -> None:
        self.events: list[dict[str, Any]] = []
        self.pid, self.tid = pid, tid
        self._ids = itertools.count(1)
        self.device_clock = 10_000.0

    def step(self, number: int, ts: float, dur: float) -> None:
        self.events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{number}",
                "pid": self.pid,
                "tid": self.tid,
                "ts": ts,
                "dur": dur,
                "args": {"External id": next(self._ids)},
            }
        )

    def op(
        self,
        name: str,
        ts: float,
        dur: float,
        kernels: list[tuple[str, float]],
        *,
        link: str = "external",
        stream: int = 7,
    ) -> int:
        """A cpu_op at ``ts`` launching ``kernels`` [(name, device_dur_us)]."""
        ext = next(self._ids)
        self.events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": name,
                "pid": self.pid,
                "tid": self.tid,
                "ts": ts,
                "dur": dur,
                "args": {"External id": ext, "Ev Idx": ext},
            }
        )
        for k, (kname, kdur) in enumerate(kernels):
            corr = next(self._ids) + 10_000
            launch_ts = ts + 1 + k
            self.events.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "pid": self.pid,
                    "tid": self.tid,
                    "ts": launch_ts,
                    "dur": 0.5,
                    "args": {"External id": ext, "cbid": 211, "correlation": corr},
                }
            )
            args: dict[str, Any] = {
                "queued": 0,
                "device": 0,
                "context": 1,
                "stream": stream,
                "correlation": corr,
            }
            if link == "external":
                args["External id"] = ext
            elif link == "orphan":
                args["correlation"] = corr + 999_999
            self.events.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": kname,
                    "pid": 0,
                    "tid": stream,
                    "ts": self.device_clock,
                    "dur": kdur,
                    "args": args,
                }
            )
            self.device_clock += kdur + 2.0
        return ext

    def doc(self, **extra: Any) -> dict[str, Any]:
        return {
            "schemaVersion": 1,
            "deviceProperties": [{"id": 0, "name": "NVIDIA H100"}],
            "traceEvents": self.events,
            "displayTimeUnit": "ms",
            **extra,
        }


def training_trace(
    steps: int = 3, *, freq_mhz: float | None = 1410.0, warmup_differs: bool = False
) -> dict[str, Any]:
    """``steps`` iterations of mm -> gelu -> allreduce (+ an op without kernels, an orphan)."""
    b = TraceBuilder()
    t = 0.0
    for s in range(steps):
        b.step(s + 5, t, 900.0)
        b.op("aten::mm", t + 10, 50, [("sm90_xmma_gemm_bf16", 120.0 + s)])
        b.op("aten::view", t + 70, 5, [])
        b.op(
            "aten::gelu",
            t + 100,
            40,
            [("vectorized_elementwise_kernel", 30.0), ("vectorized_elementwise_kernel", 10.0)],
            link="corr",
        )
        b.op(
            "nccl:all_reduce", t + 200, 40, [("ncclDevKernel_AllReduce_Sum_bf16", 300.0)], stream=20
        )
        if warmup_differs and s == 0:
            b.op("aten::copy_", t + 300, 10, [("Memcpy HtoD", 5.0)])
        t += 1000.0
    b.op("aten::add", t + 50, 10, [("stray", 1.0)], link="orphan")
    extra = {} if freq_mhz is None else {"opdvfs_freq_mhz": str(freq_mhz)}
    return b.doc(**extra)
