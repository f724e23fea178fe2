"""Building operator lists from layer shapes: forward ops, derived backward ops, optimizer ops.

Each op is a dict with ``name, type, stream, phase, flops, bytes_loaded, bytes_stored``.
Backward ops are derived from the forward list in reverse (a matmul's backward is two matmuls of
the same FLOPs, a norm's is its grad kernel, a tensor-parallel all-reduce's is another
all-reduce ...), so forward + backward matmul FLOPs are 3x the forward's, the ``6 N T`` rule.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

__all__ = ["OpList", "backward_of", "to_frame"]

Op = dict[str, Any]

#: forward type -> backward types (each with the forward's FLOPs and bytes); [] = no kernel.
_BACKWARD: dict[str, tuple[str, ...]] = {
    "MatMul": ("MatMul", "MatMul"),  # input grad, weight grad
    "BatchMatMul": ("BatchMatMul", "BatchMatMul"),
    "Conv2D": ("Conv2DBackpropInput", "Conv2DBackpropFilter"),
    "LayerNorm": ("LayerNormGrad",),
    "RMSNorm": ("RMSNormGrad",),
    "BNTraining": ("BNTrainingGrad",),
    "Gelu": ("GeluGrad",),
    "Relu": ("ReluGrad",),
    "SiLU": ("SiLUGrad",),
    "Softmax": ("SoftmaxGrad",),
    "Dropout": ("DropoutGrad",),
    "MaxPool": ("MaxPoolGrad",),
    "AvgPool": ("AvgPoolGrad",),
    "Embedding": ("EmbeddingGrad",),
    "CrossEntropy": ("CrossEntropyGrad",),
    "BiasAdd": ("BiasAddGrad",),
    "Transpose": ("Transpose",),
    "ChannelShuffle": ("ChannelShuffle",),
    "Concat": ("Split",),
    "Split": ("Concat",),
    "Mul": ("Mul",),
    "AllReduce": ("AllReduce",),  # tensor parallel: the conjugate collective
    "Add": (),  # a residual add's gradient is passed through (accumulated below)
    "Send": ("Recv",),
    "Recv": ("Send",),
}


class OpList:
    """An append-only list of operator dicts with shape-derived work."""

    def __init__(self) -> None:
        self.ops: list[Op] = []

    def add(
        self,
        name: str,
        type_: str,
        *,
        flops: float = 0.0,
        ld: float = 0.0,
        st: float = 0.0,
        stream: str = "compute",
        phase: str = "forward",
        host_us: float = 0.0,
    ) -> None:
        """Append one operator (FLOPs, bytes loaded, bytes stored)."""
        self.ops.append(
            {
                "name": name,
                "type": type_,
                "stream": stream,
                "phase": phase,
                "flops": float(flops),
                "bytes_loaded": float(ld),
                "bytes_stored": float(st),
                "host_us": float(host_us),
            }
        )

    def extend(self, ops: list[Op]) -> None:
        """Append a list of operator dicts."""
        self.ops.extend(ops)


def backward_of(forward: list[Op], prefix: str = "") -> list[Op]:
    """Backward ops of a forward op list, in reverse order, with the forward's work per op.

    A residual ``Add`` contributes a gradient accumulation ``Add`` instead of a kernel of its own.
    """
    out: list[Op] = []
    for op in reversed(forward):
        kinds = _BACKWARD.get(op["type"], (op["type"],))
        if op["type"] == "Add":
            kinds = ("Add",)
        for j, kind in enumerate(kinds):
            suffix = ("_dx", "_dw")[j] if len(kinds) == 2 else "_grad"
            out.append(
                {**op, "name": f"{prefix}{op['name']}{suffix}", "type": kind, "phase": "backward"}
            )
    return out


def to_frame(ops: list[Op]) -> pd.DataFrame:
    """Return the op dicts as a workload table."""
    return pd.DataFrame.from_records(ops)
