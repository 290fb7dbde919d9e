"""Near misses for TR302: loaders whose workers draw no random numbers (validation transforms, deterministic
datasets), and datasets the linter cannot see into (not reported)."""

import argparse

import numpy as np
import torch
import torchvision.datasets as dset
import torchvision.transforms as transforms
from torch.utils.data import DataLoader, Dataset

from datasets_factory import build_dataset


class Arrays(Dataset):
    def __init__(self, files, transform=None):
        self.files, self.transform = files, transform

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        x = torch.from_numpy(np.load(self.files[i]))
        if self.transform:
            x = self.transform(x)
        return x


class Flagged(Dataset):
    def __init__(self, files, split="train", augment=False):
        self.files, self.split, self.augment = files, split, augment

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        x = np.load(self.files[i])
        if self.augment:
            x = x + np.random.normal(size=x.shape)
        if self.split == "train":
            x = x[..., ::-1] if np.random.rand() < 0.5 else x
        return torch.from_numpy(x)


def build_transform(train):
    train_tf = transforms.Compose([transforms.RandomCrop(32, padding=4), transforms.ToTensor()])
    val_tf = transforms.ToTensor()
    return train_tf if train else val_tf


class Data:
    def __init__(self, root, workers):
        self.root, self.workers = root, workers
        self.test_tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.5,), (0.5,))])

    def setup(self):
        self.test_set = dset.CIFAR10(self.root, train=False, transform=self.test_tf)

    def test_dataloader(self):
        return DataLoader(self.test_set, batch_size=256, num_workers=self.workers)  # ok: ToTensor, Normalize


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", default="folder")
    parser.add_argument("--workers", type=int, default=2)
    opt = parser.parse_args()
    if opt.dataset == "folder":
        dataset = dset.ImageFolder(root="data", transform=transforms.Compose([
            transforms.Resize(64), transforms.CenterCrop(64), transforms.ToTensor(),
            transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))]))
    elif opt.dataset == "mnist":
        dataset = dset.MNIST(root="data", download=True, transform=transforms.Compose([
            transforms.Resize(64), transforms.ToTensor(), transforms.Normalize((0.5,), (0.5,))]))
    else:
        dataset = dset.FakeData(image_size=(3, 64, 64), transform=transforms.ToTensor())
    loader = DataLoader(dataset, batch_size=64, num_workers=int(opt.workers))  # ok: no random transform
    arrays = DataLoader(Arrays(["a.npy"]), batch_size=8, num_workers=4)  # ok: __getitem__ draws nothing
    unknown = DataLoader(build_dataset("train"), batch_size=8, num_workers=4)  # ok: cannot see the dataset
    flagged = DataLoader(Flagged(["a.npy"], split="val"), batch_size=8, num_workers=4)  # ok: augment=False, "val"
    val_set = dset.ImageFolder("data/val", transform=build_transform(train=False))
    chosen = DataLoader(val_set, batch_size=8, num_workers=4)  # ok: build_transform(train=False) is ToTensor
    return loader, arrays, unknown, flagged, chosen


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
