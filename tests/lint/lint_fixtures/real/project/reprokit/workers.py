import random

import numpy as np
import torch


def worker_init(worker_id):
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)
    info = torch.utils.data.get_worker_info()
    info.dataset.rng = np.random.default_rng(seed)
