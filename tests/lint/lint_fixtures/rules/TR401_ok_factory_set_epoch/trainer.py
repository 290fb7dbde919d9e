"""A library training loop: the epoch is set through a helper in another file of the project."""

from torch.utils.data import DataLoader, DistributedSampler

from epochs import advance


def fit(model, dataset, epochs):
    sampler = DistributedSampler(dataset, seed=0)  # ok: advance() calls set_epoch
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    for epoch in range(epochs):
        advance(loader, epoch)
        for batch in loader:
            model(batch)
