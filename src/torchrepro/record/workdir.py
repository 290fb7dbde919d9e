"""Runs that share a working directory: files one run wrote there and a later run read.

A script that resumes from its own output (``if os.path.exists("snapshot.pt"): load it``, transformers'
``get_last_checkpoint(output_dir)``) makes the second run of ``check`` start where the first one ended, and the
comparison means nothing. Two halves find it:

- in the child, :class:`ReadAudit` (an audit hook on ``open``, ``os.listdir`` and ``os.scandir``) notes the
  paths under the working directory that the run read and that were changed since the check started (one
  ``stat`` per path, on its first read: other files cost a string test);
- in the parent, :class:`WorkdirWatch` takes a bounded ``stat`` snapshot of the working directory before and
  after run 1 (mtime, size, inode), and names the files that run 1 created or changed and a later run read.

A file run 1 wrote and then read itself (a downloaded data set, a cache) is not reported: both runs read the
same bytes.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import stat
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._core.errors import ReproError

WATCH_LIMIT = 20_000  # entries of the working directory stat'ed before and after run 1
READ_LIMIT = 1_000  # paths a run's audit records
SKIP_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache",
                       ".tox", "node_modules", "torchrepro-runs"})
MARGIN_NS = 2_000_000_000  # file times come from a coarse clock: watch from a little before the check started
SHOWN = 5


# Linux's CLOCK_REALTIME_COARSE (<linux/time.h>), which CPython's time module does not name: the clock the kernel
# stamps file times with, up to a tick (1-10 ms) behind time.time_ns().
_COARSE_CLOCK = getattr(time, "CLOCK_REALTIME_COARSE", 5 if sys.platform.startswith("linux") else None)


def fs_now_ns() -> int:
    """Now, as the kernel stamps file times: its coarse clock where it has one (Linux), which can lag
    ``time.time_ns()`` by a tick; a file made after this call never has an earlier ctime (after ``time.time_ns()``
    it can: every file made in the same tick has)."""
    return time.clock_gettime_ns(_COARSE_CLOCK) if _COARSE_CLOCK is not None else time.time_ns()

READS_KEY = "workdir_reads"  # the child's summary (manifest) field
_IMPORTLIB = frozenset({"importlib._bootstrap_external", "_frozen_importlib_external"})


# --- the child side -------------------------------------------------------------------------------------
class ReadAudit:
    """Records the paths under the working directory that this process opened for reading or listed, if they
    changed since ``since_ns`` (ctime); each with whether this process had itself written it before (fresh)."""

    def __init__(self, since_ns: int) -> None:
        self.root = os.getcwd()
        self.prefix = self.root.rstrip(os.sep) + os.sep
        self.since_ns = since_ns
        self.started_ns = fs_now_ns()
        self.read: dict[str, dict[str, bool]] = {"opened": {}, "listed": {}}
        self.truncated = False
        self._seen: set[tuple[str, str]] = set()

    def install(self) -> ReadAudit:
        sys.addaudithook(self._hook)
        return self

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        on = _EVENTS.get(event)
        if on is not None:
            try:
                on(self, args)
            except Exception:  # noqa: S110 - an audit hook must never break the script's own open()
                pass

    def _opened(self, args: tuple[Any, ...]) -> None:
        if args[2] & os.O_ACCMODE != os.O_WRONLY:
            self._note(args[0], "opened")

    def _listed(self, args: tuple[Any, ...]) -> None:
        if sys._getframe(2).f_globals.get("__name__") not in _IMPORTLIB:  # not the import system's path scans
            self._note("." if args[0] is None else args[0], "listed")

    def _note(self, path: Any, how: str) -> None:
        if isinstance(path, int):
            return
        full = os.path.abspath(os.fsdecode(path))
        if full != self.root and not full.startswith(self.prefix) or full.endswith(".pyc"):
            return
        rel = full[len(self.prefix):] or "."
        if (how, rel) in self._seen:
            return
        ctime = os.stat(full).st_ctime_ns  # a missing file raises: not seen, looked at again on the next read
        self._seen.add((how, rel))
        if ctime < self.since_ns:
            return
        if len(self.read[how]) >= READ_LIMIT:
            self.truncated = True
            return
        self.read[how][rel] = ctime >= self.started_ns

    def facts(self) -> dict[str, Any]:
        return {"root": self.root, **self.read, "truncated": self.truncated}


_EVENTS: dict[str, Callable[[ReadAudit, tuple[Any, ...]], None]] = {
    "open": ReadAudit._opened, "os.listdir": ReadAudit._listed, "os.scandir": ReadAudit._listed}


# --- the parent side ------------------------------------------------------------------------------------
@dataclass
class Snapshot:
    """``stat`` of the entries under a directory (relative path -> (mtime_ns, size, inode)), bounded."""

    entries: dict[str, tuple[int, int, int]]
    truncated: bool


def skipped_dir(path: str, skipped: set[str]) -> bool:
    """Whether :func:`walk` and the copies leave the folder ``path`` out: version control, caches, virtual
    environments, torchrepro's output, or one of ``skipped`` (real paths)."""
    return (os.path.basename(path) in SKIP_DIRS or os.path.isfile(os.path.join(path, "pyvenv.cfg"))
            or os.path.realpath(path) in skipped)


def _copied(entry: os.DirEntry[str]) -> bool:
    """Whether :func:`copy_workdir` copies ``entry`` (a regular file, folder or symlink; known without a ``stat`` on
    most file systems)."""
    try:
        return entry.is_symlink() or entry.is_file(follow_symlinks=False) or entry.is_dir(follow_symlinks=False)
    except OSError:
        return True  # as walk() does with an entry it cannot stat: counted to be safe


def walk(root: Path, skip: Iterable[Path] = (), limit: int = WATCH_LIMIT, *, copied: bool = False) -> Snapshot:
    """Stat ``root`` and what lies under it, breadth first in name order; version control, caches, virtual
    environments, torchrepro's output and ``skip`` are left out; at most ``limit``. Symlinks are followed (a
    script that writes ``out/snapshot.pt`` through a symlinked ``out/`` changes what lies under the working
    directory as the script sees it), each folder once. ``copied``: only what :func:`copy_workdir` copies (no
    FIFO, socket or device; symlinks not followed, as they are copied as links), each with the bytes it copies (a
    regular file's size, 0 for a folder or symlink)."""
    skipped = {os.path.realpath(p) for p in skip}
    entries: dict[str, tuple[int, int, int]] = {}
    visited = {os.path.realpath(root)}  # folders reached through a symlink are walked once (no cycle)
    queue = [(str(root), "")]
    while queue:
        path, rel = queue.pop(0)
        try:
            with os.scandir(path) as it:  # a huge flat folder is read only up to the limit
                kept = (e for e in it if not copied or _copied(e))  # what is not copied does not count
                children = sorted(itertools.islice(kept, limit + 1), key=lambda e: e.name)
                more = next(kept, None) is not None  # it goes on past what was read: skipped entries must not hide it
        except OSError:
            continue
        for entry in children:
            if len(entries) >= limit:
                return Snapshot(entries, truncated=True)
            sub = f"{rel}{entry.name}"
            try:
                st = entry.stat(follow_symlinks=False)
                is_dir = entry.is_dir(follow_symlinks=False)
                if not copied and entry.is_symlink():
                    st, is_dir = _through_link(entry, st, visited)
            except OSError:
                continue
            if is_dir and skipped_dir(entry.path, skipped) or copied and special_kind(st.st_mode):
                continue
            size = st.st_size if not copied or stat.S_ISREG(st.st_mode) else 0
            entries[sub] = (st.st_mtime_ns, size, st.st_ino)
            if is_dir:
                queue.append((entry.path, sub + os.sep))
        if more:
            return Snapshot(entries, truncated=True)
    return Snapshot(entries, truncated=False)


def _through_link(entry: os.DirEntry[str], own: os.stat_result, visited: set[str]) -> tuple[os.stat_result, bool]:
    """``stat`` of what the symlink ``entry`` points to, and whether to walk it as a folder (once per real folder);
    the link's own ``stat`` when it points nowhere."""
    try:
        st = entry.stat(follow_symlinks=True)
    except OSError:  # a dangling link: the link itself
        return own, False
    if not stat.S_ISDIR(st.st_mode):
        return st, False
    real = os.path.realpath(entry.path)
    if real in visited:
        return st, False
    visited.add(real)
    return st, True


def changed_files(before: Snapshot, after: Snapshot, root_before: Any, root_after: Any) -> dict[str, str]:
    """What changed between two snapshots: relative path -> "created" or "changed" (the root as ".")."""
    out = {p: ("changed" if p in before.entries else "created")
           for p, key in after.entries.items() if before.entries.get(p) != key}
    if root_before != root_after:
        out["."] = "changed"
    return out


def manifest_reads(run_dir: Path) -> list[dict[str, Any]]:
    """The audits a run recorded: its manifest's, or each rank's (``rank*/manifest.json``)."""
    found = []
    for path in [run_dir / "manifest.json", *sorted(run_dir.glob("rank*/manifest.json"))]:
        try:
            reads = json.loads(path.read_text()).get(READS_KEY)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(reads, dict):
            found.append(reads)
    return found


def _root_stat(root: Path) -> tuple[int, int] | None:
    try:
        st = root.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_ino


@dataclass
class WorkdirWatch:
    """``check``'s watch on its working directory: snapshot before and after run 1, the reads of every run."""

    root: Path
    skip: list[Path] = field(default_factory=list)
    limit: int = WATCH_LIMIT
    since_ns: int = 0
    changed: dict[str, str] = field(default_factory=dict)
    truncated: bool = False
    reads: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    _before: Snapshot | None = None
    _root_before: Any = None
    _after_first: Snapshot | None = None  # after run 1
    _before_restart: Snapshot | None = None  # check --resume-at: after the process that stopped at step K

    def start(self) -> int:
        """Snapshot the working directory; return the time (ns) from which the runs' audits note reads."""
        self.since_ns = time.time_ns() - MARGIN_NS
        self._before = walk(self.root, self.skip, self.limit)
        self._root_before = _root_stat(self.root)
        return self.since_ns

    def run_done(self, i: int, run_dir: Path) -> None:
        """Collect run ``i``'s reads; after run 1, what it changed in the working directory."""
        self.reads[i] = manifest_reads(run_dir)
        if i == 1 and self._before is not None:
            after = self._after_first = walk(self.root, self.skip, self.limit)
            self.changed = changed_files(self._before, after, self._root_before, _root_stat(self.root))
            self.truncated = self._before.truncated or after.truncated

    def before_restart(self) -> None:
        """``check --resume-at``: snapshot the working directory between run ``i``'s two processes."""
        self._before_restart = walk(self.root, self.skip, self.limit)

    def restart_done(self, i: int, run_dir: Path) -> None:
        """Add the reads of run ``i``'s restarted process, less the files its first process changed: the restart
        reads those by design (its checkpoint, e.g. a transformers ``output_dir/checkpoint-K``)."""
        rewritten: set[str] = set()
        if self._before_restart is not None:
            before = self._after_first or Snapshot({}, False)
            rewritten = {p for p, key in self._before_restart.entries.items() if before.entries.get(p) != key}
        for reads in manifest_reads(run_dir):
            for how in ("opened", "listed"):
                reads[how] = {p: fresh for p, fresh in (reads.get(how) or {}).items() if p not in rewritten}
            self.reads.setdefault(i, []).append(reads)

    def _first_run_fresh(self, how: str) -> set[str]:
        return {p for r in self.reads.get(1, []) for p, fresh in (r.get(how) or {}).items() if fresh}

    def shared(self, upto: int | None = None, hows: tuple[str, ...] = ("opened",)) -> list[dict[str, Any]]:
        """Files that run 1 created or changed and a later run opened, unless run 1 read them after writing them
        itself: ``{"run", "path", "how", "change" (created/changed)}``. A folder a later run only listed (Lightning
        counting ``lightning_logs/version_N`` to pick the next) does not count: what it reads from it does
        (``hows=("listed",)`` gives the listings)."""
        found = []
        for i in sorted(k for k in self.reads if k > 1 and (upto is None or k <= upto)):
            for how in hows:
                own = self._first_run_fresh(how)
                paths = {p for r in self.reads[i] if r.get("root") == str(self.root)
                         for p, fresh in (r.get(how) or {}).items() if not fresh}
                found += [{"run": i, "path": p, "how": how, "change": self.changed[p]}
                          for p in sorted(paths) if p in self.changed and p not in own]
        return found

    def to_json(self) -> dict[str, Any]:
        return {"isolated": False, "root": str(self.root), "watched_entries_limit": self.limit,
                "watch_truncated": self.truncated, "changed_by_run_1": len(self.changed),
                "audit_truncated": any(r.get("truncated") for rs in self.reads.values() for r in rs),
                "read_from_earlier_run": self.shared(),
                "listed_from_earlier_run": self.shared(hows=("listed",))}  # information only: no warning


def shared_text(shared: list[dict[str, Any]]) -> str:
    """"run 2 opened snapshot.pt (created by run 1), ..." for at most SHOWN entries."""
    words = [f"run {s['run']} {s['how']} {s['path'] if s['path'] != '.' else 'the working directory'}"
             f" ({s['change']} by run 1)" for s in shared[:SHOWN]]
    more = f" and {len(shared) - SHOWN} more" if len(shared) > SHOWN else ""
    return ", ".join(words) + more


# --- check --fresh-cwd: each run in its own copy of the working directory ---------------------------------------
COPY_OF_ENV = "TORCHREPRO_CWD_COPY_OF"  # a run in a copy: JSON [copy, original working directory]


def as_in_original(path: str, copy_of: tuple[str, str] | None) -> str:
    """``path`` under a run's copy of the working directory, named as under the original (so that two runs in two
    copies name the same source file alike); any other path as it is.

    >>> as_in_original("/o/run1-cwd/train.py", ("/o/run1-cwd", "/home/me/project"))
    '/home/me/project/train.py'
    """
    if copy_of is None:
        return path
    copy, original = copy_of
    return original + path[len(copy):] if path == copy or path.startswith(copy + os.sep) else path


def copy_of_from_env() -> tuple[str, str] | None:
    """This process's (copy, original working directory), when check runs it in a copy (``COPY_OF_ENV``)."""
    try:
        copy, original = json.loads(os.environ.get(COPY_OF_ENV) or "null") or (None, None)
    except (ValueError, TypeError):
        return None
    return (copy, original) if isinstance(copy, str) and isinstance(original, str) else None


COPY_FILES = 10_000
COPY_BYTES = 256 * 2**20
_OPEN_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
               | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))


class WorkdirCopyError(ReproError):
    """The working directory is too large to copy for every run, or could not be copied (exit 2)."""


def special_kind(mode: int) -> str | None:
    """None for what --fresh-cwd copies (a regular file, a folder, a symlink); else what the entry is (a FIFO, a
    socket, a device), which the copy leaves out: reading it would block, or never end (``/dev/zero``)."""
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode):
        return None
    return ("FIFO" if stat.S_ISFIFO(mode) else "socket" if stat.S_ISSOCK(mode)
            else "character device" if stat.S_ISCHR(mode) else "block device" if stat.S_ISBLK(mode)
            else "special file")


def check_copyable(root: Path, skip: Iterable[Path] = ()) -> None:
    """Raise unless what :func:`copy_workdir` copies of ``root`` is at most COPY_FILES entries and COPY_BYTES."""
    snap = walk(root, skip, limit=COPY_FILES, copied=True)
    size = sum(s for _, s, _ in snap.entries.values())
    if snap.truncated or size > COPY_BYTES:
        found = f"more than {COPY_FILES} files" if snap.truncated else f"{size / 2**20:.0f} MiB"
        raise WorkdirCopyError(
            f"--fresh-cwd copies the working directory {root} for every run, but it holds {found} (at most "
            f"{COPY_FILES} files and {COPY_BYTES // 2**20} MiB are copied; version control, caches, virtual "
            "environments and torchrepro-runs are left out). Run check from a smaller directory that holds the "
            "script, or keep large data outside it (symlinks are copied as links), or drop --fresh-cwd.")


@dataclass
class WorkdirCopy:
    """A copy of the working directory: where it is, and what was left out (relative path -> kind)."""

    path: Path
    left_out: dict[str, str] = field(default_factory=dict)


class _CopyTooLarge(Exception):
    """The copy went past COPY_BYTES (the working directory grew since :func:`check_copyable`)."""


def copy_workdir(root: Path, dest: Path, skip: Iterable[Path] = ()) -> WorkdirCopy:
    """Copy ``root`` into ``dest`` (replacing an earlier copy there), leaving out what :func:`walk` leaves out.

    Only regular files, folders and symlinks (as links) are copied; a FIFO, socket or device is never opened but
    left out and named in the result's ``left_out``. At most COPY_BYTES are written. A copy that fails part-way
    removes ``dest``, which it made itself (an entry already there that is not an earlier copy is left alone)."""
    skipped = {os.path.realpath(p) for p in skip}
    copy = WorkdirCopy(dest)
    budget = [COPY_BYTES]

    def ignore(folder: str, names: list[str]) -> set[str]:
        out = set()
        for name in names:
            path = os.path.join(folder, name)
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                continue  # gone: copytree says so
            kind = special_kind(mode)
            if kind:
                copy.left_out[os.path.relpath(path, root)] = kind
                out.add(name)
            elif stat.S_ISDIR(mode) and skipped_dir(path, skipped):
                out.add(name)
        return out

    def copy_file(src: str, dst: str) -> str:
        fd = os.open(src, _OPEN_FLAGS)  # not a link, and no waiting on a FIFO put there since ignore() looked
        try:
            st = os.fstat(fd)
            kind = special_kind(st.st_mode)
            if kind:
                copy.left_out[os.path.relpath(src, root)] = kind
                return dst
            with open(dst, "xb") as out:
                while chunk := os.read(fd, 2**20):
                    budget[0] -= len(chunk)
                    if budget[0] < 0:
                        raise _CopyTooLarge
                    out.write(chunk)
        finally:
            os.close(fd)
        os.chmod(dst, stat.S_IMODE(st.st_mode))
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
        return dst

    try:
        if dest.is_dir() and not dest.is_symlink():
            shutil.rmtree(dest)  # an earlier check's copy (outdir let only torchrepro's own output be reused)
        dest.mkdir()  # raises if something else is there: it is not ours, and not removed below
    except OSError as exc:
        raise WorkdirCopyError(f"--fresh-cwd: could not copy the working directory {root} to {dest} ({exc}). "
                               "Free disk space or fix the permissions, or drop --fresh-cwd.") from None
    try:
        shutil.copytree(root, dest, symlinks=True, ignore=ignore, copy_function=copy_file, dirs_exist_ok=True)
    except BaseException as exc:
        shutil.rmtree(dest, ignore_errors=True)
        if isinstance(exc, _CopyTooLarge):
            raise WorkdirCopyError(
                f"--fresh-cwd: the working directory {root} grew past {COPY_BYTES // 2**20} MiB while it was "
                "copied; nothing of the copy was kept. Keep large data outside it (symlinks are copied as links), "
                "or drop --fresh-cwd.") from None
        if isinstance(exc, (OSError, shutil.Error)):
            raise WorkdirCopyError(f"--fresh-cwd: could not copy the working directory {root} to {dest} ({exc}); "
                                   "nothing of the copy was kept. Free disk space or fix the permissions, or drop "
                                   "--fresh-cwd.") from None
        raise
    copy.path = dest.resolve()
    return copy


def left_out_text(left_out: dict[str, str], root: str | Path) -> str:
    """What to tell when the copies of the working directory left out FIFOs, sockets or devices."""
    items = sorted(left_out.items())
    words = [f"{path} ({kind})" for path, kind in items[:SHOWN]]
    more = f" and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
    return (f"--fresh-cwd copies only the regular files, folders and symlinks of the working directory {root}; it "
            f"left out {', '.join(words)}{more}, which the runs' copies do not hold: a script that needs one must "
            "open it by its absolute path.")


def script_in_copy(command: list[str], argv: list[str], root: Path, copy: Path) -> list[str]:
    """``command`` (whose last ``len(argv)`` words are the script and its arguments) for a run in ``copy`` of
    ``root``: a script under ``root`` is the copy's own (so that paths relative to ``__file__`` land in the copy
    too), one elsewhere is given by its absolute path."""
    i = len(command) - len(argv)
    path = Path(command[i]).absolute()
    try:
        new = copy / path.relative_to(root)
    except ValueError:
        new = path
    return [*command[:i], str(new), *command[i + 1:]]
