"""TR203: index_copy_ with duplicate indices keeps whichever write lands last (on CUDA; deterministic mode switches
to a deterministic kernel)."""

import torch


def copy_rows(out, idx, rows):
    out.index_copy_(0, idx, rows)  # expect: TR203
    return out


def copy_rows_functional(out, idx, rows):
    return torch.index_copy(out, 0, idx, rows)  # expect: TR203


def select_rows(x, idx):
    return x.index_select(0, idx)  # ok: only its backward (index_add_) varies, and indexing is everywhere


def main():
    torch.manual_seed(0)
    copy_rows(torch.zeros(4, 2).cuda(), torch.tensor([0, 0]), torch.ones(2, 2))


if __name__ == "__main__":
    main()
