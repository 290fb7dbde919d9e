"""Atomic file writes: a crash mid-write never leaves a half-written file at the target path.

Only regular files are replaced. A symlink stays a symlink (the file it points to is replaced, in that file's
directory); a FIFO, a character device (``/dev/null``) or a ``/dev/stdout``-style descriptor link is written
through, never replaced; a directory, block device or socket is refused. Temporary files are named
``.NAME.torchrepro-<pid>-<random>.tmp`` so that the stale ones of a killed writer can be told apart and removed.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from .errors import OutputDirError

STALE_DEAD_S = 60  # a dead writer's temp file is removed once unchanged this long (another pid namespace...)
STALE_ANY_S = 24 * 3600  # any writer's: a pid reused by another process must not keep it forever
_FD_LINKS = ("/proc/", "/dev/fd/")  # /dev/stdout -> /proc/self/fd/1: the descriptor the caller was given
_REFUSED = {stat.S_IFDIR: "a directory, not a file; name a file to write",
            stat.S_IFBLK: "a block device, not a regular file; torchrepro does not write to it: name a file",
            stat.S_IFSOCK: "a socket, not a regular file; torchrepro does not replace it: name a file"}
_THROUGH = (stat.S_IFCHR, stat.S_IFIFO)  # written through as `echo > PATH` would: /dev/null, a pipe, a tty


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], object], *, durable: bool = True,
                 clean_stale: bool = False) -> None:
    """Call ``write(f)`` on a temporary file in ``path``'s directory, fsync it, then rename it onto ``path``.

    A crash or ``kill -9`` at any point leaves the previous file at ``path`` intact. ``durable=False`` skips the
    fsync: still never a half-written file after a crash of the process, but a power loss may lose the file.
    ``clean_stale`` first removes this target's temporary files left by writers that were killed. A FIFO or
    character device is written through; a directory, block device or socket raises :class:`OutputDirError`.
    When the write fails for lack of space (or a size limit, or a quota), the :class:`OSError` raised names
    the path and carries ``bytes_written``, even when ``write`` wrapped it in another exception.
    """
    target, through = write_target(Path(path))
    if through:
        _write_through(target, write)
        return
    _make_parent(target.parent)
    if clean_stale:
        remove_stale_temps(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.torchrepro-{os.getpid()}-", suffix=".tmp", dir=target.parent)
    try:
        if hasattr(os, "fchmod"):  # mkstemp makes 0600; give the file the mode open() would (0666 & ~umask)
            os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        written = _size(tmp)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        disk = disk_error(exc)
        if disk is not None:
            raise _disk_oserror(disk, target, written) from exc
        raise


def write_target(path: Path) -> tuple[Path, bool]:
    """The file to write for ``path`` and whether to write through it (True) rather than replace it.

    Symlinks are resolved, so the link stays and the file it names is replaced. Raises
    :class:`OutputDirError` for a directory, block device or socket.
    """
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # not there yet (or under a file: creating it says so)
        mode = None
    if mode is not None and stat.S_IFMT(mode) in _REFUSED:
        raise OutputDirError(f"{path}: is {_REFUSED[stat.S_IFMT(mode)]}.")
    if mode is not None and (stat.S_IFMT(mode) in _THROUGH or _via_fd_link(path)):
        return path, True
    return Path(os.path.realpath(path)), False


def _make_parent(parent: Path) -> None:
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # a file where the directory should be
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(parent)) from None


def _via_fd_link(path: Path) -> bool:
    """Whether ``path`` is, or leads through symlinks to, a ``/proc/.../fd`` or ``/dev/fd`` descriptor link."""
    current = os.path.abspath(path)
    for _ in range(40):  # the kernel's own limit on symlink hops
        if current.startswith(_FD_LINKS):
            return True
        if not os.path.islink(current):
            return False
        current = os.path.normpath(os.path.join(os.path.dirname(current), os.readlink(current)))
    return False


def _write_through(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Write into a FIFO, a character device or a descriptor link as it is: no temporary file, no rename."""
    with open(path, "wb") as f:
        write(f)
        f.flush()


# errno -> what it means for a write, in the words a user searches for
_DISK_ERRORS = {errno.ENOSPC: "no space left on device",
                errno.EFBIG: "file too large (a file-size limit such as `ulimit -f`, or the filesystem's maximum)",
                errno.EDQUOT: "disk quota exceeded"}


def disk_error(exc: BaseException) -> OSError | None:
    """The out-of-space (or size-limit, or quota) :class:`OSError` behind ``exc``, following its cause chain."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _DISK_ERRORS:
            return current
        current = current.__cause__ or current.__context__
    return None


def disk_problem(exc: OSError) -> str:
    """What a disk error means (``"no space left on device"``...)."""
    return _DISK_ERRORS.get(exc.errno or 0, exc.strerror or str(exc))


def _disk_oserror(exc: OSError, target: Path, written: int | None) -> OSError:
    err = OSError(exc.errno, exc.strerror or disk_problem(exc), str(target))
    err.bytes_written = written  # type: ignore[attr-defined]
    return err


def _size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def _temp_pattern(target: Path) -> re.Pattern[str]:
    return re.compile(rf"\.{re.escape(target.name)}\.torchrepro-(\d+)-[A-Za-z0-9_]+\.tmp")


def stale_temps(target: str | Path, *, now: float | None = None) -> list[Path]:
    """This target's temporary files whose writer is gone: regular files of torchrepro's own temp pattern
    whose pid is dead (unchanged for :data:`STALE_DEAD_S`) or that nobody touched for :data:`STALE_ANY_S`."""
    target = Path(target)
    pattern, now = _temp_pattern(target), time.time() if now is None else now
    found = []
    with contextlib.suppress(OSError), os.scandir(target.parent) as entries:
        for entry in entries:
            match = pattern.fullmatch(entry.name)
            if match is None:
                continue
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                age = now - st.st_mtime
                if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and (
                        age >= STALE_ANY_S or (age >= STALE_DEAD_S and not _alive(int(match.group(1))))):
                    found.append(Path(entry.path))
    return found


def remove_stale_temps(target: str | Path) -> list[Path]:
    """Remove :func:`stale_temps` of ``target``; return what was removed."""
    removed = []
    for path in stale_temps(target):
        with contextlib.suppress(OSError):
            path.unlink()
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    if pid <= 0 or pid > 2**22:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows (``/proc/self/status`` on Linux)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere: read it by setting it, then put it back at once
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_write`)."""
    atomic_write(path, lambda f: f.write(data))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as indented UTF-8 JSON, atomically."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())
