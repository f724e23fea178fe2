"""A data-parallel script for the torchrun tests: ``STEPS [CRASH_AT [KILL_AT [ALL_REDUCE]]]``.

It makes its gloo group, then trains the tiny GPT ``STEPS`` steps, each rank on its own data. At
step ``CRASH_AT`` rank 1 raises; at step ``KILL_AT`` rank 3 SIGKILLs itself (printing the time);
``ALL_REDUCE`` 1: the ranks all-reduce their gradients (0: they only share the group). -1: never.
"""

import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from tiny_gpt import TinyGPT

steps = int(sys.argv[1])
crash_at, kill_at, all_reduce = (int(a) for a in [*sys.argv[2:], "-1", "-1", "0"][:3])
dist.init_process_group("gloo")
torch.set_num_threads(1)
rank = dist.get_rank()
torch.manual_seed(rank)
model = TinyGPT()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.randint(0, 64, (steps, 2, 17))
for i in range(steps):
    if i == crash_at and rank == 1:
        raise RuntimeError(f"boom on rank 1 at step {i}")
    if i == kill_at and rank == 3:
        print(f"killed at {time.time()!r}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    logits = model(data[i, :, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), data[i, :, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if all_reduce == 1:
        for p in model.parameters():
            dist.all_reduce(p.grad)
    opt.step()
dist.destroy_process_group()
