"""``torchrepro check``: run a script N times and say whether, where and why the runs diverge."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import importlib
import json
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._io import atomic_write_bytes, atomic_write_json
from ..errors import EnvFileError, Interrupted, ScriptError
from ..launcher import LaunchOptions, RunResult, launch, parse_python_command, ranks_command
from ..outdir import check_check_dir, check_run_dir, lock_dir, make_dir, unique_dir
from ..store import GRAD_VALUE_STEPS, GRAD_VALUES_ENV, OPS, Run, load_run
from ..workdir import WorkdirWatch, check_copyable, copy_workdir, script_in_copy
from .run_cmd import add_launch_options, positive_int, runs_arg

if TYPE_CHECKING:  # the analysis modules (and torch, matplotlib) are imported in the background while run 1 runs
    from ..compare import CheckResult
    from ..envdiff import EnvDiff

STDERR_TAIL_LINES = 25


def add_parser(sub: Any) -> None:
    p = sub.add_parser("check", help="run a training script N times and compare the runs bit for bit",
                       usage="torchrepro check [--runs N] [--seed S] [--deterministic] [--max-steps K] [--json] "
                             "[--out DIR] [--nproc-per-node P] -- python train.py [ARGS]")
    p.add_argument("--runs", type=runs_arg, default=2, help="how many runs to compare (at least 2; default 2)")
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
    p.add_argument("--json", action="store_true", help="write one JSON document to stdout")
    p.add_argument("--out", metavar="DIR", help="output directory; only an earlier check's output in it may be "
                   "replaced (default: a new torchrepro-runs/check-TIMESTAMP-PID)")
    p.set_defaults(handler=run, accepts_command=True)


class _Progress:
    """A progress display on stderr: rich when available and on a terminal, plain lines otherwise."""

    def __init__(self, total: int) -> None:
        self.total = total
        self._rich: Any = None
        if sys.stderr.isatty():
            try:
                from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

                self._rich = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                      transient=True)
            except ImportError:
                self._rich = None

    def __enter__(self) -> _Progress:
        if self._rich is not None:
            self._rich.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._rich is not None:
            self._rich.__exit__(*exc)

    def start(self, i: int) -> Any:
        desc = f"run {i}/{self.total}"
        if self._rich is None:
            print(f"torchrepro: {desc} ...", file=sys.stderr, flush=True)
            return lambda steps: None
        task = self._rich.add_task(f"{desc}: starting", total=None)
        return lambda steps: self._rich.update(task, description=f"{desc}: {steps} steps recorded")

    def done(self, i: int, result: RunResult, seconds: float) -> None:
        steps = (result.manifest or {}).get("steps", 0)
        msg = f"torchrepro: run {i}/{self.total} {result.status}: {steps} steps in {seconds:.1f}s"
        if self._rich is not None:
            self._rich.console.print(msg, highlight=False)
        else:
            print(msg, file=sys.stderr, flush=True)


def tail_lines(path: Path, n: int = STDERR_TAIL_LINES) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no output captured)"
    return "\n".join(lines[-n:]) if lines else "(empty)"


def _failure(i: int, total: int, result: RunResult, run_dir: Path, shared: str | None = None) -> ScriptError:
    m = result.manifest or {}
    if m.get("ranks"):  # a torchrun launch: name the rank that failed first
        from ._ranks import rank_failure

        error = rank_failure(i, total, result, run_dir)
        return error if shared is None else _with_note(error, shared)
    if result.status == "killed":
        what = f"was killed by {m.get('signal') or f'signal {-result.returncode}'}"
    elif result.returncode != 0:
        what = f"failed with exit code {result.returncode}"
    else:
        what = "finished but recorded no optimizer step and no backward() call"
    hint = ("Fix the script so that it runs on its own (`python ...`), then check again."
            if result.returncode != 0 else
            "torchrepro check compares training steps: make sure the script calls loss.backward() "
            "(and optimizer.step()).")
    if shared is not None:
        hint = f"{shared}\n{hint}"
    error = ScriptError(f"run {i} of {total} {what}; the runs cannot be compared. {hint}\n"
                        f"Last lines of its stderr ({run_dir / 'stderr.txt'}):\n{tail_lines(run_dir / 'stderr.txt')}")
    error.stderr_path = str(run_dir / "stderr.txt")  # type: ignore[attr-defined]
    return error


def _with_note(error: ScriptError, note: str) -> ScriptError:
    """``error`` with ``note`` added to its message (its stderr path kept)."""
    new = ScriptError(f"{error}\n{note}")
    new.stderr_path = getattr(error, "stderr_path", None)  # type: ignore[attr-defined]
    return new


# Imported in a background thread while the first run trains, so their import time (torch, matplotlib) is not
# added to the check's wall time. A failure here is ignored: the same import in the main thread raises it later.
_ANALYSIS_MODULES = ("torchrepro.compare", "torchrepro.envdiff", "torchrepro.report", "torchrepro.cli._render",
                     "matplotlib.figure", "matplotlib.backends.backend_agg")


def _import_quietly(names: tuple[str, ...]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: S112 - reported by the main thread's own import of the module
            continue


def prefetch_analysis() -> None:
    """Start importing the analysis modules in a daemon thread (at most once per process)."""
    global _prefetched
    if not _prefetched:
        _prefetched = True
        threading.Thread(target=_import_quietly, args=(_ANALYSIS_MODULES,), name="torchrepro-prefetch",
                         daemon=True).start()


_prefetched = False


@dataclass
class Isolation:
    """How ``check``'s runs share the working directory: watched (``watch``) or each in a copy (``fresh``)."""

    fresh: bool = False
    watch: WorkdirWatch | None = None
    copies: list[str] = dataclasses.field(default_factory=list)

    @classmethod
    def for_check(cls, fresh: bool, out: Path) -> Isolation:
        """``--fresh-cwd``: copies (refused now if the cwd is too large); otherwise a watch on the cwd."""
        if fresh:
            check_copyable(Path.cwd(), skip=[out])
            return cls(fresh=True)
        return cls(watch=WorkdirWatch(Path.cwd(), skip=[out]))

    def options(self, i: int, out: Path, run_dir: Path, opts: LaunchOptions) -> LaunchOptions:
        """Run ``i``'s launch options: its own copy of the cwd, or the audit of what it reads."""
        if self.fresh:
            cwd = copy_workdir(Path.cwd(), out / f"run{i}-cwd", skip=[out])
            self.copies.append(str(cwd))
            return dataclasses.replace(opts, record=str(run_dir.resolve()), cwd=str(cwd))
        if self.watch is not None:
            since = self.watch.start() if i == 1 else self.watch.since_ns
            return dataclasses.replace(opts, record=str(run_dir), watch_since_ns=since)
        return dataclasses.replace(opts, record=str(run_dir))

    def command(self, command: list[str]) -> list[str]:
        """The command for the run just prepared: in a copy, the copy's script (see script_in_copy)."""
        target = parse_python_command(command)
        if not self.fresh or target.kind != "path":
            return command
        return script_in_copy(command, target.argv, Path.cwd(), Path(self.copies[-1]))

    def run_done(self, i: int, run_dir: Path) -> str | None:
        """Note what run ``i`` read; the warning if it read what run 1 wrote in the shared cwd."""
        if self.watch is None:
            return None
        from ..compare import shared_workdir_warning

        self.watch.run_done(i, run_dir)
        return shared_workdir_warning(self.watch.shared(upto=i)) if i > 1 else None

    def to_json(self) -> dict[str, Any] | None:
        if self.fresh:
            return {"isolated": True, "copies": self.copies, "read_from_earlier_run": []}
        return self.watch.to_json() if self.watch is not None else None


def execute_runs(command: list[str], out: Path, n: int, opts: LaunchOptions,
                 isolation: Isolation | None = None) -> list[Path]:
    """Run ``command`` ``n`` times into ``out/run1..runN``; raise ScriptError on a failed run.

    ``out`` must already be checked (:func:`~torchrepro.outdir.check_check_dir`) and locked by the caller.
    ``isolation`` gives each run a copy of the working directory, or watches what the runs read there.
    """
    parse_python_command(command)  # validate before starting anything
    prefetch_analysis()
    isolation = isolation or Isolation()
    dirs = []
    with _Progress(n) as progress:
        for i in range(1, n + 1):
            run_dir = out / f"run{i}"
            check_run_dir(run_dir, flag="--out")
            make_dir(run_dir, flag="--out", parents=True)
            opts_i = isolation.options(i, out, run_dir, opts)
            update = progress.start(i)
            t0 = time.perf_counter()
            with open(run_dir / "stdout.txt", "wb") as so, open(run_dir / "stderr.txt", "wb") as se:
                try:
                    result = launch(isolation.command(command), opts_i, stdout=so, stderr=se, on_poll=update)
                except Interrupted as exc:
                    raise Interrupted(exc.signum, f"{exc} Run {i} of {n} was interrupted; the output so far "
                                                  f"is in {out} (its stderr: {run_dir / 'stderr.txt'}).") from None
            progress.done(i, result, time.perf_counter() - t0)
            shared = isolation.run_done(i, run_dir)
            if result.returncode != 0 or not (result.manifest or {}).get("steps"):
                raise _failure(i, n, result, run_dir, shared)
            dirs.append(run_dir)
    return dirs


@dataclass
class EnvironmentDifferences:
    """The ranked environment/launch differences of compared runs, or why they could not be compared."""

    diff: EnvDiff | None
    problem: str | None = None
    quiet_if_same: bool = False  # check: say nothing when its runs' environments are the same (the usual case)
    locate_hint: bool = True  # suggest `diff --locate` (not when it is running)

    def to_json(self, verdict: str) -> dict[str, Any]:
        if self.diff is None:
            return {"compared": False, "problem": self.problem}
        return self.diff.to_json() | {"compared": True, "note": self.note(verdict)}

    def note(self, verdict: str) -> str | None:
        from ..envdiff import verdict_note

        return verdict_note(verdict, self.diff, locate_hint=self.locate_hint) if self.diff is not None else None

    def render(self, verdict: str) -> str | None:
        if self.diff is None:
            return f"Environment: not compared ({self.problem})"
        if self.quiet_if_same and not self.diff.changes:
            return None
        from ._render import render_env_diff

        text = render_env_diff(self.diff)
        note = self.note(verdict)
        return text + (f"\nNote:  {note}" if note else "")


def environment_differences(runs: list[Run], *, quiet_if_same: bool = False) -> EnvironmentDifferences:
    """Run 1's environment and launch options against the others'; a run without a readable one is named."""
    from ..envdiff import diff_runs

    try:
        return EnvironmentDifferences(diff_runs(runs), quiet_if_same=quiet_if_same)
    except EnvFileError as exc:
        return EnvironmentDifferences(None, str(exc), quiet_if_same=quiet_if_same)


# What to do when an output file cannot be written, by errno (default: WRITE_ADVICE)
WRITE_ADVICE_BY_ERRNO = {errno.ENOSPC: "Free disk space (or pass --out DIR on another disk)",
                         errno.EDQUOT: "Free space within your disk quota (or pass --out DIR on another disk)"}
WRITE_ADVICE = "Make sure you can write there (or pass --out DIR elsewhere)"
WriteErrors = list[tuple[str, int | None]]  # (what failed to write, its errno), in the order they happened


def write_error(path: Path, exc: OSError) -> str:
    """``could not write PATH (No space left on device, ENOSPC)``."""
    code = errno.errorcode.get(exc.errno) if exc.errno else None
    return f"could not write {path} ({exc.strerror or exc}{', ' + code if code else ''})"


def saved(path: Path, write: Any, errors: WriteErrors) -> Any:
    """``write()``'s result; on an OSError, None, with what failed added to ``errors`` (the verdict is printed
    anyway, and the command exits 2: see :func:`unsaved_message`)."""
    try:
        return write()
    except OSError as exc:
        errors.append((write_error(path, exc), exc.errno))
        return None


def wrote(path: Path, write: Any, errors: WriteErrors) -> bool:
    """Whether ``write()`` succeeded (see :func:`saved`)."""
    before = len(errors)
    saved(path, write, errors)
    return len(errors) == before


def unsaved_message(errors: WriteErrors) -> str:
    """What could not be written, and what to do."""
    advice = WRITE_ADVICE_BY_ERRNO.get(errors[0][1], WRITE_ADVICE)
    return (f"{'; '.join(e for e, _ in errors)}; the verdict above is complete, only the file(s) named are missing. "
            f"{advice} and run the check again.")


def print_verdict(doc: dict[str, Any], text: str, as_json: bool, errors: WriteErrors) -> int:
    """Print the JSON document or the text, then any write error (exit 2); return the exit code."""
    if errors:
        doc["exit_code"], doc["error"] = 2, unsaved_message(errors)
    print(json.dumps(doc, indent=2) if as_json else text, flush=True)
    if errors:
        print(f"torchrepro: error: {doc['error']}", file=sys.stderr, flush=True)
    return int(doc["exit_code"])


def finish(result: CheckResult, out: Path, *, what: str, as_json: bool,
           located: dict[str, Any] | None = None, environment: EnvironmentDifferences | None = None,
           errors: WriteErrors | None = None) -> int:
    """Plot, write check.json, print the summary or JSON; return the exit code (0 identical, 1 diverged, 2 when
    an output file could not be written: the verdict is printed all the same)."""
    from ..report import plot_check
    from ._render import render, render_locate

    errors = list(errors or [])
    plot = saved(out / "check.png", lambda: plot_check(result, out / "check.png"), errors)
    doc = result.to_json() | {"plot": str(plot) if plot else None, "command": what,
                              "exit_code": 0 if result.verdict == "identical" else 1}
    if environment is not None:
        doc["environment_diff"] = environment.to_json(result.verdict)
    if located is not None:
        doc["locate"] = located
    if errors:  # check.json says so too
        doc["exit_code"], doc["error"] = 2, unsaved_message(errors)
    saved(out / "check.json", lambda: atomic_write_json(out / "check.json", doc), errors)
    text = ""
    if not as_json:
        env_text = environment.render(result.verdict) if environment is not None else None
        text = "\n".join([render(result, what=what, plot=str(plot) if plot else None),
                          *(["\n" + env_text] if env_text else []),
                          *([render_locate(located)] if located is not None else [])])
    return print_verdict(doc, text, as_json, errors)


LOCATABLE = ("compute", "initial-weights")


def run_locate(command: list[str], out: Path, result: CheckResult, opts: LaunchOptions, steps: int,
               errors: WriteErrors | None = None, isolation: Isolation | None = None) -> dict[str, Any]:
    """Re-run twice with the op tracer on the first divergent step(s); compare the two op streams."""
    from ..locate import VERDICTS, locate_ops
    from ..optrace import read_ops
    from ._render import render_op_table

    if result.verdict == "identical":
        return {"verdict": "nothing-to-locate", "title": VERDICTS["nothing-to-locate"]}
    if result.cause not in LOCATABLE:
        return {"verdict": "skipped", "title": f"not traced: the cause is {result.cause!r}, which --locate does "
                "not need to trace (the summary above says what differs and what to do)"}
    errors = [] if errors is None else errors
    if result.compiled and result.compiled.get("in_compiled_code") is not False:  # the op tracer cannot see it
        return run_compiled_locate(command, out, result, opts, errors, isolation)
    first = int(result.first_step or 0)
    last = first + steps - 1
    # In optimizer mode the traced runs stop right after the traced steps (step 0 = construction: stop at 1).
    stop_at = max(last, 1) if result.step_mode == "optimizer" else opts.max_steps
    trace_opts = dataclasses.replace(opts, keep_values=False, trace_steps=[first, last],
                                     trace_mode=result.step_mode, max_steps=stop_at)
    print(f"torchrepro: --locate: tracing every operation of step {first}" +
          (f"..{last}" if last > first else "") + " in two more runs", file=sys.stderr, flush=True)
    dirs = execute_runs(command, out / "locate", 2, trace_opts, _fresh_only(isolation))
    ops = [list(read_ops(d / OPS)) if (d / OPS).exists() else [] for d in dirs]
    device = (load_run(dirs[0]).manifest.get("device") or "cpu").split(":")[0]
    loc = locate_ops(ops[0], ops[1], device=device)
    doc = loc.to_json()
    table = out / "locate_ops.txt"
    if wrote(table, lambda: atomic_write_bytes(table, (render_op_table(loc.context) + "\n").encode()), errors):
        doc["op_table"] = str(table)
    saved(out / "locate.json", lambda: atomic_write_json(out / "locate.json", doc), errors)
    return doc


def _fresh_only(isolation: Isolation | None) -> Isolation | None:
    """The --locate re-runs get copies of the cwd as the compared runs did (they are not watched)."""
    return Isolation(fresh=True) if isolation is not None and isolation.fresh else None


def run_compiled_locate(command: list[str], out: Path, result: CheckResult, opts: LaunchOptions,
                        errors: WriteErrors, isolation: Isolation | None = None) -> dict[str, Any]:
    """Re-run twice capturing the graphs inductor compiled; measure them at the first divergent step (see
    :mod:`torchrepro.compilelocate`)."""
    from ..compiled import CAPTURE_ENV, DEFAULT_REPEATS, GRAPHS_FILE
    from ..compilelocate import locate_compiled
    from ._render import render_op_table

    first = max(int(result.first_step or 1), 1)
    stop_at = first if result.step_mode == "optimizer" else opts.max_steps
    capture_opts = dataclasses.replace(opts, keep_values=False, max_steps=stop_at, extra_env={
        **opts.extra_env, CAPTURE_ENV: json.dumps({"repeats": DEFAULT_REPEATS})})
    print(f"torchrepro: --locate: the divergence lies in torch.compile'd code; capturing the graphs inductor "
          f"compiled and measuring them at step {first} in two more runs", file=sys.stderr, flush=True)
    dirs = execute_runs(command, out / "locate", 2, capture_opts, _fresh_only(isolation))
    docs = [json.loads((d / GRAPHS_FILE).read_text()) if (d / GRAPHS_FILE).exists() else {} for d in dirs]
    device = (load_run(dirs[0]).manifest.get("device") or "cpu").split(":")[0]
    doc = locate_compiled(docs, step=first, device=device).to_json()
    table = out / "locate_ops.txt"
    text = render_op_table([{**r, "op_other_run": None, "phase": doc["op"] and doc["op"]["phase"]}
                            for r in doc["context"]]) + "\n"
    if wrote(table, lambda: atomic_write_bytes(table, text.encode()), errors):
        doc["op_table"] = str(table)
    saved(out / "locate.json", lambda: atomic_write_json(out / "locate.json", doc), errors)
    return doc


def output_dir(given: str | None, prefix: str) -> Path:
    """The command's output directory: ``--out`` checked (only torchrepro output may be replaced), or a new one."""
    if given is None:
        return unique_dir(Path("torchrepro-runs"), prefix)
    out = Path(given)
    check_check_dir(out, flag="--out")
    return make_dir(out, flag="--out")


def run(args: argparse.Namespace) -> int:
    command, nproc = ranks_command(args.user_command, args.nproc_per_node)
    if nproc:  # several ranks through torchrun
        from ._ranks import run_ranks_check

        return run_ranks_check(args, command, nproc)
    parse_python_command(command)  # a bad command is refused before any directory is made
    out = output_dir(args.out, "check")
    opts = LaunchOptions(seed=args.seed, deterministic=args.deterministic, max_steps=args.max_steps,
                         keep_values=True, values_budget=args.values_budget, value_schedule="sampled",
                         extra_env={GRAD_VALUES_ENV: str(GRAD_VALUE_STEPS)})  # gradient |Δ| of the first steps
    with lock_dir(out):
        isolation = Isolation.for_check(args.fresh_cwd, out)
        dirs = execute_runs(command, out, args.runs, opts, isolation)
        from ..compare import compare_runs, note_shared_workdir

        runs = [load_run(d) for d in dirs]
        result = compare_runs(runs)
        note_shared_workdir(result, isolation.to_json() or {})
        errors: WriteErrors = []
        located = run_locate(command, out, result, opts, args.locate_steps, errors, isolation) if args.locate else None
        return finish(result, out, what=f"`{' '.join(command)}`", as_json=args.json, located=located,
                      environment=environment_differences(runs, quiet_if_same=True), errors=errors)
