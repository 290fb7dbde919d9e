"""``torchrepro check``: run a script N times and say whether, where and why the runs diverge."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._core.errors import Interrupted, ReproError
from ..record.launcher import CommandError, LaunchOptions, parse_python_command, ranks_command
from ..record.outdir import lock_dir
from ..record.settings import TraceSettings
from ..record.store import GRAD_VALUE_STEPS, GRAD_VALUES_ENV, OPS, load_run
from ._checkrun import (
    EnvironmentDifferences,
    Isolation,
    WriteErrors,
    environment_differences,
    execute_runs,
    isolation_for,
    output_dir,
)
from ._options import (
    add_json_option,
    add_launch_options,
    check_words,
    determinism_options,
    kept_values,
    positive_int,
    runs_arg,
)
from ._output import locate_failed, save_locate
from ._usage import COMMAND_TAIL, set_usage

if TYPE_CHECKING:  # the analysis modules (and torch, matplotlib) are imported in the background while run 1 runs
    from ..analysis.compare import CheckResult

DEFAULT_STEPS_AFTER = 5  # steps a diverged run records after its first divergence (check --steps-after-divergence)


EXAMPLES = """\
Examples:
  torchrepro check -- python train.py                           # two runs, compared bit for bit
  torchrepro check --max-steps 20 -- python train.py --lr 0.1   # from the script on, the words are the script's
  torchrepro check --locate -- python -m torchrepro.examples.scatter_gnn   # the first nondeterministic op
  torchrepro check --seed 0 --deterministic --runs 3 -- python train.py
  torchrepro check --resume-at 5 -- python train.py             # does resuming after step 5 change anything?"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("check", help="run a training script N times and compare the runs bit for bit",
                       description="Run a training script N times (default 2) and compare the runs step by step, bit "
                                   "for bit: the first divergent step, what diverged first, the likely cause and what "
                                   "to do next. Exit codes: 0 identical, 1 diverged, 2 usage error or failed script.",
                       epilog=EXAMPLES)
    p.add_argument("--runs", type=runs_arg, default=2, help="how many runs to compare (at least 2; default 2)")
    p.add_argument("--resume-at", type=positive_int, metavar="K",
                   help="prove resume: run 1 trains straight through; run 2 checkpoints after step K, stops, and a "
                        "fresh process resumes from the checkpoint; compare them step by step and say what the "
                        "resume did not restore (Lightning and transformers Trainer scripts need no change; a "
                        "script with its own loop reads torchrepro.resume_point(): see docs/resume-at.md)")
    add_launch_options(p)
    p.add_argument("--locate", action="store_true",
                   help="on a divergence, re-run twice tracing every op of the first divergent step, and name the "
                        "first nondeterministic operation, its module and source line")
    p.add_argument("--locate-steps", type=positive_int, default=1, metavar="N",
                   help="with --locate: trace N steps from the first divergent one (default 1)")
    p.add_argument("--fresh-cwd", action="store_true",
                   help="run each run in its own copy of the working directory (OUT/runN-cwd), so that no run "
                        "reads what an earlier one wrote there (a resumed snapshot.pt, a checkpoint folder); "
                        "without it, check names such files in its verdict")
    p.add_argument("--steps-after-divergence", type=positive_int, default=DEFAULT_STEPS_AFTER, metavar="K",
                   help="compare each later run with run 1 as it records and stop it K steps after its first "
                        f"divergence: the verdict, first divergent step and growth table need no more (default "
                        f"{DEFAULT_STEPS_AFTER})")
    p.add_argument("--full-runs", action="store_true",
                   help="run every run to its end, diverged or not (the final |Δ weight| of diverged runs)")
    p.add_argument("--parallel", action="store_true",
                   help="start all runs at once and compare them step by step as they go; all stop K steps after "
                        "the first divergence. Each run keeps the threads it would have alone; with a GPU per run, "
                        "each run gets its own (see docs/check.md: when it is faster)")
    p.add_argument("--no-prestart", action="store_true",
                   help="start each run's interpreter only once the run before it has ended (by default the next "
                        "run's interpreter starts, and imports torch, while the current one trains, and waits "
                        "before its script: the script runs exactly as it would; this only saves the start-up)")
    add_json_option(p)
    p.add_argument("--out", metavar="DIR", help="output directory; only an earlier check's output in it may be "
                   "replaced (default: a new torchrepro-runs/check-TIMESTAMP-PID)")
    set_usage(p, "torchrepro check", COMMAND_TAIL)
    p.set_defaults(handler=run, accepts_command=True)


def finish(result: CheckResult, out: Path, *, what: str, as_json: bool,
           located: dict[str, Any] | None = None, environment: EnvironmentDifferences | None = None,
           errors: WriteErrors | None = None, title: str = "torchrepro check", runs: list[Any] | None = None) -> int:
    """Plot, write report.html and check.json, print the summary or JSON; return the exit code (0 identical, 1
    diverged, 2 when an output file could not be written: the verdict is printed all the same)."""
    from ..analysis.report import plot_check
    from ._html.reports import check_report, loadable
    from ._output import Verdict, emit
    from ._render import render, render_locate

    doc = result.to_json() | {"plot": None, "command": what, "exit_code": None}
    if environment is not None:
        doc["environment_diff"] = environment.to_json(result.verdict)
    if located is not None:
        doc["locate"] = located
    shown = runs if runs is not None else loadable(result.runs)  # the runs the caller loaded, not read again

    def text(_: str, plot: str | None, report: Path | None) -> str:
        env_text = environment.render(result.verdict) if environment is not None else None
        sure = title == "torchrepro check"  # diff compares two recordings: their number is not the user's choice
        return "\n".join([render(result, what=what, plot=plot, report=report, sure=sure),
                          *(["\n" + env_text] if env_text else []),
                          *([render_locate(located)] if located is not None else [])])

    return emit(Verdict(doc, 0 if result.verdict == "identical" else 1, "check.json", summary=lambda plot: "",
                        plot=lambda path: plot_check(result, path), text=text,
                        report=lambda d, _: check_report(result, d, shown, out, command=what, title=title)),
                out, as_json=as_json, errors=errors)


LOCATED_NEXT = "See Locate below: what the traced re-runs found, and what to change."
DETERMINISTIC_NEXT = ("Deterministic mode was on, so this is not a kernel that deterministic mode covers: look for an "
                      "unseeded random op (a generator seeded from os.urandom or the time), a kernel with no "
                      "deterministic implementation that only warned, or state outside torch. `{rerun}` names the "
                      "operation and its source line.")


def run_locate(command: list[str], out: Path, result: CheckResult, opts: LaunchOptions, steps: int,
               errors: WriteErrors | None = None, isolation: Isolation | None = None, *,
               prestart: bool = True, rank: int | None = None) -> dict[str, Any]:
    """Re-run twice with the op tracer on the first divergent step(s); compare the two op streams (under torchrun,
    those of ``rank``: every rank traces, the rank that diverged first is compared)."""
    from ..analysis.causes import untraced_note
    from ..analysis.locate import VERDICTS, locate_ops
    from ..record.optrace import read_ops
    from ._render import render_op_table

    if result.verdict == "identical":
        return {"verdict": "nothing-to-locate", "title": VERDICTS["nothing-to-locate"]}
    untraced = untraced_note(result.cause)
    if untraced:
        return {"verdict": "skipped", "title": untraced}
    errors = [] if errors is None else errors
    if result.compiled and result.compiled.get("in_compiled_code") is not False:  # the op tracer cannot see it
        return run_compiled_locate(command, out, result, opts, errors, isolation, prestart=prestart, rank=rank)
    first = int(result.first_step or 0)
    last = first + steps - 1
    # In optimizer mode the traced runs stop right after the traced steps (step 0 = construction: stop at 1).
    stop_at = max(last, 1) if result.step_mode == "optimizer" else opts.max_steps
    trace_opts = dataclasses.replace(opts.with_values(keep=False), trace=TraceSettings(steps=(first, last),
                                     mode=result.step_mode), max_steps=stop_at)
    print(f"torchrepro: --locate: tracing every operation of step {first}" +
          (f"..{last}" if last > first else "") + " in two more runs", file=sys.stderr, flush=True)
    dirs = execute_runs(command, out / "locate", 2, trace_opts, _fresh_only(isolation), prestart=prestart)
    if rank is not None:
        dirs = [d / f"rank{rank}" for d in dirs]
    ops = [list(read_ops(d / OPS)) if (d / OPS).exists() else [] for d in dirs]
    device = (load_run(dirs[0]).manifest.get("device") or "cpu").split(":")[0]
    loc = locate_ops(ops[0], ops[1], device=device)
    return save_locate(out, loc.to_json(), render_op_table(loc.context), errors)


def locate_keeping_verdict(args: argparse.Namespace, command: list[str], out: Path, result: CheckResult,
                           opts: LaunchOptions, errors: WriteErrors, isolation: Isolation | None, *,
                           rank: int | None = None) -> dict[str, Any]:
    """``--locate`` after a verdict: :func:`run_locate`, or, when its traced re-runs fail, a document that says so
    (the verdict is known: it is kept)."""
    from ..analysis.causes import check_command

    try:
        return run_locate(command, out, result, opts, args.locate_steps, errors, isolation,
                          prestart=not args.no_prestart, rank=rank)
    except Interrupted:
        raise
    except ReproError as exc:  # the verdict is known: keep it, and say why nothing was located
        steps = ["--locate-steps", str(args.locate_steps)] if args.locate_steps != 1 else []
        return locate_failed(exc, check_command(check_words(args), args.user_command, ["--locate", *steps]))


def _fresh_only(isolation: Isolation | None) -> Isolation | None:
    """The --locate re-runs get copies of the cwd as the compared runs did (they are not watched)."""
    return Isolation(fresh=True) if isolation is not None and isolation.fresh else None


def run_compiled_locate(command: list[str], out: Path, result: CheckResult, opts: LaunchOptions,
                        errors: WriteErrors, isolation: Isolation | None = None, *, prestart: bool = True,
                        rank: int | None = None) -> dict[str, Any]:
    """Re-run twice capturing the graphs inductor compiled; measure them at the first divergent step (see
    :mod:`torchrepro.analysis.compilelocate`)."""
    from ..analysis.compilelocate import locate_compiled
    from ..record.compiled import CAPTURE_ENV, DEFAULT_REPEATS, GRAPHS_FILE
    from ._render import render_op_table

    first = max(int(result.first_step or 1), 1)
    stop_at = first if result.step_mode == "optimizer" else opts.max_steps
    capture_opts = dataclasses.replace(opts.with_values(keep=False), max_steps=stop_at, extra_env={
        **opts.extra_env, CAPTURE_ENV: json.dumps({"repeats": DEFAULT_REPEATS})})
    print(f"torchrepro: --locate: the divergence lies in torch.compile'd code; capturing the graphs inductor "
          f"compiled and measuring them at step {first} in two more runs", file=sys.stderr, flush=True)
    dirs = execute_runs(command, out / "locate", 2, capture_opts, _fresh_only(isolation), prestart=prestart)
    if rank is not None:
        dirs = [d / f"rank{rank}" for d in dirs]
    docs = [json.loads((d / GRAPHS_FILE).read_text()) if (d / GRAPHS_FILE).exists() else {} for d in dirs]
    device = (load_run(dirs[0]).manifest.get("device") or "cpu").split(":")[0]
    doc = locate_compiled(docs, step=first, device=device).to_json()
    table = render_op_table([{**r, "op_other_run": None, "phase": doc["op"] and doc["op"]["phase"]}
                             for r in doc["context"]])
    return save_locate(out, doc, table, errors)


def run(args: argparse.Namespace) -> int:
    command, nproc = ranks_command(args.user_command, args.nproc_per_node)
    if args.parallel and (nproc or args.resume_at is not None):
        raise CommandError(f"--parallel runs the runs of one process at once; it does not go with "
                           f"{'--resume-at' if args.resume_at is not None else '--nproc-per-node or torchrun'} "
                           "(those checks run one run after the other): remove --parallel.")
    if args.resume_at is not None:  # one process, or several ranks through torchrun
        from ._resumecheck import run_resume_check

        return run_resume_check(args, command, nproc)
    if nproc:  # several ranks through torchrun
        from ._ranks import run_ranks_check

        return run_ranks_check(args, command, nproc)
    parse_python_command(command)  # a bad command is refused before any directory is made
    Isolation.refuse_uncopyable(args.fresh_cwd, args.out)
    out = output_dir(args.out, "check")
    opts = LaunchOptions(seed=args.seed, **determinism_options(args), max_steps=args.max_steps,
                         values=kept_values(args),
                         extra_env={GRAD_VALUES_ENV: str(GRAD_VALUE_STEPS)})  # gradient |Δ| of the first steps
    with lock_dir(out):
        isolation = isolation_for(args.fresh_cwd, out)
        dirs = execute_runs(command, out, args.runs, opts, isolation, parallel=args.parallel,
                            stop_after=None if args.full_runs else args.steps_after_divergence,
                            prestart=not args.no_prestart)
        from ..analysis.causes import check_command
        from ..analysis.compare import compare_runs, note_shared_workdir

        runs = [load_run(d) for d in dirs]
        result = compare_runs(runs)
        note_shared_workdir(result, isolation.to_json() or {})
        result.set_rerun(check_words(args), args.user_command)  # Next's commands: this check, and what to add
        if result.cause == "compute" and opts.deterministic:  # not "rerun with --deterministic": it was on
            rerun = check_command(check_words(args), args.user_command, ["--locate"])
            result.next_action = DETERMINISTIC_NEXT.format(rerun=rerun)
        errors: WriteErrors = []
        located = locate_keeping_verdict(args, command, out, result, opts, errors, isolation) if args.locate \
            else None
        from ._render import NOT_TRACED

        if located is not None and located.get("verdict") not in NOT_TRACED:
            result.next_action = LOCATED_NEXT  # not "check --locate names the operation": it just ran
        return finish(result, out, what=f"`{' '.join(command)}`", as_json=args.json, located=located,
                      environment=environment_differences(runs, quiet_if_same=True), errors=errors, runs=runs)
