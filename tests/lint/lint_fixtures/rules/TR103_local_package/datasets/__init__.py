"""The project's own datasets package (not Hugging Face's)."""

import os
import random


def split_files(root, val_fraction=0.1):
    files = sorted(os.listdir(root))
    random.shuffle(files)
    n = int(len(files) * val_fraction)
    return files[n:], files[:n]
