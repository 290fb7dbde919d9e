from .dataset import ImageDataset, create_dataset
from .loader import create_loader
from .mixup import Mixup
from .transforms import create_transform

__all__ = ["ImageDataset", "Mixup", "create_dataset", "create_loader", "create_transform"]
