"""A loader factory whose only caller, a program of the project, never sets the epoch."""

from torch.utils.data import DataLoader, DistributedSampler


def make_loader(dataset):
    sampler = DistributedSampler(dataset, seed=0)  # expect: TR401
    return DataLoader(dataset, batch_size=32, sampler=sampler)
