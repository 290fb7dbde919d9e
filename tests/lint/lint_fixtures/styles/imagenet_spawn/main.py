"""Train a torchvision classifier on an ImageFolder tree, one process per GPU (style of pytorch/examples imagenet).

--seed seeds `random` and torch and turns on deterministic cuDNN in main(); with --multiprocessing-distributed,
main() then starts the workers with mp.spawn. Spawned processes are fresh interpreters: neither the seeds nor the
cuDNN flag set in main() reach main_worker, which builds the model.
"""

import argparse
import os
import random
import shutil
import time
import warnings

import torch
import torch.backends.cudnn as cudnn
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.utils.data
import torch.utils.data.distributed
import torchvision.datasets as datasets
import torchvision.models as models
import torchvision.transforms as transforms
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import Subset

ARCHS = sorted(name for name in models.list_models(module=models) if name.islower())  # ok: names, no model

parser = argparse.ArgumentParser(description="ImageFolder classification, one process per GPU")
parser.add_argument("data", nargs="?", default="imagenet", help="root with train/ and val/ folders")
parser.add_argument("-a", "--arch", default="resnet18", choices=ARCHS)
parser.add_argument("-j", "--workers", default=4, type=int, help="data loading workers per process")
parser.add_argument("--epochs", default=90, type=int)
parser.add_argument("--start-epoch", default=0, type=int, help="first epoch (set when resuming)")
parser.add_argument("-b", "--batch-size", default=256, type=int, help="total over the GPUs of one node")
parser.add_argument("--lr", default=0.1, type=float)
parser.add_argument("--momentum", default=0.9, type=float)
parser.add_argument("--wd", default=1e-4, type=float, dest="weight_decay")
parser.add_argument("--print-freq", default=10, type=int)
parser.add_argument("--resume", default="", type=str, help="checkpoint to resume from")
parser.add_argument("--evaluate", action="store_true", help="only evaluate on the validation set")
parser.add_argument("--pretrained", action="store_true", help="start from the torchvision weights")
parser.add_argument("--world-size", default=-1, type=int, help="number of nodes")
parser.add_argument("--rank", default=-1, type=int, help="rank of this node")
parser.add_argument("--dist-url", default="tcp://127.0.0.1:23456", type=str)
parser.add_argument("--dist-backend", default="nccl", type=str)
parser.add_argument("--seed", default=None, type=int, help="seed for a reproducible run")
parser.add_argument("--gpu", default=None, type=int, help="use this GPU only")
parser.add_argument("--multiprocessing-distributed", action="store_true",
                    help="start one process per GPU of this node with mp.spawn")
parser.add_argument("--dummy", action="store_true", help="synthetic images instead of a dataset")

best_acc1 = 0.0


def main():
    args = parser.parse_args()
    if args.seed is not None:
        random.seed(args.seed)  # expect: TR105 (--seed defaults to None: the default command runs unseeded)
        torch.manual_seed(args.seed)
        cudnn.deterministic = True
        cudnn.benchmark = False
        warnings.warn("Seeded training turns on deterministic cuDNN, which can be slower.")

    if args.dist_url == "env://" and args.world_size == -1:
        args.world_size = int(os.environ["WORLD_SIZE"])
    args.distributed = args.world_size > 1 or args.multiprocessing_distributed
    ngpus_per_node = torch.cuda.device_count() if torch.cuda.is_available() else 1

    if args.multiprocessing_distributed:
        # one process per GPU of this node: the world grows by that factor
        args.world_size = ngpus_per_node * args.world_size
        mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))  # expect[spawn]: TR101|TR106
    else:
        main_worker(args.gpu, ngpus_per_node, args)


def main_worker(gpu, ngpus_per_node, args):  # expect: TR207 (the cuDNN flag set in main() is off here)
    global best_acc1
    args.gpu = gpu
    if args.distributed:
        if args.dist_url == "env://" and args.rank == -1:
            args.rank = int(os.environ["RANK"])
        if args.multiprocessing_distributed:
            args.rank = args.rank * ngpus_per_node + gpu
        dist.init_process_group(backend=args.dist_backend, init_method=args.dist_url,
                                world_size=args.world_size, rank=args.rank)

    print(f"=> building {args.arch} ({'pretrained' if args.pretrained else 'from scratch'})")
    model = models.get_model(args.arch, weights="DEFAULT" if args.pretrained else None)  # expect[spawn]: TR101|TR106

    if args.distributed and args.gpu is not None:
        torch.cuda.set_device(args.gpu)
        model.cuda(args.gpu)
        # each process gets its share of the node's batch and workers
        args.batch_size = int(args.batch_size / ngpus_per_node)
        args.workers = int((args.workers + ngpus_per_node - 1) / ngpus_per_node)
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
    elif args.distributed:
        model.cuda()
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif args.gpu is not None:
        torch.cuda.set_device(args.gpu)
        model = model.cuda(args.gpu)
    else:
        model = torch.nn.DataParallel(model).cuda()

    criterion = nn.CrossEntropyLoss().cuda(args.gpu)
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay)
    scheduler = StepLR(optimizer, step_size=30, gamma=0.1)  # the learning rate drops tenfold every 30 epochs

    if args.resume:
        if os.path.isfile(args.resume):
            location = None if args.gpu is None else f"cuda:{args.gpu}"
            checkpoint = torch.load(args.resume, map_location=location)
            args.start_epoch = checkpoint["epoch"]
            best_acc1 = checkpoint["best_acc1"]
            model.load_state_dict(checkpoint["state_dict"])
            optimizer.load_state_dict(checkpoint["optimizer"])
            scheduler.load_state_dict(checkpoint["scheduler"])
            print(f"=> resumed from {args.resume} (epoch {checkpoint['epoch']})")
        else:
            print(f"=> no checkpoint at {args.resume}")

    if args.dummy:
        # FakeData draws each image from a generator seeded with its index: the same images in every run
        train_dataset = datasets.FakeData(100_000, (3, 224, 224), 1000, transforms.ToTensor())
        val_dataset = datasets.FakeData(5_000, (3, 224, 224), 1000, transforms.ToTensor())
    else:
        normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
        train_dataset = datasets.ImageFolder(os.path.join(args.data, "train"), transforms.Compose([
            transforms.RandomResizedCrop(224),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            normalize,
        ]))
        val_dataset = datasets.ImageFolder(os.path.join(args.data, "val"), transforms.Compose([
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            normalize,
        ]))

    if args.distributed:
        train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset)  # ok: set_epoch every epoch
        val_sampler = torch.utils.data.distributed.DistributedSampler(val_dataset, shuffle=False, drop_last=True)
    else:
        train_sampler = None
        val_sampler = None

    # shuffle= is not a literal here (it is True only without a sampler): not judged, see docs/lint.md
    train_loader = torch.utils.data.DataLoader(  # expect: TR302
        train_dataset, batch_size=args.batch_size, shuffle=(train_sampler is None),
        num_workers=args.workers, pin_memory=True, sampler=train_sampler)
    val_loader = torch.utils.data.DataLoader(  # ok: the validation transforms draw no random numbers in workers
        val_dataset, batch_size=args.batch_size, shuffle=False,
        num_workers=args.workers, pin_memory=True, sampler=val_sampler)

    if args.evaluate:
        validate(val_loader, model, criterion, args)
        return

    for epoch in range(args.start_epoch, args.epochs):
        if args.distributed:
            train_sampler.set_epoch(epoch)
        train(train_loader, model, criterion, optimizer, epoch, args)
        acc1 = validate(val_loader, model, criterion, args)
        scheduler.step()

        is_best = acc1 > best_acc1
        best_acc1 = max(acc1, best_acc1)
        if not args.multiprocessing_distributed or args.rank % ngpus_per_node == 0:
            save_checkpoint({  # expect: TR501
                "epoch": epoch + 1,
                "arch": args.arch,
                "state_dict": model.state_dict(),
                "best_acc1": best_acc1,
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
            }, is_best)


def train(train_loader, model, criterion, optimizer, epoch, args):
    model.train()
    end = time.time()
    for i, (images, target) in enumerate(train_loader):
        if args.gpu is not None:
            images = images.cuda(args.gpu, non_blocking=True)
        target = target.cuda(args.gpu, non_blocking=True)
        output = model(images)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if i % args.print_freq == 0:
            print(f"epoch {epoch} [{i}/{len(train_loader)}] loss {loss.item():.4f} ({time.time() - end:.3f}s)")
        end = time.time()


def validate(val_loader, model, criterion, args):
    def run(loader):
        correct = seen = 0
        with torch.no_grad():
            for images, target in loader:
                if args.gpu is not None:
                    images = images.cuda(args.gpu, non_blocking=True)
                target = target.cuda(args.gpu, non_blocking=True)
                output = model(images)
                criterion(output, target)
                correct += (output.argmax(1) == target).sum().item()
                seen += target.numel()
        return correct, seen

    model.eval()
    correct, seen = run(val_loader)
    if args.distributed and len(val_loader.sampler) * args.world_size < len(val_loader.dataset):
        # the samples the distributed sampler dropped to even out the ranks, evaluated once more here
        rest = Subset(val_loader.dataset, range(len(val_loader.sampler) * args.world_size, len(val_loader.dataset)))
        rest_loader = torch.utils.data.DataLoader(  # ok: validation transforms, nothing random in the workers
            rest, batch_size=args.batch_size, shuffle=False, num_workers=args.workers, pin_memory=True)
        more_correct, more_seen = run(rest_loader)
        correct, seen = correct + more_correct, seen + more_seen
    return 100.0 * correct / max(seen, 1)


def save_checkpoint(state, is_best, filename="checkpoint.pth.tar"):
    torch.save(state, filename)
    if is_best:
        shutil.copyfile(filename, "model_best.pth.tar")


if __name__ == "__main__":
    main()
