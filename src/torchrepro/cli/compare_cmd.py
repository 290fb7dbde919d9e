"""``torchrepro compare 'CMD_A' 'CMD_B'``: run two different commands once each, recorded, and compare them step by
step: bitwise **identical**, **equivalent** within ``--rtol``/``--atol``, or **diverged** (where, in what, by how
much); ``--locate`` names the first op that computes differently, on both sides.

Each command line is split as a shell would (``shlex``), like hyperfine's; leading ``NAME=value`` words set
environment variables for that command only (``'OMP_NUM_THREADS=1 python train.py'``). A recorded run directory
(``torchrepro run --record DIR --keep-values``) may stand in for a command. A torchrun command runs on its ranks;
runs of other world sizes are compared by their full tensors (``--full-tensors``: :mod:`..analysis.fullcompare`).

Example::

    torchrepro compare 'python train.py' 'python train.py --compile'
    torchrepro compare --rtol 1e-4 --locate 'python train.py' 'python train.py --amp'
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._core.errors import Interrupted, ReproError
from ..record.launcher import CommandError, LaunchOptions
from ..record.outdir import lock_dir
from ..record.store import COMPARE_GRAD_STEPS, GRAD_VALUES_ENV, load_run
from ._checkrun import WriteErrors, environment_differences, isolation_for, output_dir
from ._options import (
    add_full_tensors_option,
    add_run_options,
    compare_words,
    determinism_options,
    kept_values,
    positive_int,
)
from ._output import locate_failed
from ._sides import Side, parse_side, record_side
from ._usage import SUMMARIES, set_usage

if TYPE_CHECKING:
    from ..analysis.crossrun import CompareResult
    from ..analysis.tolerance import Tolerance

# compare keeps the gradients and optimizer state of the first COMPARE_GRAD_STEPS steps too (values budget
# permitting), so that their differences can be measured against the tolerance, not only the parameters'


PER_DTYPE = "dtype"  # --rtol dtype / --atol dtype: torch.testing.assert_close's default for each dtype
DEFAULTS_HELP = ("`dtype`: per dtype, as torch.testing.assert_close: float32 1.3e-6 / 1e-5, bfloat16 1.6e-2 / 1e-5, "
                 "float16 1e-3 / 1e-5, float64 1e-7 / 1e-7 (rtol / atol); the one not given is per dtype")


def tolerance_arg(text: str) -> float | str:
    if text.strip().lower() == PER_DTYPE:
        return PER_DTYPE
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a tolerance (a number >= 0 such as 1e-5, or `dtype` for the "
                                         f"per-dtype default), got {text!r}")
    return value


def add_tolerance_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rtol", type=tolerance_arg, metavar="R",
                   help="accept values a, b with |a-b| <= atol + rtol*|b| (default: bitwise, each difference still "
                        f"measured against the per-dtype defaults); {DEFAULTS_HELP}")
    p.add_argument("--atol", type=tolerance_arg, metavar="A", help="absolute tolerance (see --rtol)")


EXAMPLES = """\
Examples:
  torchrepro compare 'python train.py' 'python train.py --compile'
  torchrepro compare --rtol 1e-4 'python train.py' 'python train.py --amp'
  torchrepro compare 'OMP_NUM_THREADS=1 python train.py' 'OMP_NUM_THREADS=2 python train.py'
  torchrepro compare --locate --max-steps 5 'python train.py' 'python train.py --reverse'"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("compare", help=SUMMARIES["compare"],
                       description="Run two different command lines (a flag, a refactor, eager against compiled, other"
                                   " variables) and compare them step by step, bitwise or within --rtol/--atol; "
                                   "--locate names the op where they part. Exit codes: 0 identical or within "
                                   "tolerance, 1 different, 2 usage error or failed command.",
                       epilog=EXAMPLES)
    p.add_argument("command_a", metavar="CMD_A", help="the first command line, quoted ('python train.py'; "
                   "'VAR=value python train.py' sets a variable; a recorded run directory is used as it is)")
    p.add_argument("command_b", metavar="CMD_B", help="the second command line, quoted")
    add_tolerance_options(p)
    add_run_options(p)
    add_full_tensors_option(p)  # torchrun commands: runs of other world sizes compared by their full tensors
    p.add_argument("--locate", action="store_true",
                   help="re-run both commands tracing every op of the first divergent step; align the two op "
                        "streams and name the first op (or program difference) where they part, on both sides")
    p.add_argument("--locate-steps", type=positive_int, default=1, metavar="N",
                   help="with --locate: trace N steps from the first divergent one (default 1)")
    p.add_argument("--out", metavar="DIR",
                   help="output directory (default: a new torchrepro-runs/compare-TIMESTAMP-PID)")
    set_usage(p, "torchrepro compare", "'CMD_A' 'CMD_B'")
    p.set_defaults(handler=run)


def launch_options(args: argparse.Namespace) -> LaunchOptions:
    """What each recorded run gets: seeding, determinism, steps, and values for the tolerance."""
    return LaunchOptions(seed=args.seed, **determinism_options(args), max_steps=args.max_steps,
                         values=kept_values(args),
                         extra_env={GRAD_VALUES_ENV: str(COMPARE_GRAD_STEPS)})


def tolerance(args: argparse.Namespace) -> Tolerance:
    """Bitwise unless --rtol or --atol is given; `dtype` (or the one not given) is the per-dtype default."""
    from ..analysis.tolerance import Tolerance

    def value(v: float | str | None) -> float | None:
        return None if v is None or v == PER_DTYPE else float(v)

    return Tolerance(rtol=value(args.rtol), atol=value(args.atol), bitwise=args.rtol is None and args.atol is None)


def run(args: argparse.Namespace) -> int:
    sides = [parse_side("A", args.command_a, torchrun=True), parse_side("B", args.command_b, torchrun=True)]
    if args.locate and any(side.nproc for side in sides):
        raise CommandError("--locate does not trace torchrun commands yet: compare them without it, then record one "
                           "rank of each with `torchrepro run --record DIR --trace-steps K -- torchrun ...` and run "
                           "`torchrepro diff --locate DIR_A/rank0 DIR_B/rank0`.")
    refuse_overlap(sides, args.out)
    for side in sides:  # a recorded run is read in full before anything runs
        if side.recorded is not None:
            load_run(side.recorded, allow_ranks=True)
    out = output_dir(args.out, "compare")
    opts = launch_options(args)
    with lock_dir(out):
        # both commands run in this directory: B reading what A wrote there would void the comparison
        both = all(side.recorded is None for side in sides)
        isolation = isolation_for(False, out) if both else None
        dirs = [record_side(side, out / side.label.lower(), opts, isolation=isolation, number=k)
                for k, side in enumerate(sides, start=1)]
        from ..analysis.fullcompare import compare_sides  # a torchrun side: its full-tensor view, or rank by rank

        result, runs = compare_sides(dirs, tolerance(args), full_tensors=args.full_tensors,
                                     commands=[s.shown for s in sides],
                                  workdir=isolation.to_json() if isolation is not None else None,
                                  options=compare_words(args))
        errors: WriteErrors = []
        located = None
        if args.locate:
            from ._comparelocate import locate_sides

            try:
                located = locate_sides(sides, runs, result, out, opts, args.locate_steps, errors)
            except Interrupted:
                raise
            except ReproError as exc:  # the verdict is known: keep it, and say why nothing was located
                steps = ["--locate-steps", str(args.locate_steps)] if args.locate_steps != 1 else []
                located = locate_failed(exc, shlex.join(["torchrepro", "compare", *compare_words(args), "--locate",
                                                         *steps, args.command_a, args.command_b]))
        return finish(result, out, runs, as_json=args.json, located=located, errors=errors)


def refuse_overlap(sides: list[Side], out: str | None) -> None:
    """A recorded run given as A or B must not lie in ``--out`` (it would be replaced) nor hold it."""
    if out is None:
        return
    target = Path(out).resolve()
    for side in sides:
        if side.recorded is None:
            continue
        run = side.recorded.resolve()
        if run == target or target in run.parents or run in target.parents:
            raise CommandError(f"--out {out} overlaps run directory {side.label} ({side.recorded}): compare would "
                               "write over the run it reads. Pass an --out outside it.")


# What differs between two commands' launches by construction, not in their environments
_OWN_KEYS = ("launch.command", "launch.cwd")


def environment_between(runs: list[Any], verdict: str = "diverged") -> tuple[str | None, dict[str, Any]]:
    """The environment differences of A and B that are not the command itself: text (None when there are none)
    and the ``torchrepro.env-diff/1`` document (``{"compared": false, ...}`` without a readable environment).
    ``verdict`` (compare's) says what the differences that can break bitwise equality did to these runs."""
    found = environment_differences(runs)
    if found.diff is None:
        return f"Environment: not compared ({found.problem})", found.to_json("diverged")
    from ..analysis.envdiff import BENIGN, EnvDiff
    from ._render import render_env_diff

    found.diff.changes = [c for c in found.diff.changes if c.key not in _OWN_KEYS]
    found.diff.a, found.diff.b = "A", "B"
    doc = found.diff.to_json() | {"compared": True}
    shown = EnvDiff("A", "B", [c for c in found.diff.changes if c.rank != BENIGN])  # the text leaves out benign ones
    return (render_env_diff(shown, verdict=verdict) if shown.changes else None), doc


def finish(result: CompareResult, out: Path, runs: list[Any], *, as_json: bool,
           located: dict[str, Any] | None = None, errors: WriteErrors | None = None) -> int:
    """Write report.html and compare.json, print the summary or the JSON document; return the exit code (0 identical or
    equivalent, 1 diverged, 2 when an output file could not be written)."""
    from ..analysis.crossrun import VERDICT_EXIT
    from ._compare_render import render_compare
    from ._html.reports import compare_report
    from ._output import Verdict, emit

    environment, env_doc = environment_between(runs, result.verdict)
    doc = result.to_json() | {"out": str(out), "environment_diff": env_doc, "locate": located}
    if located is not None:  # the locate section is the answer: no advice to run it
        doc["action"] = None
    return emit(Verdict(doc, VERDICT_EXIT[result.verdict], "compare.json",
                        summary=lambda _: render_compare(result, environment=environment, located=located),
                        report=lambda d, _: compare_report(result, d, runs, out)),
                out, as_json=as_json, errors=errors)
