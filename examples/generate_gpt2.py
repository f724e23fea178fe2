"""A generation loop to tune per phase: a tiny, randomly initialised GPT-2 serving requests.

``python examples/generate_gpt2.py [REQUESTS] [--vary]`` runs REQUESTS (default 80) requests
through Hugging Face ``generate()`` with a KV cache: each a prompt of 256 tokens and 10 new
tokens, or with ``--vary`` a prompt of 192 to 256 tokens and 6 to 14 new ones. Tuned as it
stands (docs/guide/generate.md): ``opdvfs tune --mode generate --target 0.05 --actuator
sim:a100-like --work-scale 800 -- python examples/generate_gpt2.py 80``.

The model (512 wide, 2 layers, bfloat16) is small enough for a CPU and, with the work scaled,
does the work of a served model on the simulated GPU: its prefill is compute-bound, its decode
memory-bound. Needs ``transformers`` (the ``integrations`` extra).
"""

from __future__ import annotations

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def tiny_gpt2() -> GPT2LMHeadModel:
    """Return the tiny GPT-2 (random weights, seed 0), in bfloat16, for inference."""
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=256,
        n_positions=512,
        n_embd=512,
        n_layer=2,
        n_head=8,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(config).eval().to(torch.bfloat16)


def serve(model: GPT2LMHeadModel, requests: int, *, vary: bool = False, seed: int = 1) -> int:
    """Generate ``requests`` requests; return the tokens generated."""
    gen = torch.Generator().manual_seed(seed)
    tokens = 0
    with torch.no_grad():
        for _ in range(requests):
            prompt = int(torch.randint(192, 257, (1,), generator=gen)) if vary else 256
            new = int(torch.randint(6, 15, (1,), generator=gen)) if vary else 10
            ids = torch.randint(1, 256, (1, prompt), generator=gen)
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
            )
            tokens += int(out.shape[1] - prompt)
    return tokens


def main() -> None:
    """Serve the requests the command line asks for."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("requests", type=int, nargs="?", default=80)
    parser.add_argument("--vary", action="store_true", help="vary prompt and output lengths")
    args = parser.parse_args()
    tokens = serve(tiny_gpt2(), args.requests, vary=args.vary)
    print(f"generated {tokens} tokens in {args.requests} requests")


if __name__ == "__main__":
    main()
