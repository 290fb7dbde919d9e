import glob
import os

import numpy as np
import torch
from torch.utils.data import Dataset


class GraphFolder(Dataset):
    def __init__(self, root, seed):
        self.files = sorted(glob.glob(os.path.join(root, "*.npz")))
        names = {os.path.basename(f).split("_")[0] for f in self.files}
        self.classes = sorted(names)
        self.rng = np.random.default_rng(seed)

    def __len__(self):
        return len(self.files)

    def __getitem__(self, index):
        graph = np.load(self.files[index])
        noise = torch.from_numpy(self.rng.normal(0.0, 0.01, size=graph["x"].shape).astype(np.float32))
        return (torch.from_numpy(graph["x"]) + noise, torch.from_numpy(graph["src"]), torch.from_numpy(graph["dst"]),
                torch.from_numpy(graph["y"]))
