"""TR105: seeds drawn from a generator that is not seeded yet (random, numpy.random, torch), or chosen at
random when no seed is given (logged or not: the default run cannot be repeated without passing the printed
value back), unless a fixed default of the option means that never happens."""

import argparse
import logging
import random

import numpy as np
import torch

log = logging.getLogger(__name__)


def drawn_seeds():
    seed = random.randint(1, 10000)
    torch.manual_seed(seed)  # expect: TR105
    np.random.seed(np.random.randint(2**31))  # expect: TR105


def drawn_from_torch():
    torch_seed = torch.randint(0, 2**31, (1,)).item()
    random.seed(torch_seed)  # expect: TR105


def drawn_and_printed():
    seed = random.randrange(2**32)
    print(f"seed: {seed}")
    torch.manual_seed(seed)  # expect: TR105


def derived_from_a_seeded_generator(args):
    random.seed(args.seed)
    worker_seed = random.randint(0, 2**31)
    torch.manual_seed(worker_seed)  # ok: random is seeded before the draw


def fallback_logged():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    if args.seed is None:
        args.seed = random.randint(1, 10000)
    log.info("using seed %d", args.seed)
    random.seed(args.seed)  # expect: TR105 (logged, but the default run differs every time)
    torch.manual_seed(args.seed)  # ok: the same seed, reported once


def fallback_with_fixed_default():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-seed", type=int, default=1234)
    args = parser.parse_args()
    data_seed = args.data_seed if args.data_seed is not None else random.randint(1, 10000)
    np.random.seed(data_seed)  # ok: the option has a fixed default, so the draw is not the usual seed


def fallback_in_options(opt):
    if opt.manualSeed is None:
        opt.manualSeed = random.randint(1, 10000)
    print("Random Seed: ", opt.manualSeed)
    torch.manual_seed(opt.manualSeed)  # expect: TR105 (printed: only repeatable by passing the value back)


def fallback_not_logged(args):
    seed = args.seed if args.seed is not None else random.randint(1, 10000)
    torch.manual_seed(seed)  # expect: TR105


def fallback_options_not_logged(cfg):
    if cfg.seed is None:
        cfg.seed = np.random.randint(2**31)
    np.random.seed(cfg.seed)  # expect: TR105


def fallback_printed_option():
    parser = argparse.ArgumentParser()
    parser.add_argument("--manualSeed", type=int, help="seed")
    opt = parser.parse_args()
    print(opt)  # printed before the seed is chosen: it shows None
    if opt.manualSeed is None:
        opt.manualSeed = random.randint(1, 10000)
    print("Random Seed:", opt.manualSeed)
    random.seed(opt.manualSeed)  # expect: TR105
    torch.manual_seed(opt.manualSeed)  # ok: the same seed, reported once


def fallback_with_fixed_option_default():
    parser = argparse.ArgumentParser()
    parser.add_argument("--init-seed", type=int, default=1)
    args = parser.parse_args()
    if args.init_seed is None:
        args.init_seed = random.randint(1, 10000)
    torch.manual_seed(args.init_seed)  # ok: --init-seed defaults to 1, so the random branch never runs


def fallback_with_fixed_parameter_default(seed=0):
    if seed is None:
        seed = random.randint(1, 10000)
    torch.manual_seed(seed)  # ok: the parameter defaults to 0
