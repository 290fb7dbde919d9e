"""Near miss for TR502: weights saved every epoch and loaded back with --init to start a fine-tuning run. Nothing
in the program says they are loaded to go on with an interrupted run; the model is merely called resumeNet."""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--init", default="", help="weights to start from (e.g. resumeNet's backbone)")
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--out", default=".")
args = parser.parse_args()

torch.manual_seed(0)
resumenet = nn.Linear(16, 4)  # the model's name holds the word only as a part
if args.init:
    resumenet.load_state_dict(torch.load(args.init))
optimizer = torch.optim.Adam(resumenet.parameters())

for epoch in range(args.epochs):
    loss = resumenet(torch.randn(8, 16)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    torch.save(resumenet.state_dict(), f"{args.out}/weights_{epoch}.pth")  # ok: weights to start other runs from
