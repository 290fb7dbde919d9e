"""Reading files the linter did not write: regular files only (symbolic links followed), never more than a size
limit, never blocking.

Anything else named ``*.py`` — a FIFO (opening one waits for a writer: a pre-commit hang), a device
(``/dev/zero`` never ends), a socket, a directory — is not opened. The size is taken with ``stat`` before
anything is read, and at most ``limit + 1`` bytes are read, so a file that grows cannot exhaust memory either.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

MAX_SOURCE_BYTES = 20_000_000  # larger files are not read (reported as TR004)
_KINDS: tuple[tuple[Callable[[int], bool], str], ...] = (
    (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
)
# O_NONBLOCK: should the path become a FIFO between the stat and the open, opening it does not wait for a writer.
_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
_CHUNK = 1 << 20


class Unreadable(Exception):
    """A file that was not read; the message says what it is or what failed."""


def kind(mode: int) -> str:
    """What a file of this ``st_mode`` is, in words: ``a FIFO (named pipe)``, ``a character device``, ..."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def is_regular(path: Path | str) -> bool:
    """Whether ``path`` is a regular file (symbolic links followed); False when it cannot be examined."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def read_regular(path: Path | str, limit: int = MAX_SOURCE_BYTES) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them; :class:`Unreadable` for anything
    else: a FIFO, a device, a directory, a file over the limit, one that cannot be opened or read."""
    try:
        _check(os.stat(path), path, limit)
        fd = os.open(path, _FLAGS)
    except OSError as exc:
        raise Unreadable(f"cannot read the file: {exc.strerror or exc}") from None
    try:
        _check(os.fstat(fd), path, limit)  # the file opened is still the one examined
        return _read_at_most(fd, limit)
    except OSError as exc:
        raise Unreadable(f"cannot read the file: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def _check(st: os.stat_result, path: Path | str, limit: int) -> None:
    if stat.S_ISDIR(st.st_mode):
        raise Unreadable(_directory(path))
    if not stat.S_ISREG(st.st_mode):
        raise Unreadable(f"it is {kind(st.st_mode)}, not a regular file; it was not read")
    if st.st_size > limit:
        raise Unreadable(_too_large(st.st_size, limit))


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = os.read(fd, min(limit + 1 - size, _CHUNK))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > limit:  # it grew after the stat
        raise Unreadable(_too_large(size, limit, "at least "))
    return b"".join(chunks)


def _too_large(size: int, limit: int, bound: str = "") -> str:
    return f"the file is {bound}{size:,} bytes, over the limit of {limit:,} bytes; it was not read"


def _directory(path: Path | str) -> str:
    """Why a directory was not read: the directory search yields the directories it cannot list."""
    try:
        with os.scandir(path):
            pass
    except OSError as exc:
        return f"cannot list the directory: {exc.strerror or exc}; the files in it were not checked"
    return "it is a directory, not a regular file; it was not read"
