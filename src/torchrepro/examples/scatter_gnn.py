"""A message-passing model whose aggregation uses index_put_(accumulate=True) on a large 1-D tensor.

With 2+ CPU threads that scatter-add is nondeterministic, so two runs diverge (cause: compute);
under deterministic mode they are identical:

    torchrepro check -- python -m torchrepro.examples.scatter_gnn
    torchrepro check --deterministic -- python -m torchrepro.examples.scatter_gnn

A smaller graph runs faster (deterministic mode is slow on the default one):
``python -m torchrepro.examples.scatter_gnn --steps 2 --nodes 200 --edges 2000``.
This is ``examples/scatter_gnn.py`` of the source tree, shipped in the package (tests keep the two the same).
"""

from __future__ import annotations

import argparse

import torch
from torch import nn


def scatter_sum(messages: torch.Tensor, dst: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """Sum edge messages (E, F) into nodes (N, F), flattened to one large 1-D accumulation."""
    feats = messages.shape[1]
    flat_index = (dst.unsqueeze(1) * feats + torch.arange(feats)).reshape(-1)
    out = torch.zeros(num_nodes * feats, dtype=messages.dtype)
    out = out.index_put_((flat_index,), messages.reshape(-1), accumulate=True)
    return out.view(num_nodes, feats)


class MessagePassing(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.message = nn.Linear(2 * dim, dim)
        self.update = nn.Linear(2 * dim, dim)

    def forward(self, h: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        m = torch.relu(self.message(torch.cat([h[src], h[dst]], dim=1)))
        agg = scatter_sum(m, dst, h.shape[0])
        return torch.relu(self.update(torch.cat([h, agg], dim=1)))


class GNN(nn.Module):
    def __init__(self, dim: int = 16, layers: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList(MessagePassing(dim) for _ in range(layers))
        self.readout = nn.Linear(dim, 1)

    def forward(self, h: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            h = layer(h, src, dst)
        return self.readout(h).squeeze(1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--edges", type=int, default=150_000)
    args = parser.parse_args()

    torch.manual_seed(0)
    h0 = torch.randn(args.nodes, 16)
    src = torch.randint(0, args.nodes, (args.edges,))
    dst = torch.randint(0, args.nodes, (args.edges,))
    target = torch.randn(args.nodes)
    model = GNN()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(args.steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(h0, src, dst), target)
        loss.backward()
        opt.step()
        print(f"step {step}: loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
