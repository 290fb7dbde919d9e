"""Sets its thread count in the environment before it imports torch, as data-loading scripts often do, then trains
the scatter-add GNN of examples/scatter_gnn.py 2 steps, its parameters updated by hand (no torch.optim, whose first
use imports torch._dynamo: about 1 CPU s a run).

``threads_at_top.py VAR=VALUE [--after]``: ``os.environ[VAR] = VALUE`` before ``import torch`` (with
``--after``: after it, where torch no longer reads it). Prints ``threads N at the start`` (torch.get_num_threads()),
then the losses. With 2+ threads the scatter-add (index_put_ with accumulate=True on a large 1-D tensor) is
nondeterministic; with one it is deterministic.
"""
import os
import sys

var, _, value = sys.argv[1].partition("=")
if "--after" not in sys.argv:
    os.environ[var] = value

import torch  # noqa: E402 - the point of the script: the environment is set first

if "--after" in sys.argv:
    os.environ[var] = value
print(f"threads {torch.get_num_threads()} at the start", flush=True)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import scatter_gnn  # noqa: E402 - imports torch once more: after --after's setting
from torch import nn  # noqa: E402

torch.manual_seed(0)
nodes, edges = 2000, 150_000
h0 = torch.randn(nodes, 16)
src, dst = torch.randint(0, nodes, (edges,)), torch.randint(0, nodes, (edges,))
target = torch.randn(nodes)
model = scatter_gnn.GNN()
for step in range(2):
    loss = nn.functional.mse_loss(model(h0, src, dst), target)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad, alpha=-1e-5)
            p.grad = None
    print(f"step {step}: loss {loss.item():.6f}")
