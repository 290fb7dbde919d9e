"""TR304: directory listings used in file-system order."""

import glob
import os
from pathlib import Path


class Images:
    def __init__(self, root):
        self.files = [os.path.join(root, f) for f in os.listdir(root)]  # expect: TR304
        self.sorted_files = sorted(os.listdir(root))  # ok
        self.masks = sorted(glob.glob(os.path.join(root, "*.png")))  # ok
        self.paths = list(Path(root).glob("*.jpg"))  # expect: TR304
        self.count = len(os.listdir(root))  # ok: a count
        later = glob.glob(os.path.join(root, "*.txt"))  # ok: sorted on the next line
        later.sort()
        self.texts = later


def all_files(root):
    out = []
    for dirpath, _dirnames, filenames in os.walk(root):  # expect: TR304
        for name in filenames:
            out.append(os.path.join(dirpath, name))
    return out


def all_files_added(root):
    out = []
    for dirpath, _dirnames, filenames in os.walk(root):  # expect: TR304
        out += [os.path.join(dirpath, name) for name in filenames]
    return out


def all_files_sorted(root):
    out = []
    for dirpath, _dirnames, filenames in os.walk(root):  # ok: sorted after the loop
        for name in filenames:
            out.append(os.path.join(dirpath, name))
    out.sort()
    return out


def all_files_sorted_in_place(root):
    out = []
    for dirpath, dirnames, filenames in os.walk(root):  # ok: traversal and files sorted
        dirnames[:] = sorted(dirnames)
        for name in sorted(filenames):
            out.append(os.path.join(dirpath, name))
    return out


def only_checked(root):
    names = [p.name for p in Path(root).iterdir()]  # ok: only tested below
    return all(name.endswith(".png") for name in names)


def has_checkpoint(root):
    return any(f.endswith(".ckpt") for f in os.listdir(root))  # ok


def cleanup(root):
    for f in os.listdir(root):  # ok: deleting does not depend on the order
        os.remove(os.path.join(root, f))
