import torch
from torch import nn


class GNN(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.message = nn.Linear(2 * hidden, hidden)
        self.update = nn.Linear(2 * hidden, hidden)
        self.readout = nn.Linear(hidden, 1)

    def forward(self, h, src, dst):
        m = torch.relu(self.message(torch.cat([h[src], h[dst]], dim=1)))
        agg = torch.zeros_like(h).index_add_(0, dst, m)
        return self.readout(torch.relu(self.update(torch.cat([h, agg], dim=1)))).squeeze(1)
