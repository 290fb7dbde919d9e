"""Imports done ahead of time on CPU time that nobody else wants: a thread at the lowest scheduling priority.

``check`` imports ahead of need twice while run 1 trains: the parent imports the analysis modules (torch,
matplotlib), and the prestarted run 2 imports torch and the recorder before it waits for its turn. On a
machine with few cores that work competed with run 1 itself, which is what the user waits for: a 60-step MLP
that takes 4.0 s under ``torchrepro run`` took 5.2-6.1 s as run 1 of a check on 2 cores. Both imports now run
in a thread of their own whose nice value is raised to 19, so the scheduler gives them only what run 1 leaves.

Only on Linux, where a nice value belongs to one thread (``setpriority(PRIO_PROCESS, tid)``); elsewhere it is
the whole process's, and an unprivileged process can never raise its priority again, so the thread runs at the
normal priority there. The thread that waits for the import (the main thread) keeps its own priority, and so do
the threads the script starts later. Threads that a module starts when it is imported inherit the lowered one:
numpy's OpenBLAS starts its worker threads at import (torch imports numpy), so a caller that keeps those threads
for later work names such modules in ``first``, imported by the calling thread before the others.

>>> thread = import_in_background(("json",), name="example")
>>> thread.join()
>>> import json                       # already imported: instant
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from collections.abc import Iterable

LOWEST = 19  # the highest nice value: CPU time only when no task of normal priority wants it


def lower_this_thread() -> bool:
    """Give the calling thread the lowest CPU priority; False where that would touch other threads or failed."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOWEST)  # on Linux: this thread only
    except (OSError, AttributeError):
        return False
    return True


def _import_quietly(names: tuple[str, ...]) -> None:
    lower_this_thread()
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: S112 - reported by the waiting thread's own import of the module
            continue


def import_in_background(names: Iterable[str], *, name: str, first: Iterable[str] = ()) -> threading.Thread:
    """Start importing ``names`` in a thread at the lowest priority; errors are left to the caller's own import.

    ``first``: modules imported here, in the calling thread, before the thread starts (those that start threads of
    their own at import); one that is not installed is skipped. Not a daemon thread: the interpreter waits for it
    before shutting down (a process that ends while torch is still being imported in a daemon thread aborts in
    torch's C++ teardown instead of exiting with its code)."""
    for module in first:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: S112 - not installed, or reported by the caller's own import
            continue
    thread = threading.Thread(target=_import_quietly, args=(tuple(names),), name=name)
    thread.start()
    return thread
