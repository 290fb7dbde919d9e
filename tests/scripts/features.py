"""Two models, two optimizers (one LBFGS with a closure), gradient accumulation."""
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Linear(3, 3)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer1 = nn.Sequential(Block(), Block())
        self.out = nn.Linear(3, 1)

    def forward(self, x):
        return self.out(self.layer1[1].conv1(self.layer1[0].conv1(x)))


torch.manual_seed(0)
net, critic = Net(), nn.Linear(1, 1)
opt = torch.optim.Adam(net.parameters(), lr=1e-2)
lbfgs = torch.optim.LBFGS(critic.parameters(), max_iter=3)
x = torch.randn(8, 3)


def closure_for(target):
    def closure():
        lbfgs.zero_grad()
        loss = ((critic(target) - 1.0) ** 2).mean()
        loss.backward()
        return loss

    return closure


for _ in range(3):
    for _k in range(2):  # gradient accumulation: two backward() per step
        (net(x) ** 2).mean().backward()
    opt.step()
    opt.zero_grad()
    lbfgs.step(closure_for(net(x).detach()))
print("done")
