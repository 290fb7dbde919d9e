"""Read a tokenised corpus (train.txt, valid.txt, test.txt) into tensors of word ids."""

import os

import torch


class Dictionary:
    """Word <-> id, ids given in order of first appearance (the same order in every run)."""

    def __init__(self):
        self.word2idx = {}
        self.idx2word = []

    def add_word(self, word):
        if word not in self.word2idx:
            self.idx2word.append(word)
            self.word2idx[word] = len(self.idx2word) - 1
        return self.word2idx[word]

    def __len__(self):
        return len(self.idx2word)


class Corpus:
    def __init__(self, path):
        self.dictionary = Dictionary()
        self.train = self.tokenize(os.path.join(path, "train.txt"))
        self.valid = self.tokenize(os.path.join(path, "valid.txt"))
        self.test = self.tokenize(os.path.join(path, "test.txt"))

    def tokenize(self, path):
        """One tensor of ids for a whole file, with an <eos> after every line."""
        assert os.path.exists(path), path
        with open(path, encoding="utf8") as f:
            for line in f:
                for word in line.split() + ["<eos>"]:
                    self.dictionary.add_word(word)
        chunks = []
        with open(path, encoding="utf8") as f:
            for line in f:
                ids = [self.dictionary.word2idx[word] for word in line.split() + ["<eos>"]]
                chunks.append(torch.tensor(ids, dtype=torch.int64))
        return torch.cat(chunks)
