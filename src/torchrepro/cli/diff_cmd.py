"""``torchrepro diff RUN_A RUN_B``: compare two recorded run directories (e.g. from two machines).

Under the verdict it lists the environment and launch differences of the two runs, ranked
(:mod:`torchrepro.analysis.envdiff`). ``--locate`` compares the op traces the runs kept (``torchrepro run --record DIR
--trace-steps N``) and names the first op whose inputs were identical while its outputs differed.
"""

from __future__ import annotations

import argparse
from typing import Any, cast

from .._core.errors import RunDirError
from ..analysis.compare import CheckResult, compare_runs
from ..analysis.envdiff import locate_between
from ..record.launcher import CommandError
from ..record.outdir import lock_dir
from ..record.store import MANIFEST, load_ranks, load_run, read_manifest, split_run_dirs
from ._checkrun import EnvironmentDifferences, WriteErrors, environment_differences, output_dir
from ._options import add_json_option
from ._output import save_locate
from ._render import render_op_table
from ._usage import SUMMARIES
from .check_cmd import finish

NOTHING_TO_LOCATE: dict[str, Any] = {"verdict": "nothing-to-locate",
                                     "title": "the runs are identical: nothing to locate"}


def next_action(result: CheckResult, env_diff: EnvironmentDifferences, located: dict[str, Any] | None) -> str | None:
    """The next step for two runs whose environments differ in what can break bitwise equality; None: the cause's.

    Deterministic mode makes one environment repeat itself; it cannot make two environments agree, so the
    cause's usual advice (``check --deterministic``) would contradict the environment differences listed below.
    """
    diff = env_diff.diff
    if result.verdict == "identical" or diff is None or not diff.breaks_bitwise:
        return None
    if located is not None and located.get("explanation"):
        return "See Locate below: it names the operation that computes differently in B's environment and why."
    return (f"The runs differ in settings that can break bitwise equality ({diff.summary()}): give both the same "
            "settings and record again. `check --deterministic` would not help: it makes one environment repeat "
            "itself, not agree with another.")


def recorded_rerun(runs: list[Any]) -> tuple[list[str], list[str]] | None:
    """The check that reproduces two recorded runs of one command: their command and the launch options they were
    recorded with (seed, deterministic mode, steps); None when the runs ran other commands or did not record one."""
    manifests = [run.manifest for run in runs]
    commands = [m.get("command") for m in manifests]
    command = commands[0]
    if not isinstance(command, list) or not command or not all(isinstance(w, str) for w in command) \
            or any(c != command for c in commands):
        return None
    m = manifests[0]
    options: list[str] = []
    if isinstance(m.get("seed"), int) and not isinstance(m.get("seed"), bool):
        options += ["--seed", str(m["seed"])]
    if m.get("deterministic") is True:
        options.append("--deterministic")
    if isinstance(m.get("max_steps"), int) and not isinstance(m.get("max_steps"), bool):
        options += ["--max-steps", str(m["max_steps"])]
    return options, list(command)


EXAMPLES = """\
Examples:
  torchrepro run --record runs/a -- python train.py
  torchrepro run --record runs/b -- python train.py
  torchrepro diff runs/a runs/b
  torchrepro diff --locate runs/a runs/b      # both recorded with --trace-steps N"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("diff", help=SUMMARIES["diff"],
                       description="Compare two run directories recorded by `torchrepro run --record` step by step, as"
                                   " check compares its runs, and rank the differences of their environments. Exit "
                                   "codes: 0 identical, 1 diverged, 2 usage or input error.",
                       epilog=EXAMPLES)
    p.add_argument("run_a", metavar="RUN_A",
                   help="a run directory; for a run of several nodes recorded into each node's own directory, "
                        "those directories joined by ':' (A_node0:A_node1)")
    p.add_argument("run_b", metavar="RUN_B")
    p.add_argument("--locate", action="store_true",
                   help="compare the op traces the runs kept (record them with `torchrepro run --record DIR "
                        "--trace-steps N`): name the first op whose inputs were identical and outputs differed, "
                        "and the environment differences that explain it")
    add_json_option(p)
    p.add_argument("--out", metavar="DIR", help="where to write check.json and the plot (default: a new dir)")
    p.set_defaults(handler=run)


def _ranks_of(run_dir: str) -> int | None:
    """How many ranks the run in ``run_dir`` (its first directory) lists; None for a run of one process."""
    path = split_run_dirs(run_dir)[0]
    if not (path / MANIFEST).is_file():
        return None
    try:
        ranks = read_manifest(path / MANIFEST).get("ranks")
    except RunDirError:
        return None  # load_run names the problem
    return len(ranks) if isinstance(ranks, list) and ranks else None


def run_ranks_diff(args: argparse.Namespace) -> int:
    """Two runs of several ranks (one node or several): every rank against its counterpart, and the ranks of
    each run against each other, as ``check --nproc-per-node`` compares its runs."""
    from ..analysis.rankcompare import compare_rank_runs
    from ._ranks import finish_ranks

    if args.locate:
        raise CommandError("--locate compares the op traces of one process: pass one rank's directory of each run, "
                           f"e.g. `torchrepro diff --locate {args.run_a}/rank0 {args.run_b}/rank0`.")
    loaded = [load_ranks(args.run_a), load_ranks(args.run_b)]
    runs = [ranks for _, ranks in loaded]
    if len(runs[0]) != len(runs[1]):
        raise CommandError(f"{args.run_a} has {len(runs[0])} ranks and {args.run_b} has {len(runs[1])}: runs of "
                           "different sizes cannot be compared rank by rank. Compare one rank's directories, e.g. "
                           f"`torchrepro diff {args.run_a}/rank0 {args.run_b}/rank0`.")
    check = compare_rank_runs(runs)
    out = output_dir(args.out, "diff")
    with lock_dir(out):
        env = environment_differences([r[0] for r in runs])
        return finish_ranks(check, out, what=f"{args.run_a} vs {args.run_b}", as_json=args.json, environment=env)


def run(args: argparse.Namespace) -> int:
    counts = [_ranks_of(args.run_a), _ranks_of(args.run_b)]
    if counts[0] and counts[1]:
        return run_ranks_diff(args)
    if counts[0] or counts[1]:
        several, one = (args.run_a, args.run_b) if counts[0] else (args.run_b, args.run_a)
        raise CommandError(f"{several} is a run of several ranks and {one} a run of one process: compare runs of the "
                           f"same kind, or one rank's directory with the other run (e.g. {several}/rank0).")
    runs = [load_run(args.run_a), load_run(args.run_b)]
    result = compare_runs(runs)
    env_diff = environment_differences(runs)
    located: dict[str, Any] | None = None
    if args.locate:
        env_diff.locate_hint = False
        located = (dict(NOTHING_TO_LOCATE) if result.verdict == "identical" else
                   locate_between(runs[0], runs[1], env_diff.diff, first_step=result.first_step))
    result.next_action = next_action(result, env_diff, located)
    rerun = recorded_rerun(runs)
    if rerun is not None:  # Next's `torchrepro check ... -- ...`: the recorded command, as it was launched
        result.set_rerun(*rerun)
    out = output_dir(args.out, "diff")
    with lock_dir(out):
        errors: WriteErrors = []
        if located is not None:
            context = cast("list[dict[str, Any]] | None", located.get("context"))
            save_locate(out, located, render_op_table(context) if context is not None else None, errors)
        return finish(result, out, what=f"{args.run_a} vs {args.run_b}", as_json=args.json, located=located,
                      environment=env_diff, title="torchrepro diff", runs=runs, errors=errors)
