"""TR203: explicit index_put_ calls whose duplicate indices make the result depend on the write order (CUDA),
and index_put_(accumulate=True), deterministic on CUDA but not on CPU with 2+ threads. Subscript assignment
(`x[mask] = 0`, `x[idx] = v`) is index_put_ too, but its indices are usually a boolean mask or unique: not judged."""

import torch


def write_rows(table, idx, rows):
    return table.index_put_((idx,), rows)  # expect: TR203


def write_rows_functional(table, idx, rows):
    return torch.index_put(table, (idx,), rows, accumulate=False)  # expect: TR203


def accumulate_rows(table, idx, rows, flag):
    table.index_put_((idx,), rows, accumulate=True)  # expect: TR203
    table.index_put_((idx,), rows, accumulate=flag)  # ok: not a literal, not judged
    return table


def masked(x, idx, values):
    x[x < 0] = 0  # ok: boolean mask, no duplicates
    x[idx] = values  # ok: subscript assignment is not judged (unique indices are the common case)
    return x


def main():
    torch.manual_seed(0)
    write_rows(torch.zeros(4, 2).cuda(), torch.tensor([0, 0]), torch.ones(2, 2))


if __name__ == "__main__":
    main()
