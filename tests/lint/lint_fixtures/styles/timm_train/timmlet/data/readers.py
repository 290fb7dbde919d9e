"""Find the images of a folder tree: one class per leaf folder."""

import os
import re

IMG_EXTENSIONS = (".png", ".jpg", ".jpeg")


def natural_key(string_):
    """Sort key that orders 'img2' before 'img10'."""
    return [int(s) if s.isdigit() else s for s in re.split(r"(\d+)", string_.lower())]


def find_images_and_targets(folder, types=IMG_EXTENSIONS, class_to_idx=None, leaf_name_only=True):
    """(path, class index) of every image under folder, sorted by path, and the class -> index map."""
    labels = []
    filenames = []
    for root, _subdirs, files in os.walk(folder, topdown=False, followlinks=True):  # ok: sorted below
        rel_path = os.path.relpath(root, folder) if root != folder else ""
        label = os.path.basename(rel_path) if leaf_name_only else rel_path.replace(os.path.sep, "_")
        for f in files:
            if os.path.splitext(f)[1].lower() in types:
                filenames.append(os.path.join(root, f))
                labels.append(label)
    if class_to_idx is None:
        unique_labels = set(labels)
        sorted_labels = sorted(unique_labels, key=natural_key)  # ok: the set is sorted before it is numbered
        class_to_idx = {c: idx for idx, c in enumerate(sorted_labels)}
    images_and_targets = [(f, class_to_idx[label]) for f, label in zip(filenames, labels) if label in class_to_idx]
    images_and_targets.sort(key=lambda k: natural_key(k[0]))  # the walk's order does not survive this
    return images_and_targets, class_to_idx
