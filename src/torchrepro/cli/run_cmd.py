"""``torchrepro run``: run a training script unmodified, with seeding, deterministic mode and recording."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..control._seeds import validate_seed
from ..control._settings import SETTING_NAMES, setting, without
from ..record.launcher import CommandError, LaunchOptions, launch, parse_torchrun, ranks_command
from ._usage import COMMAND_TAIL, set_usage


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


def settings_arg(text: str) -> list[str]:
    """A comma-separated list of deterministic-mode settings (``--deterministic-except``)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    try:
        if not names:
            raise ValueError("an empty list")
        return [setting(n).name for n in dict.fromkeys(names)]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; expected a comma-separated list of: "
                                         f"{', '.join(SETTING_NAMES)}") from None


def determinism_options(args: argparse.Namespace) -> dict[str, Any]:
    """``--deterministic`` / ``--deterministic-except LIST`` as the LaunchOptions fields ``deterministic`` and
    ``determinism`` (keyword arguments of ``torchrepro.deterministic``)."""
    left_out = getattr(args, "deterministic_except", None)
    if left_out:
        return {"deterministic": True, "determinism": without(left_out)}
    return {"deterministic": bool(args.deterministic), "determinism": {}}


def node_failure(record: str, nnodes: int, node: object) -> str:
    """What failed on node ``node`` of a run of several nodes, from its manifest (``DIR/nodeN/manifest.json``)."""
    from ..record.launcher import read_summary

    doc = read_summary(Path(record) / f"node{node}" / "manifest.json") if isinstance(node, int) else {}
    found = doc.get("rank_status")
    statuses: dict[str, Any] = found if isinstance(found, dict) else {}
    ranks = ", ".join(f"{name} {info.get('status')} (exit code {info.get('exit_code')})"
                      for name, info in statuses.items() if isinstance(info, dict)) or "no rank recorded"
    return (f"torchrepro run: node {node} of {nnodes} {doc.get('status', 'failed')}: {ranks}. A rank that waits for a "
            "rank of another node that died fails at its next collective (torchrepro's own keep their time limit, "
            "TORCHREPRO_DIST_TIMEOUT); look at every node's output for the first error. This node's recording: "
            f"{record}.")


def add_launch_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=seed_arg, help="seed every RNG with this seed before the script starts")
    p.add_argument("--deterministic", action="store_true",
                   help="switch deterministic mode on (flags + CUBLAS_WORKSPACE_CONFIG) before the script starts")
    p.add_argument("--deterministic-except", type=settings_arg, metavar="LIST",
                   help="deterministic mode without these settings (comma-separated: "
                        f"{', '.join(SETTING_NAMES)}); `torchrepro bench --explain` finds the cheapest set that is "
                        "still bitwise reproducible")
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
    p = sub.add_parser("run", help="run a script with seeding/determinism and optional recording")
    p.add_argument("--record", metavar="DIR", help="record the run into this run directory")
    p.add_argument("--keep-values", action="store_true",
                   help="also save parameter values per step (needed for max |Δ weight|)")
    p.add_argument("--trace-steps", type=step_arg, metavar="N",
                   help="with --record: keep the op trace of optimizer step N (0 = model construction) in the run "
                        "directory (ops.jsonl), for `torchrepro diff --locate` of two recorded runs")
    p.add_argument("--json", action="store_true",
                   help="print the run's manifest as one JSON document on stdout (the script's stdout goes to stderr)")
    add_launch_options(p)
    set_usage(p, "torchrepro run", COMMAND_TAIL)
    p.set_defaults(handler=run, accepts_command=True)


def run(args: argparse.Namespace) -> int:
    if args.values_budget is not None and not (args.record and args.keep_values):
        raise CommandError("--values-budget limits the value snapshots of a recorded run, so it needs --record DIR "
                           "and --keep-values.")
    if args.trace_steps is not None and not args.record:
        raise CommandError("--trace-steps keeps the op trace in the run directory, so it needs --record DIR: "
                           "`torchrepro run --record DIR --trace-steps N -- python train.py`.")
    spec = parse_torchrun(args.user_command)
    nodes: dict[str, Any] = {}
    if spec is not None and spec.nnodes > 1:  # one node of several: its rendezvous options go on to torchrun
        if args.nproc_per_node is not None and args.nproc_per_node != spec.nproc_per_node:
            raise CommandError(f"--nproc-per-node {args.nproc_per_node} disagrees with the torchrun command's "
                               f"--nproc-per-node {spec.nproc_per_node}; give the number of ranks once.")
        command, nproc = spec.python_command, spec.nproc_per_node  # type: list[str], int | None
        nodes = {"nnodes": spec.nnodes, "node_rank": spec.node_rank, "rendezvous": list(spec.rendezvous),
                 "static_ranks": spec.static}
    else:
        command, nproc = ranks_command(args.user_command, args.nproc_per_node)
    opts = LaunchOptions(record=args.record, seed=args.seed, **determinism_options(args), **nodes,
                         max_steps=args.max_steps, keep_values=args.keep_values, values_budget=args.values_budget,
                         trace_steps=[args.trace_steps] * 2 if args.trace_steps is not None else None,
                         nproc_per_node=nproc)
    result = launch(command, opts, stdout=sys.stderr if args.json else None)
    if opts.nnodes > 1 and args.record and result.status not in ("ok", "stopped-at-max-steps"):
        print(node_failure(args.record, opts.nnodes, (result.manifest or {}).get("node")), file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(result.manifest if result.manifest is not None else
                         {"command": args.user_command, "exit_code": result.returncode, "status": result.status},
                         indent=2))
    return result.returncode if result.returncode >= 0 else 128 - result.returncode
