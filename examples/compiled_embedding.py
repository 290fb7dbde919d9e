"""A tiny nanoGPT-style language model (token + position embeddings, one residual MLP block, a head tied to
the token embedding), trained with ``torch.compile`` on CPU.

The code inductor generates for the backward of the tied token embedding adds rows into the gradient from several
threads (``atomic_add``), so with 2+ CPU threads the gradient of ``wte.weight`` differs between runs in its last
bits. Eager PyTorch computes the same gradient deterministically; so does the compiled code in deterministic mode.
The warm-up learning rate is tiny, as at the start of nanoGPT's training, so the parameters stay identical for the
first steps while the gradients and the Adam state differ:

    torchrepro check -- python examples/compiled_embedding.py              # DIVERGED (compute, compiled code)
    torchrepro check --locate -- python examples/compiled_embedding.py     # names the compiled kernel
    torchrepro check --deterministic -- python examples/compiled_embedding.py   # IDENTICAL
    torchrepro check -- python examples/compiled_embedding.py --eager      # IDENTICAL (not compiled)
"""

from __future__ import annotations

import argparse
import math

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.ln_2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, block_size: int, dim: int) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict({
            "wte": nn.Embedding(vocab, dim),
            "wpe": nn.Embedding(block_size, dim),
            "h": nn.ModuleList([Block(dim)]),
            "ln_f": nn.LayerNorm(dim),
        })
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying, as in GPT-2 and nanoGPT
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)  # TOKEN-EMBEDDING
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def warmup_lr(step: int, max_lr: float = 6e-4, warmup: int = 2000) -> float:
    """nanoGPT's linear warm-up: tiny learning rates at the first steps."""
    return max_lr * (step + 1) / warmup


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--eager", action="store_true", help="do not compile the model (the eager twin)")
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (Triton kernels, tools/compile_locate_cuda.py)")
    args = parser.parse_args()

    torch.set_num_threads(2)  # the race needs at least two threads
    torch.manual_seed(0)
    model = TinyGPT(args.vocab, args.block_size, args.dim).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=warmup_lr(0), weight_decay=0.1)
    if not args.eager:
        model = torch.compile(model)  # COMPILE-CALL
    data = torch.randint(0, args.vocab, (args.steps, args.batch, args.block_size + 1)).to(args.device)
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = warmup_lr(step)
        x, y = data[step, :, :-1].contiguous(), data[step, :, 1:].contiguous()
        loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        print(f"step {step + 1}: loss {loss.item():.6f} (ln V = {math.log(args.vocab):.4f})")


if __name__ == "__main__":
    main()
