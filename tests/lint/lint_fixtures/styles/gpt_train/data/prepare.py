"""Character-level corpus: every .txt file of a folder, encoded as uint16 ids into train.bin and val.bin.

The files are read in the order glob returns them, which is the file system's: the concatenated text, and so
the train/val split and every batch, differ between machines holding the same files.
"""

import argparse
import glob
import os
import pickle

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("input_dir", help="folder with the .txt files")
parser.add_argument("--out-dir", default=os.path.dirname(__file__))
parser.add_argument("--val-fraction", type=float, default=0.1)
args = parser.parse_args()

data = ""
for path in glob.glob(os.path.join(args.input_dir, "*.txt")):  # expect: TR304
    with open(path, encoding="utf-8") as f:
        data += f.read()
print(f"length of dataset in characters: {len(data):,}")

chars = sorted(list(set(data)))  # ok: sorted before the ids are assigned
vocab_size = len(chars)
stoi = {ch: i for i, ch in enumerate(chars)}
itos = {i: ch for i, ch in enumerate(chars)}

n = len(data)
split = int(n * (1 - args.val_fraction))
train_ids = np.array([stoi[c] for c in data[:split]], dtype=np.uint16)
val_ids = np.array([stoi[c] for c in data[split:]], dtype=np.uint16)
print(f"train has {len(train_ids):,} tokens, val has {len(val_ids):,} tokens")
train_ids.tofile(os.path.join(args.out_dir, "train.bin"))
val_ids.tofile(os.path.join(args.out_dir, "val.bin"))
with open(os.path.join(args.out_dir, "meta.pkl"), "wb") as f:
    pickle.dump({"vocab_size": vocab_size, "itos": itos, "stoi": stoi}, f)
