"""``torchrepro diff RUN_A RUN_B``: compare two recorded run directories (e.g. from two machines)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..compare import compare_runs
from ..store import load_run
from .check_cmd import default_out, finish


def add_parser(sub: Any) -> None:
    p = sub.add_parser("diff", help="compare two recorded run directories")
    p.add_argument("run_a", metavar="RUN_A")
    p.add_argument("run_b", metavar="RUN_B")
    p.add_argument("--json", action="store_true", help="write one JSON document to stdout")
    p.add_argument("--out", metavar="DIR", help="where to write check.json and the plot (default: a new dir)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    runs = [load_run(args.run_a), load_run(args.run_b)]
    out = Path(args.out) if args.out else default_out("diff")
    out.mkdir(parents=True, exist_ok=True)
    return finish(compare_runs(runs), out, what=f"{args.run_a} vs {args.run_b}", as_json=args.json)
