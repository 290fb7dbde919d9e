"""TR207: deterministic mode and cuDNN's flag are set in the parent, but the training runs in processes started
with the spawn method, which begin with PyTorch's default settings (the shape of pytorch/examples' ImageNet
script: the flags in main(), the model in main_worker)."""

import argparse
import multiprocessing

import torch
import torch.backends.cudnn as cudnn
import torch.multiprocessing as mp
import torchrepro
import torchvision.models as models
from torch import nn


def main_worker(gpu, args):  # expect: TR207
    torch.manual_seed(args.seed)
    model = models.__dict__[args.arch]().cuda(gpu)
    return model


def evaluate(n):  # expect: TR207
    return nn.Linear(n, 1)


def seeded_and_deterministic(rank, args):  # ok: the process sets deterministic mode itself
    torchrepro.seed_everything(args.seed + rank)
    torchrepro.deterministic()
    return nn.Conv2d(3, 8, 3).cuda(rank)


def cudnn_flag_only(rank, args):  # ok: sets cuDNN's flag itself, the only setting main() made
    cudnn.deterministic = True
    return nn.Conv2d(3, 8, 3).cuda(rank)


def tokenize(shard):  # ok: builds no model and uses no CUDA; the settings change nothing here
    return [line.split() for line in open(shard)]


def forked(n):  # ok: a forked child inherits the parent's settings
    return nn.Linear(n, 1).cuda()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="resnet18")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    cudnn.deterministic = True
    cudnn.benchmark = False
    mp.spawn(main_worker, nprocs=torch.cuda.device_count(), args=(args,))
    multiprocessing.Process(target=evaluate, args=(4,)).start()
    multiprocessing.get_context("spawn").Process(target=tokenize, args=("train.txt",)).start()
    multiprocessing.get_context("fork").Process(target=forked, args=(4,)).start()
    mp.spawn(cudnn_flag_only, nprocs=2, args=(args,))


def main_strict():
    torch.use_deterministic_algorithms(True)
    mp.spawn(seeded_and_deterministic, nprocs=2, args=(argparse.Namespace(seed=0),))


if __name__ == "__main__":
    main()
    main_strict()
