"""Training (random) and evaluation (fixed) transforms."""

import math

from torchvision import transforms

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def create_transform(input_size, is_training=False, no_aug=False, hflip=0.5, color_jitter=0.4, crop_pct=0.875):
    if is_training and not no_aug:
        return transforms.Compose([
            transforms.RandomResizedCrop(input_size),
            transforms.RandomHorizontalFlip(p=hflip),
            transforms.ColorJitter(color_jitter, color_jitter, color_jitter),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ])
    scale_size = math.floor(input_size / crop_pct)
    return transforms.Compose([
        transforms.Resize(scale_size),
        transforms.CenterCrop(input_size),
        transforms.ToTensor(),
        transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])
