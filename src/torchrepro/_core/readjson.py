"""Reading JSON and JSON Lines that torchrepro did not just write: run directories, env files, locks.

Every such file is untrusted input. :func:`read_json` and :func:`read_jsonl` read regular files only (never a
directory, FIFO or device: a FIFO would hang, ``/dev/zero`` would never end), at most ``limit`` bytes, strict
UTF-8, nested at most :data:`MAX_DEPTH` deep, and turn every way of being unreadable (``RecursionError``, a
5,000-digit integer, bad bytes, a cut-off file) into the caller's :class:`~torchrepro._core.errors.StateFileError`
subclass, whose message names the file (and line), what was found, and what to do. :func:`check_fields` then
checks the JSON types of the fields a reader uses, so that the code after it can trust them.

>>> doc = read_json("run/manifest.json", error=RunDirError, action="Record the run again.")  # doctest: +SKIP
>>> check_fields(doc, {"ranks": ("list of strings",)}, source="run/manifest.json", error=RunDirError)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from .errors import StateFileError

MAX_JSON_BYTES = 256 << 20  # a manifest, env file or lock file: far above any that torchrepro writes
MAX_JSONL_BYTES = 4 << 30  # a trace of a long run of a large model
MAX_DEPTH = 64  # torchrepro writes documents nested at most ~6 deep

ErrorType = type[StateFileError]

# stat's file type -> how it is named in the message
_NOT_REGULAR: tuple[tuple[Callable[[int], bool], str], ...] = (
    (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
)


def file_kind(mode: int) -> str:
    """How a file that is not a regular one is named in messages, from its ``st_mode``: ``a FIFO (named pipe)``."""
    return next((name for test, name in _NOT_REGULAR if test(mode)), "not a regular file")


def check_regular(path: str | Path, *, error: ErrorType = StateFileError, action: str = "") -> None:
    """Raise ``error`` unless ``path`` is (or links to) a regular file: never open a FIFO (it blocks) or a device."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise error(path, "does not exist.", action) from None
    except OSError as exc:
        raise error(path, f"cannot be read ({exc.strerror or exc}).", action) from None
    if not stat.S_ISREG(mode):
        raise error(path, f"is {file_kind(mode)}, expected a regular file.", action)


@contextlib.contextmanager
def open_regular(path: str | Path, *, error: ErrorType = StateFileError, action: str = "") -> Iterator[IO[bytes]]:
    """Open regular file ``path`` for binary reading; ``error`` for anything else (missing, a directory, a FIFO,
    a device). The file type is checked before the file is opened (so a FIFO never blocks) and again on the open
    file (in case it was swapped in between)."""
    check_regular(path, error=error, action=action)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise error(path, f"cannot be read ({exc.strerror or exc}).", action) from None
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(f.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise error(path, f"is {file_kind(mode)}, expected a regular file.", action)
        try:
            yield f
        except OSError as exc:
            raise error(path, f"cannot be read ({exc.strerror or exc}).", action) from None


def _too_large(path: str | Path, limit: int, error: ErrorType, action: str) -> StateFileError:
    return error(path, f"is larger than {limit:,} bytes, more than torchrepro ever writes there.", action)


def read_bytes(path: str | Path, *, error: ErrorType = StateFileError, action: str = "",
               limit: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of regular file ``path`` (at most ``limit``); ``error`` otherwise (see :func:`open_regular`)."""
    with open_regular(path, error=error, action=action) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise _too_large(path, limit, error, action)
    return data


def decode(data: bytes, *, source: str | Path, error: ErrorType = StateFileError, action: str = "",
           where: str = "") -> str:
    """``data`` as strict UTF-8; ``error`` naming the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(source, f"{where}is not UTF-8 text (byte {exc.start + 1} is {data[exc.start:exc.start + 1]!r}); "
                    "it is corrupt or not a torchrepro file.", action) from None


def parse(text: str, *, source: str | Path, error: ErrorType = StateFileError, action: str = "",
          where: str = "") -> Any:
    """One JSON document, nested at most :data:`MAX_DEPTH` deep; ``error`` for anything else."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(source, f"{where}is not valid JSON ({exc}); it is corrupt or truncated.", action) from None
    except RecursionError:
        raise error(source, f"{where}is JSON nested too deeply to read; torchrepro writes at most {MAX_DEPTH} "
                    "levels.", action) from None
    except ValueError as exc:  # e.g. an integer of more digits than int() converts (sys.get_int_max_str_digits)
        why = str(exc).split(";")[0]  # not Python's advice to raise the interpreter's limit
        raise error(source, f"{where}holds a value that cannot be read ({why}).", action) from None
    if text.count("[") + text.count("{") > MAX_DEPTH and _depth_exceeds(doc, MAX_DEPTH):  # fewer cannot nest deeper
        raise error(source, f"{where}is JSON nested more than {MAX_DEPTH} levels deep; torchrepro never writes "
                    "that.", action)
    return doc


def _depth_exceeds(doc: Any, limit: int) -> bool:
    """Whether containers in ``doc`` nest more than ``limit`` levels (iterative: no recursion on deep input)."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False


def read_json(path: str | Path, *, error: ErrorType = StateFileError, action: str = "",
              limit: int = MAX_JSON_BYTES) -> Any:
    """The JSON document in regular file ``path`` (see the module doc); ``error`` naming what is wrong."""
    data = read_bytes(path, error=error, action=action, limit=limit)
    return parse(decode(data, source=path, error=error, action=action), source=path, error=error, action=action)


def read_jsonl(path: str | Path, *, error: ErrorType = StateFileError, action: str = "",
               limit: int = MAX_JSONL_BYTES, check: Callable[[Any], list[str]] | None = None,
               what: str = "a valid record") -> tuple[list[Any], bool]:
    """The values of a JSON Lines file and whether its last line was cut off (a writer killed mid-line).

    Empty lines are skipped; any other unreadable line raises ``error`` naming its line number, and so does a
    value for which ``check`` returns problems (sentences): ``line 7 is not {what}: ...``.
    """
    values: list[Any] = []
    total, number = 0, 0
    with open_regular(path, error=error, action=action) as f:
        while raw := f.readline(limit - total + 1):  # line by line, never more than the limit in memory
            total, number = total + len(raw), number + 1
            if total > limit:
                raise _too_large(path, limit, error, action)
            value = _jsonl_value(raw, number, path, error, action)
            if value is _CUT:
                return values, True
            if value is _EMPTY:
                continue
            problems = check(value) if check is not None else []
            if problems:
                shown = "; ".join(problems[:3]) + (f" (+{len(problems) - 3} more)" if len(problems) > 3 else "")
                raise error(path, f"line {number} is not {what}: {shown}; the file is corrupt or was edited.", action)
            values.append(value)
    return values, False


_CUT, _EMPTY = object(), object()


def _jsonl_value(raw: bytes, number: int, path: str | Path, error: ErrorType, action: str) -> Any:
    """The value on one line; ``_EMPTY`` for an empty line, ``_CUT`` for an unreadable last line (no newline)."""
    line = raw.removesuffix(b"\n")
    if not line:
        return _EMPTY
    where = f"line {number} "
    try:
        return parse(decode(line, source=path, error=error, action=action, where=where), source=path, error=error,
                     action=action, where=where)
    except StateFileError:
        if not raw.endswith(b"\n"):  # the last line, cut off: the writer was killed mid-line
            return _CUT
        raise


# --- the JSON types of fields --------------------------------------------------------------------------
def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    """A finite int or float that ``float()`` converts (a 400-digit integer does not)."""
    if _is_int(v):
        return abs(v) <= sys.float_info.max
    return isinstance(v, float) and math.isfinite(v)


def _is_hex_float(v: Any) -> bool:
    try:
        float.fromhex(v)
    except (TypeError, ValueError, OverflowError):
        return False
    return True


def _types(values: Iterable[Any]) -> set[type]:
    """The exact types of ``values`` (JSON gives plain str, dict, ...; a set is cheaper than isinstance per item)."""
    return {type(x) for x in values}


# kind -> test; a field's spec is a tuple of these names, the value must pass one of them
KINDS: dict[str, Callable[[Any], bool]] = {
    "null": lambda v: v is None,
    "bool": lambda v: isinstance(v, bool),
    "int": _is_int,
    "number": _is_number,
    "string": lambda v: isinstance(v, str),
    "hex float string": lambda v: isinstance(v, str) and _is_hex_float(v),
    "list": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "list of strings": lambda v: isinstance(v, list) and _types(v) <= {str},
    "list of objects": lambda v: isinstance(v, list) and _types(v) <= {dict},
    "object of strings or nulls": lambda v: isinstance(v, dict) and _types(v.values()) <= {str, type(None)},
}

Spec = Mapping[str, tuple[str, ...]]


def _a(kind: str) -> str:
    """``a string``, ``an int``, ``null``: a kind's name in a sentence."""
    return kind if kind == "null" else f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"


def describe(value: Any) -> str:
    """A short description of a JSON value for a message: ``the number 5``, ``a list of 3 items``."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, (int, float)):
        text = repr(value) if len(str(value)) <= 24 else f"{str(value)[:20]}... ({len(str(value))} digits)"
        return f"the number {text}"
    if isinstance(value, str):
        return f"the string {value[:40]!r}" + ("..." if len(value) > 40 else "")
    if isinstance(value, list):
        return f"a list of {len(value)} item{'s' if len(value) != 1 else ''}"
    return f"an object with {len(value)} key{'s' if len(value) != 1 else ''}"


def field_problems(doc: Mapping[str, Any], spec: Spec, *, prefix: str = "") -> list[str]:
    """Sentences naming each field of ``doc`` in ``spec`` whose value is none of its kinds (absent fields pass)."""
    problems = []
    for name, kinds in spec.items():
        if name in doc and not any(KINDS[k](doc[name]) for k in kinds):
            problems.append(f"'{prefix}{name}' is {describe(doc[name])}, expected {' or '.join(map(_a, kinds))}")
    return problems


def check_fields(doc: Any, spec: Spec, *, source: str | Path, error: ErrorType = StateFileError, action: str = "",
                 where: str = "", what: str = "an object") -> dict[str, Any]:
    """``doc`` if it is an object whose fields in ``spec`` have their JSON types; else ``error`` naming each one."""
    if not isinstance(doc, dict):
        raise error(source, f"{where}holds {describe(doc)}, expected {what}.", action)
    problems = field_problems(doc, spec)
    if problems:
        shown = "; ".join(problems[:3]) + (f" (+{len(problems) - 3} more)" if len(problems) > 3 else "")
        raise error(source, f"{where}has fields of the wrong type: {shown}.", action)
    return doc
