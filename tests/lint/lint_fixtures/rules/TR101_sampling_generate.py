"""TR101: a project model's `generate` samples with `torch.multinomial` when asked to, and nothing is seeded."""

import torch
from torch import nn


class CharModel(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.head = nn.Linear(vocab, vocab)

    @classmethod
    def from_pretrained(cls, path):
        model = cls(65)  # ok: overwritten by the checkpoint
        model.load_state_dict(torch.load(path))
        return model

    def generate(self, idx, steps, do_sample=False):
        for _ in range(steps):
            probs = torch.softmax(self.head(idx), dim=-1)
            if do_sample:
                idx = torch.multinomial(probs, num_samples=1)  # drawn only with do_sample=True
            else:
                idx = probs.argmax(dim=-1, keepdim=True)
        return idx


def main():
    model = CharModel.from_pretrained("char.pt")
    start = torch.zeros(1, 65)
    print(model.generate(start, 10))  # ok: greedy (the default do_sample=False) draws nothing
    print(model.generate(start, 10, do_sample=True))  # expect: TR101


if __name__ == "__main__":
    main()
