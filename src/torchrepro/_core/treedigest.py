"""Fingerprints of Python structures holding tensors (data batches): a walk of their contents into one digest."""

from __future__ import annotations

import array
import enum
import hashlib
import os
import re
import struct
import types
from collections.abc import Mapping
from typing import Any

import torch

from .compat import np
from .tensordigest import fingerprint, fingerprint_many

UNREADABLE = "unreadable: "  # prefix of a recorded value that stands for "could not be read", with the reason
MAX_DEPTH = 32
MAX_NODES = 1_000_000


class UnreadableError(ValueError):
    """A Python object whose contents cannot be read exactly; the message names where and why."""


def fingerprint_object(obj: Any, *, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> str:
    """A 32-hex-digit exact digest of a Python structure holding tensors (a DataLoader batch).

    Tensors are read with :func:`fingerprint_many`; ``None``, bools, ints, floats (their bits), complex
    numbers, strings, bytes, NumPy arrays and scalars by value; lists, tuples (named tuples with their type
    and field names), mappings (in iteration order), sets (order-free), dataclasses and other objects
    (their ``__dict__`` and ``__slots__``, with the type's qualified name) element by element; functions
    and classes by qualified name; objects with none of these by their pickle state (``__reduce_ex__``).
    A ``repr`` is never used (it may hold a memory address or elide the values of a large tensor).

    Raises :class:`UnreadableError` naming the part that cannot be read (e.g. ``batch.meta['lock']: ...``):
    an object without readable state, a meta tensor, nesting deeper than ``max_depth``, or more than
    ``max_nodes`` elements. A reference cycle is digested as a back reference, not an error.
    """
    reader = _TreeReader(max_depth, max_nodes)
    reader.walk(obj, "batch", 0)
    return reader.digest()


def unreadable_text(exc: BaseException) -> str:
    """What to record in place of a fingerprint that could not be taken: ``"unreadable: <reason>"``."""
    return UNREADABLE + (str(exc) if isinstance(exc, UnreadableError) else _describe(exc))


def _describe(exc: BaseException) -> str:
    """An exception as text that is the same in every run (memory addresses elided)."""
    text = str(exc).split("\n")[0][:200]
    return f"{type(exc).__name__}: {re.sub(r'0x[0-9a-fA-F]+', '0x…', text)}"


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', None)}.{getattr(obj, '__qualname__', getattr(obj, '__name__', '?'))}"


def _slot_names(cls: type) -> list[str]:
    names: list[str] = []
    for klass in reversed(cls.__mro__):
        slots = klass.__dict__.get("__slots__", ())
        for name in [slots] if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and name not in names:
                names.append(name)
    return names


class _TreeReader:
    """Walks a structure into length-prefixed tokens (bytes) and tensor slots (ints into ``tensors``)."""

    def __init__(self, max_depth: int, max_nodes: int) -> None:
        self.max_depth = max_depth
        self.max_nodes = max_nodes
        self.nodes = 0
        self.tokens: list[bytes | int] = []
        self.tensors: list[torch.Tensor] = []
        self.tensor_paths: list[str] = []
        self._open: dict[int, int] = {}  # id -> depth of the containers being walked (cycle detection)

    def emit(self, tag: str, payload: bytes = b"") -> None:
        self.tokens.append(_tok(tag, payload))

    def digest(self) -> str:
        try:
            fps = fingerprint_many(self.tensors)
        except Exception:
            for t, path in zip(self.tensors, self.tensor_paths):
                try:
                    fingerprint(t)
                except Exception as exc:
                    raise UnreadableError(f"{path}: {_describe(exc)}") from None
            raise
        h = hashlib.blake2b(digest_size=16)
        for token in self.tokens:
            h.update(fps[token].encode() if isinstance(token, int) else token)
        return h.hexdigest()

    def walk(self, obj: Any, path: str, depth: int) -> None:
        self.nodes += 1
        if self.nodes > self.max_nodes:
            raise UnreadableError(f"{path}: the batch has more than {self.max_nodes} elements to read one by one; "
                                  "return tensors or NumPy arrays from the dataset or collate_fn")
        if depth > self.max_depth:
            raise UnreadableError(f"{path}: nested more than {self.max_depth} levels deep")
        if isinstance(obj, torch.Tensor):
            self.emit("T")
            self.tokens.append(len(self.tensors))
            self.tensors.append(obj)
            self.tensor_paths.append(path)
            return
        leaf = _leaf(obj)
        if leaf is not None:
            self.tokens.append(leaf)
            return
        key = id(obj)
        if key in self._open:  # a reference cycle: digest how far up it points
            self.emit("R", str(depth - self._open[key]).encode())
            return
        self._open[key] = depth
        try:
            self._walk_container(obj, path, depth)
        finally:
            del self._open[key]

    def _walk_container(self, obj: Any, path: str, depth: int) -> None:
        cls = type(obj)
        if isinstance(obj, Mapping):
            self.emit("m", _qualname(cls).encode())
            for i, (k, v) in enumerate(list(obj.items())):
                self.walk(k, f"{path}<key {i}>", depth + 1)
                self.walk(v, f"{path}[{k!r}]" if isinstance(k, (str, int)) else f"{path}<value {i}>", depth + 1)
            self.emit("/")
        elif isinstance(obj, (list, tuple)):
            fields = getattr(obj, "_fields", None)
            header = _qualname(cls) + (f"|{','.join(map(str, fields))}" if isinstance(fields, tuple) else "")
            self.emit("l", header.encode())
            fast = _number_list(obj)
            if fast is not None:
                self.tokens.append(fast)
            else:
                for i, v in enumerate(obj):
                    self.walk(v, f"{path}[{i}]", depth + 1)
            self.emit("/")
        elif isinstance(obj, (set, frozenset)):
            parts = []  # each element digested on its own, then sorted: set order depends on hashing
            for v in obj:
                sub = _TreeReader(self.max_depth, self.max_nodes)
                sub.nodes, sub._open = self.nodes, self._open
                sub.walk(v, f"{path}<set element>", depth + 1)
                self.nodes = sub.nodes
                parts.append(sub.digest())
            self.emit("S", _qualname(cls).encode() + "|".join(sorted(parts)).encode())
        elif np is not None and isinstance(obj, np.ndarray):  # only object arrays reach here (see _leaf)
            self.emit("A", f"{_qualname(cls)}|{obj.shape}".encode())
            for i, v in enumerate(obj.flat):
                self.walk(v, f"{path}.flat[{i}]", depth + 1)
            self.emit("/")
        else:
            self._walk_object(obj, path, depth)

    def _walk_object(self, obj: Any, path: str, depth: int) -> None:
        cls = type(obj)
        if cls.__flags__ & _IMMUTABLETYPE and self._walk_reduced(obj, path, depth, strict=False):
            return  # a C type (functools.partial, datetime, ...): its pickle state is its value
        state: list[tuple[str, Any]] = []
        has_dict = isinstance(getattr(obj, "__dict__", None), dict)
        if has_dict:
            state.extend(vars(obj).items())
        slots = _slot_names(cls)
        state.extend((name, getattr(obj, name)) for name in slots if hasattr(obj, name))
        if has_dict or slots:
            self.emit("O", _qualname(cls).encode())
            for name, value in state:
                self.emit("k", str(name).encode("utf-8", "surrogatepass"))
                self.walk(value, f"{path}.{name}", depth + 1)
            self.emit("/")
            return
        self._walk_reduced(obj, path, depth, strict=True)

    def _walk_reduced(self, obj: Any, path: str, depth: int, *, strict: bool) -> bool:
        """Walk ``obj``'s pickle state (``__reduce_ex__``); False (or, if ``strict``, an error) if it has none."""
        cls = type(obj)
        try:
            reduced = obj.__reduce_ex__(4)
        except Exception as exc:
            if not strict:
                return False
            raise UnreadableError(f"{path}: cannot read an object of type {_qualname(cls)}: it has no __dict__ "
                                  f"or __slots__ and no pickle state ({_describe(exc)})") from None
        if isinstance(reduced, str) or not isinstance(reduced, tuple):  # a global: read by name
            self.emit("G", f"{_qualname(cls)}|{reduced}".encode())
            return True
        self.emit("P", _qualname(cls).encode())
        for i, part in enumerate(reduced[:5]):
            if i >= 3 and part is not None:
                part = list(part)  # list items / dict items iterators
            self.walk(part, f"{path}<pickle state {i}>", depth + 1)
        self.emit("/")
        return True


_IMMUTABLETYPE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE: a C type (classes defined in Python are mutable)


def _leaf(obj: Any) -> bytes | None:
    """The token of a value read whole (scalars, strings, bytes, arrays, names), or None for containers."""
    if obj is None:
        return b"N0:"
    cls = type(obj)
    if cls is bool:
        return b"b1:1" if obj else b"b1:0"
    if isinstance(obj, enum.Enum):
        return _tok("E", f"{_qualname(cls)}.{obj.name if obj.name is not None else obj.value}".encode())
    if np is not None and isinstance(obj, np.generic):
        return _tok("g", obj.dtype.str.encode() + b"|" + obj.tobytes()) if obj.dtype.kind != "O" else None
    if isinstance(obj, int):
        return _tok("i", str(int(obj)).encode())
    if isinstance(obj, float):
        return _tok("f", struct.pack("<d", obj))
    if isinstance(obj, complex):
        return _tok("c", struct.pack("<dd", obj.real, obj.imag))
    if isinstance(obj, str):
        return _tok("s", obj.encode("utf-8", "surrogatepass"))
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return _tok("y", bytes(obj))
    if np is not None and isinstance(obj, np.ndarray) and not obj.dtype.hasobject:
        dtype = str(obj.dtype.descr) if obj.dtype.fields else obj.dtype.str
        data = np.ascontiguousarray(obj).view(np.uint8).tobytes() if obj.size else b""
        return _tok("a", f"{dtype}|{obj.shape}|".encode() + hashlib.blake2b(data, digest_size=16).digest())
    if isinstance(obj, os.PathLike):
        return _tok("p", os.fsencode(obj))
    if isinstance(obj, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return _tok("o", str(obj).encode())
    if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType)):
        return _tok("F", _qualname(obj).encode())
    return None


def _tok(tag: str, payload: bytes) -> bytes:
    return f"{tag}{len(payload)}:".encode() + payload


def _number_list(obj: list[Any] | tuple[Any, ...]) -> bytes | None:
    """A long list of plain ints or floats as one token (C speed), or None."""
    if len(obj) < 16:
        return None
    first = type(obj[0])
    if first not in (int, float) or any(type(v) is not first for v in obj):
        return None
    try:
        data = array.array("q" if first is int else "d", obj).tobytes()
    except OverflowError:
        return None
    return _tok("n" + ("i" if first is int else "f"), hashlib.blake2b(data, digest_size=16).digest())
