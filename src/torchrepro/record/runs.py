"""One loop for the runs of every command that runs a script: ``check``, ``compare``, ``bench``, ``variance`` and
``check --resume-at``.

A command builds a plan (:class:`PlannedRun`: command, launch options, label) and hands it to a :class:`RunLoop`,
which for each run checks and makes ``OUT/run<i>``, gives the run its working directory (:class:`Isolation`: the
shared one, watched, or a copy), launches it with progress on stderr, notes what it read, and turns a failed run
into a :class:`~torchrepro._core.errors.ScriptError` that names it (:mod:`.runfailure`). Runs go one after the
other, each next run's interpreter prestarted while the one before trains (:class:`Prestarted`), or all at once
(:mod:`.parallel`). A command whose next run depends on the last (``check --resume-at``) calls :meth:`RunLoop.run`
run by run.

>>> loop = RunLoop(Path("torchrepro-runs/check-1"), total=2)  # doctest: +SKIP
>>> with loop:  # doctest: +SKIP
...     loop.run_all([PlannedRun(["python", "train.py"], LaunchOptions())] * 2, prestart=True)
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._core.errors import Interrupted, ReproError, ScriptError
from .._core.table import printable
from .divergence import stop_plan
from .launcher import GatedLaunch, LaunchOptions, RunResult, launch, parse_python_command, start_gated
from .outdir import check_run_dir, make_dir
from .runfailure import CHECK, FailureWords, failed, run_failure
from .runoutput import RunOutput
from .store import read_trace_lines
from .workdir import COPY_OF_ENV, WorkdirWatch, check_copyable, copy_workdir, left_out_text, script_in_copy

PROGRESS_ENV = "TORCHREPRO_PROGRESS_INTERVAL"  # seconds between two plain progress lines of a run (default 10)
DEFAULT_INTERVAL_S = 10.0
_show_output: list[bool] = [False]  # the innermost showing_output() is last


@contextlib.contextmanager
def showing_output(on: bool = True) -> Iterator[None]:
    """While active, the runs that a :class:`RunLoop` made here launches show their scripts' stdout and stderr on
    stderr as they run, each line after ``[run i]`` (``check --show-output``); the run directory's files keep them.

    >>> with showing_output():
    ...     Progress(2).show
    True
    """
    _show_output.append(on)
    try:
        yield
    finally:
        _show_output.pop()


def progress_interval(environ: Mapping[str, str] | None = None) -> float:
    """The seconds between two plain progress lines of a run: ``TORCHREPRO_PROGRESS_INTERVAL``, or 10.

    >>> progress_interval({}), progress_interval({"TORCHREPRO_PROGRESS_INTERVAL": "60"})
    (10.0, 60.0)
    """
    text = (os.environ if environ is None else environ).get(PROGRESS_ENV)
    if text is None or not text.strip():
        return DEFAULT_INTERVAL_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise ReproError(f"{PROGRESS_ENV}={text!r}: expected the seconds between two progress lines of a run (0 or "
                         f"more, e.g. 30); unset it for the default of {DEFAULT_INTERVAL_S:g}.")
    return value


def elapsed(seconds: float) -> str:
    """``12 s``, ``3 min 05 s``, ``1 h 02 min``: how long a run has been going.

    >>> elapsed(12.4), elapsed(185), elapsed(3720)
    ('12 s', '3 min 05 s', '1 h 02 min')
    """
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    return f"{s // 60} min {s % 60:02d} s" if s < 3600 else f"{s // 3600} h {s // 60 % 60:02d} min"


class Progress:
    """Progress on stderr: rich when available and on a terminal, plain lines otherwise.

    ``what`` names the command in the plain lines (``torchrepro bench: run 1/3 (default) ...``); none for check
    (``torchrepro: run 1/3 ...``). ``upto``: ``total`` is the most runs there may be (``run 3 of up to 10``).

    While a run runs, its steps recorded, time and last output line are shown (:class:`~.runoutput.RunOutput`):
    on a terminal one live line per running run; otherwise a line at most every ``TORCHREPRO_PROGRESS_INTERVAL``
    seconds (10) per run, when its steps or last line changed. Under :func:`showing_output`, every line the script
    writes follows ``[run i]``. Lines are written whole, one write each, under one lock: runs at once
    (``--parallel``) never share a line. An error while showing a run (its files unreadable, stderr closed) stops
    the display of that run and is raised once the run has ended (:meth:`end`): the run itself is not disturbed.
    """

    def __init__(self, total: int, what: str = "", *, upto: bool = False) -> None:
        self.total, self.upto = total, upto
        self.prefix = f"torchrepro {what}:" if what else "torchrepro:"
        self.every = progress_interval()
        self.show = _show_output[-1]
        self._lock = threading.Lock()
        self._live: dict[int, _Live] = {}
        self._rich: Any = None
        if sys.stderr.isatty():
            try:
                from rich.progress import Progress as RichProgress
                from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

                self._rich = RichProgress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                          transient=True)
            except ImportError:
                self._rich = None

    def __enter__(self) -> Progress:
        if self._rich is not None:
            self._rich.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._rich is not None:
            self._rich.__exit__(*exc)

    def name(self, i: int, label: str = "") -> str:
        """``run 2/3 (deterministic)``, or ``run 3 of up to 10``."""
        return f"run {i} of up to {self.total}{label}" if self.upto else f"run {i}/{self.total}{label}"

    def say(self, line: str) -> None:
        """Write one whole line on stderr (above the live lines on a terminal)."""
        with self._lock:
            if self._rich is not None:
                self._rich.console.print(line, highlight=False, markup=False, soft_wrap=True)
            else:
                sys.stderr.write(line + "\n")
                sys.stderr.flush()

    def start(self, i: int, label: str = "", run_dir: Path | None = None) -> Callable[[int], None]:
        """Say that run ``i`` starts; return the callback the launch calls with the steps recorded so far (about
        five times a second). ``run_dir``: where its output files are (none: steps and time only)."""
        desc = self.name(i, label)
        task = None
        if self._rich is None:
            self.say(f"{self.prefix} {desc} ...")
        else:
            task = self._rich.add_task(f"{desc}: starting", total=None)
        lines = functools.partial(self._line, i) if self.show else None
        live = _Live(self, desc, task, RunOutput(run_dir, lines) if run_dir is not None else None)
        with self._lock:
            self._live[i] = live
        return live

    def _line(self, i: int, source: str, text: str) -> None:
        self.say(f"[run {i}{' ' + source if source else ''}] {printable(text)}")

    def end(self, i: int, *, quiet: bool = False) -> None:
        """Run ``i`` has ended: show the rest of its output, remove its live line; raise what went wrong while it
        was shown (``quiet``: not, another error is on its way)."""
        with self._lock:
            live = self._live.pop(i, None)
        if live is None:
            return
        if self._rich is not None and live.task is not None:
            self._rich.remove_task(live.task)
        error = live.error
        if error is None and live.output is not None:
            try:
                live.output.close()
            except Exception as exc:  # noqa: BLE001 - raised below, as while the run ran
                error = exc
        if error is not None and not quiet:
            raise error

    def done(self, i: int, result: RunResult, seconds: float, label: str = "") -> None:
        steps = (result.manifest or {}).get("steps", 0)
        self.say(f"{self.prefix} {self.name(i, label)} {result.status}: {steps} steps in {seconds:.1f}s")


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


class _Live:
    """What is shown of one running run; called with its steps recorded so far (:meth:`Progress.start`)."""

    def __init__(self, progress: Progress, desc: str, task: Any, output: RunOutput | None) -> None:
        self.progress, self.desc, self.task, self.output = progress, desc, task, output
        self.started = self.said_at = time.monotonic()
        self.said: tuple[int, str] = (0, "")
        self.error: BaseException | None = None

    def __call__(self, steps: int) -> None:
        if self.error is not None:
            return
        try:
            self._show(steps)
        except Exception as exc:  # noqa: BLE001 - the run goes on; Progress.end raises it once the run has ended
            self.error = exc

    def _show(self, steps: int) -> None:
        p = self.progress
        if self.output is not None:
            self.output.poll()
        last = self.output.last if self.output is not None and not p.show else ""  # streamed: not repeated
        now = time.monotonic()
        if p._rich is not None:
            from rich.markup import escape

            p._rich.update(self.task, description=escape(f"{self.desc}: {_steps(steps)} recorded" +
                                                          (f"; last output: {last}" if last else "")))
            return
        if (steps, last) == self.said or now - self.said_at < p.every:
            return
        self.said, self.said_at = (steps, last), now
        p.say(f"{p.prefix} {self.desc}: {_steps(steps)}, {elapsed(now - self.started)}" +
              (f"; last output: {last}" if last else ""))


SharedWords = Callable[[list[dict[str, Any]]], "str | None"]


def _no_words(shared: list[dict[str, Any]]) -> str | None:
    return f"later runs read files an earlier run wrote in the working directory: {shared}" if shared else None


@dataclass
class Isolation:
    """How the runs share the working directory: watched (``watch``), each in a copy (``fresh``), or neither.

    ``words`` turns what a later run read from an earlier one into the warning told with a failure or verdict
    (the command passes the cause registry's wording: the analysis layer is above this one)."""

    fresh: bool = False
    watch: WorkdirWatch | None = None
    copies: list[str] = dataclasses.field(default_factory=list)
    left_out: dict[str, str] = dataclasses.field(default_factory=dict)  # FIFOs, sockets, devices not copied
    words: SharedWords = _no_words

    @staticmethod
    def refuse_uncopyable(fresh: bool, out: str | None) -> None:
        """``--fresh-cwd`` on a working directory too large to copy is refused before any directory is made."""
        if fresh:
            check_copyable(Path.cwd(), skip=[Path(out)] if out else [])

    @classmethod
    def for_check(cls, fresh: bool, out: Path, words: SharedWords = _no_words) -> Isolation:
        """``--fresh-cwd``: copies (checked by :meth:`refuse_uncopyable`); otherwise a watch on the cwd."""
        if fresh:
            return cls(fresh=True, words=words)
        return cls(watch=WorkdirWatch(Path.cwd(), skip=[out]), words=words)

    def options(self, i: int, out: Path, run_dir: Path, opts: LaunchOptions) -> LaunchOptions:
        """Run ``i``'s launch options: its own copy of the cwd, or the audit of what it reads."""
        if self.fresh:
            copy = copy_workdir(Path.cwd(), out / f"run{i}-cwd", skip=[out])
            new = {p: k for p, k in copy.left_out.items() if p not in self.left_out}
            if new:  # said at once (the verdict's note says it again): a run that needs one may fail
                print(f"torchrepro: warning: {left_out_text(new, Path.cwd())}", file=sys.stderr, flush=True)
                self.left_out |= new
            self.copies.append(str(copy.path))
            return self._in_copy(run_dir, opts)
        if self.watch is not None:
            since = self.watch.start() if i == 1 else self.watch.since_ns
            return dataclasses.replace(opts.in_dir(watch_since_ns=since), record=str(run_dir))
        return dataclasses.replace(opts, record=str(run_dir))

    def _in_copy(self, run_dir: Path, opts: LaunchOptions) -> LaunchOptions:
        return dataclasses.replace(opts.in_dir(cwd=self.copies[-1]), record=str(run_dir.resolve()), extra_env={
            **opts.extra_env, COPY_OF_ENV: json.dumps([os.path.abspath(self.copies[-1]), str(Path.cwd())])})

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
            return self._in_copy(run_dir, opts)
        if self.watch is not None:
            self.watch.before_restart()
            return dataclasses.replace(opts.in_dir(watch_since_ns=self.watch.since_ns), record=str(run_dir))
        return dataclasses.replace(opts, record=str(run_dir))

    def restart_done(self, i: int, run_dir: Path) -> str | None:
        """Note what run ``i``'s restarted process read (see :meth:`run_done`)."""
        if self.watch is None:
            return None
        self.watch.restart_done(i, run_dir)
        return self.words(self.watch.shared(upto=i))

    def run_done(self, i: int, run_dir: Path) -> str | None:
        """Note what run ``i`` read; the warning if it read what run 1 wrote in the shared cwd."""
        if self.watch is None:
            return None
        self.watch.run_done(i, run_dir)
        return self.words(self.watch.shared(upto=i)) if i > 1 else None

    def to_json(self) -> dict[str, Any] | None:
        if self.fresh:
            return {"isolated": True, "root": str(Path.cwd()), "copies": self.copies,
                    "not_copied": [{"path": p, "kind": k} for p, k in sorted(self.left_out.items())],
                    "read_from_earlier_run": []}
        return self.watch.to_json() if self.watch is not None else None


@dataclass(frozen=True)
class PlannedRun:
    """One run of a plan: the command, its launch options (``record`` is set by the loop) and its label
    (``deterministic``, shown as ``run 2/3 (deterministic)``; empty for check's identical runs)."""

    command: list[str]
    opts: LaunchOptions
    label: str = ""

    @property
    def shown(self) -> str:
        """The label as progress and errors show it after ``run 2/3``: `` (deterministic)``, or nothing."""
        return f" ({self.label})" if self.label else ""


@dataclass
class Launched:
    """One finished run: its label, directory, result and trace events."""

    label: str
    run_dir: Path
    result: RunResult
    events: list[dict[str, Any]]

    @property
    def step_times(self) -> list[float]:
        """``t`` of each step boundary: optimizer steps, or ``backward()`` calls when the script has no optimizer."""
        steps = [e["t"] for e in self.events if e.get("kind") == "step"]
        return steps or [e["t"] for e in self.events if e.get("kind") == "backward"]


class RunLoop:
    """Launch the runs of a plan into ``out/run<i>`` (see the module docstring).

    ``out`` must already be checked and locked by the caller. ``total``: the runs the progress counts; ``first``:
    the number of the first run (a series continued in parts); ``number``: the first run's number as
    ``isolation`` counts runs (``compare`` records A and B as runs 1 and 2 of one watch). ``words``: how a failed
    run is worded (:class:`~.runfailure.FailureWords`). ``upto``: ``total`` is the most runs there may be
    (``check --runs auto``)."""

    def __init__(self, out: Path, total: int, *, isolation: Isolation | None = None, what: str = "",
                 words: FailureWords = CHECK, first: int = 1, number: int = 1, upto: bool = False) -> None:
        self.out, self.total, self.first, self.number = out, total, first, number
        self.isolation = isolation or Isolation()
        self.words = words
        self.progress = Progress(total, what, upto=upto)

    def __enter__(self) -> RunLoop:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)

    def prepare(self, i: int, run: PlannedRun, run_dir: Path, *, again: bool = False) -> PlannedRun:
        """Make ``run_dir`` (only an earlier run may be replaced) and give run ``i`` its working directory.
        ``again``: a second process of the run prepared last (``check --resume-at``'s restart)."""
        check_run_dir(run_dir, flag="--out")
        make_dir(run_dir, flag="--out", parents=True)
        opts = (self.isolation.options_again(run_dir, run.opts) if again else
                self.isolation.options(i + self.number - 1, self.out, run_dir, run.opts))
        return PlannedRun(self.isolation.command(run.command), opts, run.label)

    def _on_device(self, i: int, run: PlannedRun, run_dir: Path, device: str | None) -> PlannedRun:
        """:meth:`prepare`, and the run sees only GPU ``device`` (``--parallel`` with a GPU per run)."""
        run = self.prepare(i, run, run_dir)
        if device is None:
            return run
        return dataclasses.replace(run, opts=dataclasses.replace(
            run.opts, extra_env={**run.opts.extra_env, "CUDA_VISIBLE_DEVICES": device}))

    def launch(self, i: int, run: PlannedRun, run_dir: Path) -> RunResult:
        """Launch the prepared run ``i`` into ``run_dir`` (its stdout and stderr there too), with progress."""
        with open(run_dir / "stdout.txt", "wb") as so, open(run_dir / "stderr.txt", "wb") as se:
            return self.tracked(i, run_dir, lambda update: launch(run.command, run.opts, stdout=so, stderr=se,
                                                                  on_poll=update), run.shown)

    def tracked(self, i: int, run_dir: Path, go: Callable[[Any], RunResult], label: str = "") -> RunResult:
        """``go(on_poll)`` as run ``i``, with progress (its output followed in ``run_dir``); an interruption says
        where the run's output is."""
        update = self.progress.start(i, label, run_dir)
        t0 = time.perf_counter()
        try:
            result = go(update)
        except Interrupted as exc:
            self.progress.end(i, quiet=True)
            raise Interrupted(exc.signum, f"{exc} Run {i} of {self.total}{label} was interrupted; the output "
                                          f"so far is in {run_dir.parent} (its stderr: {run_dir / 'stderr.txt'})."
                              ) from None
        except BaseException:
            self.progress.end(i, quiet=True)
            raise
        self.progress.end(i)
        self.progress.done(i, result, time.perf_counter() - t0, label)
        return result

    def done(self, i: int, run_dir: Path, result: RunResult, label: str = "", *, again: bool = False,
             check: bool = True) -> str | None:
        """Note what run ``i`` read in the working directory; with ``check``, raise its ScriptError when it failed
        or recorded no step. Returns the shared-cwd warning, if any."""
        shared = (self.isolation.restart_done(i + self.number - 1, run_dir) if again else
                  self.isolation.run_done(i + self.number - 1, run_dir))
        if check and failed(result):
            raise self.failure(i, run_dir, result, label, shared)
        return shared

    def failure(self, i: int, run_dir: Path, result: RunResult, label: str = "", shared: str | None = None
                ) -> ScriptError:
        """The ScriptError of run ``i``, worded for this command (:func:`~.runfailure.run_failure`)."""
        return run_failure(i, self.total, result, run_dir, shared, label, self.words)

    def run(self, i: int, run: PlannedRun, run_dir: Path, *, again: bool = False, check: bool = True
            ) -> tuple[RunResult, str | None]:
        """Prepare, launch and finish one run (:meth:`prepare`, :meth:`launch`, :meth:`done`)."""
        result = self.launch(i, self.prepare(i, run, run_dir, again=again), run_dir)
        return result, self.done(i, run_dir, result, run.shown, again=again, check=check)

    def run_all(self, plan: list[PlannedRun], *, prestart: bool = False, parallel: bool = False,
                after: Callable[[int, Launched], None] | None = None,
                go_on: Callable[[int, Path], bool] | None = None) -> list[Path]:
        """Run every run of ``plan`` into ``out/run<first>...``; raise ScriptError at the first that failed.

        ``prestart``: start run i+1's interpreter while run i runs, held before its script until run i has ended
        (one process per run, POSIX). ``parallel``: all at once (:mod:`.parallel`). ``after(i, launched)`` is
        called after each run and may raise (a problem stops the plan at once). ``go_on(i, run_dir)`` (one after
        the other only): called after each run; False ends the plan there (a prestarted next run is ended before
        its script starts, its directory removed). Returns the directories of the runs made."""
        dirs = [self.out / f"run{i}" for i in range(self.first, self.first + len(plan))]
        if parallel:
            from .parallel import run_parallel

            results = run_parallel(dirs, [functools.partial(self._on_device, i, run)
                                          for i, run in enumerate(plan, start=self.first)],
                                   lambda k, run, run_dir: self.launch(self.first + k, run, run_dir))
            for i, (run, run_dir, result) in enumerate(zip(plan, dirs, results), start=self.first):
                self._finished(i, run, run_dir, result, after)
            return dirs
        prestart = prestart and os.name == "posix"
        with contextlib.ExitStack() as pending:
            waiting: Prestarted | None = None
            for k, (run, run_dir) in enumerate(zip(plan, dirs)):
                i = self.first + k
                ready = self.prepare(i, run, run_dir) if waiting is None else waiting.run
                following = None
                if prestart and k + 1 < len(plan):  # run i+1's interpreter imports torch while run i trains
                    following = Prestarted.start(self.prepare(i + 1, plan[k + 1], dirs[k + 1]), dirs[k + 1],
                                                 copy=Path(self.isolation.copies[-1]) if self.isolation.fresh
                                                 else None)
                    pending.callback(following.cancel)
                result = waiting.release(self, i) if waiting is not None else self.launch(i, ready, run_dir)
                waiting = following
                self._finished(i, run, run_dir, result, after)
                if go_on is not None and not go_on(i, run_dir):
                    if following is not None:  # never run: its copy of the cwd is no copy of the check's
                        following.cancel()
                        if following.copy is not None and str(following.copy) in self.isolation.copies:
                            self.isolation.copies.remove(str(following.copy))
                    return dirs[:k + 1]
        return dirs

    def _finished(self, i: int, run: PlannedRun, run_dir: Path, result: RunResult,
                  after: Callable[[int, Launched], None] | None) -> None:
        self.done(i, run_dir, result, run.shown)
        if after is not None:
            after(i, Launched(run.label, run_dir, result, read_trace_lines(run_dir)[0]))


@dataclass
class Prestarted:
    """A run started ahead of its turn and held before its script (:func:`~torchrepro.record.launcher.start_gated`):
    :meth:`release` runs it with progress as :meth:`RunLoop.launch` does; :meth:`cancel` (a no-op once released)
    ends it unrun and removes the directory it was given."""

    run: PlannedRun
    run_dir: Path
    gated: GatedLaunch
    files: contextlib.ExitStack
    copy: Path | None = None  # its copy of the working directory (--fresh-cwd), made for it
    released: bool = False

    @classmethod
    def start(cls, run: PlannedRun, run_dir: Path, copy: Path | None = None) -> Prestarted:
        files = contextlib.ExitStack()
        try:
            so = files.enter_context(open(run_dir / "stdout.txt", "wb"))
            se = files.enter_context(open(run_dir / "stderr.txt", "wb"))
            gated = start_gated(run.command, run.opts, stdout=so, stderr=se)
        except BaseException:
            files.close()
            raise
        return cls(run, run_dir, gated, files, copy)

    def release(self, loop: RunLoop, i: int) -> RunResult:
        self.released = True
        with self.files:
            return loop.tracked(i, self.run_dir, lambda update: self.gated.release(on_poll=update), self.run.shown)

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


def run_series(out: Path, plan: list[tuple[str, list[str], LaunchOptions]], *, what: str,
               after: Callable[[int, Launched], None] | None = None, bundled: str | None = None,
               first: int = 1, total: int | None = None) -> list[Launched]:
    """Launch each ``(label, command, options)`` of ``plan`` into ``out/run<i>``, one after the other (``bench``,
    ``variance``); return the finished runs. A run that fails or records no step raises ScriptError (exit 2);
    ``bundled`` names the script when it is torchrepro's own (``bench --builtin``)."""
    done: list[Launched] = []

    def keep(i: int, run: Launched) -> None:
        done.append(run)
        if after is not None:
            after(i, run)

    total = total if total is not None else first - 1 + len(plan)
    with RunLoop(out, total, what=what, words=FailureWords.series(what, bundled), first=first) as loop:
        loop.run_all([PlannedRun(command, opts, label) for label, command, opts in plan], after=keep)
    return done


def execute_runs(command: list[str], out: Path, n: int, opts: LaunchOptions, isolation: Isolation | None = None, *,
                 stop_after: int | None = None, parallel: bool = False, prestart: bool = True,
                 number: int = 1, go_on: Callable[[int, Path], bool] | None = None) -> list[Path]:
    """``check``'s runs: ``command`` ``n`` times into ``out/run1..runN``; raise ScriptError on a failed run.

    ``stop_after``: each later run is compared with run 1 as it records and stopped that many steps after its
    first divergence (None: every run runs to its end); with ``parallel`` all runs are stopped that many steps
    after the first divergence of any. ``prestart`` applies to runs of one process (not torchrun launches).
    ``go_on(i, run_dir)``: asked after each run whether to run the next (``check --runs auto``: ``n`` is then the
    most runs there may be); returns the directories of the runs made."""
    parse_python_command(command)  # validate before starting anything
    dirs = [out / f"run{i}" for i in range(1, n + 1)]
    plan = []
    for i, run_dir in enumerate(dirs, start=1):
        opts_i = opts
        if stop_after is not None and parallel:
            opts_i = dataclasses.replace(opts, divergence_stop=stop_plan(dirs, i - 1, stop_after))
        elif stop_after is not None and i > 1:
            opts_i = dataclasses.replace(opts, divergence_stop=stop_plan([dirs[0], run_dir], 1, stop_after,
                                                                         numbers=[1, i]))
        plan.append(PlannedRun(command, opts_i))
    with RunLoop(out, n, isolation=isolation, number=number, upto=go_on is not None) as loop:
        return loop.run_all(plan, prestart=prestart and not opts.ranks.nproc_per_node, parallel=parallel,
                            go_on=go_on)
