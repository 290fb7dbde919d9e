"""Memory no op wrote, in every step before an unseeded draw: ``copy.deepcopy`` of a tensor (a fresh storage
handed to ``set_``, then ``copy_``), a storage set into a tensor and then filled, and a ``torch.empty`` buffer
filled by ``copy_``; then dropout with a mask drawn from a generator seeded from the OS: every run differs there.
Forward and backward run in the closure passed to ``optimizer.step``.
A freed tensor of random bytes before each makes the fresh memory hold different bytes in every run."""
import copy
import ctypes
import os

import torch
from torch import nn


def scribble(nbytes: int) -> None:
    """Leave bytes that differ run to run in the memory torch's allocator hands out next (no op writes them)."""
    junk = torch.UntypedStorage(nbytes)
    ctypes.memmove(junk.data_ptr(), os.urandom(nbytes), nbytes)
    del junk


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 1)
        self.g = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little"))  # BUG: seeded from the OS
        self.register_buffer("template", torch.zeros(32, 16))

    def forward(self, x):
        scribble(2048)
        h = copy.deepcopy(self.template)  # Tensor.__deepcopy__: empty, set_ (a fresh storage), copy_
        scribble(2048)
        s = torch.empty(0).set_(torch.UntypedStorage(2048)).view(32, 16)  # a storage no op wrote
        s.copy_(self.fc1(x).relu())
        buf = torch.empty(32, 16)
        buf.copy_(s + h)
        keep = torch.empty(32, 16).bernoulli_(0.9, generator=self.g)  # MASK-LINE
        return self.fc2(buf * keep)


torch.manual_seed(0)
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(32, 8), torch.randn(32, 1)


def closure():  # run by opt.step: forward and backward, as Lightning runs training_step
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    return loss


for _ in range(3):
    opt.step(closure)
