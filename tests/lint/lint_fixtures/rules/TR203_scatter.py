"""TR203: scatter_/scatter with a tensor src (which write wins among duplicate indices, on CUDA); with a scalar
value every write is the same, so the result does not depend on the order."""

import torch


def scatter_rows(out, idx, src):
    return out.scatter_(0, idx, src)  # expect: TR203


def scatter_functional(out, idx, src):
    return torch.scatter(out, 0, idx, src=src)  # expect: TR203


class LabelSmoothing:
    def __init__(self, confidence):
        self.confidence = confidence

    def targets(self, logits, target):
        one_hot = torch.zeros_like(logits).scatter_(1, target.unsqueeze(1), 1.0)  # ok: a scalar value
        smooth = torch.zeros_like(logits).scatter_(1, target.unsqueeze(1), self.confidence)  # ok: a configured scalar
        filled = torch.zeros_like(logits).scatter_(1, target.unsqueeze(1), value=1 - self.confidence)  # ok: value=
        return one_hot, smooth, filled


def one_hot(x, num_classes, on_value=1.0, off_value=0.0):
    return torch.full((x.size(0), num_classes), off_value).scatter_(1, x, on_value)  # ok: a number-defaulted parameter


def fill_rows(out, idx, rows=None):
    return out.scatter_(0, idx, rows)  # expect: TR203


def main():
    torch.manual_seed(0)
    scatter_rows(torch.zeros(4, device="cuda"), torch.tensor([0, 0]), torch.ones(2))


if __name__ == "__main__":
    main()
