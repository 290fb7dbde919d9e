"""Where an op was called from: the user's source line (the innermost frame outside torch, torchrepro and the
standard library), and the text of that line, read once per file."""

from __future__ import annotations

import os
from types import FrameType

import torch

from .._core.errors import StateFileError
from .._core.readjson import open_regular

_TORCH_DIR = os.path.dirname(torch.__file__)
_OWN_DIR = os.path.dirname(os.path.dirname(__file__))  # the torchrepro package, every subpackage

_INTERNAL_FILES: dict[str, bool] = {}  # file name -> whether it belongs to torch/torchrepro/the stdlib plumbing


def _is_internal(name: str) -> bool:
    internal = _INTERNAL_FILES.get(name)
    if internal is None:
        internal = (name.startswith(_TORCH_DIR) or name.startswith(_OWN_DIR) or name.startswith("<frozen")
                    or "/contextlib.py" in name or "/runpy.py" in name)
        if len(_INTERNAL_FILES) > 10_000:  # code made by exec() under ever new names: stay bounded
            _INTERNAL_FILES.clear()
        _INTERNAL_FILES[name] = internal
    return internal


_STDLIB_DIR = os.path.join(os.path.dirname(os.__file__), "")
_STDLIB_FILES: dict[str, bool] = {}  # file name -> whether it is in Python's standard library (not site-packages)


def _in_stdlib(name: str) -> bool:
    found = _STDLIB_FILES.get(name)
    if found is None:
        found = name.startswith(_STDLIB_DIR) and "-packages" not in name[len(_STDLIB_DIR):]
        if len(_STDLIB_FILES) > 10_000:  # code made by exec() under ever new names: stay bounded
            _STDLIB_FILES.clear()
        _STDLIB_FILES[name] = found
    return found


def _site_of(frame: FrameType | None) -> tuple[str, int, str] | None:
    """(file, line, code) of the innermost frame, from ``frame`` outwards, outside torch and torchrepro, and
    outside Python's standard library unless no frame further out is the user's (``copy.deepcopy(x)`` runs
    ``x.clone()`` from copy.py: the user's line is the deepcopy call)."""
    f = frame
    stdlib = None
    while f is not None:
        name = f.f_code.co_filename
        if not _is_internal(name):
            if not _in_stdlib(name):
                return name, f.f_lineno, ""
            if stdlib is None:
                stdlib = name, f.f_lineno, ""
        f = f.f_back
    return stdlib


_MAX_SOURCE_BYTES = 16 << 20  # a source file larger than this is not read for its line's text
_MAX_CODE_CHARS = 200  # the stored text of a source line


def _source_lines(path: str) -> list[str]:
    """The lines of a user's source file, or [] when it is not a readable regular file of sane size."""
    try:
        with open_regular(path) as f:
            data = f.read(_MAX_SOURCE_BYTES + 1)
    except (StateFileError, OSError, ValueError):  # not a regular file, unreadable; ValueError: a NUL in the name
        return []
    return [] if len(data) > _MAX_SOURCE_BYTES else data.decode("utf-8", errors="replace").splitlines()


def _code_line(path: str, line: int, cache: dict[str, list[str]]) -> str:
    """The stripped text of ``path``'s line ``line`` (at most ``_MAX_CODE_CHARS``), "" when unknown."""
    if path not in cache:
        if len(cache) > 10_000:  # code made by exec() under ever new names: stay bounded
            cache.clear()
        cache[path] = _source_lines(path)
    lines = cache[path]
    return lines[line - 1].strip()[:_MAX_CODE_CHARS] if 0 < line <= len(lines) else ""
