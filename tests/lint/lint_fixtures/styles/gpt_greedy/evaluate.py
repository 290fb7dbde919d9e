"""Evaluate pretrained GPT-2 weights: perplexity on a token file, read in order, and a greedy continuation.

Nothing here is random: the weights come from the released checkpoint, dropout is off in eval mode, the
evaluation windows are consecutive and decoding takes the argmax. So no seed is needed.
"""

import argparse
import math
import os

import numpy as np
import tiktoken
import torch

from model import GPT

parser = argparse.ArgumentParser(description="perplexity and greedy samples of pretrained GPT-2")
parser.add_argument("--init-from", default="gpt2", help="gpt2, gpt2-medium, gpt2-large or gpt2-xl")
parser.add_argument("--data-dir", default="data/openwebtext", help="folder with val.bin (uint16 token ids)")
parser.add_argument("--block-size", type=int, default=1024)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--max-batches", type=int, default=200)
parser.add_argument("--prompt", default="The meaning of life is")
parser.add_argument("--max-new-tokens", type=int, default=64)
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")


def windows(data, block_size, batch_size, max_batches):
    """Consecutive (input, target) windows of the token array, batch_size at a time, from the start."""
    starts = range(0, len(data) - block_size - 1, block_size)
    batch = []
    for n, i in enumerate(starts):
        if n >= max_batches * batch_size:
            break
        batch.append(i)
        if len(batch) == batch_size:
            x = torch.stack([torch.from_numpy(data[j:j + block_size].astype(np.int64)) for j in batch])
            y = torch.stack([torch.from_numpy(data[j + 1:j + 1 + block_size].astype(np.int64)) for j in batch])
            yield x, y
            batch = []


def main():
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True  # ok: TF32 changes precision, not run-to-run results

    model = GPT.from_pretrained(args.init_from, dict(dropout=0.0))  # ok: pretrained, evaluated in eval mode
    model.eval()
    model.to(args.device)

    data = np.memmap(os.path.join(args.data_dir, "val.bin"), dtype=np.uint16, mode="r")
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in windows(data, args.block_size, args.batch_size, args.max_batches):
            _, loss = model(x.to(args.device), y.to(args.device))
            total += loss.item()
            count += 1
    print(f"val loss {total / max(count, 1):.4f}, perplexity {math.exp(total / max(count, 1)):.2f}")

    enc = tiktoken.get_encoding("gpt2")
    x = torch.tensor(enc.encode(args.prompt), dtype=torch.long, device=args.device)[None, ...]
    y = model.generate(x, args.max_new_tokens)
    print(enc.decode(y[0].tolist()))


if __name__ == "__main__":
    main()
