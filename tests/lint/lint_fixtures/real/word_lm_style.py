"""A word-level language model in the style of pytorch/examples (word_language_model): the vocabulary is
built in file order, the batches are fixed, torch is seeded; deterministic mode is on for the LSTM's
embedding gradients."""

import argparse
import math
import os
import time

import torch
import torch.nn as nn


class Dictionary:
    def __init__(self):
        self.word2idx = {}
        self.idx2word = []

    def add_word(self, word):
        if word not in self.word2idx:
            self.idx2word.append(word)
            self.word2idx[word] = len(self.idx2word) - 1
        return self.word2idx[word]


class Corpus:
    def __init__(self, path):
        self.dictionary = Dictionary()
        self.train = self.tokenize(os.path.join(path, "train.txt"))
        self.valid = self.tokenize(os.path.join(path, "valid.txt"))

    def tokenize(self, path):
        with open(path, encoding="utf8") as f:
            for line in f:
                for word in line.split() + ["<eos>"]:
                    self.dictionary.add_word(word)
        with open(path, encoding="utf8") as f:
            ids = [torch.tensor([self.dictionary.word2idx[w] for w in line.split() + ["<eos>"]]) for line in f]
        return torch.cat(ids)


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp, nhid, nlayers, dropout=0.5):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nlayers, self.nhid = nlayers, nhid

    def forward(self, inp, hidden):
        emb = self.drop(self.encoder(inp))
        output, hidden = self.rnn(emb, hidden)
        return self.decoder(self.drop(output)).view(-1, self.decoder.out_features), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))


def batchify(data, bsz, device):
    nbatch = data.size(0) // bsz
    return data.narrow(0, 0, nbatch * bsz).view(bsz, -1).t().contiguous().to(device)


def get_batch(source, i, bptt):
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].view(-1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="./data/wikitext-2")
    parser.add_argument("--emsize", type=int, default=200)
    parser.add_argument("--nhid", type=int, default=200)
    parser.add_argument("--nlayers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=20)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--bptt", type=int, default=35)
    parser.add_argument("--seed", type=int, default=1111)
    parser.add_argument("--cuda", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    device = torch.device("cuda" if args.cuda else "cpu")
    corpus = Corpus(args.data)
    train_data = batchify(corpus.train, 20, device)
    model = RNNModel(len(corpus.dictionary.idx2word), args.emsize, args.nhid, args.nlayers).to(device)
    criterion = nn.NLLLoss()
    lr = args.lr
    for epoch in range(1, args.epochs + 1):
        start = time.time()
        model.train()
        hidden = model.init_hidden(20)
        for i in range(0, train_data.size(0) - 1, args.bptt):
            data, targets = get_batch(train_data, i, args.bptt)
            hidden = tuple(h.detach() for h in hidden)
            model.zero_grad()
            output, hidden = model(data, hidden)
            loss = criterion(output, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-lr)
        print(f"epoch {epoch} loss {loss.item():.2f} ppl {math.exp(loss.item()):.2f} {time.time() - start:.1f}s")


if __name__ == "__main__":
    main()
