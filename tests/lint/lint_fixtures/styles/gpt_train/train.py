"""Train a GPT on a token file, on one GPU or with DDP under torchrun (style of nanoGPT's train.py).

Batches are random windows drawn with torch.randint from torch's global generator, seeded with 1337 + rank.
The checkpoint holds the model, the optimizer and the iteration, but not the generator's state: a run resumed
with --init-from resume draws other batches than the run it continues.
"""

import argparse
import math
import os
import pickle
import time
from contextlib import nullcontext

import numpy as np
import torch
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

from model import GPT, GPTConfig

parser = argparse.ArgumentParser(description="GPT training")
parser.add_argument("--out-dir", default="out")
parser.add_argument("--dataset", default="shakespeare_char")
parser.add_argument("--init-from", default="scratch", help="scratch or resume")
parser.add_argument("--eval-interval", type=int, default=250)
parser.add_argument("--eval-iters", type=int, default=200)
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--block-size", type=int, default=256)
parser.add_argument("--grad-accum", type=int, default=1)
parser.add_argument("--n-layer", type=int, default=6)
parser.add_argument("--n-head", type=int, default=6)
parser.add_argument("--n-embd", type=int, default=384)
parser.add_argument("--dropout", type=float, default=0.2)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--min-lr", type=float, default=1e-4)
parser.add_argument("--warmup-iters", type=int, default=100)
parser.add_argument("--max-iters", type=int, default=5000)
parser.add_argument("--weight-decay", type=float, default=1e-1)
parser.add_argument("--grad-clip", type=float, default=1.0)
parser.add_argument("--device", default="cuda")
parser.add_argument("--compile", action="store_true")
args = parser.parse_args()

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    init_process_group(backend="nccl")
    ddp_rank = int(os.environ["RANK"])
    ddp_local_rank = int(os.environ["LOCAL_RANK"])
    ddp_world_size = int(os.environ["WORLD_SIZE"])
    device = f"cuda:{ddp_local_rank}"
    torch.cuda.set_device(device)
    master_process = ddp_rank == 0
    seed_offset = ddp_rank  # every rank draws other batches
    assert args.grad_accum % ddp_world_size == 0
    args.grad_accum //= ddp_world_size
else:
    master_process = True
    seed_offset = 0
    ddp_world_size = 1
    device = args.device

if master_process:
    os.makedirs(args.out_dir, exist_ok=True)
torch.manual_seed(1337 + seed_offset)  # ok: a fixed seed per rank
torch.backends.cuda.matmul.allow_tf32 = True  # ok: TF32 changes precision, not run-to-run results
torch.backends.cudnn.allow_tf32 = True
device_type = "cuda" if "cuda" in device else "cpu"
ctx = nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type=device_type, dtype=torch.bfloat16)

data_dir = os.path.join("data", args.dataset)


def get_batch(split):
    """batch_size random windows of the split (the memmap is opened anew each time, which frees its pages)."""
    data = np.memmap(os.path.join(data_dir, f"{split}.bin"), dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - args.block_size, (args.batch_size,))  # ok: torch is seeded above
    x = torch.stack([torch.from_numpy(data[i:i + args.block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + args.block_size].astype(np.int64)) for i in ix])
    if device_type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


iter_num = 0
best_val_loss = 1e9
meta_vocab_size = None
meta_path = os.path.join(data_dir, "meta.pkl")
if os.path.exists(meta_path):
    with open(meta_path, "rb") as f:
        meta_vocab_size = pickle.load(f)["vocab_size"]

model_args = dict(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, block_size=args.block_size,
                  bias=False, vocab_size=meta_vocab_size or 50304, dropout=args.dropout)
checkpoint = None
if args.init_from == "resume":
    checkpoint = torch.load(os.path.join(args.out_dir, "ckpt.pt"), map_location=device)
    for k in ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size"):
        model_args[k] = checkpoint["model_args"][k]
model = GPT(GPTConfig(**model_args))
if checkpoint is not None:
    state_dict = checkpoint["model"]
    for k in list(state_dict):
        if k.startswith("_orig_mod."):  # keys of a compiled model
            state_dict[k[len("_orig_mod."):]] = state_dict.pop(k)
    model.load_state_dict(state_dict)
    iter_num = checkpoint["iter_num"]
    best_val_loss = checkpoint["best_val_loss"]
if args.block_size < model.config.block_size:
    model.crop_block_size(args.block_size)
model.to(device)

scaler = torch.amp.GradScaler("cuda", enabled=False)
optimizer = model.configure_optimizers(args.weight_decay, args.lr, (0.9, 0.95), device_type)
if checkpoint is not None:
    optimizer.load_state_dict(checkpoint["optimizer"])
checkpoint = None

if args.compile:
    model = torch.compile(model)  # ok: the default mode does not pick kernels by timing
if ddp:
    model = DDP(model, device_ids=[ddp_local_rank])
raw_model = model.module if ddp else model


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ("train", "val"):
        losses = torch.zeros(args.eval_iters)
        for k in range(args.eval_iters):
            X, Y = get_batch(split)
            with ctx:
                _, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean().item()
    model.train()
    return out


def get_lr(it):
    """Linear warm-up, then cosine decay to min_lr."""
    if it < args.warmup_iters:
        return args.lr * (it + 1) / (args.warmup_iters + 1)
    if it > args.max_iters:
        return args.min_lr
    ratio = (it - args.warmup_iters) / (args.max_iters - args.warmup_iters)
    return args.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (args.lr - args.min_lr)


X, Y = get_batch("train")
t0 = time.time()
while True:
    lr = get_lr(iter_num)
    for group in optimizer.param_groups:
        group["lr"] = lr

    if iter_num % args.eval_interval == 0 and master_process:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        if losses["val"] < best_val_loss and iter_num > 0:
            best_val_loss = losses["val"]
            checkpoint = {  # expect[ckpt]: TR501
                "model": raw_model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "model_args": model_args,
                "iter_num": iter_num,
                "best_val_loss": best_val_loss,
            }
            torch.save(checkpoint, os.path.join(args.out_dir, "ckpt.pt"))  # expect[ckpt]: TR501

    for micro_step in range(args.grad_accum):
        if ddp:
            model.require_backward_grad_sync = micro_step == args.grad_accum - 1
        with ctx:
            _, loss = model(X, Y)
            loss = loss / args.grad_accum
        X, Y = get_batch("train")  # the next batch, fetched while the GPU works
        scaler.scale(loss).backward()
    if args.grad_clip:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)

    t1 = time.time()
    dt, t0 = t1 - t0, t1
    if master_process and iter_num % 10 == 0:
        print(f"iter {iter_num}: loss {loss.item() * args.grad_accum:.4f}, {dt * 1000:.2f}ms, "
              f"mfu {100 * raw_model.estimate_mfu(args.batch_size * args.grad_accum, dt):.2f}%")
    iter_num += 1
    if iter_num > args.max_iters:
        break

if ddp:
    destroy_process_group()
