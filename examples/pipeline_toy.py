"""A toy pipeline-parallel training job on gloo: 1F1B over send/recv, data-parallel replicas.

    torchrun --nproc-per-node 4 examples/pipeline_toy.py STEPS [--replicas R]

The job's ``world_size / R`` stages each hold a small MLP chunk of its own width; rank ``r``
runs stage ``r // R`` (contiguous blocks). Activations go forward and gradients back between
neighbouring stages by ``dist.isend`` / ``dist.recv`` (``c10d::send`` and ``c10d::recv_`` to a
dispatch mode; gloo's blocking send would deadlock 1F1B), microbatches in the 1F1B order; a
stage's replicas all-reduce their gradients. Runs on the CPU. Nothing in it knows about opdvfs:
``torchrun --nproc-per-node 4 -m opdvfs tune ... -- python examples/pipeline_toy.py 60``
tunes it unchanged (docs/guide/multi-gpu.md). ``train(steps, stages, replicas)`` is what the
tests call in a process group they made.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.distributed as dist

#: Microbatches per iteration.
MICROBATCHES = 4


def one_f_one_b(stage: int, stages: int, microbatches: int) -> list[tuple[str, int]]:
    """Return a stage's 1F1B order: ``("f", mb)`` and ``("b", mb)`` steps."""
    warm = min(stages - 1 - stage, microbatches)
    order = [("f", m) for m in range(warm)]
    f, b = warm, 0
    while b < microbatches:
        if f < microbatches:
            order.append(("f", f))
            f += 1
        order.append(("b", b))
        b += 1
    return order


def train(
    steps: int,
    stages: int,
    replicas: int = 1,
    *,
    before_step: Callable[[int], bool] | None = None,
    uneven: bool = False,
) -> None:
    """Train the toy pipeline ``steps`` iterations (``before_step(i)`` True: stop before it).

    ``uneven``: replica ``r`` trains on ``r + 1`` times the microbatch rows (data-parallel
    ranks of different batch sizes: the same operators, different times).
    """
    rank = dist.get_rank()
    stage, replica = divmod(rank, replicas)
    torch.manual_seed(stage)
    width = 48 + 16 * stage  # each stage its own operators' sizes
    layers = torch.nn.Sequential(
        torch.nn.Linear(32, width), torch.nn.GELU(), torch.nn.Linear(width, 32)
    )
    opt = torch.optim.SGD(layers.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(100 + replica)
    prev, nxt = rank - replicas, rank + replicas
    # each stage's replicas all-reduce among themselves (every rank makes every group)
    groups = [dist.new_group([s * replicas + r for r in range(replicas)]) for s in range(stages)]
    for i in range(steps):
        if before_step is not None and before_step(i):
            break
        opt.zero_grad(set_to_none=True)
        inputs: dict[int, torch.Tensor] = {}
        outputs: dict[int, torch.Tensor] = {}
        sent: list[tuple[torch.Tensor, dist.Work]] = []  # eager sends (gloo's send blocks)
        for kind, mb in one_f_one_b(stage, stages, MICROBATCHES):
            if kind == "f":
                x = torch.empty(8, 32)
                if stage == 0:
                    x = torch.randn(8 * (1 + replica * uneven), 32, generator=gen)
                else:
                    dist.recv(x, prev)
                x.requires_grad_(stage > 0)
                y = layers(x)
                inputs[mb], outputs[mb] = x, y
                if stage < stages - 1:
                    act = y.detach()
                    sent.append((act, dist.isend(act, nxt)))
            else:
                x, y = inputs.pop(mb), outputs.pop(mb)
                if stage == stages - 1:
                    (y.square().mean() / MICROBATCHES).backward()
                else:
                    grad = torch.empty_like(y)
                    dist.recv(grad, nxt)
                    y.backward(grad)
                if stage > 0:
                    assert x.grad is not None
                    sent.append((x.grad, dist.isend(x.grad, prev)))
        for _, work in sent:
            work.wait()
        if replicas > 1:
            for p in layers.parameters():
                assert p.grad is not None
                dist.all_reduce(p.grad, group=groups[stage])
        opt.step()


def main() -> None:
    """Train ``STEPS`` iterations in the process group torchrun's environment describes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps", type=int, help="iterations (optimizer steps) to train")
    parser.add_argument("--replicas", type=int, default=1, help="data-parallel replicas")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        stages, left = divmod(dist.get_world_size(), args.replicas)
        if left or stages < 1:
            parser.error(f"--replicas {args.replicas} does not divide {dist.get_world_size()}")
        train(args.steps, stages, args.replicas)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
