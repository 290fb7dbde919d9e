"""Trains a tiny model that diverges at step 1 on purpose: noise is added to the first batch only.

The noise comes from os.urandom, or, with ``--counter FILE``, from the run's number (the Nth launch that finds
FILE gets seed N; FILE lies outside the working directory, so check's watch on it does not see it), so that two
checks record the same runs. Options: ``--steps N`` (default 40); ``--noise-runs 2,3``: only those launches get
noise (empty: none, the runs are identical); ``--threads-file F``: append torch.get_num_threads() to F;
``--manual``: update the parameters by hand (no torch.optim: one step per backward()).
"""
import argparse
import os

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--counter")
parser.add_argument("--noise-runs")
parser.add_argument("--threads-file")
parser.add_argument("--manual", action="store_true")
args = parser.parse_args()

launch = 0
if args.counter:
    launch = int(open(args.counter).read() or 0) + 1 if os.path.exists(args.counter) else 1
    with open(args.counter, "w") as f:
        f.write(str(launch))
if args.threads_file:
    with open(args.threads_file, "a") as f:
        f.write(f"{torch.get_num_threads()}\n")
noisy = args.noise_runs is None or (launch and str(launch) in args.noise_runs.split(","))
seed = launch if args.counter else int.from_bytes(os.urandom(4), "little")
noise = torch.randn(16, 8, generator=torch.Generator().manual_seed(seed)) * 1e-3

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
opt = None if args.manual else torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 8), torch.randn(16, 4)
for step in range(args.steps):
    loss = nn.functional.mse_loss(model(x + noise if noisy and step == 0 else x), y)
    loss.backward()
    if opt is not None:
        opt.step()
        opt.zero_grad()
    else:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-0.1)
                p.grad = None
print("done")
