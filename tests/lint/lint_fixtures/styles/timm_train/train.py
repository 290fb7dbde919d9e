#!/usr/bin/env python3
"""ImageNet-style training script laid out like timm's train.py.

Every library is seeded (per rank) by utils.random_seed; the loaders come from create_loader, which builds the
DistributedSampler, and the epoch loop calls loader_train.sampler.set_epoch(epoch). cuDNN benchmarking is on
and deterministic mode is not, so the ResNet's convolutions pick their algorithms by timing.
"""

import argparse
import logging
import os
import time
from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as NativeDDP

from timmlet import utils
from timmlet.data import Mixup, create_dataset, create_loader
from timmlet.models import create_model, model_entrypoints

_logger = logging.getLogger("train")

parser = argparse.ArgumentParser(description="Image classification training")
parser.add_argument("data_dir", nargs="?", default="", help="dataset root")
parser.add_argument("--dataset", default="folder", help="dataset type")
parser.add_argument("--train-split", default="train")
parser.add_argument("--val-split", default="validation")
parser.add_argument("--model", default="resnet18", type=str, help="name of a registered model")
parser.add_argument("--list-models", action="store_true", help="print the registered models and exit")
parser.add_argument("--pretrained", action="store_true")
parser.add_argument("--num-classes", type=int, default=1000)
parser.add_argument("--img-size", type=int, default=224)
parser.add_argument("-b", "--batch-size", type=int, default=128)
parser.add_argument("--epochs", type=int, default=300)
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--momentum", type=float, default=0.9)
parser.add_argument("--weight-decay", type=float, default=2e-5)
parser.add_argument("--drop", type=float, default=0.0, help="dropout before the classifier")
parser.add_argument("--mixup", type=float, default=0.0, help="mixup alpha (0 turns mixup off)")
parser.add_argument("--cutmix", type=float, default=0.0)
parser.add_argument("--smoothing", type=float, default=0.1)
parser.add_argument("--no-aug", action="store_true")
parser.add_argument("--resume", default="", type=str, help="checkpoint to resume from")
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--worker-seeding", type=str, default="all")
parser.add_argument("-j", "--workers", type=int, default=4)
parser.add_argument("--pin-mem", action="store_true")
parser.add_argument("--output", default="./output", type=str)
parser.add_argument("--log-interval", type=int, default=50)


def main():
    logging.basicConfig(level=logging.INFO)
    args = parser.parse_args()

    if args.list_models:
        for name, fn in model_entrypoints():
            print(f"{name:20s} {fn.__module__}")
        return

    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True  # ok: TF32 changes precision, not run-to-run results
        torch.backends.cudnn.benchmark = True  # expect: TR201

    args.world_size = int(os.environ.get("WORLD_SIZE", 1))
    args.distributed = args.world_size > 1
    args.rank = 0
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.distributed:
        torch.distributed.init_process_group(backend="nccl", init_method="env://")
        args.rank = torch.distributed.get_rank()
        args.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        device = torch.device(f"cuda:{args.local_rank}")
        torch.cuda.set_device(device)

    utils.random_seed(args.seed, args.rank)

    model = create_model(args.model, pretrained=args.pretrained, num_classes=args.num_classes, drop_rate=args.drop)
    model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay)

    start_epoch = 0
    if args.resume:
        start_epoch = utils.resume_checkpoint(model, args.resume, optimizer=optimizer)
    if args.distributed:
        model = NativeDDP(model, device_ids=[device])

    dataset_train = create_dataset(args.dataset, root=args.data_dir, split=args.train_split)
    dataset_eval = create_dataset(args.dataset, root=args.data_dir, split=args.val_split)

    mixup_fn = None
    if args.mixup > 0 or args.cutmix > 0:
        mixup_fn = Mixup(mixup_alpha=args.mixup, cutmix_alpha=args.cutmix, label_smoothing=args.smoothing,
                         num_classes=args.num_classes)

    loader_train = create_loader(
        dataset_train,
        input_size=args.img_size,
        batch_size=args.batch_size,
        is_training=True,
        no_aug=args.no_aug,
        num_workers=args.workers,
        distributed=args.distributed,
        pin_memory=args.pin_mem,
        worker_seeding=args.worker_seeding,
    )
    loader_eval = create_loader(
        dataset_eval,
        input_size=args.img_size,
        batch_size=args.batch_size,
        is_training=False,
        num_workers=args.workers,
        distributed=args.distributed,
        pin_memory=args.pin_mem,
    )

    train_loss_fn = nn.CrossEntropyLoss(label_smoothing=args.smoothing).to(device)
    validate_loss_fn = nn.CrossEntropyLoss().to(device)

    saver = None
    output_dir = os.path.join(args.output, f"{time.strftime('%Y%m%d-%H%M%S')}-{args.model}")
    if args.rank == 0:
        os.makedirs(output_dir, exist_ok=True)
        saver = utils.CheckpointSaver(model=model, optimizer=optimizer, args=args, checkpoint_dir=output_dir)

    best_metric = best_epoch = None
    for epoch in range(start_epoch, args.epochs):
        if args.distributed and hasattr(loader_train.sampler, "set_epoch"):
            loader_train.sampler.set_epoch(epoch)
        train_metrics = train_one_epoch(epoch, model, loader_train, optimizer, train_loss_fn, args, device,
                                        mixup_fn=mixup_fn)
        eval_metrics = validate(model, loader_eval, validate_loss_fn, args, device)
        _logger.info("epoch %d: train %s, eval %s", epoch, train_metrics, eval_metrics)
        if saver is not None:
            best_metric, best_epoch = saver.save_checkpoint(epoch, metric=eval_metrics["top1"])
    if best_metric is not None:
        _logger.info("*** Best metric: %s (epoch %s)", best_metric, best_epoch)


def train_one_epoch(epoch, model, loader, optimizer, loss_fn, args, device, mixup_fn=None):
    losses_m = utils.AverageMeter()
    model.train()
    for batch_idx, (input, target) in enumerate(loader):
        input, target = input.to(device), target.to(device)
        if mixup_fn is not None:
            input, target = mixup_fn(input, target)
        output = model(input)
        loss = loss_fn(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses_m.update(loss.item(), input.size(0))
        if batch_idx % args.log_interval == 0 and args.rank == 0:
            _logger.info("train %d [%d/%d] loss %.4f", epoch, batch_idx, len(loader), losses_m.avg)
    return OrderedDict([("loss", losses_m.avg)])


def validate(model, loader, loss_fn, args, device):
    losses_m = utils.AverageMeter()
    top1_m = utils.AverageMeter()
    model.eval()
    with torch.no_grad():
        for input, target in loader:
            input, target = input.to(device), target.to(device)
            output = model(input)
            loss = loss_fn(output, target)
            acc1 = utils.accuracy(F.softmax(output, dim=-1), target, topk=(1,))[0]
            losses_m.update(loss.item(), input.size(0))
            top1_m.update(acc1.item(), output.size(0))
    return OrderedDict([("loss", losses_m.avg), ("top1", top1_m.avg)])


if __name__ == "__main__":
    main()
