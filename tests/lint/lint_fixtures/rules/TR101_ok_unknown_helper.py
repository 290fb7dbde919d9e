"""Near miss for TR101: a seeding helper from a package the linter cannot see counts as seeding."""

import torch
from mytools.reproducibility import set_global_seed


def main():
    set_global_seed(1234)
    model = torch.nn.Linear(3, 3)  # ok: set_global_seed is assumed to seed every library
    print(model)


if __name__ == "__main__":
    main()
