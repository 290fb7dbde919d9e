"""Near miss for TR101: the seed is set in a helper in another file (utils.py) that main() calls.

The helper's name does not say "seed", so only following the import finds it.
"""

import torch

from utils import init_rngs


def main():
    init_rngs(0)
    model = torch.nn.Linear(3, 3)  # ok: seeded by utils.init_rngs
    print(model(torch.randn(2, 3)))


if __name__ == "__main__":
    main()
