"""A tiny Hugging Face Accelerate training script (CPU) for torchrepro's `accelerate launch` tests.

    accelerate launch [--cpu | --multi_gpu --num_processes N] [--mixed_precision bf16] \
        tests/scripts/accelerate_train.py [--steps N] [--unseeded]

Accelerator(cpu=True), prepare(model, optimizer, dataloader), accelerator.backward(loss), optimizer steps. Seeded
with torch.manual_seed(0) unless --unseeded (then every run starts from other weights). Each process prints one
line `accelerate <json>`: the state accelerate gave it (processes, index, mixed precision, OMP_NUM_THREADS) and the
dtype of the first layer's output (bfloat16 under accelerate's autocast with --mixed_precision bf16).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from accelerate import Accelerator


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--unseeded", action="store_true")
    args = p.parse_args()
    if not args.unseeded:
        torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    n = 4 * args.steps * accelerator.num_processes
    data = torch.utils.data.TensorDataset(torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    dtypes = []
    model[0].register_forward_hook(lambda module, inputs, output: dtypes.append(str(output.dtype)))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for step, (x, y) in enumerate(loader, start=1):
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if step == args.steps:
            break
    print("accelerate " + json.dumps({"num_processes": accelerator.num_processes,
                                      "process_index": accelerator.process_index,
                                      "mixed_precision": accelerator.mixed_precision, "dtype": dtypes[-1],
                                      "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}), flush=True)


if __name__ == "__main__":
    main()
