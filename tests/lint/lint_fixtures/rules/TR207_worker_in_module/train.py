"""TR207 across files: the function the processes run lives in another file, so the finding is on the call that
starts them."""

import torch
import torch.multiprocessing as mp

from workers import train_worker


def main():
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    mp.spawn(train_worker, nprocs=2)  # expect: TR207


if __name__ == "__main__":
    main()
