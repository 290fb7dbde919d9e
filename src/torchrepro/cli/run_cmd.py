"""``torchrepro run``: run a training script unmodified, with seeding, deterministic mode and recording."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..control._seeds import validate_seed
from ..record.launcher import CommandError, LaunchOptions, launch, ranks_command


def seed_arg(text: str) -> int:
    try:
        return validate_seed(int(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc) if "must be" in str(exc) else
                                         f"seed must be an integer in [0, 4294967295], got {text!r}") from None


def _int_at_least(text: str, minimum: int, expected: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer")


def step_arg(text: str) -> int:
    return _int_at_least(text, 0, "a step number (0 or more)")


_SIZE_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "MIB": 1 << 20,
               "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30, "T": 1 << 40, "TB": 1 << 40, "TIB": 1 << 40}


def size_arg(text: str) -> int:
    """A byte count: ``1073741824``, ``512M``, ``4G``, ``1.5GiB`` (binary units); 0 keeps no values."""
    number = text.strip().upper().rstrip("BIKMGT")
    unit = text.strip().upper()[len(number):]
    try:
        value = float(number) * _SIZE_UNITS[unit]
    except (ValueError, KeyError):
        value = -1
    if not 0 <= value < 1 << 62:
        raise argparse.ArgumentTypeError(f"expected a size in bytes such as 4G, 512M or 1073741824, got {text!r}")
    return int(value)


def runs_arg(text: str) -> int:
    value = positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(
            f"check compares runs, so it needs at least 2, got {text!r}. To compare one new run with a recorded "
            "one, record it with `torchrepro run --record DIR -- ...` and use `torchrepro diff DIR_A DIR_B`.")
    return value


def add_launch_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=seed_arg, help="seed every RNG with this seed before the script starts")
    p.add_argument("--deterministic", action="store_true",
                   help="switch deterministic mode on (flags + CUBLAS_WORKSPACE_CONFIG) before the script starts")
    p.add_argument("--max-steps", type=positive_int, metavar="K", help="end the script cleanly after K steps")
    p.add_argument("--values-budget", type=size_arg, metavar="SIZE",
                   help="disk for parameter value snapshots per run (e.g. 4G; default 1G, the initial and final "
                        "snapshots included): they give max |Δ weight|; beyond it only fingerprints are recorded")
    p.add_argument("--nproc-per-node", type=positive_int, metavar="P",
                   help="run the script on P ranks through torch.distributed.run (torchrun) and record each rank "
                        "into its own directory (rank0 ...); `-- torchrun --nproc-per-node P train.py` does the same")
    p.add_argument("user_command", nargs=argparse.REMAINDER, metavar="-- python train.py [ARGS]",
                   help="the training command; everything from the script on belongs to the script")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="run a script with seeding/determinism and optional recording",
                       usage="torchrepro run [--record DIR] [--seed S] [--deterministic] [--max-steps K] "
                             "[--nproc-per-node P] -- python train.py [ARGS]")
    p.add_argument("--record", metavar="DIR", help="record the run into this run directory")
    p.add_argument("--keep-values", action="store_true",
                   help="also save parameter values per step (needed for max |Δ weight|)")
    p.add_argument("--trace-steps", type=step_arg, metavar="N",
                   help="with --record: keep the op trace of optimizer step N (0 = model construction) in the run "
                        "directory (ops.jsonl), for `torchrepro diff --locate` of two recorded runs")
    p.add_argument("--json", action="store_true",
                   help="print the run's manifest as one JSON document on stdout (the script's stdout goes to stderr)")
    add_launch_options(p)
    p.set_defaults(handler=run, accepts_command=True)


def run(args: argparse.Namespace) -> int:
    if args.values_budget is not None and not (args.record and args.keep_values):
        raise CommandError("--values-budget limits the value snapshots of a recorded run, so it needs --record DIR "
                           "and --keep-values.")
    if args.trace_steps is not None and not args.record:
        raise CommandError("--trace-steps keeps the op trace in the run directory, so it needs --record DIR: "
                           "`torchrepro run --record DIR --trace-steps N -- python train.py`.")
    command, nproc = ranks_command(args.user_command, args.nproc_per_node)
    opts = LaunchOptions(record=args.record, seed=args.seed, deterministic=args.deterministic,
                         max_steps=args.max_steps, keep_values=args.keep_values, values_budget=args.values_budget,
                         trace_steps=[args.trace_steps] * 2 if args.trace_steps is not None else None,
                         nproc_per_node=nproc)
    result = launch(command, opts, stdout=sys.stderr if args.json else None)
    if args.json:
        print(json.dumps(result.manifest if result.manifest is not None else
                         {"command": args.user_command, "exit_code": result.returncode, "status": result.status},
                         indent=2))
    return result.returncode if result.returncode >= 0 else 128 - result.returncode
