"""Output directories of torchrepro commands: validate, create, guard and lock them.

A command may replace only what torchrepro wrote itself: a run directory (``manifest.json`` + ``trace.jsonl``
and the files beside them) or a check directory (``run1..runN``, ``locate/``, ``check.json`` ...). Anything
else in the way is the user's, and the command stops with exit 2 before it touches a file.

While a command writes into a directory it holds an advisory lock on ``DIR/.torchrepro.lock`` (``flock``:
released by the kernel when the process ends, even on ``kill -9``), so that two commands never write into
the same directory; the second one is told who holds it.

>>> with lock_dir(prepare_dir("out", flag="--out")):   # doctest: +SKIP
...     ...
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from .._core.errors import OutputDirError, StateFileError
from .._core.readjson import field_problems, read_json

LOCK = ".torchrepro.lock"
MANIFEST, TRACE, OPS, VALUES, CHILD = "manifest.json", "trace.jsonl", "ops.jsonl", "values", "child.json"
GRAPHS = "compiled_graphs.json"  # measurements of torch.compile'd graphs in a --locate re-run (see compiled.py)
RUN_FILES = {MANIFEST, TRACE, OPS, VALUES, CHILD, GRAPHS, "op_values.pt", "stdout.txt", "stderr.txt", LOCK}
CHECK_FILES = {"check.json", "check.png", "report.html", "locate.json", "locate_ops.txt", "compare.json", "bisect.json",
               "invariance.json", LOCK}
RUN_NAME = re.compile(r"run\d+")
RANK_NAME = re.compile(r"rank\d+")  # one rank's run directory inside a run of several ranks (torchrun)
NODE_NAME = re.compile(r"node\d+")  # one node's manifest (nodeN/manifest.json) inside a run of several nodes
COPY_NAME = re.compile(r"run\d+-cwd")  # check --fresh-cwd: run N's copy of the working directory (ours)
RESUMED_NAME = re.compile(r"run\d+-resumed")  # check --resume-at: the process that resumed run N (a run directory)
CHECKPOINT_NAME = re.compile(r"run\d+-checkpoint")  # check --resume-at: the checkpoint run N's script wrote there
# compare: the runs of command A and B (``a/run1``, ``b/run1``); bisect: one directory per commit (``c-SHA``)
SIDE_NAME = re.compile(r"[ab]|c-[0-9a-f]{7,64}")
NEXT = "Choose a new or empty directory (or delete it yourself if you no longer need it)."


def _entries(path: Path) -> set[str]:
    try:
        return {p.name for p in path.iterdir()}
    except OSError as exc:
        raise OutputDirError(f"{path}: cannot be read ({exc.strerror or exc}). Check its permissions.") from None


def check_run_dir(path: Path, *, flag: str) -> None:
    """Raise unless ``path`` is absent, empty, or an earlier torchrepro run directory (which may be replaced)."""
    if not path.exists():
        return
    if not path.is_dir():
        raise OutputDirError(f"{flag} {path}: exists and is not a directory. {NEXT}")
    names = _entries(path) - {"stdout.txt", "stderr.txt", LOCK}
    ranks = {n for n in names if (RANK_NAME.fullmatch(n) or NODE_NAME.fullmatch(n)) and (path / n).is_dir()}
    for name in sorted(ranks):
        check_run_dir(path / name, flag=flag)
    names -= ranks
    if names and (not names & {MANIFEST, TRACE} or names - RUN_FILES):
        raise OutputDirError(f"{flag} {path}: the directory is not empty and is not a torchrepro run directory "
                             f"(it holds {sorted(names)[:5]}). torchrepro replaces only its own runs. {NEXT}")


def check_check_dir(path: Path, *, flag: str = "--out") -> None:
    """Raise unless ``path`` is absent, empty, or holds only what ``torchrepro check``/``diff`` writes."""
    if not path.exists():
        return
    if not path.is_dir():
        raise OutputDirError(f"{flag} {path}: exists and is not a directory. {NEXT}")
    foreign = []
    for name in sorted(_entries(path)):
        entry = path / name
        if (RUN_NAME.fullmatch(name) or RESUMED_NAME.fullmatch(name)) and entry.is_dir():
            check_run_dir(entry, flag=flag)
        elif ((COPY_NAME.fullmatch(name) or CHECKPOINT_NAME.fullmatch(name)) and entry.is_dir()
              and not entry.is_symlink()):
            continue
        elif entry.is_dir() and (name == "locate" or SIDE_NAME.fullmatch(name) and not entry.is_symlink()):
            check_check_dir(entry, flag=flag)
        elif name in CHECK_FILES and not entry.is_dir():
            continue
        else:
            foreign.append(name)
    if foreign:
        raise OutputDirError(f"{flag} {path}: the directory holds files that torchrepro did not write "
                             f"({foreign[:5]}); torchrepro replaces only its own check output. {NEXT}")


def make_dir(path: Path, *, flag: str, parents: bool = True) -> Path:
    """Create ``path`` and any missing parents (as ``mkdir -p`` and ``torchrepro.watch`` do).

    ``parents=False`` refuses a missing parent instead. OS errors become a clear OutputDirError.
    """
    if path.exists() and not path.is_dir():
        raise OutputDirError(f"{flag} {path}: exists and is not a directory. {NEXT}")
    blocker = _file_in_the_way(path)
    if blocker is not None:
        raise OutputDirError(f"{flag} {path}: {blocker} is a file, not a directory, so {path} cannot be created "
                             "under it. Pass a path under a directory.")
    if not parents and not path.parent.is_dir():
        raise OutputDirError(f"{flag} {path}: the parent directory {path.parent} does not exist. "
                             "Create it first, or pass a path under an existing directory.")
    try:
        path.mkdir(parents=parents, exist_ok=True)
    except OSError as exc:
        raise OutputDirError(f"{flag} {path}: cannot create the directory ({exc.strerror or exc}). "
                             "Pass a directory you can write to.") from None
    return path


def _file_in_the_way(path: Path) -> Path | None:
    """The nearest existing ancestor of ``path`` if it is not a directory (so ``mkdir -p`` would fail)."""
    for parent in path.absolute().parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def clear_run_dir(path: Path) -> None:
    """Remove an earlier recording from a directory that :func:`check_run_dir` accepted.

    ``stdout.txt``/``stderr.txt`` stay: ``check`` opens them (truncated) before the run starts.
    """
    for name in _entries(path) - {LOCK, "stdout.txt", "stderr.txt"}:
        target = path / name
        shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()


def unique_dir(parent: Path, prefix: str) -> Path:
    """A new directory ``parent/prefix-YYYYmmdd-HHMMSS-PID[-n]`` that no other command can also get."""
    make_dir(parent, flag="output directory", parents=True)
    stamp = f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    for n in range(1000):
        path = parent / (stamp if n == 0 else f"{stamp}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
        except OSError as exc:
            raise OutputDirError(f"{path}: cannot create the directory ({exc.strerror or exc}).") from None
    raise OutputDirError(f"{parent}: could not find a free name for a new {prefix} directory.")


@contextlib.contextmanager
def lock_dir(path: Path, *, what: str = "", wait_s: float = 0.0) -> Iterator[Path]:
    """Hold an exclusive lock on directory ``path`` for the ``with`` block; raise if another command holds it
    (after waiting up to ``wait_s`` seconds for it to let go: the nodes of one run take turns this way).

    The lock file is removed when the block ends, so a finished command leaves only its output behind.
    """
    lock = path / LOCK
    fd = _acquire(path, lock, wait_s)
    try:
        holder = {"pid": os.getpid(), "command": what or " ".join(["torchrepro", *sys.argv[1:]]),
                  "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(holder).encode())
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)  # before closing: whoever opens the name next gets a new file (see _acquire)
        os.close(fd)  # releases the flock


def _acquire(path: Path, lock: Path, wait_s: float = 0.0) -> int:
    try:
        import fcntl
    except ImportError:  # no flock (Windows): no protection, but nothing breaks
        fcntl = None  # type: ignore[assignment]
    deadline = time.monotonic() + wait_s
    for _ in range(100):
        fd = _open_lock(path, lock)
        if fcntl is None:
            return fd
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError:
                    if time.monotonic() >= deadline:
                        raise
                    time.sleep(0.05)
        except OSError:
            os.close(fd)
            raise OutputDirError(f"{path}: is in use by another torchrepro command ({_holder(lock)}). "
                                 "Wait for it to finish, or pass another directory.") from None
        try:  # the holder may have removed the file between our open and flock: then lock the new one
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)
    raise OutputDirError(f"{path}: could not take the lock {lock}.")


_NOFOLLOW, _NONBLOCK = getattr(os, "O_NOFOLLOW", 0), getattr(os, "O_NONBLOCK", 0)
_KINDS = ((os.path.islink, "a symbolic link"), (os.path.isdir, "a directory"))  # else: "not a regular file"
_HOLDER_FIELDS = {"pid": ("int",), "command": ("string",), "started": ("string",)}


def _open_lock(path: Path, lock: Path) -> int:
    """Open (or create) the lock file: a regular file only, never through a symlink, a FIFO or a device."""
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _NONBLOCK, 0o666)
    except OSError as exc:
        if os.path.islink(lock) or (os.path.lexists(lock) and not os.path.isfile(lock)):
            raise _not_a_lock(path, lock) from None
        raise OutputDirError(f"{path}: cannot write into the directory ({exc.strerror or exc}). "
                             "Pass a directory you can write to.") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _not_a_lock(path, lock)
    return fd


def _not_a_lock(path: Path, lock: Path) -> OutputDirError:
    kind = next((name for test, name in _KINDS if test(lock)), "not a regular file")
    return OutputDirError(f"{path}: {lock.name} is {kind}, not a lock file; torchrepro never writes that there, and "
                          "never replaces what it did not write. Remove it yourself, or pass another directory.")


def _holder(lock: Path) -> str:
    """Who holds the lock, from the JSON the holder wrote into it; ``holder unknown`` when it is unreadable."""
    try:
        info = read_json(lock, limit=64 << 10)
    except StateFileError:
        return "holder unknown"
    if not isinstance(info, dict) or not set(_HOLDER_FIELDS) <= set(info) or field_problems(info, _HOLDER_FIELDS):
        return "holder unknown"
    return f"pid {info['pid']}, `{info['command'][:300]}`, started {info['started'][:40]}"
