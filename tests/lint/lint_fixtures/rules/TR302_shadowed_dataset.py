"""TR302: a project class that shadows the name it derives from (`class Dataset(Dataset)`), with random flips
chosen by a constructor flag."""

from multiprocessing import cpu_count

from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms as T


class Dataset(Dataset):
    def __init__(self, paths, image_size, flip=False):
        self.paths = paths
        self.transform = T.Compose([T.Resize(image_size), T.RandomHorizontalFlip() if flip else nn.Identity(),
                                    T.ToTensor()])

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, index):
        return self.transform(Image.open(self.paths[index]))


class Trainer:
    def __init__(self, paths, image_size=64, flip=True):
        self.ds = Dataset(paths, image_size, flip=flip)
        self.dl = DataLoader(self.ds, batch_size=16, shuffle=True, num_workers=cpu_count())  # expect: TR302
        self.eval_dl = DataLoader(Dataset(paths, image_size), batch_size=16, num_workers=4)  # ok: flip=False
