"""The scatter-add GNN of examples/scatter_gnn.py (index_put_ with accumulate=True on a large 1-D tensor:
nondeterministic with 2+ CPU threads), seeded by torchrepro (not by itself), trained a few steps, its parameters
updated by hand (no torch.optim, whose first use imports torch._dynamo: about 1 CPU s a run); then logs a
validation MSE computed in float64 (sensitive to last-bit differences of the weights)."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from scatter_gnn import GNN  # noqa: E402

import torchrepro  # noqa: E402

nodes, edges = 2000, 150_000
g = torch.Generator().manual_seed(0)  # the graph is fixed; the model's initial weights follow the seed
h0, target = torch.randn(nodes, 16, generator=g), torch.randn(nodes, generator=g)
src, dst = torch.randint(0, nodes, (edges,), generator=g), torch.randint(0, nodes, (edges,), generator=g)
model = GNN()
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
    nn.functional.mse_loss(model(h0, src, dst), target).backward()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad, alpha=-1e-5)
            p.grad = None
with torch.no_grad():
    torchrepro.log_metric("val_mse", (model(h0, src, dst).double() - target.double()).square().mean())
