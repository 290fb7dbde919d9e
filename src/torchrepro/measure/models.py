"""Models bundled with torchrepro: a ResNet-18 written here (no torchvision), and the training script
that ``torchrepro bench --builtin resnet18`` times.

The ResNet-18 has torchvision's layout and parameter names (a 7x7 stem, four stages of two basic blocks,
global average pooling, one linear layer), so its numbers compare with published ResNet-18 timings (e.g. fp32
17.94 → 20.90 ms per step under deterministic mode, bf16 autocast 12.42 → 14.37 ms, on one GPU).

Run it on its own::

    python -m torchrepro.measure.models --precision bf16 --steps 20
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

import torch
from torch import nn

from .._core.compat import device_problem

PRECISIONS = ("fp32", "bf16")
PROG = "python -m torchrepro.measure.models"


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and a residual connection (1x1 projection when the shape changes)."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    """ResNet-18 (He et al. 2016) with torchvision's module names; ``num_classes`` outputs."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        widths = (64, 128, 256, 512)
        stages, inplanes = [], 64
        for i, planes in enumerate(widths):
            stride = 1 if i == 0 else 2
            stages.append(nn.Sequential(BasicBlock(inplanes, planes, stride), BasicBlock(planes, planes)))
            inplanes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(num_classes: int = 1000) -> ResNet18:
    return ResNet18(num_classes)


BUILTINS = {"resnet18": resnet18}


def best_device() -> torch.device:
    """CUDA if available, then MPS, else CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG,
                                description="Train the bundled ResNet-18 on synthetic images (what `torchrepro bench "
                                            "--builtin resnet18` times).")
    p.add_argument("--model", choices=sorted(BUILTINS), default="resnet18")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32", help="fp32, or bf16 autocast")
    p.add_argument("--steps", type=int, default=50, help="training steps (default 50)")
    p.add_argument("--batch-size", type=int, default=None, help="default 32 on GPUs, 8 on CPU")
    p.add_argument("--image-size", type=int, default=None, help="default 224 on GPUs, 64 on CPU")
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--device", default=None, help="default: the best available (cuda, mps, cpu)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    problem = device_problem(args.device) if args.device else None
    if problem is not None:
        print(f"{PROG}: error: --device {args.device}: {problem}. Leave --device out to train on the best "
              f"available device ({best_device()}), or pass one this machine has.", file=sys.stderr)
        return 2
    device = torch.device(args.device) if args.device else best_device()
    on_cpu = device.type == "cpu"
    batch = args.batch_size or (8 if on_cpu else 32)
    size = args.image_size or (64 if on_cpu else 224)
    seed = int(os.environ.get("TORCHREPRO_SEED") or 0)
    torch.manual_seed(seed)
    model = BUILTINS[args.model](args.classes).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    gen = torch.Generator().manual_seed(seed)
    batches = [(torch.randn(batch, 3, size, size, generator=gen).to(device),
                torch.randint(0, args.classes, (batch,), generator=gen).to(device)) for _ in range(4)]
    dtype = torch.bfloat16 if args.precision == "bf16" else None
    start = time.perf_counter()
    for step in range(args.steps):
        x, y = batches[step % len(batches)]
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    print(f"{args.model} {args.precision} on {device}: {args.steps} steps, batch {batch}, {size}x{size}, "
          f"{(time.perf_counter() - start) / max(args.steps, 1) * 1e3:.2f} ms/step, final loss {loss.item():.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
