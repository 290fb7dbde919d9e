"""``torchrepro diff RUN_A RUN_B``: compare two recorded run directories (e.g. from two machines)."""

from __future__ import annotations

import argparse
from typing import Any

from ..compare import compare_runs
from ..outdir import lock_dir
from ..store import load_run
from .check_cmd import finish, output_dir


def add_parser(sub: Any) -> None:
    p = sub.add_parser("diff", help="compare two recorded run directories")
    p.add_argument("run_a", metavar="RUN_A")
    p.add_argument("run_b", metavar="RUN_B")
    p.add_argument("--json", action="store_true", help="write one JSON document to stdout")
    p.add_argument("--out", metavar="DIR", help="where to write check.json and the plot (default: a new dir)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    runs = [load_run(args.run_a), load_run(args.run_b)]
    result = compare_runs(runs)
    out = output_dir(args.out, "diff")
    with lock_dir(out):
        return finish(result, out, what=f"{args.run_a} vs {args.run_b}", as_json=args.json)
