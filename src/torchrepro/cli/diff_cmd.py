"""``torchrepro diff RUN_A RUN_B``: compare two recorded run directories (e.g. from two machines).

Under the verdict it lists the environment and launch differences of the two runs, ranked
(:mod:`torchrepro.analysis.envdiff`). ``--locate`` compares the op traces the runs kept (``torchrepro run --record DIR
--trace-steps N``) and names the first op whose inputs were identical while its outputs differed.
"""

from __future__ import annotations

import argparse
from typing import Any

from .._core.io import atomic_write_json
from ..analysis.compare import compare_runs
from ..analysis.envdiff import locate_between
from ..record.outdir import lock_dir
from ..record.store import load_run
from ._checkrun import environment_differences, output_dir
from ._render import render_op_table
from .check_cmd import finish


def add_parser(sub: Any) -> None:
    p = sub.add_parser("diff", help="compare two recorded run directories (and their environments)")
    p.add_argument("run_a", metavar="RUN_A")
    p.add_argument("run_b", metavar="RUN_B")
    p.add_argument("--locate", action="store_true",
                   help="compare the op traces the runs kept (record them with `torchrepro run --record DIR "
                        "--trace-steps N`): name the first op whose inputs were identical and outputs differed, "
                        "and the environment differences that explain it")
    p.add_argument("--json", action="store_true", help="write one JSON document to stdout")
    p.add_argument("--out", metavar="DIR", help="where to write check.json and the plot (default: a new dir)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    runs = [load_run(args.run_a), load_run(args.run_b)]
    result = compare_runs(runs)
    env_diff = environment_differences(runs)
    located = None
    if args.locate:
        env_diff.locate_hint = False
        located = locate_between(runs[0], runs[1], env_diff.diff, first_step=result.first_step)
    out = output_dir(args.out, "diff")
    with lock_dir(out):
        if located is not None:
            table = out / "locate_ops.txt"
            table.write_text(render_op_table(located["context"]) + "\n")
            located["op_table"] = str(table)
            atomic_write_json(out / "locate.json", located)
        return finish(result, out, what=f"{args.run_a} vs {args.run_b}", as_json=args.json, located=located,
                      environment=env_diff)
