"""Logs when its process started and when the script itself started and ended, then trains a few steps, its
parameters updated by hand (no torch.optim, whose first use imports torch._dynamo: about 1 CPU s a run).

``startlog.py LOG [--steps N] [--fail] [--sleep S]`` appends one JSON line to LOG at the script's
start (``{"event": "start", "pid", "process_started", "script_started"}``, ``process_started`` read from /proc:
when the interpreter was exec'd) and one at its end (``{"event": "end", "pid", "t"}``). ``--fail``: exit 3 before
training; ``--sleep S``: sleep S seconds before training (a run that is still going when a signal comes).
"""
import argparse
import json
import os
import sys
import time


def process_started() -> float:
    """The epoch time this process was started (Linux: /proc/self/stat's start time after boot, in clock ticks)."""
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rpartition(")")[2].split()[19])
    with open("/proc/stat") as f:
        boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def log(path: str, **fields: object) -> None:
    with open(path, "a") as f:
        f.write(json.dumps({"pid": os.getpid(), **fields}) + "\n")


parser = argparse.ArgumentParser()
parser.add_argument("log")
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--fail", action="store_true")
parser.add_argument("--sleep", type=float, default=0.0)
args = parser.parse_args()
log(args.log, event="start", process_started=process_started(), script_started=time.time())
if args.fail:
    sys.exit(3)
time.sleep(args.sleep)

import torch  # noqa: E402 - after the log line: the script's own start is what the log says
from torch import nn  # noqa: E402

torch.manual_seed(0)
model = nn.Linear(4, 2)
x = torch.randn(8, 4)
for _ in range(args.steps):
    model(x).square().mean().backward()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad, alpha=-0.1)
            p.grad = None
log(args.log, event="end", t=time.time())
