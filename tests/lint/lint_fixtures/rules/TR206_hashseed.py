"""TR206: PYTHONHASHSEED set inside the running interpreter."""

import os
import subprocess
import sys

import torch


def setup(seed):
    os.environ["PYTHONHASHSEED"] = str(seed)  # expect: TR206
    torch.manual_seed(seed)


def relaunch():
    os.environ["PYTHONHASHSEED"] = "0"  # ok: the child process started below reads it
    subprocess.run([sys.executable, "train.py"], check=True)
