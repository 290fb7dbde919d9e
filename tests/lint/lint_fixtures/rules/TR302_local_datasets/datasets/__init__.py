"""The project's datasets: image files, augmented for training."""

from pathlib import Path

import torch
import torchvision.transforms as T
from PIL import Image

TRAIN_TRANSFORM = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor()])
VAL_TRANSFORM = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor()])


class ImageFiles(torch.utils.data.Dataset):
    def __init__(self, root, transform):
        self.files = sorted(Path(root).glob("*.jpg"))
        self.transform = transform

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        return self.transform(Image.open(self.files[i]).convert("RGB"))


def build_dataset(root, train):
    return ImageFiles(root, TRAIN_TRANSFORM if train else VAL_TRANSFORM)
