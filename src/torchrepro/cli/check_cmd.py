"""``torchrepro check``: run a script N times and say whether, where and why the runs diverge."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..record.launcher import CommandError, LaunchOptions, parse_python_command, ranks_command
from ..record.outdir import lock_dir
from ..record.runs import progress_interval, showing_output
from ..record.store import GRAD_VALUE_STEPS, GRAD_VALUES_ENV, load_run
from ._checkrun import (
    EnvironmentDifferences,
    Isolation,
    WriteErrors,
    environment_differences,
    execute_runs,
    isolation_for,
    output_dir,
)
from ._locate import LOCATED_NEXT, locate_keeping_verdict
from ._options import (
    AUTO,
    add_json_option,
    add_launch_options,
    check_words,
    determinism_options,
    duration_arg,
    duration_text,
    kept_values,
    positive_int,
    runs_arg,
)
from ._usage import COMMAND_TAIL, SUMMARIES, set_usage

if TYPE_CHECKING:  # the analysis modules (and torch, matplotlib) are imported in the background while run 1 runs
    from ..analysis.compare import CheckResult

DEFAULT_STEPS_AFTER = 5  # steps a diverged run records after its first divergence (check --steps-after-divergence)
AUTO_CAP = 10  # check --runs auto: the most runs it makes
DEFAULT_BUDGET_S = 600.0  # check --runs auto: no run starts after this long (--budget)


EXAMPLES = """\
Examples:
  torchrepro check -- python train.py                           # two runs, compared bit for bit
  torchrepro check --max-steps 20 -- python train.py --lr 0.1   # from the script on, the words are the script's
  torchrepro check --locate -- python -m torchrepro.examples.scatter_gnn   # the first nondeterministic op
  torchrepro check --seed 0 --deterministic --runs 3 -- python train.py
  torchrepro check --resume-at 5 -- python train.py             # does resuming after step 5 change anything?"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("check", help=SUMMARIES["check"],
                       description="Run a training script N times (default 2) and compare the runs step by step, bit "
                                   "for bit: the first divergent step, what diverged first, the likely cause and what "
                                   "to do next. Exit codes: 0 identical, 1 diverged, 2 usage error or failed script.",
                       epilog=EXAMPLES)
    p.add_argument("--runs", type=runs_arg, default=2,
                   help="how many runs to compare (at least 2; default 2), or auto: 2 runs, then one more at a time "
                        f"while they agree, up to {AUTO_CAP} or until --budget is spent")
    p.add_argument("--budget", type=duration_arg, metavar="DURATION",
                   help=f"with --runs auto: start no run after this long from the start of the check (e.g. 90s, "
                        f"10m, 1h; default {duration_text(DEFAULT_BUDGET_S)})")
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
    p.add_argument("--show-output", action="store_true",
                   help="show the script's stdout and stderr as it runs, each line after [run N] (on stderr); the "
                        "run directory's stdout.txt and stderr.txt still get every line")
    add_json_option(p)
    p.add_argument("--out", metavar="DIR", help="output directory; only an earlier check's output in it may be "
                   "replaced (default: a new torchrepro-runs/check-TIMESTAMP-PID)")
    set_usage(p, "torchrepro check", COMMAND_TAIL)
    p.set_defaults(handler=run, accepts_command=True)


def finish(result: CheckResult, out: Path, *, what: str, as_json: bool,
           located: dict[str, Any] | None = None, environment: EnvironmentDifferences | None = None,
           errors: WriteErrors | None = None, title: str = "torchrepro check", runs: list[Any] | None = None,
           runs_auto: dict[str, Any] | None = None) -> int:
    """Plot, write report.html and check.json, print the summary or JSON; return the exit code (0 identical, 1
    diverged, 2 when an output file could not be written: the verdict is printed all the same). ``runs_auto``:
    how many runs ``--runs auto`` made and why no more (:meth:`AutoRuns.to_json`)."""
    from ..analysis.report import plot_check
    from ._html.reports import check_report, loadable
    from ._output import Verdict, emit
    from ._render import render, render_locate

    doc = result.to_json() | {"plot": None, "command": what, "exit_code": None}
    if environment is not None:
        doc["environment_diff"] = environment.to_json(result.verdict)
    if located is not None:
        doc["locate"] = located
    if runs_auto is not None:
        doc["runs_auto"] = runs_auto
    shown = runs if runs is not None else loadable(result.runs)  # the runs the caller loaded, not read again

    def text(_: str, plot: str | None, report: Path | None) -> str:
        env_text = environment.render(result.verdict) if environment is not None else None
        sure = title == "torchrepro check"  # diff compares two recordings: their number is not the user's choice
        return "\n".join([render(result, what=what, plot=plot, report=report, sure=sure, auto=runs_auto),
                          *(["\n" + env_text] if env_text else []),
                          *([render_locate(located)] if located is not None else [])])

    return emit(Verdict(doc, 0 if result.verdict == "identical" else 1, "check.json", summary=lambda plot: "",
                        plot=lambda path: plot_check(result, path), text=text,
                        report=lambda d, _: check_report(result, d, shown, out, command=what, title=title)),
                out, as_json=as_json, errors=errors)


DETERMINISTIC_NEXT = ("Deterministic mode was on, so this is not a kernel that deterministic mode covers: look for an "
                      "unseeded random op (a generator seeded from os.urandom or the time), a kernel with no "
                      "deterministic implementation that only warned, or state outside torch. `{rerun}` names the "
                      "operation and its source line.")


@dataclass
class AutoRuns:
    """``check --runs auto``: after each run, whether to add another (:meth:`go_on`); what it did
    (:meth:`to_json`, check.json's ``runs_auto``).

    >>> auto = AutoRuns(budget_s=600, started=time.monotonic())
    >>> auto.go_on(1, Path("out/run1")), auto.to_json()["stopped"]
    (True, None)
    """

    budget_s: float
    started: float  # time.monotonic() when the check started: the budget counts from there
    runs: int = 0
    stopped: str | None = None  # "diverged", "cap" or "budget" (AUTO_STOPPED in _render)
    _first: Any = None  # run 1, loaded once

    def go_on(self, i: int, run_dir: Path) -> bool:
        """After run ``i`` (in ``run_dir``): stop at its divergence from run 1, at the cap of AUTO_CAP runs, or when
        the budget is spent (the next run would start after it); otherwise one more run."""
        self.runs = i
        if i == 1:
            self._first = run_dir
            return True
        if self._diverged(run_dir):
            self.stopped = "diverged"
        elif i >= AUTO_CAP:
            self.stopped = "cap"
        elif time.monotonic() - self.started >= self.budget_s:
            self.stopped = "budget"
        return self.stopped is None

    def _diverged(self, run_dir: Path) -> bool:
        """Whether run ``run_dir`` differs from run 1 as the verdict will see it (compare's rules)."""
        from ..analysis.compare import compare_runs

        if isinstance(self._first, Path):
            self._first = load_run(self._first)
        return compare_runs([self._first, load_run(run_dir)]).verdict != "identical"

    def to_json(self) -> dict[str, Any]:
        return {"runs": self.runs, "stopped": self.stopped, "cap": AUTO_CAP, "budget_s": self.budget_s}


# Where --runs auto cannot apply: (is it given, the option's name, why)
AUTO_REFUSED = (
    (lambda args, nproc: args.parallel, "--parallel", "it starts every run at once, so their number is fixed before "
                                                      "any has ended"),
    (lambda args, nproc: args.resume_at is not None, "--resume-at",
     "it compares one uninterrupted run with one resumed run"),
    (lambda args, nproc: bool(nproc), "--nproc-per-node (torchrun)",
     "runs of several ranks are compared in a number of runs fixed in advance"),
)


def refuse_auto(args: argparse.Namespace, nproc: int | None) -> None:
    """``--runs auto`` with an option it does not go with, or ``--budget`` without it: a CommandError (exit 2)."""
    if args.runs != AUTO:
        if args.budget is not None:
            raise CommandError(f"--budget {duration_text(args.budget)} limits --runs auto, but the runs were given as "
                               f"--runs {args.runs}: add --runs auto, or remove --budget.")
        return
    for given, name, why in AUTO_REFUSED:
        if given(args, nproc):
            raise CommandError(f"--runs auto adds runs one after the other while they agree; it does not go with "
                               f"{name}: {why}. Give a number of runs instead (--runs {AUTO_CAP}), or remove {name}.")


def run(args: argparse.Namespace) -> int:
    """``torchrepro check``; with ``--show-output`` the scripts' output is shown as they run."""
    started = time.monotonic()
    progress_interval()  # a bad TORCHREPRO_PROGRESS_INTERVAL is refused before anything is made
    with showing_output(args.show_output):
        return _check(args, started)


def _check(args: argparse.Namespace, started: float) -> int:
    command, nproc = ranks_command(args.user_command, args.nproc_per_node)
    refuse_auto(args, nproc)
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
    auto = AutoRuns(args.budget or DEFAULT_BUDGET_S, started) if args.runs == AUTO else None
    with lock_dir(out):
        isolation = isolation_for(args.fresh_cwd, out)
        dirs = execute_runs(command, out, AUTO_CAP if auto else args.runs, opts, isolation, parallel=args.parallel,
                            stop_after=None if args.full_runs else args.steps_after_divergence,
                            prestart=not args.no_prestart, **({"go_on": auto.go_on} if auto else {}))
        from ..analysis.causes import check_command
        from ..analysis.compare import compare_runs, note_shared_workdir

        runs = [load_run(d) for d in dirs]
        result = compare_runs(runs)
        note_shared_workdir(result, isolation.to_json() or {})
        result.set_rerun(check_words(args), args.user_command)  # Next's commands: this check, and what to add
        if auto is not None and result.verdict != "identical":  # (under IDENTICAL the Sure: line says it)
            from ._render import auto_words

            result.notes.append(auto_words(auto.to_json()) + ".")
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
                      environment=environment_differences(runs, quiet_if_same=True), errors=errors, runs=runs,
                      runs_auto=auto.to_json() if auto else None)
