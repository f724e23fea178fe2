"""Launch every aten operator a program dispatches on a :class:`SimulatedGpu` (needs torch).

:class:`SimGpuFeed` is the workload recorder (:class:`~opdvfs.runtime.dispatch.WorkloadRecorder`)
with its rows sent to the simulated GPU as launches instead of kept: the same FLOPs, bytes and
counting as ``opdvfs capture``, so the executor's operator indices and the device's agree. The
aten name becomes the simulator's operator type (:data:`TWIN_TYPES`: a matmul runs on the matrix
units, a layer norm as a reduction ...); views and allocations start no kernel.

Enter it *before* an executor (lower on the dispatch-mode stack): the executor then sees each
operator first and issues its switch, and the device places the operator after, at the clock
that switch leaves in effect.
"""

from __future__ import annotations

import threading
from typing import Any

from opdvfs.runtime.dispatch import WorkloadRecorder
from opdvfs.runtime.simgpu import SimulatedGpu

__all__ = ["TWIN_TYPES", "SimGpuFeed"]

#: aten operator (name without namespace and overload) -> the simulator's operator type. Others
#: keep their aten name, which the simulator runs as a pipelined vector operator.
TWIN_TYPES: dict[str, str] = {
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

#: aten operators that start no kernel on a GPU besides views (allocations, metadata).
_NO_KERNEL = frozenset(
    {
        "aten::empty",
        "aten::empty_strided",
        "aten::empty_like",
        "aten::new_empty",
        "aten::new_empty_strided",
        "aten::lift_fresh",
        "aten::resize_",
        "aten::set_",
        "aten::_local_scalar_dense",
    }
)


class _Launcher(list[dict[str, Any]]):
    """Where the recorder appends each operator's row: a launch on the device, nothing kept."""

    def __init__(self, feed: SimGpuFeed) -> None:
        super().__init__()
        self._feed = feed

    def append(self, row: dict[str, Any]) -> None:
        """Launch ``row`` on the device (its type translated for the simulator)."""
        self._feed.launch(row)


class SimGpuFeed(WorkloadRecorder):
    """A dispatch mode that launches every aten operator on ``gpu``; iterations end there too.

    Parameters
    ----------
    gpu
        The simulated GPU the program runs on.
    optimizer_steps
        As :class:`~opdvfs.runtime.applier.IterationCounter`: iterations end at optimizer steps
        (or only at :meth:`mark_iteration`, for ``--iteration-at``).
    """

    def __init__(self, gpu: SimulatedGpu, *, optimizer_steps: bool = True) -> None:
        super().__init__(optimizer_steps=optimizer_steps)
        self.gpu = gpu
        self._current = _Launcher(self)
        self._views: set[str] = set()
        self._local = threading.local()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func._schema.name
        self._local.kernel = not (func.is_view or name in _NO_KERNEL)
        return super().__torch_dispatch__(func, types, args, kwargs)

    def launch(self, row: dict[str, Any]) -> None:
        """Launch the recorder's ``row`` for the operator being dispatched."""
        aten = row["type"]
        op = {**row, "type": TWIN_TYPES.get(aten, aten)}
        self.gpu.launch(op, kernel=getattr(self._local, "kernel", True))

    def end_iteration(self, n_ops: int) -> None:
        """End the device's iteration (its time and energy counter are recorded)."""
        self.gpu.mark_iteration()
