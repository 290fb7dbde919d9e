"""Near miss for TR106: the seed is set at the top level of the main module, outside the `__main__` block, so
every spawned process runs it again when it re-imports the module (as `__mp_main__`)."""

import argparse

import torch
import torch.multiprocessing as mp
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=543)
args = parser.parse_args()

torch.manual_seed(args.seed)


def run_worker(rank, world_size):
    policy = nn.Linear(4, 2)  # ok: seeded when the spawned process imports this module
    return policy, rank, world_size


def main():
    mp.spawn(run_worker, args=(2,), nprocs=2, join=True)


if __name__ == "__main__":
    main()
