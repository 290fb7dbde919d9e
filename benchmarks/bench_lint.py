"""`torchrepro lint` throughput on a generated corpus of realistic training code, on one core.

Target: >= 20,000 lines per second of CPU time (files read, parsed, analysed and reported, by one
single-threaded process). CPU time is what one core spends, so the figure holds on a shared machine where
other processes compete for cores; wall-clock time is printed beside it. Also prints what parsing alone
costs, for scale.
Run: python benchmarks/bench_lint.py [--files 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import ast
import importlib
import os
import random
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

TARGET = 20_000
SRC = Path(__file__).resolve().parent.parent / "src" / "torchrepro"


def import_lint() -> types.ModuleType:
    """``torchrepro.lint`` without running ``torchrepro/__init__.py`` (which imports torch): the lint
    subpackage needs only the standard library, so the benchmark measures the linter, not torch's import."""
    if "torchrepro" not in sys.modules:
        package = types.ModuleType("torchrepro")
        package.__path__ = [str(SRC)]
        sys.modules["torchrepro"] = package
    return importlib.import_module("torchrepro.lint")


# --- the corpus ---------------------------------------------------------------------------------------------------
HEADER = '''"""{title}.

Trains a {kind} on {data} and writes checkpoints and metrics to --out.
"""

import argparse
import json
import logging
import math
import os
import random
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

logger = logging.getLogger(__name__)
'''

DATASET = '''

class {name}Dataset(Dataset):
    """Samples stored as .npy files under root/split, labels in the file name."""

    def __init__(self, root, split="train", augment=False, seed=0):
        self.root = Path(root) / split
        self.files = {listing}
        self.labels = [int(p.stem.rsplit("_", 1)[-1]) for p in self.files]
        self.augment = augment
        self.rng = np.random.default_rng({rng_seed})
        self.classes = {classes}

    def __len__(self):
        return len(self.files)

    def __getitem__(self, index):
        x = np.load(self.files[index]).astype(np.float32)
        if self.augment:
            x = x + self.rng.normal(0.0, {noise}, size=x.shape).astype(np.float32)
            if self.rng.random() < 0.5:
                x = x[..., ::-1].copy()
        return torch.from_numpy(x), self.labels[index]
'''

BLOCK = '''

class {name}(nn.Module):
    def __init__(self, channels, hidden={hidden}, dropout={dropout}):
        super().__init__()
        self.conv1 = nn.Conv{dim}d(channels, hidden, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm{dim}d(hidden)
        self.conv2 = nn.Conv{dim}d(hidden, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm{dim}d(channels)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.drop(out)
        out = self.bn2(self.conv2(out))
        return F.relu(out + x)
'''

MODEL = '''

class {name}(nn.Module):
    def __init__(self, in_channels={cin}, num_classes={classes}, width={width}, depth={depth}):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv{dim}d(in_channels, width, 3, padding=1), nn.ReLU())
        self.blocks = nn.Sequential(*[{block}(width) for _ in range(depth)])
        self.pool = nn.{pool}
        self.head = nn.Linear(width, num_classes)
        self.reset_parameters()

    def reset_parameters(self):
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.{init}(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.head(torch.flatten(self.pool(x), 1))
'''

HELPERS = '''

def {seed_fn}(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    {det}


def accuracy(logits, target, topk=(1,)):
    maxk = max(topk)
    _, pred = logits.topk(maxk, 1, True, True)
    correct = pred.t().eq(target.view(1, -1).expand_as(pred.t()))
    return [correct[:k].reshape(-1).float().sum(0).item() * 100.0 / target.size(0) for k in topk]


class AverageMeter:
    def __init__(self, name):
        self.name = name
        self.reset()

    def reset(self):
        self.sum, self.count = 0.0, 0

    def update(self, value, n=1):
        self.sum += value * n
        self.count += n

    @property
    def avg(self):
        return self.sum / max(self.count, 1)


def train_one_epoch(model, loader, optimizer, scheduler, device, epoch, log_every={log_every}):
    model.train()
    losses, top1 = AverageMeter("loss"), AverageMeter("acc@1")
    start = time.time()
    for step, (x, y) in enumerate(loader):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        logits = model(x)
        loss = F.cross_entropy(logits, y, label_smoothing={smoothing})
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), {clip})
        optimizer.step()
        scheduler.step()
        losses.update(loss.item(), x.size(0))
        top1.update(accuracy(logits, y)[0], x.size(0))
        if step % log_every == 0:
            logger.info("epoch %d step %d loss %.4f acc %.2f (%.1fs)", epoch, step, losses.avg, top1.avg,
                        time.time() - start)
    return losses.avg, top1.avg


@torch.no_grad()
def evaluate(model, loader, device):
    model.eval()
    losses, top1 = AverageMeter("loss"), AverageMeter("acc@1")
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        logits = model(x)
        losses.update(F.cross_entropy(logits, y).item(), x.size(0))
        top1.update(accuracy(logits, y)[0], x.size(0))
    return losses.avg, top1.avg


def save_checkpoint(path, model, optimizer, scheduler, epoch, step):
    torch.save({{
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "epoch": epoch,
        "step": step,{rng_state}
    }}, path)
'''

MAIN = '''

def parse_args():
    parser = argparse.ArgumentParser(description="{title}")
    parser.add_argument("--data", default="./data")
    parser.add_argument("--out", default="./runs/{slug}")
    parser.add_argument("--epochs", type=int, default={epochs})
    parser.add_argument("--batch-size", type=int, default={batch})
    parser.add_argument("--lr", type=float, default={lr})
    parser.add_argument("--weight-decay", type=float, default=5e-4)
    parser.add_argument("--workers", type=int, default={workers})
    parser.add_argument("--seed", type=int, default={seed})
    parser.add_argument("--width", type=int, default={width})
    parser.add_argument("--depth", type=int, default={depth})
    parser.add_argument("--resume", default="")
    parser.add_argument("--amp", action="store_true")
    return parser.parse_args()


def main():
    args = parse_args()
    logging.basicConfig(level=logging.INFO)
    {seed_fn}(args.seed)
    {bench}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    train_set = {dataset}Dataset(args.data, "train", augment=True, seed=args.seed)
    val_set = {dataset}Dataset(args.data, "val", seed=args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, {shuffle}, num_workers=args.workers,
                              pin_memory=True, drop_last=True, worker_init_fn=seed_worker)
    val_loader = DataLoader(val_set, batch_size=args.batch_size, num_workers=args.workers, generator=generator)
    model = {model}(width=args.width, depth=args.depth).to(device)
    optimizer = torch.optim.{optimizer}(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    total = args.epochs * len(train_loader)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=max(total, 1))
    start_epoch = 0
    if args.resume and os.path.exists(args.resume):
        state = torch.load(args.resume, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        start_epoch = state["epoch"] + 1
    history = []
    for epoch in range(start_epoch, args.epochs):
        train_loss, train_acc = train_one_epoch(model, train_loader, optimizer, scheduler, device, epoch)
        val_loss, val_acc = evaluate(model, val_loader, device)
        history.append({{"epoch": epoch, "train_loss": train_loss, "train_acc": train_acc,
                        "val_loss": val_loss, "val_acc": val_acc, "lr": scheduler.get_last_lr()[0]}})
        save_checkpoint(out / "last.pt", model, optimizer, scheduler, epoch, (epoch + 1) * len(train_loader))
        logger.info("epoch %d: val loss %.4f acc %.2f", epoch, val_loss, val_acc)
    (out / "history.json").write_text(json.dumps(history, indent=2))
    best = max(history, key=lambda h: h["val_acc"]) if history else None
    print(json.dumps({{"best": best, "params": sum(p.numel() for p in model.parameters())}}))


def seed_worker(worker_id):
    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)
    random.seed(worker_seed)


if __name__ == "__main__":
    main()
'''


def corpus_file(i: int, rng: random.Random) -> str:
    kind = rng.choice(["ResNet", "ConvNet", "WideNet", "DenseNet", "MobileNet"])
    dim = rng.choice([1, 2, 2, 2, 3])
    name = f"{kind}{i}"
    blocks = [f"Block{i}_{j}" for j in range(rng.randint(2, 6))]
    parts = [HEADER.format(title=f"Experiment {i}: {kind} training", kind=kind,
                           data=rng.choice(["CIFAR-10 shards", "spectrograms", "volumes", "sensor windows"]))]
    parts.append(DATASET.format(
        name=name,
        listing=rng.choice(["sorted(self.root.glob(\"*.npy\"))", "sorted(self.root.glob(\"*.npy\"))",
                            "list(self.root.glob(\"*.npy\"))"]),
        rng_seed=rng.choice(["seed", "seed", ""]), noise=rng.choice([0.01, 0.05, 0.1]),
        classes=rng.choice(["sorted(set(self.labels))", "sorted(set(self.labels))", "list(set(self.labels))"])))
    for block in blocks:
        parts.append(BLOCK.format(name=block, hidden=rng.choice([32, 64, 128]), dropout=rng.choice([0.0, 0.1, 0.2]),
                                  dim=dim))
    parts.append(MODEL.format(name=name, cin=rng.choice([1, 3]), classes=rng.choice([10, 100, 1000]),
                              width=rng.choice([32, 64]), depth=rng.randint(2, 8), dim=dim, block=rng.choice(blocks),
                              pool=rng.choice([f"AdaptiveAvgPool{dim}d(1)", f"AdaptiveMaxPool{dim}d(1)"]),
                              init=rng.choice(["xavier_uniform_", "kaiming_normal_", "orthogonal_"])))
    seed_fn = rng.choice(["set_seed", "seed_everything", "fix_seeds"])
    parts.append(HELPERS.format(
        seed_fn=seed_fn, log_every=rng.choice([10, 50, 100]), smoothing=rng.choice([0.0, 0.1]),
        clip=rng.choice([1.0, 5.0]),
        det=rng.choice(["torch.use_deterministic_algorithms(True)", "torch.backends.cudnn.deterministic = True",
                        "pass"]),
        rng_state=rng.choice(["", '\n        "rng": torch.get_rng_state(),'])))
    parts.append(MAIN.format(
        title=f"Experiment {i}", slug=f"exp{i}", epochs=rng.choice([10, 30, 90]), batch=rng.choice([64, 128, 256]),
        lr=rng.choice([0.1, 0.01, 3e-4]), workers=rng.choice([0, 4, 8]), seed=rng.choice([0, 42, 1234]),
        width=rng.choice([32, 64]), depth=rng.randint(2, 8), seed_fn=seed_fn, dataset=name, model=name,
        bench=rng.choice(["torch.backends.cudnn.benchmark = True", "torch.backends.cudnn.benchmark = False"]),
        shuffle=rng.choice(["shuffle=True, generator=generator", "shuffle=True"]),
        optimizer=rng.choice(["SGD", "AdamW", "Adam"])))
    return "".join(parts)


def write_corpus(directory: Path, files: int) -> int:
    rng = random.Random(0)
    lines = 0
    for i in range(files):
        text = corpus_file(i, rng)
        ast.parse(text)  # the corpus is valid Python
        (directory / f"train_{i:04d}.py").write_text(text)
        lines += text.count("\n")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    lint = import_lint()
    assert "torch" not in sys.modules, "the linter imported torch"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "pyproject.toml").write_text("")
        lines = write_corpus(root, args.files)
        config = lint.LintConfig(base=root)
        old = os.getcwd()
        os.chdir(root)
        try:
            lint.lint_paths(["."], config)  # warm-up (file cache, imports)
            lint_cpu, lint_wall, parse_cpu, result = [], [], [], None
            for _ in range(args.rounds):
                c0, w0 = time.process_time(), time.perf_counter()
                result = lint.lint_paths(["."], config)
                lint_cpu.append(time.process_time() - c0)
                lint_wall.append(time.perf_counter() - w0)
                c0 = time.process_time()
                for path in sorted(root.glob("*.py")):
                    ast.parse(path.read_bytes())
                parse_cpu.append(time.process_time() - c0)
        finally:
            os.chdir(old)
    lint_t, parse_t, wall_t = statistics.median(lint_cpu), statistics.median(parse_cpu), statistics.median(lint_wall)
    rate = lines / lint_t
    by_code: dict[str, int] = {}
    for d in result.diagnostics:
        by_code[d.code] = by_code.get(d.code, 0) + 1
    print(f"corpus: {args.files} generated training scripts, {lines:,} lines; Python {sys.version.split()[0]}, "
          f"one process, median of {args.rounds} rounds, CPU time")
    print(f"  ast.parse only        {parse_t * 1e3:8.1f} ms   {lines / parse_t:10,.0f} lines/s")
    print(f"  torchrepro lint       {lint_t * 1e3:8.1f} ms   {rate:10,.0f} lines/s   "
          f"(wall clock {wall_t * 1e3:.0f} ms, {lines / wall_t:,.0f} lines/s; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    print(f"  findings: {len(result.diagnostics)} ({', '.join(f'{k}: {v}' for k, v in sorted(by_code.items()))})")
    print(f"lint throughput = {rate:,.0f} lines/s (target >= {TARGET:,}) {'OK' if rate >= TARGET else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
