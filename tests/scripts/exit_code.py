import sys

import torch

print("argv:", sys.argv[1:])
w = torch.nn.Parameter(torch.ones(2))
opt = torch.optim.SGD([w], lr=0.1)
for _ in range(5):
    (w * 2).sum().backward()
    opt.step()
    opt.zero_grad()
print("hash-seed-fixed", hash("torchrepro") == hash("torchrepro"))
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
