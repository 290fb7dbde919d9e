"""TR105: seeds that differ in every run."""

import datetime
import os
import random
import time
import uuid

import numpy as np
import torch
from transformers import set_seed


def main(args):
    seed = int(time.time())
    torch.manual_seed(seed)  # expect: TR105
    np.random.seed(os.getpid())  # expect: TR105
    random.seed()  # expect: TR105
    np.random.seed(None)  # expect: TR105
    torch.seed()  # expect: TR105
    rng = np.random.default_rng(uuid.uuid4().int)  # expect: TR105
    torch.cuda.manual_seed_all(int.from_bytes(os.urandom(4), "little"))  # expect: TR105
    set_seed(hash(args.run_name) % 2**32)  # expect: TR105
    random.seed(datetime.datetime.now().microsecond)  # expect: TR105
    g = torch.Generator()
    g.seed()  # expect: TR105
    torch.manual_seed(hash((3, 4)))  # ok: hash of ints is the same in every run
    torch.manual_seed(args.seed)  # ok
    np.random.seed(torch.initial_seed() % 2**32)  # ok
    torch.manual_seed(args.seed or int(time.time()))  # expect: TR105 (the clock when no seed is given, not logged)
    fallback = args.seed if args.seed is not None else int(time.time())
    print("seed:", fallback)
    random.seed(fallback)  # expect: TR105 (the clock when no seed is given; logged, repeatable only by hand)
    return rng, g


def seed_all(seed=None):
    if seed is None:
        seed = random.SystemRandom().randrange(2**32)
        print(f"no seed given, using {seed}")
    torch.manual_seed(seed)  # expect: TR105 (a logged fallback: seed_all() repeats only by hand)
