"""TR304: files read in listing order and accumulated with `+=`, `x = x + ...` or `torch.cat`: the text, the
token stream or the tensor holds the files in the file system's order."""

import glob
import os
from pathlib import Path

import numpy as np
import torch


def read_corpus(root):
    data = ""
    for path in glob.glob(os.path.join(root, "*.txt")):  # expect: TR304
        with open(path, encoding="utf-8") as f:
            data += f.read()
    return data


def read_lines(root):
    lines = []
    for path in Path(root).glob("*.txt"):  # expect: TR304
        lines += path.read_text().splitlines()
    return lines


def read_blob(root):
    blob = b""
    for name in os.listdir(root):  # expect: TR304
        blob = blob + Path(root, name).read_bytes()
    return blob


def load_tokens(root):
    ids = torch.empty(0, dtype=torch.long)
    for name in os.listdir(root):  # expect: TR304
        ids = torch.cat([ids, torch.load(os.path.join(root, name))])
    return ids


def load_shards(root):
    shards = []
    for path in glob.glob(os.path.join(root, "*.npy")):  # expect: TR304
        shards.append(np.load(path))
    return np.concatenate(shards)


def read_corpus_sorted(root):
    data = ""
    for path in sorted(glob.glob(os.path.join(root, "*.txt"))):  # ok: sorted
        with open(path, encoding="utf-8") as f:
            data += f.read()
    return data


def total_size(root):
    total = 0
    for name in os.listdir(root):  # ok: a sum of sizes is the same in any order
        total += os.path.getsize(os.path.join(root, name))
    return total


def count_lines(root):
    count = 0
    for path in glob.glob(os.path.join(root, "*.txt")):  # ok: a count
        with open(path, encoding="utf-8") as f:
            count += len(f.read().splitlines())
    return count
