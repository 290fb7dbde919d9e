"""What ``torchrepro check`` does around the runs, shared by the check of one process (:mod:`.check_cmd`) and
the check of several ranks (:mod:`._ranks`): starting the runs, naming a failed run (or rank), the environment
differences, and writing the results without losing the verdict."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import importlib
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._core.errors import EnvFileError, Interrupted, ScriptError
from .._core.table import printable_lines
from ..record.divergence import stop_plan
from ..record.launcher import GatedLaunch, LaunchOptions, RunResult, launch, parse_python_command, start_gated
from ..record.outdir import check_check_dir, check_run_dir, make_dir, unique_dir
from ..record.store import Run
from ..record.workdir import (
    COPY_OF_ENV,
    WorkdirWatch,
    check_copyable,
    copy_workdir,
    left_out_text,
    script_in_copy,
)

if TYPE_CHECKING:  # the analysis modules (and torch, matplotlib) are imported in the background while run 1 runs
    from ..analysis.envdiff import EnvDiff

STDERR_TAIL_LINES = 25


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

    def start(self, i: int, label: str = "") -> Any:
        desc = f"run {i}/{self.total}{label}"
        if self._rich is None:
            print(f"torchrepro: {desc} ...", file=sys.stderr, flush=True)
            return lambda steps: None
        task = self._rich.add_task(f"{desc}: starting", total=None)
        return lambda steps: self._rich.update(task, description=f"{desc}: {steps} steps recorded")

    def done(self, i: int, result: RunResult, seconds: float, label: str = "") -> None:
        steps = (result.manifest or {}).get("steps", 0)
        msg = f"torchrepro: run {i}/{self.total}{label} {result.status}: {steps} steps in {seconds:.1f}s"
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


def _failure(i: int, total: int, result: RunResult, run_dir: Path, shared: str | None = None,
             label: str = "") -> ScriptError:
    m = result.manifest or {}
    if m.get("ranks"):  # a torchrun launch: name the rank that failed first
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
    return ScriptError(f"run {i} of {total}{label} {what}; the runs cannot be compared. {hint}\n"
                       f"Last lines of its stderr ({run_dir / 'stderr.txt'}):\n{tail_lines(run_dir / 'stderr.txt')}",
                       stderr_path=run_dir / "stderr.txt")


def _with_note(error: ScriptError, note: str) -> ScriptError:
    """``error`` with ``note`` added to its message (its stderr path kept)."""
    return ScriptError(f"{error}\n{note}", stderr_path=error.stderr_path)


# Imported in a background thread while the first run trains, so their import time (torch, matplotlib) is not
# added to the check's wall time. A failure here is ignored: the same import in the main thread raises it later.
_ANALYSIS_MODULES = ("torchrepro.analysis.compare", "torchrepro.analysis.envdiff", "torchrepro.analysis.report",
                     "torchrepro.cli._render", "matplotlib.figure", "matplotlib.backends.backend_agg")


def _import_quietly(names: tuple[str, ...]) -> None:
    for name in names:
        if _stop_prefetch.is_set():  # the check is ending: the module being imported finishes, no next one starts
            return
        try:
            importlib.import_module(name)
        except Exception:  # reported by the main thread's own import of the module
            return  # the next one could import a half-initialised torch again (SIGSEGV at exit)


def prefetch_analysis() -> None:
    """Start importing the analysis modules in a background thread (at most once per process).

    Not a daemon thread: the interpreter waits for it before it shuts down. A check that ends while torch is
    still being imported there (run 1 failed at once) would otherwise abort in torch's C++ teardown
    ("terminate called without an active exception", SIGABRT) instead of exiting with its own code. A check
    that ends early waits for it (:func:`wait_for_prefetch`) before the interpreter begins to shut down: from
    then on the import fails half-way ("can't register atexit after shutdown")."""
    global _prefetch
    if _prefetch is None:
        _prefetch = threading.Thread(target=_import_quietly, args=(_ANALYSIS_MODULES,), name="torchrepro-prefetch")
        _prefetch.start()


def wait_for_prefetch() -> None:
    """Wait until the background import has ended (at once if it never started); a module not yet begun is not
    imported (a check that ends early waits for one module's import at most, not for all of them)."""
    _stop_prefetch.set()
    if _prefetch is not None:
        _prefetch.join()


_prefetch: threading.Thread | None = None
_stop_prefetch = threading.Event()


@dataclass
class Isolation:
    """How ``check``'s runs share the working directory: watched (``watch``) or each in a copy (``fresh``)."""

    fresh: bool = False
    watch: WorkdirWatch | None = None
    copies: list[str] = dataclasses.field(default_factory=list)
    left_out: dict[str, str] = dataclasses.field(default_factory=dict)  # FIFOs, sockets, devices not copied

    @staticmethod
    def refuse_uncopyable(fresh: bool, out: str | None) -> None:
        """``--fresh-cwd`` on a working directory too large to copy is refused before any directory is made."""
        if fresh:
            check_copyable(Path.cwd(), skip=[Path(out)] if out else [])

    @classmethod
    def for_check(cls, fresh: bool, out: Path) -> Isolation:
        """``--fresh-cwd``: copies (checked by :meth:`refuse_uncopyable`); otherwise a watch on the cwd."""
        return cls(fresh=True) if fresh else cls(watch=WorkdirWatch(Path.cwd(), skip=[out]))

    def options(self, i: int, out: Path, run_dir: Path, opts: LaunchOptions) -> LaunchOptions:
        """Run ``i``'s launch options: its own copy of the cwd, or the audit of what it reads."""
        if self.fresh:
            copy = copy_workdir(Path.cwd(), out / f"run{i}-cwd", skip=[out])
            new = {p: k for p, k in copy.left_out.items() if p not in self.left_out}
            if new:  # said at once (the verdict's note says it again): a run that needs one may fail
                print(f"torchrepro: warning: {left_out_text(new, Path.cwd())}", file=sys.stderr, flush=True)
                self.left_out |= new
            self.copies.append(str(copy.path))
            return dataclasses.replace(opts, record=str(run_dir.resolve()), cwd=str(copy.path), extra_env={
                **opts.extra_env, COPY_OF_ENV: json.dumps([os.path.abspath(copy.path), str(Path.cwd())])})
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

    def options_again(self, run_dir: Path, opts: LaunchOptions) -> LaunchOptions:
        """The launch options of a second process of the run just prepared (``check --resume-at``'s restart): the
        same copy of the working directory, or the same watch."""
        if self.fresh:
            return dataclasses.replace(opts, record=str(run_dir.resolve()), cwd=self.copies[-1], extra_env={
                **opts.extra_env, COPY_OF_ENV: json.dumps([os.path.abspath(self.copies[-1]), str(Path.cwd())])})
        if self.watch is not None:
            self.watch.before_restart()
            return dataclasses.replace(opts, record=str(run_dir), watch_since_ns=self.watch.since_ns)
        return dataclasses.replace(opts, record=str(run_dir))

    def restart_done(self, i: int, run_dir: Path) -> str | None:
        """Note what run ``i``'s restarted process read (see :meth:`run_done`)."""
        if self.watch is None:
            return None
        from ..analysis.compare import shared_workdir_warning

        self.watch.restart_done(i, run_dir)
        return shared_workdir_warning(self.watch.shared(upto=i))

    def run_done(self, i: int, run_dir: Path) -> str | None:
        """Note what run ``i`` read; the warning if it read what run 1 wrote in the shared cwd."""
        if self.watch is None:
            return None
        from ..analysis.compare import shared_workdir_warning

        self.watch.run_done(i, run_dir)
        return shared_workdir_warning(self.watch.shared(upto=i)) if i > 1 else None

    def to_json(self) -> dict[str, Any] | None:
        if self.fresh:
            return {"isolated": True, "root": str(Path.cwd()), "copies": self.copies,
                    "not_copied": [{"path": p, "kind": k} for p, k in sorted(self.left_out.items())],
                    "read_from_earlier_run": []}
        return self.watch.to_json() if self.watch is not None else None


def execute_runs(command: list[str], out: Path, n: int, opts: LaunchOptions,
                 isolation: Isolation | None = None, *, stop_after: int | None = None,
                 parallel: bool = False, prestart: bool = True, number: int = 1) -> list[Path]:
    """Run ``command`` ``n`` times into ``out/run1..runN``; raise ScriptError on a failed run.

    ``out`` must already be checked (:func:`~torchrepro.record.outdir.check_check_dir`) and locked by the caller.
    ``isolation`` gives each run a copy of the working directory, or watches what the runs read there.
    ``stop_after``: each later run is compared with run 1 as it records and stopped that many steps after its
    first divergence (None: every run runs to its end). ``parallel``: all runs at once (:mod:`._parallel`), all
    stopped ``stop_after`` steps after the first divergence of any. ``prestart``: start run i+1's interpreter
    while run i runs, held before its script until run i has ended (:class:`Prestarted`). ``number``: the first
    run's number as ``isolation`` counts runs (``compare`` records A and B as runs 1 and 2 of one watch).
    """
    parse_python_command(command)  # validate before starting anything
    prefetch_analysis()
    try:
        return _execute_runs(command, out, n, opts, isolation, stop_after=stop_after, parallel=parallel,
                             prestart=prestart, number=number)
    except BaseException:  # ended early (a failed run, a signal): let the background import end cleanly first
        wait_for_prefetch()
        raise


def _execute_runs(command: list[str], out: Path, n: int, opts: LaunchOptions, isolation: Isolation | None, *,
                  stop_after: int | None, parallel: bool, prestart: bool, number: int) -> list[Path]:
    isolation = isolation or Isolation()
    prestart = prestart and not opts.nproc_per_node and os.name == "posix"  # one process; an inherited pipe
    dirs = [out / f"run{i}" for i in range(1, n + 1)]
    if parallel:
        from ._parallel import run_parallel

        with _Progress(n) as progress:
            def launch_one(i: int, run_command: list[str], opts_i: LaunchOptions) -> RunResult:
                return launch_run(command, dirs[i - 1], opts_i, progress, isolation, i, run_command=run_command)

            results = run_parallel(command, out, dirs, opts, isolation, stop_after, launch_one)
        for i, (run_dir, result) in enumerate(zip(dirs, results), start=1):
            check_run_result(i, n, result, run_dir, isolation.run_done(i, run_dir))
        return dirs
    def prepared(i: int) -> tuple[list[str], LaunchOptions]:
        run_dir = dirs[i - 1]
        prepare_run(run_dir)
        opts_i = isolation.options(i + number - 1, out, run_dir, opts)
        if stop_after is not None and i > 1:
            opts_i = dataclasses.replace(opts_i, divergence_stop=stop_plan([dirs[0], run_dir], 1, stop_after,
                                                                           numbers=[1, i]))
        return isolation.command(command), opts_i

    with _Progress(n) as progress, contextlib.ExitStack() as pending:
        waiting: Prestarted | None = None
        for i, run_dir in enumerate(dirs, start=1):
            run_command, opts_i = prepared(i) if waiting is None else (waiting.command, waiting.opts)
            if prestart and i < n:  # run i+1's interpreter imports torch while run i trains (see start_gated)
                following = Prestarted.start(*prepared(i + 1), dirs[i],
                                             copy=Path(isolation.copies[-1]) if isolation.fresh else None)
                pending.callback(following.cancel)
            if waiting is not None:
                result = waiting.release(progress, i)
            else:
                result = launch_run(command, run_dir, opts_i, progress, isolation, i, run_command=run_command)
            waiting = following if prestart and i < n else None
            check_run_result(i, n, result, run_dir, isolation.run_done(i + number - 1, run_dir))
    return dirs


@dataclass
class Prestarted:
    """A run of ``check`` started ahead of its turn and held before its script (:func:`~torchrepro.record.launcher.
    start_gated`): :meth:`release` runs it with progress as :func:`launch_run` does; :meth:`cancel` (a no-op once
    released) ends it unrun and removes the directory it was given."""

    command: list[str]
    opts: LaunchOptions
    run_dir: Path
    gated: GatedLaunch
    files: contextlib.ExitStack
    copy: Path | None = None  # its copy of the working directory (--fresh-cwd), made for it
    released: bool = False

    @classmethod
    def start(cls, command: list[str], opts: LaunchOptions, run_dir: Path, copy: Path | None = None) -> Prestarted:
        files = contextlib.ExitStack()
        try:
            so = files.enter_context(open(run_dir / "stdout.txt", "wb"))
            se = files.enter_context(open(run_dir / "stderr.txt", "wb"))
            gated = start_gated(command, opts, stdout=so, stderr=se)
        except BaseException:
            files.close()
            raise
        return cls(command, opts, run_dir, gated, files, copy)

    def release(self, progress: _Progress, i: int) -> RunResult:
        self.released = True
        with self.files:
            return _tracked(progress, i, self.run_dir, lambda update: self.gated.release(on_poll=update))

    def cancel(self) -> None:
        if self.released:
            return
        self.released = True
        try:
            self.gated.cancel()
        finally:
            self.files.close()
            for name in ("stdout.txt", "stderr.txt"):  # what the process was given; it ran nothing
                with contextlib.suppress(OSError):
                    (self.run_dir / name).unlink()
            with contextlib.suppress(OSError):
                self.run_dir.rmdir()  # only when empty: nothing else of ours or anyone's is removed
            if self.copy is not None:  # the copy of the working directory made for this run (--fresh-cwd)
                shutil.rmtree(self.copy, ignore_errors=True)


def check_run_result(i: int, n: int, result: RunResult, run_dir: Path, shared: str | None) -> None:
    """Raise the ScriptError for run ``i`` when it failed or recorded no step."""
    if result.returncode != 0 or not (result.manifest or {}).get("steps"):
        raise _failure(i, n, result, run_dir, shared)


def prepare_run(run_dir: Path) -> None:
    """Check ``run_dir`` (only an earlier run may be replaced) and make it."""
    check_run_dir(run_dir, flag="--out")
    make_dir(run_dir, flag="--out", parents=True)


def launch_run(command: list[str], run_dir: Path, opts: LaunchOptions, progress: _Progress, isolation: Isolation,
               i: int, label: str = "", *, run_command: list[str] | None = None) -> RunResult:
    """Launch run ``i`` into ``run_dir`` (its stdout and stderr there too), with progress; say where an
    interrupted run's output is. ``run_command``: the command as ``isolation`` prepared it for this run (default:
    ``isolation.command(command)``, for the run prepared last)."""
    with open(run_dir / "stdout.txt", "wb") as so, open(run_dir / "stderr.txt", "wb") as se:
        return _tracked(progress, i, run_dir, lambda update: launch(
            run_command or isolation.command(command), opts, stdout=so, stderr=se, on_poll=update), label)


def _tracked(progress: _Progress, i: int, run_dir: Path, go: Callable[[Any], RunResult], label: str = "") -> RunResult:
    """``go(on_poll)`` as run ``i``, with progress; an interruption says where the run's output is."""
    update = progress.start(i, label)
    t0 = time.perf_counter()
    try:
        result = go(update)
    except Interrupted as exc:
        raise Interrupted(exc.signum, f"{exc} Run {i} of {progress.total}{label} was interrupted; the output "
                                      f"so far is in {run_dir.parent} (its stderr: {run_dir / 'stderr.txt'})."
                          ) from None
    progress.done(i, result, time.perf_counter() - t0, label)
    return result


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
        from ..analysis.envdiff import verdict_note

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
    from ..analysis.envdiff import diff_runs

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
    advice = WRITE_ADVICE_BY_ERRNO.get(errors[0][1], WRITE_ADVICE)  # type: ignore[arg-type]
    return (f"{'; '.join(e for e, _ in errors)}; the verdict above is complete, only the file(s) named are missing. "
            f"{advice} and run the check again.")


def print_verdict(doc: dict[str, Any], text: str, as_json: bool, errors: WriteErrors) -> int:
    """Print the JSON document or the text, then any write error (exit 2); return the exit code."""
    if errors:
        doc["exit_code"], doc["error"] = 2, unsaved_message(errors)
    print(json.dumps(doc, indent=2) if as_json else printable_lines(text), flush=True)
    if errors:
        print(f"torchrepro: error: {doc['error']}", file=sys.stderr, flush=True)
    return int(doc["exit_code"])


def output_dir(given: str | None, prefix: str) -> Path:
    """The command's output directory: ``--out`` checked (only torchrepro output may be replaced), or a new one."""
    if given is None:
        return unique_dir(Path("torchrepro-runs"), prefix)
    out = Path(given)
    check_check_dir(out, flag="--out")
    return make_dir(out, flag="--out")


_FIX_SCRIPT = ("Fix the script so that it runs under torchrun on its own (`torchrun --nproc-per-node N train.py`), "
               "then check again.")
_FIX_EARLY = ("A rank that ends before the others leaves them waiting in collectives: make every rank run the same "
              "number of steps (the same loop bounds and number of batches on every rank), then check again.")
_FIX_NO_STEPS = ("torchrepro check compares training steps: make sure the script calls loss.backward() "
                 "(and optimizer.step()).")


def rank_failure(i: int, total: int, result: RunResult, run_dir: Path) -> ScriptError:
    """The error for a failed run of several ranks: the rank that ended early or failed first, how, what the
    others did, and the last lines of the stderr of the rank that failed first."""
    m = result.manifest or {}
    statuses: dict[str, Any] = m.get("rank_status") if isinstance(m.get("rank_status"), dict) else {}  # type: ignore[assignment]
    failed = m.get("failed_rank")
    early = [r for r in m.get("ended_early") or [] if f"rank{r}" in statuses]
    hint = _FIX_SCRIPT if result.returncode != 0 else _FIX_NO_STEPS
    if early:
        what, named, hint = _early_what(early, statuses), early, _FIX_EARLY
    elif failed is None:
        named = []
        what = ("finished but recorded no optimizer step and no backward() call on rank 0" if result.returncode == 0
                else f"failed (torchrun exited with status {result.returncode} before any rank failed: see its "
                     "own output)")
    else:
        code = (statuses.get(f"rank{failed}") or {}).get("exit_code")
        how = f"was killed by signal {-code}" if isinstance(code, int) and code < 0 else f"exited with code {code}"
        what, named = f"failed: rank {failed} {how} first", [failed]
    path = run_dir / f"rank{failed}" if failed is not None else (run_dir / "rank0" if result.returncode == 0
                                                                 else run_dir)
    others = [_other(name, info, run_dir) for name, info in statuses.items() if int(name[4:]) not in named]
    stderr, whose = path / "stderr.txt", f"rank {failed}'s" if early else "its"
    error = ScriptError(f"run {i} of {total} {what}" + (f"; then {', '.join(others)}" if others else "")
                        + f". The runs cannot be compared. {hint}\nLast lines of {whose} stderr ({stderr}):\n"
                        f"{tail_lines(stderr)}", stderr_path=stderr)
    return error


def _early_what(early: list[int], statuses: dict[str, dict[str, object]]) -> str:
    """``failed: rank 1 ended early (exit code 0 after 1 step) while rank 0 was still running``."""
    ended = ", ".join(f"rank {r} ended early (exit code 0 after {_steps(statuses[f'rank{r}'])})" for r in early)
    running = [f"rank {name[4:]}" for name in statuses if int(name[4:]) not in early]
    return f"failed: {ended} while {' and '.join(running)} {'was' if len(running) == 1 else 'were'} still running"


def _steps(info: dict[str, object]) -> str:
    steps = info.get("steps")
    return f"{steps} step" + ("" if steps == 1 else "s")


def _other(name: str, info: dict[str, object], run_dir: Path) -> str:
    """``rank 0 failed (1) after 1 step: <last line of its stderr>``: what another rank did."""
    code = f" ({info['exit_code']})" if info.get("exit_code") else ""
    return (f"rank {name[4:]} {info.get('status')}{code} after {_steps(info)}"
            + _last_line(run_dir / name / "stderr.txt", info.get("status")))


def _last_line(path: Path, status: object) -> str:
    """``: <last line of a failed rank's stderr>`` (what the other ranks saw), or nothing."""
    if status not in ("failed", "killed"):
        return ""
    last = tail_lines(path, 1).strip()
    return f": {last[:240]}" if last and not last.startswith("(") else ""


