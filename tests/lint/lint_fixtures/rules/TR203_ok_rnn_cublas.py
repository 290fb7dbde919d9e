"""Near miss for TR203: an LSTM in a program that fixes cuBLAS's workspace before CUDA starts (what makes cuDNN's
RNN kernels deterministic; deterministic mode is not needed for them)."""

import os

import torch
from torch import nn


def main():
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.manual_seed(0)
    lstm = nn.LSTM(32, 64, num_layers=2).cuda()  # ok: CUBLAS_WORKSPACE_CONFIG is set first
    rnn = nn.RNN(32, 64)  # ok: same
    return lstm, rnn


if __name__ == "__main__":
    main()
