"""TR203: the device is picked at run time (`"cuda" if torch.cuda.is_available() else "cpu"`), so the program runs
on CUDA wherever there is a GPU: its cuDNN LSTM and convolutions are reported."""

import torch
from torch import nn


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(1000, 64)  # ok: embedding is deterministic
        self.char_conv = nn.Conv1d(64, 64, 3)  # expect: TR203
        self.rnn = nn.LSTM(64, 128, batch_first=True)  # expect: TR203


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return Tagger().to(device)


if __name__ == "__main__":
    main()
