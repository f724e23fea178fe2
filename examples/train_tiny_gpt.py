"""A tiny GPT training loop: the script the README tunes (any PyTorch training script will do).

    python examples/train_tiny_gpt.py [STEPS] [--device cpu|cuda] [--dim DIM] [--batch N]

Nothing in it knows about opdvfs: ``opdvfs tune ... -- python examples/train_tiny_gpt.py 200``
runs it unchanged and counts an iteration at each ``optimizer.step()``. On the CPU by default;
``--device cuda`` trains on the GPU (``--dim`` and ``--batch`` make its kernels take time: at
the defaults an iteration is launch-bound, its clock barely matters).
"""

import argparse

import torch
from torch import nn

VOCAB, SEQ = 64, 16


class Block(nn.Module):
    """One transformer block: attention and an MLP, each behind a layer norm."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Return the block's output for ``x`` under the causal ``mask``."""
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A small GPT: token and position embeddings, ``layers`` blocks, a language-model head."""

    def __init__(
        self, vocab: int = VOCAB, dim: int = 32, heads: int = 2, layers: int = 2, seq: int = SEQ
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(1, seq, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Return next-token logits for the token ids ``idx``."""
        x = self.tok(idx) + self.pos[:, : idx.shape[1]]
        for block in self.blocks:
            x = block(x, self.mask)
        return self.head(self.ln(x))


def train_step(
    model: TinyGPT, optimizer: torch.optim.Optimizer, batch: torch.Tensor
) -> torch.Tensor:
    """Take one step of next-token training on ``batch`` (sequences of SEQ + 1 tokens).

    Returns the loss tensor (reading its value would synchronise with the device).
    """
    logits = model(batch[:, :-1])
    vocab = logits.shape[-1]
    loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), batch[:, 1:].reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss


def main(steps: int, *, device: str = "cpu", dim: int = 32, batch: int = 2) -> None:
    """Train for ``steps`` steps on random tokens (one optimizer step each) on ``device``."""
    torch.manual_seed(0)
    model = TinyGPT(dim=dim).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, VOCAB, (steps, batch, SEQ + 1), device=device)
    for batch in data:
        loss = train_step(model, optimizer, batch)
    print(f"trained {steps} steps, last loss {loss.item():.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Train the tiny GPT on random tokens.")
    parser.add_argument("steps", nargs="?", type=int, default=200, help="optimizer steps")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--dim", type=int, default=32, help="model width (default 32)")
    parser.add_argument("--batch", type=int, default=2, help="sequences per step (default 2)")
    args = parser.parse_args()
    main(args.steps, device=args.device, dim=args.dim, batch=args.batch)
