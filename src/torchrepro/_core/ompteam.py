"""Run Python work on torch's own OpenMP threads: what lets CPU fingerprints use every core.

After each parallel torch op, torch's OpenMP worker threads spin for a while waiting for the next one. A
Python thread started to hash the other half of a tensor then competes with a spinning worker for the same
core, and the hand-off itself costs more than it saves: measured here right after an optimizer step, hashing
384 MB of parameters took 19 ms with a helper thread, 18 ms in one thread, and 11-14 ms on torch's team.

:func:`run` asks the OpenMP runtime that torch uses (libgomp, found among the libraries mapped into this
process) to run a Python callable once on each thread of a team of ``threads``; each call gets its index.
The callable should spend its time in code that releases the GIL (``xxhash`` does on large inputs).

It is used only where it is safe, and otherwise :func:`run` returns False and the caller does the work its
own way: Linux, torch's ATen backend OpenMP, exactly one libgomp mapped, the main thread, never in a process
forked after ``import torchrepro`` nor in a multiprocessing worker (libgomp's threads do not survive ``fork``).
Not detected: a process made by a bare ``os.fork()`` before torchrepro was imported, from a parent that ran
parallel torch ops (``torchrepro run``/``check`` import torchrepro before the script starts, so not there);
torch's own parallel ops hang in such a process too. Signals that arrive while the team works are handled
right after it (see :func:`signals_deferred`). Results never depend on which thread did what.

>>> out = [None, None]
>>> def work(i: int) -> None:
...     out[i] = i * 10
>>> if not run(work, 2):   # not usable here: do the work in this thread
...     for i in range(2):
...         work(i)
>>> out
[0, 10]
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_state: dict[str, Any] = {"looked_up": False, "lib": None, "forked": False}
_job: dict[str, Any] = {}
_lock = threading.Lock()


def _find_libgomp() -> str | None:
    """The path of the one libgomp mapped into this process, or None (none, several, or no /proc)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            paths = {line.split()[-1] for line in f if "libgomp" in line and "/" in line}
    except OSError:
        return None
    return paths.pop() if len(paths) == 1 else None


def _load() -> Any:
    """The libgomp handle for this process, looked up once; None where the team cannot be used."""
    if _state["forked"] or _multiprocessing_child():
        return None
    if _state["looked_up"]:
        return _state["lib"]
    _state["looked_up"] = True
    try:
        import torch

        if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
            return None
        path = _find_libgomp()
        if path is None:
            return None
        lib = ctypes.CDLL(path)  # the library already loaded by torch: same handle, nothing new is loaded
        lib.omp_get_thread_num.restype = ctypes.c_int
        lib.GOMP_parallel.argtypes = [_CALLBACK, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
        lib.GOMP_parallel.restype = None
    except (ImportError, OSError, AttributeError):
        return None
    _state["lib"] = lib
    return lib


def _multiprocessing_child() -> bool:
    """Whether this process is a multiprocessing worker (a Pool or Process child, e.g. forked before
    ``import torchrepro``, when no fork hook of ours could see it). Spawned ones would be safe; all are
    treated alike."""
    mp = sys.modules.get("multiprocessing")
    return mp is not None and mp.parent_process() is not None


def _after_fork_in_child() -> None:
    _state["forked"] = True  # the parent's OpenMP threads do not exist here: GOMP_parallel could wait forever


if hasattr(os, "register_at_fork"):  # torchrepro imports this module at start-up, so any later fork is seen
    os.register_at_fork(after_in_child=_after_fork_in_child)


try:  # the C functions behind signal.signal/getsignal: the same calls without the enum conversions (~50x faster)
    import _signal as _sig
except ImportError:  # pragma: no cover - not CPython
    _sig = signal
_SIGNALS: list[int] = []  # every valid signal number, as plain ints (valid_signals() builds enums: 0.1 ms)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Python signal handlers (Ctrl-C's KeyboardInterrupt) run in the main thread between bytecodes, which
    includes the first one of the team callback, outside its ``try``: ctypes would print and drop such an
    exception, and the interrupted region could then hang (seen in a probe). During the region the handlers
    only note the signal; once it is over, each noted signal's handler is called, and the first exception one
    of them raised is raised here. Costs ~6 us."""
    if not _SIGNALS:
        _SIGNALS.extend(int(s) for s in signal.valid_signals())
    noted: list[int] = []
    deferring = [True]
    saved: dict[int, Any] = {}

    def note(signum: int, frame: Any) -> None:
        if deferring[0]:
            noted.append(signum)
        else:  # the region is over but this handler is not swapped back yet: act as the original
            saved[signum](signum, frame)

    try:
        for sig in _SIGNALS:
            handler = _sig.getsignal(sig)
            if callable(handler):
                saved[sig] = handler
                _sig.signal(sig, note)
        yield
    finally:
        deferring[0] = False  # from here on a handler may raise; the ones not yet restored forward to it
        for sig, handler in saved.items():
            _sig.signal(sig, handler)
        first: BaseException | None = None
        for sig in noted:  # each handler is called, even after one raised (raise_signal would run it at once)
            try:
                saved[sig](sig, None)
            except BaseException as exc:  # noqa: BLE001 - the first is raised below
                first = first or exc
        if first is not None:
            raise first


def _body(_: Any) -> None:
    """What each team thread runs: the job's callable with the thread's index, failures kept for the caller."""
    try:
        i = _job["lib"].omp_get_thread_num()
        _job["fn"](i)
        _job["done"].add(i)
    except BaseException as exc:  # noqa: BLE001 - re-raised in the calling thread by run()
        _job["errors"].append(exc)


_body_c = _CALLBACK(_body)  # kept alive for as long as the module: libgomp calls it by address


def available() -> bool:
    """Whether :func:`run` can use torch's OpenMP team from this thread of this process."""
    return threading.current_thread() is threading.main_thread() and _load() is not None


def run(fn: Callable[[int], None], threads: int) -> bool:
    """Call ``fn(i)`` for ``i`` in ``range(threads)``, each on a thread of torch's OpenMP team, and wait.

    Returns False, having called nothing, where the team cannot be used (see the module docs); the caller
    then does the work itself. If the runtime gives a smaller team than asked for, the calling thread runs
    the indices no team thread ran. An exception raised by ``fn`` on any thread is raised here.
    """
    if threads < 2 or not available() or not _lock.acquire(blocking=False):
        return False
    try:
        lib = _state["lib"]
        errors: list[BaseException] = []
        done: set[int] = set()
        _job.update(fn=fn, lib=lib, errors=errors, done=done)
        with signals_deferred():
            lib.GOMP_parallel(_body_c, None, threads, 0)  # ctypes releases the GIL while the team runs
        if errors:
            raise errors[0]
        for i in range(threads):
            if i not in done:
                fn(i)
        return True
    finally:
        _job.clear()  # also when a deferred signal's handler raised: no reference to the caller's data is kept
        _lock.release()
