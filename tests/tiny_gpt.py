"""The tests' tiny GPT: its training script, a launch log and a torch.profiler capture (torch).

Shared by the live-capture, sweep and tune tests and by ``fixtures/make_torch_trace.py``, which
wrote the checked-in trace fixture, so that all exercise the same program.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import torch

# the model is the example's that docs/guide/tune.md tunes (one model for the docs, the tests
# and the fixtures)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from train_tiny_gpt import Block, TinyGPT, train_step

__all__ = [
    "TRAIN_SCRIPT",
    "Block",
    "LaunchLog",
    "TinyGPT",
    "capture_training_trace",
    "train_step",
    "write_train_script",
]

#: The tiny GPT as a training script (a test writes it with :func:`write_train_script`):
#: ``train.py STEPS [STOP_AT [raise|term|exit|diverge]]`` stops at step STOP_AT as told, or, with
#: ``diverge``, runs two more operators per iteration from it on.
TRAIN_SCRIPT = textwrap.dedent("""
    import os
    import signal
    import sys
    import torch
    sys.path.insert(0, {tests!r})
    from tiny_gpt import TinyGPT
    steps = int(sys.argv[1])
    stop_at = int(sys.argv[2]) if len(sys.argv) > 2 else -1
    how = sys.argv[3] if len(sys.argv) > 3 else "raise"
    torch.manual_seed(0)
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 64, (steps, 2, 17))
    for i in range(steps):
        if i == stop_at and how == "term":
            os.kill(os.getpid(), signal.SIGTERM)
        if i == stop_at and how == "raise":
            raise RuntimeError(f"boom at step {{i}}")
        if i == stop_at and how == "exit":
            sys.exit(0)
        logits = model(data[i, :, :-1])
        if how == "diverge" and 0 <= stop_at <= i:
            logits = logits * 1.0 + 0.0  # two more operators per iteration from here on
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), data[i, :, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
""")


def write_train_script(folder: Path) -> Path:
    """Write :data:`TRAIN_SCRIPT` to ``folder / "train.py"`` (it imports this module); return it."""
    path = folder / "train.py"
    path.write_text(TRAIN_SCRIPT.format(tests=str(Path(__file__).resolve().parent)))
    return path


class LaunchLog:
    """Stands in for a simulated GPU: keeps what a feed launches (kernels only), per iteration."""

    def __init__(self) -> None:
        self.iterations: list[list[dict]] = [[]]

    def launch(self, op: dict, *, kernel: bool = True) -> None:
        if kernel:
            self.iterations[-1].append(op)

    def mark_iteration(self) -> None:
        self.iterations.append([])


def capture_training_trace(
    path: Path, *, steps: int = 3, seed: int = 0, freq_mhz: float | None = None, device: str = "cpu"
) -> Path:
    """Profile ``steps`` training steps of TinyGPT (after one warm-up) into a Chrome trace."""
    torch.manual_seed(seed)
    model = TinyGPT().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 64, (steps + 2, 2, 17), device=device)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)

    def save(prof: torch.profiler.profile) -> None:
        prof.export_chrome_trace(str(path))

    with torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=steps, repeat=1),
        on_trace_ready=save,
        record_shapes=True,
    ) as prof:
        for i in range(steps + 1):
            train_step(model, opt, data[i])
            if i == 1 and freq_mhz is not None:
                # Metadata only sticks while the profiler is recording (an active step).
                prof.add_metadata_json("opdvfs_freq_mhz", str(freq_mhz))
            prof.step()
    return path
