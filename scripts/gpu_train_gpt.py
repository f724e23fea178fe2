"""A GPT training loop for the device checks (``scripts/gpu_check_tune.sh``), opdvfs-free.

    python scripts/gpu_train_gpt.py STEPS [--compile none|default|reduce-overhead]

On CUDA: a 4-layer, 1024-wide GPT (about 95 ms a step on an H200, batch 64); on the CPU the tiny
one of ``examples/train_tiny_gpt.py``, so the script can be rehearsed here. At the end it prints
one JSON line, ``gpu_train_gpt: {...}``, with the device, the median step time and, when
compiled, Dynamo's counters (frames compiled, graph breaks, recompiles), so a check can tell
whether the model stayed compiled under opdvfs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from train_tiny_gpt import TinyGPT


def main() -> None:
    """Train for STEPS steps on random tokens and print the summary line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps", type=int)
    parser.add_argument("--compile", default="none", choices=("none", "default", "reduce-overhead"))
    args = parser.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    big = dev == "cuda"
    cfg = dict(vocab=8192, dim=1024, heads=16, layers=4, seq=512) if big else dict(vocab=64, dim=32)
    vocab, seq, batch = cfg["vocab"], cfg.get("seq", 16), 64 if big else 2
    if big:
        torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(0)
    model: nn.Module = TinyGPT(**cfg).to(dev)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    step_model = model if args.compile == "none" else torch.compile(model, mode=args.compile)
    data = torch.randint(0, vocab, (16, batch, seq + 1), device=dev)
    times: list[float] = []
    for i in range(args.steps):
        start = time.perf_counter()
        tokens = data[i % len(data)]
        logits = step_model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if dev == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    summary: dict[str, object] = {
        "device": torch.cuda.get_device_name() if big else "cpu",
        "steps": args.steps,
        "compile": args.compile,
        "median_step_s": round(sorted(times)[len(times) // 2], 5),
        "last_loss": round(loss.item(), 4),
    }
    if args.compile != "none":
        from torch._dynamo.utils import counters

        kept = ("stats", "graph_break")
        summary["dynamo"] = {k: dict(v) for k, v in counters.items() if k in kept}
    print("gpu_train_gpt:", json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
