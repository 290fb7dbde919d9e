"""Reading an ``ops.jsonl`` file back: every op record checked, as untrusted input (:func:`read_ops`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .._core.errors import RunDirError
from .._core.readjson import read_jsonl

_MAX_OPS_BYTES = 4 << 30  # an ops.jsonl file (one traced step of a large model stays far below)


def read_ops(path: str | Path) -> Iterator[dict[str, Any]]:
    """Op records from an ``ops.jsonl`` file, each checked (:data:`_OP_FIELDS`), with ``code`` as stored.

    The file is untrusted input (a run directory may come from anywhere): the source files its records name are
    never opened, and the file itself is read as :func:`torchrepro._core.readjson.read_jsonl` reads (regular files
    only, bounded, strict UTF-8, bounded nesting). A cut-off last line (a killed run) is ignored. Any other line
    that is not a valid op record raises :class:`RunDirError` naming the file and line: skipping it, or stopping
    there, would shift or shorten the op stream and make two runs' streams look different.
    """
    ops, _cut_off = read_jsonl(path, error=RunDirError, action=_RETRACE, limit=_MAX_OPS_BYTES,
                               check=_op_problems, what="a valid op record")
    return iter([_clean_op(op) for op in ops])


_RETRACE = "Trace the run again (`torchrepro check --locate -- ...`)."
_MAX_INT = 1 << 63


def _is_count(v: Any) -> bool:
    return type(v) is int and 0 <= v < _MAX_INT


def _is_str_list(v: Any) -> bool:
    return type(v) is list and all(type(x) is str for x in v)


# field -> (required, check, what it must be); the fields of one op record (docs/formats.md)
_OP_FIELDS: dict[str, tuple[bool, Any, str]] = {
    "op": (True, lambda v: type(v) is str, "a string"),
    "in": (True, _is_str_list, "a list of strings"),
    "out": (True, _is_str_list, "a list of strings"),
    "i": (False, _is_count, "a non-negative integer"),
    "step": (False, lambda v: v is None or _is_count(v), "a non-negative integer or null"),
    "line": (False, lambda v: v is None or _is_count(v), "a non-negative integer or null"),
    "phase": (False, lambda v: v is None or type(v) is str, "a string or null"),
    "module": (False, lambda v: v is None or type(v) is str, "a string or null"),
    "file": (False, lambda v: v is None or type(v) is str, "a string or null"),
    "generator": (False, lambda v: v is None or type(v) is str, "a string or null"),
    "code": (False, lambda v: type(v) is str, "a string"),
    "rng": (False, lambda v: type(v) is bool, "true or false"),
}


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _op_problems(op: Any) -> list[str]:
    """:func:`_op_problem` as the list :func:`torchrepro._core.readjson.read_jsonl` takes."""
    problem = _op_problem(op)
    return [problem] if problem else []


def _op_problem(op: Any) -> str | None:
    """What is wrong with a parsed op record, or None when it has the shape :mod:`torchrepro.analysis.locate` reads."""
    if type(op) is not dict:
        return f"it is {'a list' if type(op) is list else 'a ' + type(op).__name__}, expected a JSON object"
    for key, (required, ok, what) in _OP_FIELDS.items():
        if key not in op:
            if required:
                return f"`{key}` is missing"
        elif not ok(op[key]):
            return f"`{key}` is {_shown(op[key])} ({type(op[key]).__name__}), expected {what}"
    return None


def _clean_op(op: dict[str, Any]) -> dict[str, Any]:
    """A checked record with only the known fields (others, of any size or depth, are dropped)."""
    clean = {key: op[key] for key in _OP_FIELDS if key in op}
    clean.setdefault("code", "")
    return clean
