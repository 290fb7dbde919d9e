"""``torchrepro run``: run a training script unmodified, with seeding, deterministic mode and recording."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..record.launcher import CommandError, LaunchOptions, launch, parse_torchrun, ranks_command
from ..record.options import RankOptions
from ..record.settings import TraceSettings, ValueSettings
from ._options import add_json_option, add_launch_options, determinism_options, step_arg
from ._usage import COMMAND_TAIL, SUMMARIES, set_usage


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


EXAMPLES = """\
Examples:
  torchrepro run --record runs/a -- python train.py
  torchrepro run --seed 0 --deterministic --max-steps 10 -- python train.py
  torchrepro run --record runs/a --trace-steps 3 -- python train.py   # keep step 3's op trace, for diff --locate"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("run", help=SUMMARIES["run"],
                       description="Run a training script once, as it runs alone, with torchrepro's seeding, "
                                   "deterministic mode and step limit applied; with --record, record its steps into a "
                                   "run directory that `torchrepro diff` compares.",
                       epilog=EXAMPLES)
    p.add_argument("--record", metavar="DIR", help="record the run into this run directory")
    p.add_argument("--keep-values", action="store_true",
                   help="also save parameter values per step (needed for max |Δ weight|)")
    p.add_argument("--trace-steps", type=step_arg, metavar="N",
                   help="with --record: keep the op trace of optimizer step N (0 = model construction) in the run "
                        "directory (ops.jsonl), for `torchrepro diff --locate` of two recorded runs")
    add_json_option(p, "print the run's manifest as one JSON document on stdout (the script's stdout goes to stderr)")
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
    nodes: dict[str, Any] = {}  # RankOptions of one node of several
    if spec is not None and spec.nnodes > 1:  # one node of several: its rendezvous options go on to torchrun
        if args.nproc_per_node is not None and args.nproc_per_node != spec.nproc_per_node:
            raise CommandError(f"--nproc-per-node {args.nproc_per_node} disagrees with the torchrun command's "
                               f"--nproc-per-node {spec.nproc_per_node}; give the number of ranks once.")
        command, nproc = spec.python_command, spec.nproc_per_node  # type: list[str], int | None
        nodes = {"nnodes": spec.nnodes, "node_rank": spec.node_rank, "rendezvous": list(spec.rendezvous),
                 "static": spec.static}
    else:
        command, nproc = ranks_command(args.user_command, args.nproc_per_node)
    budget = {} if args.values_budget is None else {"budget": args.values_budget}
    opts = LaunchOptions(record=args.record, seed=args.seed, **determinism_options(args), max_steps=args.max_steps,
                         values=ValueSettings(keep=args.keep_values, full_tensors=args.full_tensors, **budget),
                         trace=TraceSettings(steps=(args.trace_steps, args.trace_steps) if args.trace_steps is not None
                                             else None),
                         ranks=RankOptions(nproc_per_node=nproc, **nodes))
    result = launch(command, opts, stdout=sys.stderr if args.json else None)
    if opts.ranks.nnodes > 1 and args.record and result.status not in ("ok", "stopped-at-max-steps"):
        node = (result.manifest or {}).get("node")
        print(node_failure(args.record, opts.ranks.nnodes, node), file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(result.manifest if result.manifest is not None else
                         {"command": args.user_command, "exit_code": result.returncode, "status": result.status},
                         indent=2))
    return result.returncode if result.returncode >= 0 else 128 - result.returncode
