"""Near miss for TR402: Accelerate shards the loader across ranks (accelerator.prepare)."""

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader


def main(train_set, model):
    accelerator = Accelerator()
    torch.manual_seed(0)
    loader = DataLoader(train_set, batch_size=32, shuffle=True)  # ok: prepare() gives each rank its own shard
    model, loader = accelerator.prepare(model, loader)
    torch.distributed.init_process_group("nccl")
    return model, loader


if __name__ == "__main__":
    main(None, None)
