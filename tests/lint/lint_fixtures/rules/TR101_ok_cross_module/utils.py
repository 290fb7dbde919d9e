import random

import numpy as np
import torch


def init_rngs(value):
    random.seed(value)
    np.random.seed(value)
    torch.manual_seed(value)
