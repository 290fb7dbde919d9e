"""TR402: every rank shuffles the whole dataset with the same seed."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler


def main(train_set, net):
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(net)
    a = DataLoader(train_set, batch_size=32, shuffle=True)  # expect: TR402
    g = torch.Generator()
    g.manual_seed(1234)
    b = DataLoader(train_set, batch_size=32, shuffle=True, generator=g)  # expect: TR402
    g_rank = torch.Generator().manual_seed(1234 + rank)
    c = DataLoader(train_set, batch_size=32, shuffle=True, generator=g_rank)  # ok: the seed depends on the rank
    d = DataLoader(train_set, batch_size=32, sampler=DistributedSampler(train_set))  # ok: sharded
    return model, a, b, c, d


if __name__ == "__main__":
    main(None, None)
