"""A tiny training script with a CUDA-nondeterministic op in its forward pass, for tools/gpu_check.py (part 2).

A two-layer message-passing model sums edge messages into nodes. On CUDA the sum is ``Tensor.index_add_`` with
many duplicate indices: atomicAdd, so the order of the float32 additions, and the result's last bits, change from
run to run; deterministic mode switches it to a deterministic kernel. On the CPU (``--device cpu``: the check's
dry run) ``index_add_`` is deterministic, so the same sum is ``index_put_(accumulate=True)`` on a flattened 1-D
tensor, which varies with 2+ CPU threads. Expected on either device (a few steps, seeded):

    torchrepro check --locate -- python tools/cuda_nondet_train.py          # DIVERGED at step 1, the op named
    torchrepro check --deterministic -- python tools/cuda_nondet_train.py   # IDENTICAL

``--device`` defaults to cuda when there is one.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

# the op that makes the runs differ, by device (what `check --locate` should name)
NONDETERMINISTIC_OP = {"cuda": "aten.index_add_", "cpu": "aten.index_put_"}


def scatter_sum(messages: torch.Tensor, dst: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """Sum the edge messages (E, F) into their destination nodes (N, F)."""
    if messages.device.type == "cuda":
        out = torch.zeros(num_nodes, messages.shape[1], dtype=messages.dtype, device=messages.device)
        return out.index_add_(0, dst, messages)
    feats = messages.shape[1]
    flat = (dst.unsqueeze(1) * feats + torch.arange(feats, device=dst.device)).reshape(-1)
    out = torch.zeros(num_nodes * feats, dtype=messages.dtype, device=messages.device)
    return out.index_put_((flat,), messages.reshape(-1), accumulate=True).view(num_nodes, feats)


class Layer(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.message = nn.Linear(2 * dim, dim)
        self.update = nn.Linear(2 * dim, dim)

    def forward(self, h: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        m = torch.relu(self.message(torch.cat([h[src], h[dst]], dim=1)))
        return torch.relu(self.update(torch.cat([h, scatter_sum(m, dst, h.shape[0])], dim=1)))


class Model(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Layer(dim), Layer(dim)])
        self.readout = nn.Linear(dim, 1)

    def forward(self, h: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            h = layer(h, src, dst)
        return self.readout(h).squeeze(1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--edges", type=int, default=150_000)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(0)  # everything is drawn on the CPU, then moved: the same inputs on every device
    h0 = torch.randn(args.nodes, 16)
    src = torch.randint(0, args.nodes, (args.edges,))
    dst = torch.randint(0, args.nodes, (args.edges,))
    target = torch.randn(args.nodes)
    model = Model().to(device)
    h0, src, dst, target = h0.to(device), src.to(device), dst.to(device), target.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(args.steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(h0, src, dst), target)
        loss.backward()
        opt.step()
        print(f"step {step}: loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
