"""TR302: loaders whose workers draw random numbers (augmentations, random crops in a Dataset, a mixing collate
function), with worker seeds left to torch's global generator."""

import random

import numpy as np
import torch
import torchvision.datasets as datasets
import torchvision.transforms as transforms
from timm.data import create_transform
from torch.utils.data import DataLoader, Dataset, random_split


class NoisyPatches(Dataset):
    def __init__(self, arrays, patch=32):
        self.arrays, self.patch = arrays, patch

    def __len__(self):
        return len(self.arrays)

    def __getitem__(self, i):
        return self._crop(self.arrays[i])

    def _crop(self, a):
        y = random.randint(0, a.shape[0] - self.patch)
        return torch.from_numpy(a[y:y + self.patch])


class HeldGenerator(Dataset):
    def __init__(self, arrays, seed):
        self.arrays = arrays
        self.rng = np.random.default_rng(seed)

    def __len__(self):
        return len(self.arrays)

    def __getitem__(self, i):
        return self.arrays[i] + self.rng.normal(size=self.arrays[i].shape)


class Folder(Dataset):
    def __init__(self, files, transform=None):
        self.files, self.transform = files, transform

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        x = torch.load(self.files[i])
        if self.transform is not None:
            x = self.transform(x)
        return x


class Flagged(Dataset):
    def __init__(self, files, augment=False):
        self.files, self.augment = files, augment

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        x = torch.load(self.files[i])
        if self.augment:
            x = x + torch.randn_like(x)
        return x


def mixup(batch):
    x = torch.stack([b[0] for b in batch])
    lam = np.random.beta(0.2, 0.2)
    return lam * x + (1 - lam) * x.flip(0)


def make_loader(dataset, workers):
    return DataLoader(dataset, batch_size=64, num_workers=workers)  # expect: TR302


def main(args, arrays, files):
    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    train_set = datasets.ImageFolder(args.train_dir, transforms.Compose([
        transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.ToTensor(), normalize]))
    val_set = datasets.ImageFolder(args.val_dir, transforms.Compose([
        transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(), normalize]))
    train = DataLoader(train_set, batch_size=64, shuffle=True, num_workers=args.workers)  # expect: TR302
    val = DataLoader(val_set, batch_size=64, num_workers=args.workers)  # ok: no randomness in the workers
    patches = DataLoader(NoisyPatches(arrays), batch_size=8, num_workers=2)  # expect: TR302
    g = torch.Generator().manual_seed(0)
    held = DataLoader(HeldGenerator(arrays, 0), batch_size=8, num_workers=2, generator=g)  # expect: TR302
    jitter = Folder(files, transform=transforms.ColorJitter(0.4, 0.4, 0.4))
    folder = DataLoader(jitter, batch_size=8, num_workers=4)  # expect: TR302
    plain = DataLoader(Folder(files), batch_size=8, num_workers=4)  # ok: no transform
    mixed = DataLoader(Folder(files), batch_size=8, num_workers=4, collate_fn=mixup)  # expect: TR302
    part, _rest = random_split(train_set, [0.9, 0.1], generator=g)
    subset = DataLoader(part, batch_size=8, num_workers=4)  # expect: TR302
    timm_set = datasets.ImageFolder(args.train_dir, transform=create_transform(224, is_training=True))
    timm_loader = DataLoader(timm_set, batch_size=8, num_workers=4)  # expect: TR302
    eval_set = datasets.ImageFolder(args.val_dir, transform=create_transform(224))
    timm_eval = DataLoader(eval_set, batch_size=8, num_workers=4)  # ok: create_transform(is_training=False)
    again = make_loader(train_set, args.workers)
    noisy = DataLoader(Flagged(files, augment=True), batch_size=8, num_workers=4)  # expect: TR302
    quiet = DataLoader(Flagged(files), batch_size=8, num_workers=4)  # ok: augment=False
    return train, val, patches, held, folder, plain, mixed, subset, timm_loader, timm_eval, again, noisy, quiet
