"""What ``torchrepro check`` does around the runs, shared by the check of one process (:mod:`.check_cmd`) and
the check of several ranks (:mod:`._ranks`): starting the runs, naming a failed run (or rank), the environment
differences, and writing the results without losing the verdict."""

from __future__ import annotations

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

from .._core.errors import EnvFileError, Interrupted, ScriptError
from ..record.launcher import LaunchOptions, RunResult, launch, parse_python_command
from ..record.outdir import check_check_dir, check_run_dir, make_dir, unique_dir
from ..record.store import Run
from ..record.workdir import WorkdirWatch, check_copyable, copy_workdir, script_in_copy

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
_ANALYSIS_MODULES = ("torchrepro.analysis.compare", "torchrepro.analysis.envdiff", "torchrepro.analysis.report",
                     "torchrepro.cli._render", "matplotlib.figure", "matplotlib.backends.backend_agg")


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
        from ..analysis.compare import shared_workdir_warning

        self.watch.run_done(i, run_dir)
        return shared_workdir_warning(self.watch.shared(upto=i)) if i > 1 else None

    def to_json(self) -> dict[str, Any] | None:
        if self.fresh:
            return {"isolated": True, "copies": self.copies, "read_from_earlier_run": []}
        return self.watch.to_json() if self.watch is not None else None


def execute_runs(command: list[str], out: Path, n: int, opts: LaunchOptions,
                 isolation: Isolation | None = None) -> list[Path]:
    """Run ``command`` ``n`` times into ``out/run1..runN``; raise ScriptError on a failed run.

    ``out`` must already be checked (:func:`~torchrepro.record.outdir.check_check_dir`) and locked by the caller.
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
    statuses = m.get("rank_status") if isinstance(m.get("rank_status"), dict) else {}
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
                        f"{tail_lines(stderr)}")
    error.stderr_path = str(stderr)  # type: ignore[attr-defined]
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


