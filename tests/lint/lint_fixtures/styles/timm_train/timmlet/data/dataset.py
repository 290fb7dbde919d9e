"""Image classification datasets."""

import os

import torch.utils.data as data
from PIL import Image

from .readers import find_images_and_targets


class ImageDataset(data.Dataset):
    def __init__(self, root, transform=None, target_transform=None, class_map=None):
        self.samples, self.class_to_idx = find_images_and_targets(root, class_to_idx=class_map)
        if not self.samples:
            raise RuntimeError(f"found no images in {root}")
        self.transform = transform
        self.target_transform = target_transform

    def __getitem__(self, index):
        path, target = self.samples[index]
        with open(path, "rb") as f:
            img = Image.open(f).convert("RGB")
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target

    def __len__(self):
        return len(self.samples)


def create_dataset(name, root, split="validation", class_map=None):
    """An ImageDataset of root/<split> (name is kept for the command line; only folders are supported)."""
    split_root = os.path.join(root, split)
    if not os.path.isdir(split_root):
        raise FileNotFoundError(f"{name}: no folder {split_root}")
    return ImageDataset(split_root, class_map=class_map)
