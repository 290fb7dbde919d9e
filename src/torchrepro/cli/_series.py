"""A series of launches of one command with different options, into ``OUT/run1..runN`` (``bench``, ``variance``)."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._core.errors import Interrupted, OutputDirError, ScriptError
from .._core.io import atomic_write
from ..record.launcher import LaunchOptions, RunResult, launch
from ..record.outdir import LOCK, NEXT, RUN_NAME, check_run_dir, make_dir, unique_dir
from ..record.store import read_trace_lines
from ._checkrun import tail_lines


@dataclass
class Launched:
    """One finished run of the series."""

    label: str
    run_dir: Path
    result: RunResult
    events: list[dict[str, Any]]

    @property
    def step_times(self) -> list[float]:
        """``t`` of each step boundary: optimizer steps, or ``backward()`` calls when the script has no optimizer."""
        steps = [e["t"] for e in self.events if e.get("kind") == "step"]
        return steps or [e["t"] for e in self.events if e.get("kind") == "backward"]


def output_dir(given: str | None, prefix: str, own_files: set[str]) -> Path:
    """``--out`` checked (only run directories and this command's ``own_files`` may be replaced), or a new one."""
    if given is None:
        return unique_dir(Path("torchrepro-runs"), prefix)
    out = Path(given)
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"--out {out}: exists and is not a directory. {NEXT}")
    if out.is_dir():
        foreign = []
        for entry in sorted(out.iterdir(), key=lambda p: p.name):
            if RUN_NAME.fullmatch(entry.name) and entry.is_dir():
                check_run_dir(entry, flag="--out")
            elif entry.name not in own_files | {LOCK} or entry.is_dir():
                foreign.append(entry.name)
        if foreign:
            raise OutputDirError(f"--out {out}: the directory holds files that torchrepro {prefix} did not write "
                                 f"({foreign[:5]}); torchrepro replaces only its own output. {NEXT}")
    return make_dir(out, flag="--out")


BUNDLED_HINT = ("That is torchrepro's bundled script (`{script}`), not yours: if its stderr below names a resource "
                "(memory, a device), change the arguments after `--`; otherwise it is a bug in torchrepro: please "
                "report it with these lines.")


def _failure(i: int, total: int, label: str, result: RunResult, run_dir: Path, command: str,
             bundled: str | None = None) -> ScriptError:
    m = result.manifest or {}
    if result.status == "killed":
        what = f"was killed by {m.get('signal') or f'signal {-result.returncode}'}"
        hint = "Find out what stopped it (memory? a time limit?), then run again."
    elif result.returncode != 0:
        what = f"failed with exit code {result.returncode}"
        hint = ("Fix the script so that it runs on its own (`python ...`), then run again." if bundled is None
                else BUNDLED_HINT.format(script=bundled))
    else:
        what = "finished but recorded no optimizer step and no backward() call"
        hint = (f"torchrepro {command} needs training steps: make sure the script calls loss.backward() (and "
                "optimizer.step()).")
    return ScriptError(f"run {i} of {total} ({label}) {what}. {hint}\n"
                       f"Last lines of its stderr ({run_dir / 'stderr.txt'}):\n{tail_lines(run_dir / 'stderr.txt')}",
                       stderr_path=run_dir / "stderr.txt")


def run_series(out: Path, plan: list[tuple[str, list[str], LaunchOptions]], *, what: str,
               after: Callable[[int, Launched], None] | None = None, bundled: str | None = None,
               first: int = 1, total: int | None = None) -> list[Launched]:
    """Launch each ``(label, command, options)`` of ``plan`` into ``out/run<i>``; progress on stderr.

    Raises :class:`~torchrepro._core.errors.ScriptError` (exit 2) when a run fails or records no step; ``after(i, run)``
    is called after each run and may raise too (so that a problem stops the series at once). ``out`` must be
    checked by :func:`output_dir` and locked by the caller. ``bundled`` names the script when it is torchrepro's
    own (``bench --builtin``): a failure then never asks the user to fix it. A series continued in parts starts
    at run ``first`` of ``total`` (default: this plan's length).
    """
    done: list[Launched] = []
    total = total if total is not None else first - 1 + len(plan)
    for i, (label, command, opts) in enumerate(plan, start=first):
        run_dir = out / f"run{i}"
        check_run_dir(run_dir, flag="--out")
        make_dir(run_dir, flag="--out", parents=True)
        print(f"torchrepro {what}: run {i}/{total} ({label}) ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        with open(run_dir / "stdout.txt", "wb") as so, open(run_dir / "stderr.txt", "wb") as se:
            try:
                result = launch(command, dataclasses.replace(opts, record=str(run_dir)), stdout=so, stderr=se)
            except Interrupted as exc:
                raise Interrupted(exc.signum, f"{exc} Run {i} of {total} was interrupted; the output so far is in "
                                              f"{out}.") from None
        steps = (result.manifest or {}).get("steps", 0)
        print(f"torchrepro {what}: run {i}/{total} ({label}) {result.status}: {steps} steps in "
              f"{time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
        if result.returncode != 0 or not steps:
            raise _failure(i, total, label, result, run_dir, what, bundled)
        done.append(Launched(label, run_dir, result, read_trace_lines(run_dir)[0]))
        if after is not None:
            after(i, done[-1])
    return done


def pyplot() -> Any:
    """matplotlib.pyplot with the file-only backend, or None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save_figure(fig: Any, path: Path) -> Path:
    """Write ``fig`` to ``path`` atomically and close it."""
    plt = pyplot()
    fig.tight_layout()
    try:
        atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100), durable=False)
    finally:
        plt.close(fig)
    return path
