"""What each setting of deterministic mode costs in one training step, in-process and side by side.

The figures `torchrepro bench --explain` reports come from separate processes; this times the same toggles in one
process (the bundled ResNet-18, fp32, on the CPU by default), rounds interleaved, and prints per-round paired
ratios against the default step:

    python benchmarks/bench_determinism_settings.py [--batch-size 8] [--image-size 64] [--rounds 9]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import interleaved_samples, paired_ratio  # noqa: E402

import torchrepro  # noqa: E402
from torchrepro.measure.models import resnet18  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--inner", type=int, default=2)
    args = p.parse_args()
    torch.manual_seed(0)
    model = resnet18(100)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    y = torch.randint(0, 100, (args.batch_size,))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    def under(**kwargs: bool) -> object:
        def fn() -> None:
            with torchrepro.deterministic(**kwargs):  # type: ignore[arg-type]
                step()
        return fn

    variants = {
        "default": step,
        "deterministic": under(),
        "deterministic, fill off": under(fill_uninitialized_memory=False),
        "deterministic, algorithms off": under(use_deterministic_algorithms=False),
    }
    samples = interleaved_samples(variants, rounds=args.rounds, inner=args.inner)  # type: ignore[arg-type]
    print(f"ResNet-18 fp32 step, batch {args.batch_size} at {args.image_size}x{args.image_size}, "
          f"{torch.get_num_threads()} threads, {args.rounds} rounds x {args.inner} steps")
    for name in variants:
        med, q1, q3 = paired_ratio(samples, name, "default")
        ms = sorted(samples[name])[len(samples[name]) // 2] * 1e3
        print(f"  {name:32s} {ms:9.2f} ms/step   ratio vs default {med:.3f} (IQR {q1:.3f}-{q3:.3f})")
    full = paired_ratio(samples, "deterministic", "default")[0]
    no_fill = paired_ratio(samples, "deterministic, fill off", "default")[0]
    print(f"  the fill's share of deterministic mode's overhead: {full - no_fill:+.3f} of {full - 1:+.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
