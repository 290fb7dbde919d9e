"""Near misses for TR304: directory walks whose results are sorted before use."""

import glob
import os


def walk_then_sort(root):
    files = []
    for dirpath, _dirs, names in os.walk(root):  # ok: files.sort() below
        files += [os.path.join(dirpath, n) for n in names]
    files.sort()
    return files


def walk_then_sorted(root):
    found = []
    for dirpath, _dirs, names in os.walk(root):  # ok: sorted(found) below
        found.extend(os.path.join(dirpath, n) for n in names)
    return sorted(found)


def walk_sorted_in_place(root):
    out = []
    for dirpath, dirs, names in os.walk(root):  # ok: dirs and names sorted in place
        dirs.sort()
        names.sort()
        for n in names:
            out.append(os.path.join(dirpath, n))
    return out


def walk_sorted_glob(root):
    out = []
    for dirpath, dirs, _names in os.walk(root):  # ok: traversal sorted, each directory's glob sorted
        dirs.sort()
        out.extend(sorted(glob.glob(os.path.join(dirpath, "*.jpg"))))
    return out


def images_and_targets(folder, sort=True):
    labels = []
    filenames = []
    for dirpath, _subdirs, names in os.walk(folder):  # ok: the pairs built from both lists are sorted
        for f in names:
            filenames.append(os.path.join(dirpath, f))
            labels.append(os.path.basename(dirpath))
    class_to_idx = {c: i for i, c in enumerate(sorted(set(labels)))}
    pairs = [(f, class_to_idx[lab]) for f, lab in zip(filenames, labels)]
    if sort:
        pairs = sorted(pairs, key=lambda p: p[0])
    return pairs, class_to_idx
