"""``torchrepro COMMAND ...`` run by the test's own process (``torchrepro.cli.main``), not by a new interpreter.

For the tests of what a command reports (its verdict, JSON, report): the training runs the command starts are new
processes as always; only the command's own process is the test's, which saves starting an interpreter and
importing torch and the analysis modules (about 2 s of CPU) for each command. The tests of the command's process
itself (signals, a killed parent, the ``python -m torchrepro`` entry point) start it as a process.
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from torchrepro.cli import main


@contextlib.contextmanager
def _cwd(path: str | Path) -> Iterator[None]:
    """``contextlib.chdir`` (Python 3.11+)."""
    saved = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(saved)


@contextlib.contextmanager
def _environ(env: dict[str, str] | None) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def torchrepro(*args: str, cwd: str | Path | None = None, env: dict[str, str] | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess:
    """Like ``subprocess.run([python, "-m", "torchrepro", *args], capture_output=True, text=True, cwd=cwd,
    env={**os.environ, **env}, timeout=timeout)``, in this process. A command still going after ``timeout`` seconds
    ends this process with every thread's traceback (a hung test must not hang the suite)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        if cwd is not None:
            stack.enter_context(_cwd(cwd))
        stack.enter_context(_environ(env))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        faulthandler.dump_traceback_later(timeout, exit=True, file=sys.__stderr__)
        try:
            code = main(list(args))
        finally:
            faulthandler.cancel_dump_traceback_later()
    return subprocess.CompletedProcess(["torchrepro", *args], code, out.getvalue(), err.getvalue())
