"""TR203: a word-level LSTM language model on CUDA, in a program that sets neither deterministic mode nor
CUBLAS_WORKSPACE_CONFIG (cuDNN's RNN kernels can vary on some cuDNN/CUDA versions without a fixed cuBLAS
workspace; deterministic mode has no other kernel for them)."""

import torch
import torch.nn as nn


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp, nhid, nlayers, dropout=0.5):
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp)  # ok: embedding backward is deterministic on CUDA
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)  # expect: TR203
        self.decoder = nn.Linear(nhid, ntoken)  # ok: not in the registry

    def forward(self, inp, hidden):
        output, hidden = self.rnn(self.encoder(inp), hidden)
        return self.decoder(output), hidden


class CharModel(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.gru = nn.GRU(n, n, batch_first=True)  # expect: TR203
        self.cell = nn.LSTMCell(n, n)  # ok: LSTMCell is not a cuDNN RNN


def main():
    torch.manual_seed(0)
    model = RNNModel(10000, 200, 200, 2).cuda()
    return model, CharModel(64)


if __name__ == "__main__":
    main()
