"""A training loop without a DataLoader: nanoGPT's ``get_batch`` (``torch.randint`` indices into a fixed token tensor).

The model is seeded. Options: ``--data-seed N`` seeds the generator of the batch indices (without it the indices
come from a generator seeded from os.urandom: the data differs between runs); ``--dropout-unseeded`` adds a
dropout inside the model whose generator is seeded from os.urandom (the computation differs between runs);
``--eval-unseeded`` runs, after every step, a validation forward under ``torch.no_grad()`` and one in eval mode with
autograd on, both on batches drawn from os.urandom (they are not training data); ``--kwargs`` calls
``model(idx=x, targets=y)``; ``--accum N`` micro-batches per step; ``--steps N``; ``--manual`` updates the
parameters by hand after the step's backward() calls instead of with AdamW (no torch.optim, whose first use imports
torch._dynamo: about 1 CPU s a run; with ``--accum 1`` one backward() a step, as an optimizer step would be).
"""
import argparse
import os

import torch
from handstep import sgd_step
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--data-seed", type=int)
parser.add_argument("--dropout-unseeded", action="store_true")
parser.add_argument("--eval-unseeded", action="store_true")
parser.add_argument("--kwargs", action="store_true")
parser.add_argument("--accum", type=int, default=1)
parser.add_argument("--manual", action="store_true")
args = parser.parse_args()


def urandom_generator() -> torch.Generator:
    return torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))


VOCAB, BLOCK, BATCH = 17, 8, 4
data = torch.arange(512) * 7 % VOCAB  # the "memmap" of tokens: fixed
gen = torch.Generator().manual_seed(args.data_seed) if args.data_seed is not None else urandom_generator()
eval_gen = urandom_generator()


def get_batch(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    ix = torch.randint(len(data) - BLOCK, (BATCH,), generator=g)
    x = torch.stack([data[i:i + BLOCK] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + BLOCK] for i in ix])
    return x, y


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16)
        self.head = nn.Linear(16, VOCAB)
        self.drop_gen = urandom_generator() if args.dropout_unseeded else None

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.emb(idx)
        if self.drop_gen is not None and self.training:
            h = h * (torch.rand(h.shape, generator=self.drop_gen) > 0.2) / 0.8
        logits = self.head(torch.tanh(h))
        return logits, nn.functional.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


torch.manual_seed(0)
model = TinyLM()
opt = None if args.manual else torch.optim.AdamW(model.parameters(), lr=1e-2)
x, y = get_batch(gen)
for _step in range(args.steps):
    for _ in range(args.accum):
        _, loss = model(idx=x, targets=y) if args.kwargs else model(x, y)
        x, y = get_batch(gen)  # prefetch, as nanoGPT does
        (loss / args.accum).backward()
    if opt is None:
        sgd_step(model.parameters())
    else:
        opt.step()
        opt.zero_grad(set_to_none=True)
    if args.eval_unseeded:
        with torch.no_grad():
            model(*get_batch(eval_gen))
        model.eval()
        model(*get_batch(eval_gen))  # autograd on, but an eval forward: no training data
        model.train()
print("done")
