"""TR105: seeds set only when a seed option is given, while the option's default skips them (pytorch/examples'
`if args.seed is not None:` with `--seed` defaulting to None): the default command runs unseeded."""

import argparse
import random

import numpy as np
import torch


def guarded_by_none():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=None, help="seed for initializing training")
    args = parser.parse_args()
    if args.seed is not None:
        random.seed(args.seed)  # expect: TR105
        torch.manual_seed(args.seed)  # ok: the same `if`, reported once
    return torch.nn.Linear(4, 4)


def no_default_and_truthiness():
    parser = argparse.ArgumentParser()
    parser.add_argument("--manual-seed", type=int)
    args = parser.parse_args()
    if args.manual_seed:
        torch.manual_seed(args.manual_seed)  # expect: TR105 (no default: None)


def zero_default_tested_for_truth():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.seed:
        np.random.seed(args.seed)  # expect: TR105 (0 is false: the default seed is never set)


def in_the_else_branch():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=-1)
    args = parser.parse_args()
    if args.seed < 0:
        print("not seeding")
    else:
        torch.manual_seed(args.seed)  # expect: TR105


def set_all_seeds(seed):
    if seed is not None:
        random.seed(seed)  # expect: TR105 (every caller passes --data-seed, whose default is None)
        np.random.seed(seed)  # ok: the same `if`


def through_a_helper():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-seed", type=int, default=None)
    args = parser.parse_args()
    set_all_seeds(args.data_seed)


def fixed_default():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    if args.seed is not None:
        torch.manual_seed(args.seed)  # ok: the default command seeds with 42


def seeded_either_way():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    if args.seed is not None:
        torch.manual_seed(args.seed)  # ok: the else branch seeds too
    else:
        torch.manual_seed(0)


def filled_in_later():
    parser = argparse.ArgumentParser()
    parser.add_argument("--init-seed", type=int, default=None)
    args = parser.parse_args()
    args.init_seed = load_config()["seed"]
    if args.init_seed is not None:
        torch.manual_seed(args.init_seed)  # ok: the option is assigned before the test, not judged


def required_option():
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-seed", type=int, required=True)
    args = parser.parse_args()
    if args.run_seed is not None:
        torch.manual_seed(args.run_seed)  # ok: the option must be given


def other_guard(flag):
    if flag:
        torch.manual_seed(0)  # ok: not an option's default


def load_config():
    return {"seed": 0}
