"""The scatter-add GNN of examples/scatter_gnn.py (nondeterministic with 2+ CPU threads), trained in a
non-main thread that the main thread joins: --locate must trace that thread.

Its parameters are updated by hand, not by torch.optim (whose first use imports torch._dynamo: about 1 CPU s in
every run); 2 steps. The graph is as large as the example's: the race needs it.
"""
import sys
import threading
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from scatter_gnn import GNN  # noqa: E402

torch.set_num_threads(2)


def train() -> None:
    torch.manual_seed(0)
    nodes, edges = 2000, 150_000
    h0, target = torch.randn(nodes, 16), torch.randn(nodes)
    src, dst = torch.randint(0, nodes, (edges,)), torch.randint(0, nodes, (edges,))
    model = GNN()
    for _ in range(2):
        nn.functional.mse_loss(model(h0, src, dst), target).backward()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-0.1)
                p.grad = None


worker = threading.Thread(target=train)
worker.start()
worker.join()
