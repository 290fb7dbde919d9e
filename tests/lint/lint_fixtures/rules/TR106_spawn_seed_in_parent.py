"""TR106: the seed is set in the parent, but the work runs in processes started with the spawn method, which
begin with fresh generators (the shape of pytorch/examples' ImageNet script)."""

import argparse
import multiprocessing
import random
import threading

import numpy as np
import torch
import torch.multiprocessing as mp
import torchvision.models as models
from torch import nn


def main_worker(gpu, ngpus_per_node, args):
    model = models.__dict__[args.arch]()  # expect: TR106
    print(gpu, ngpus_per_node, model)


def evaluate_shard(shard):
    order = list(range(shard))
    random.shuffle(order)  # expect: TR106
    return order


def augment_forked(n):
    return np.random.rand(n)  # ok: a forked child inherits the parent's seeded generators


def jitter(n):
    return np.random.normal(size=n)  # expect: TR106


def forked_worker(rank, n):
    return torch.rand(n) + rank  # ok: start_processes(..., start_method="fork") forks


def resume_worker(rank, path):
    model = nn.Linear(4, 4)  # expect: TR106
    torch.set_rng_state(torch.load(path)["rng"])  # restored only after the model is built, and only on resume
    return model, rank


def report(n):
    return torch.randn(n)  # ok: a thread shares the seeded generators of its process


def score(n):
    torch.manual_seed(n)
    return nn.Linear(n, 1)  # ok: seeded in the child


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="resnet18")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--multiprocessing-distributed", action="store_true")
    args = parser.parse_args()
    if args.seed is not None:
        random.seed(args.seed)
        np.random.seed(args.seed)
        torch.manual_seed(args.seed)
    ngpus_per_node = torch.cuda.device_count()
    if args.multiprocessing_distributed:
        mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))
    else:
        main_worker(0, ngpus_per_node, args)  # seeded on this path, but not in the spawned processes
    ctx = multiprocessing.get_context("spawn")
    worker = ctx.Process(target=evaluate_shard, args=(8,))
    worker.start()
    forked = multiprocessing.get_context("fork").Process(target=augment_forked, args=(4,))
    forked.start()
    scorer = multiprocessing.Process(target=score, args=(4,))
    scorer.start()
    threading.Thread(target=report, args=(4,)).start()
    multiprocessing.Process(target=jitter, args=(4,)).start()
    mp.spawn(resume_worker, args=("last.pt",), nprocs=2)
    mp.start_processes(forked_worker, args=(4,), nprocs=2, start_method="fork")


if __name__ == "__main__":
    main()
