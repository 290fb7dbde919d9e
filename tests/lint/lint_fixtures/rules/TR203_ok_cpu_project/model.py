from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 32, 3)  # ok: the program that imports this module never uses CUDA
        self.pool = nn.MaxPool2d(2)
