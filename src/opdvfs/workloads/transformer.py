"""Transformer workloads: GPT-3 (tensor + pipeline parallel), BERT, ViT training; LLaMA-2 decoding.

Work per op follows from the shapes (``t`` tokens, hidden ``h``, FFN ``f``, ``tp``-way tensor
parallel shards); bytes are BF16/FP16 (2 bytes) activations and weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from opdvfs.workloads._oplist import Op, OpList, backward_of, to_frame
from opdvfs.workloads.workload import Workload

__all__ = [
    "TransformerConfig",
    "llama2_decode",
    "one_f_one_b",
    "pipeline_waits_us",
    "transformer_training",
]

B = 2  # bytes per element (BF16 / FP16)


@dataclass(frozen=True)
class TransformerConfig:
    """Shape of a transformer training job as seen by one device."""

    name: str
    layers: int  # layers on this device
    hidden: int
    heads: int
    ffn: int
    seq: int
    micro_batch: int
    microbatches: int = 1
    vocab: int = 0  # 0: no embedding/head on this device
    tp: int = 1
    pp: int = 1
    stage: int = 0  # pipeline stage of this device
    causal: bool = True
    patch_embed: int = 0  # ViT: patch size (conv stem) instead of a token embedding

    @property
    def tokens(self) -> int:
        """Tokens per microbatch."""
        return self.micro_batch * self.seq

    @property
    def layer_params(self) -> int:
        """Weight parameters of one layer's shard (matmul weights only)."""
        return (4 * self.hidden * self.hidden + 2 * self.hidden * self.ffn) // self.tp


def _layer_forward(c: TransformerConfig, i: int) -> list[Op]:
    t, h, hp, fp = c.tokens, c.hidden, c.hidden // c.tp, c.ffn // c.tp
    nh, d = c.heads // c.tp, c.hidden // c.heads
    bh = c.micro_batch * nh
    s = c.seq
    o = OpList()
    p = f"layer{i}."
    o.add(p + "ln1", "LayerNorm", flops=8 * t * h, ld=t * h * B, st=t * h * B)
    o.add(
        p + "qkv",
        "MatMul",
        flops=2 * t * h * 3 * hp,
        ld=(t * h + h * 3 * hp) * B,
        st=t * 3 * hp * B,
    )
    o.add(p + "qkv_transpose", "Transpose", ld=3 * t * hp * B, st=3 * t * hp * B)
    o.add(
        p + "scores",
        "BatchMatMul",
        flops=2 * bh * s * s * d,
        ld=2 * bh * s * d * B,
        st=bh * s * s * B,
    )
    o.add(p + "scale", "Mul", flops=bh * s * s, ld=bh * s * s * B, st=bh * s * s * B)
    o.add(p + "softmax", "Softmax", flops=5 * bh * s * s, ld=bh * s * s * B, st=bh * s * s * B)
    o.add(
        p + "attn_dropout",
        "Dropout",
        flops=2 * bh * s * s,
        ld=bh * s * s * B,
        st=bh * s * s * (B + 1),
    )
    o.add(
        p + "context",
        "BatchMatMul",
        flops=2 * bh * s * s * d,
        ld=(bh * s * s + bh * s * d) * B,
        st=bh * s * d * B,
    )
    o.add(p + "context_transpose", "Transpose", ld=t * hp * B, st=t * hp * B)
    o.add(p + "proj", "MatMul", flops=2 * t * hp * h, ld=(t * hp + hp * h) * B, st=t * h * B)
    if c.tp > 1:
        o.add(p + "proj_allreduce", "AllReduce", ld=t * h * B, st=t * h * B, stream="comm")
    o.add(p + "proj_dropout", "Dropout", flops=2 * t * h, ld=t * h * B, st=t * h * (B + 1))
    o.add(p + "residual1", "Add", flops=t * h, ld=2 * t * h * B, st=t * h * B)
    o.add(p + "ln2", "LayerNorm", flops=8 * t * h, ld=t * h * B, st=t * h * B)
    o.add(p + "fc1", "MatMul", flops=2 * t * h * fp, ld=(t * h + h * fp) * B, st=t * fp * B)
    o.add(p + "gelu", "Gelu", flops=8 * t * fp, ld=t * fp * B, st=t * fp * B)
    o.add(p + "fc2", "MatMul", flops=2 * t * fp * h, ld=(t * fp + fp * h) * B, st=t * h * B)
    if c.tp > 1:
        o.add(p + "fc2_allreduce", "AllReduce", ld=t * h * B, st=t * h * B, stream="comm")
    o.add(p + "mlp_dropout", "Dropout", flops=2 * t * h, ld=t * h * B, st=t * h * (B + 1))
    o.add(p + "residual2", "Add", flops=t * h, ld=2 * t * h * B, st=t * h * B)
    return o.ops


def _embedding(c: TransformerConfig) -> list[Op]:
    o = OpList()
    t, h = c.tokens, c.hidden
    if c.patch_embed:
        k = c.patch_embed
        o.add(
            "patch_embed",
            "Conv2D",
            flops=2 * t * h * 3 * k * k,
            ld=(t * 3 * k * k + h * 3 * k * k) * B,
            st=t * h * B,
        )
        o.add("pos_embed_add", "Add", flops=t * h, ld=2 * t * h * B, st=t * h * B)
    else:
        o.add("embedding", "Embedding", ld=t * h * B + t * 4, st=t * h * B)
        o.add("pos_embed_add", "Add", flops=t * h, ld=2 * t * h * B, st=t * h * B)
    o.add("embed_dropout", "Dropout", flops=2 * t * h, ld=t * h * B, st=t * h * (B + 1))
    return o.ops


def _head(c: TransformerConfig) -> list[Op]:
    o = OpList()
    t, h, v = c.tokens, c.hidden, c.vocab // c.tp
    o.add("final_ln", "LayerNorm", flops=8 * t * h, ld=t * h * B, st=t * h * B)
    o.add("lm_head", "MatMul", flops=2 * t * h * v, ld=(t * h + h * v) * B, st=t * v * B)
    o.add("cross_entropy", "CrossEntropy", flops=5 * t * v, ld=t * v * B, st=t * 4)
    return o.ops


def _microbatch(c: TransformerConfig, mb: int) -> tuple[list[Op], list[Op]]:
    """Forward and backward ops of one microbatch on this device."""
    fwd: list[Op] = []
    first, last = c.stage == 0, c.stage == c.pp - 1
    act = c.tokens * c.hidden * B
    if c.pp > 1 and not first:
        fwd.append(_comm("recv_activation", "Recv", act))
    if first and c.vocab:
        fwd += _embedding(c)
    for i in range(c.layers):
        fwd += _layer_forward(c, i)
    if last and c.vocab:
        fwd += _head(c)
    if c.pp > 1 and not last:
        fwd.append(_comm("send_activation", "Send", act))
    fwd = [{**op, "name": f"mb{mb}.{op['name']}"} for op in fwd]
    return fwd, backward_of(fwd)


def _comm(name: str, kind: str, nbytes: float) -> Op:
    o = OpList()
    o.add(name, kind, ld=nbytes, st=nbytes, stream="comm")
    return o.ops[0]


def _optimizer(c: TransformerConfig) -> list[Op]:
    """Data-parallel gradient all-reduce (bucketed) and a fused AdamW per weight tensor."""
    o = OpList()
    h, hp, fp = c.hidden, c.hidden // c.tp, c.ffn // c.tp
    shapes = {
        "qkv": h * 3 * hp,
        "proj": hp * h,
        "fc1": h * fp,
        "fc2": fp * h,
        "qkv_bias": 3 * hp,
        "proj_bias": h,
        "fc1_bias": fp,
        "fc2_bias": h,
        "ln1_gamma": h,
        "ln1_beta": h,
        "ln2_gamma": h,
        "ln2_beta": h,
    }
    grad_bytes = c.layers * sum(shapes.values()) * B
    buckets = max(1, c.layers // 2)
    for k in range(buckets):
        o.add(
            f"grad_allreduce{k}",
            "AllReduce",
            ld=grad_bytes / buckets,
            st=grad_bytes / buckets,
            stream="comm",
            phase="optimizer",
        )
    o.add(
        "grad_norm",
        "ReduceSum",
        flops=c.layers * sum(shapes.values()),
        ld=grad_bytes,
        st=4,
        phase="optimizer",
    )
    for i in range(c.layers):
        for name, n in shapes.items():
            # AdamW reads param, grad, m, v (fp32 states) and writes param, m, v.
            o.add(
                f"layer{i}.{name}.adamw",
                "AdamW",
                flops=12 * n,
                ld=n * (B + B + 8),
                st=n * (B + 8),
                phase="optimizer",
            )
    return o.ops


#: Peers' nominal rates (a 910B-like device at its top clock), to size the pipeline bubble:
#: the waits are the other stages' work, which this device's clock does not change.
_PEER_TFLOPS = 300.0
_PEER_MEM_GBS = 1600.0
_PEER_LINK_GBS = 150.0


def _nominal_us(ops: list[Op]) -> float:
    """Roofline time of an op list on a peer: compute or memory bound per op, links for comm."""
    total = 0.0
    for op in ops:
        moved = op["bytes_loaded"] + op["bytes_stored"]
        if op["stream"] == "comm":
            total += moved / (_PEER_LINK_GBS * 1e3)
        else:
            total += max(op["flops"] / (_PEER_TFLOPS * 1e6), moved / (_PEER_MEM_GBS * 1e3))
    return total


def one_f_one_b(pp: int, microbatches: int, stage: int) -> list[tuple[str, int]]:
    """Return the 1F1B order of passes on ``stage``: warm-up forwards, alternate F/B, drain."""
    warm = min(pp - stage - 1, microbatches)
    order = [("F", mb) for mb in range(warm)]
    for mb in range(warm, microbatches):
        order += [("F", mb), ("B", mb - warm)]
    order += [("B", mb) for mb in range(microbatches - warm, microbatches)]
    return order


def pipeline_waits_us(pp: int, microbatches: int, fwd_us: float, bwd_us: float) -> np.ndarray:
    """Wait before every pass of every stage of a 1F1B pipeline, shape (pp, 2 * microbatches).

    Every stage runs a forward in ``fwd_us`` and a backward in ``bwd_us``; a forward needs the
    previous stage's forward of that microbatch, a backward the next stage's backward. In steady
    state every stage repeats with stage 0's period, so a stage's first wait also covers the
    time it sat idle at the end of the previous iteration. Each stage idles
    ``(pp - 1) * (fwd_us + bwd_us)`` per iteration in all.
    """
    orders = [one_f_one_b(pp, microbatches, s) for s in range(pp)]
    done: dict[tuple[str, int, int], float] = {}
    start = np.zeros((pp, 2 * microbatches))
    end = np.zeros_like(start)
    free = [0.0] * pp
    nxt = [0] * pp
    while any(nxt[s] < len(orders[s]) for s in range(pp)):
        for s in range(pp):
            while nxt[s] < len(orders[s]):
                kind, mb = orders[s][nxt[s]]
                dep = (kind, mb, s - 1) if kind == "F" else (kind, mb, s + 1)
                ready = 0.0 if not 0 <= dep[2] < pp else done.get(dep)
                if ready is None:
                    break  # the peer has not produced it yet
                begin = max(free[s], ready)
                start[s, nxt[s]] = begin
                free[s] = end[s, nxt[s]] = begin + (fwd_us if kind == "F" else bwd_us)
                done[(kind, mb, s)] = free[s]
                nxt[s] += 1
    # a stage's first pass follows its previous iteration's last, shifted by stage 0's period
    prev_end = np.c_[end[:, -1] - end[0, -1], end[:, :-1]]
    return start - prev_end


def transformer_training(c: TransformerConfig, *, description: str) -> Workload:
    """One training iteration: 1F1B pipeline schedule over microbatches, then the optimizer.

    With ``pp`` stages, the device runs ``pp - stage - 1`` warm-up forwards, then alternates one
    forward and one backward, then drains the backwards. The pipeline bubble is where a stage
    waits for its peers: the wait of the ``Recv`` that opens the pass (``wait_us``), sized by a
    1F1B timeline of every stage at nominal peer rates (:func:`pipeline_waits_us`).
    """
    passes = [_microbatch(c, mb) for mb in range(c.microbatches)]
    order = one_f_one_b(c.pp, c.microbatches, c.stage) if c.pp > 1 else None
    if order is None:
        order = [(k, mb) for mb in range(c.microbatches) for k in ("F", "B")]
        waits = np.zeros(len(order))
    else:
        fwd_us, bwd_us = _nominal_us(passes[0][0]), _nominal_us(passes[0][1])
        waits = pipeline_waits_us(c.pp, c.microbatches, fwd_us, bwd_us)[c.stage]
    ops: list[Op] = []
    for (kind, mb), wait in zip(order, waits, strict=True):
        body = passes[mb][0 if kind == "F" else 1]
        if wait > 0:
            if body[0]["type"] != "Recv":  # a pass waits on the message that opens it
                raise AssertionError(f"pass {kind}{mb} waits {wait:.0f} us but opens with no Recv")
            body = [{**body[0], "wait_us": float(wait)}, *body[1:]]
        ops += body
    ops += _optimizer(c)
    frame = to_frame(ops)
    frame["wait_us"] = frame["wait_us"].fillna(0.0) if "wait_us" in frame else 0.0
    weight_params = c.layers * c.layer_params
    if c.vocab and c.stage == c.pp - 1:
        weight_params += c.hidden * c.vocab // c.tp
    meta = {
        "description": description,
        "config": c.__dict__,
        "weight_params_on_device": weight_params,
        "tokens_per_iteration": c.tokens * c.microbatches,
        "pipeline_wait_us": float(np.sum(waits)),
    }
    return Workload(frame, name=c.name, meta=meta)


def llama2_decode(
    *,
    layers: int = 32,
    hidden: int = 4096,
    ffn: int = 11008,
    heads: int = 32,
    vocab: int = 32000,
    context: int = 512,
    host_us: float = 40.0,
) -> Workload:
    """One decoding step of LLaMA-2 7B at batch 1 with a ``context``-token KV cache.

    Every matmul is a matrix-vector product that streams its weights: memory-bound. Eager
    dispatch costs ``host_us`` of host time per op, more than many ops take on the device, so
    the step is host-bound, as the paper observed for llama2 inference (§5.4).
    """
    o = OpList()
    h = hidden
    kv = context * h * B
    o.add("embedding", "Embedding", ld=h * B + 4, st=h * B, phase="other", host_us=host_us)
    for i in range(layers):
        p = f"layer{i}."
        ops = [
            ("attn_norm", "RMSNorm", 4 * h, h * B, h * B),
            ("qkv", "MatMul", 2 * h * 3 * h, (h + 3 * h * h) * B, 3 * h * B),
            ("rotary", "RotaryEmb", 6 * h, 2 * h * B, 2 * h * B),
            ("kv_cache_write", "KVCacheWrite", 0, 2 * h * B, 2 * h * B),
            ("scores", "BatchMatMul", 2 * context * h, kv + h * B, heads * context * B),
            ("softmax", "Softmax", 5 * heads * context, heads * context * B, heads * context * B),
            ("context", "BatchMatMul", 2 * context * h, kv + heads * context * B, h * B),
            ("o_proj", "MatMul", 2 * h * h, (h + h * h) * B, h * B),
            ("residual1", "Add", h, 2 * h * B, h * B),
            ("mlp_norm", "RMSNorm", 4 * h, h * B, h * B),
            ("gate", "MatMul", 2 * h * ffn, (h + h * ffn) * B, ffn * B),
            ("up", "MatMul", 2 * h * ffn, (h + h * ffn) * B, ffn * B),
            ("silu", "SiLU", 4 * ffn, ffn * B, ffn * B),
            ("gate_mul", "Mul", ffn, 2 * ffn * B, ffn * B),
            ("down", "MatMul", 2 * ffn * h, (ffn + ffn * h) * B, h * B),
            ("residual2", "Add", h, 2 * h * B, h * B),
        ]
        for name, kind, flops, ld, st in ops:
            o.add(p + name, kind, flops=flops, ld=ld, st=st, phase="other", host_us=host_us)
    o.add("final_norm", "RMSNorm", flops=4 * h, ld=h * B, st=h * B, phase="other", host_us=host_us)
    o.add(
        "lm_head",
        "MatMul",
        flops=2 * h * vocab,
        ld=(h + h * vocab) * B,
        st=vocab * B,
        phase="other",
        host_us=host_us,
    )
    o.add("sample", "AICPU", flops=vocab, ld=vocab * B, st=4, phase="other", host_us=host_us)
    meta = {
        "description": "LLaMA-2 7B decoding, batch 1, host-bound eager dispatch",
        "config": {
            "layers": layers,
            "hidden": hidden,
            "ffn": ffn,
            "heads": heads,
            "vocab": vocab,
            "context": context,
            "host_us": host_us,
        },
        "host_bound": True,
    }
    return Workload(to_frame(o.ops), name="llama2-infer", meta=meta)
