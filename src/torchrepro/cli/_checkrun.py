"""What the commands that run scripts do around their runs (the runs themselves: :mod:`torchrepro.record.runs`):
importing the analysis modules while the runs train, the environment differences of the runs, and writing the
results without losing the verdict."""

from __future__ import annotations

import errno
import importlib
import json
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._core.errors import EnvFileError
from .._core.table import printable_lines
from ..record import runs
from ..record.launcher import LaunchOptions, parse_python_command
from ..record.outdir import check_check_dir, make_dir, unique_dir
from ..record.runfailure import tail_lines
from ..record.runs import Isolation
from ..record.store import Run

__all__ = ["EnvironmentDifferences", "Isolation", "WriteErrors", "environment_differences", "execute_runs",
           "isolation_for", "output_dir", "print_verdict", "saved", "tail_lines", "unsaved_message", "wrote"]

if TYPE_CHECKING:  # the analysis modules (and torch, matplotlib) are imported in the background while run 1 runs
    from ..analysis.envdiff import EnvDiff

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


def _shared_words(shared: list[dict[str, Any]]) -> str | None:
    from ..analysis.compare import shared_workdir_warning

    return shared_workdir_warning(shared)


def isolation_for(fresh: bool, out: Path) -> Isolation:
    """``check``'s working directory for its runs (see :class:`~torchrepro.record.runs.Isolation`): a copy per run
    (``--fresh-cwd``) or a watch on the shared one, its warning worded by the cause registry."""
    return Isolation.for_check(fresh, out, words=_shared_words)


def execute_runs(command: list[str], out: Path, n: int, opts: LaunchOptions,
                 isolation: Isolation | None = None, **how: Any) -> list[Path]:
    """:func:`torchrepro.record.runs.execute_runs`, with the analysis modules imported in the background while
    the runs train (``out`` checked and locked by the caller)."""
    parse_python_command(command)  # validate before starting anything
    prefetch_analysis()
    try:
        return runs.execute_runs(command, out, n, opts, isolation, **how)
    except BaseException:  # ended early (a failed run, a signal): let the background import end cleanly first
        wait_for_prefetch()
        raise


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


