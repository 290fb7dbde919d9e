"""Fingerprints of an op's tensors for the op tracer: the tensors among its arguments, the cache that reuses a
fingerprint while the memory is unmodified, and the marks of uninitialized memory (``torch.empty``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .._core.fingerprint import (
    UnfingerprintableError,
    check_fingerprintable,
    fingerprint_many,
    plain_cpu_fingerprint,
    small_cpu_fingerprint_at,
)

UNINITIALIZED = "uninitialized"
# The input fingerprint of an ``out=`` argument that was uninitialized: the op writes it without reading it.
OVERWRITTEN = "overwritten"


def _tensors(obj: Any, out: list[torch.Tensor]) -> list[torch.Tensor]:
    if type(obj) in _LEAF_TYPES:  # most op arguments: numbers, dtypes, None (the hot path skips isinstance)
        return out
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _tensors(x, out)
    elif isinstance(obj, Mapping):
        for x in obj.values():
            _tensors(x, out)
    return out


_LEAF_TYPES = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                         torch.memory_format})


def _scalar_repr(value: Any) -> str:
    """A stable text for a non-tensor op result (numbers exactly; other objects by type only)."""
    if isinstance(value, float):
        return value.hex()
    if value is None or isinstance(value, (bool, int, complex, str)):
        return repr(value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int, float)) for v in value):
        return repr([v.hex() if isinstance(v, float) else v for v in value])
    return f"<{type(value).__name__}>"


def _unchanged(t: torch.Tensor, last: list[tuple[torch.Tensor, int, int, str]]) -> str | None:
    """The fingerprint ``t`` had as an output of the previous op, if it is one and its version counter and data
    pointer are the same (an in-place op bumps the version after it returns: its outputs are hashed again)."""
    for held, version, ptr, fp in last:
        if held is t:
            try:
                return fp if t._version == version and t.data_ptr() == ptr else None
            except RuntimeError:
                return None
    return None


def _version(t: torch.Tensor) -> int:
    """The tensor's version counter, or -1 when it has none (inference tensors): never cached."""
    try:
        return t._version
    except RuntimeError:
        return -1


class _FpCache:
    """Fingerprints of tensors, reused while the memory they view is alive and unmodified.

    The key is what the bytes are (device, data pointer, dtype, shape, strides), not the Python object: autograd
    hands the same saved tensor to backward ops through new Python wrappers. An entry is valid while the storage
    is alive (a weak reference, so freed-and-reused memory never matches) and the version counter, which every
    in-place op bumps, is unchanged. The recorder clears the cache at each step boundary, since writes through
    ``.data`` do not bump the version counter.

    Small CPU tensors (``small_cpu_fingerprint_at``) are hashed again each time they are seen: that costs less
    than a lookup, and is never stale. The exception: memory marked uninitialized (``torch.empty``) keeps its
    mark until written, so while marks exist, a small tensor whose key has one is looked up first.
    """

    def __init__(self) -> None:
        self._cache: dict[tuple[Any, ...], tuple[Any, int, str]] = {}
        self._pending: list[tuple[torch.Tensor, str]] = []
        # The small outputs of the last op, with their version and data pointer when hashed: the next op's inputs
        # are mostly these very tensors. Emptied by every op once its inputs are hashed (see _Dispatch), so it
        # spans one op: only an op (which empties it) or a write the version counter does not see (through
        # ``.data``, as for the cache) could change them in between.
        self.last: list[tuple[torch.Tensor, int, int, str]] = []
        self._uninitialized: set[tuple[Any, ...]] = set()  # keys marked UNINITIALIZED and maybe not yet written

    @staticmethod
    def _key(t: torch.Tensor) -> tuple[Any, ...]:
        return (t.device, t.data_ptr(), t.dtype, t.shape, t.stride())

    def _marked(self, t: torch.Tensor) -> bool:
        try:
            return self._key(t) in self._uninitialized
        except Exception:  # no data pointer: the checked path says why
            return True

    def get(self, tensors: list[torch.Tensor], *, fresh: bool = False) -> list[str]:
        """Fingerprints of ``tensors``; ``fresh=True`` ignores cached values (for op outputs: an in-place op's
        version counter is bumped only after it returns, so a cached value could be stale)."""
        return self.outputs(tensors) if fresh else self.inputs(tensors)

    def inputs(self, tensors: list[torch.Tensor]) -> list[str]:
        """Fingerprints of an op's input tensors: the previous op's unchanged outputs keep theirs, small CPU
        tensors are hashed again, others are looked up in the cache (see :meth:`_checked`)."""
        out: list[str | None] = []
        todo: list[int] = []
        marks = self._uninitialized
        last = self.last
        for i, t in enumerate(tensors):
            if last:  # an output of the previous op, unchanged since: no need to hash it again
                fp = _unchanged(t, last)
                if fp is not None:
                    out.append(fp)
                    continue
            if not marks or not self._marked(t):
                found = small_cpu_fingerprint_at(t)
                if found is not None:
                    out.append(found[0])
                    continue
            fp = self._checked(t, False)
            if fp is None:
                todo.append(i)
            out.append(fp)
        if todo:
            self._other_devices(tensors, todo, out, False)
        return out  # type: ignore[return-value]

    def outputs(self, tensors: list[torch.Tensor]) -> list[str]:
        """Fingerprints of an op's output tensors, never from the cache; the small ones become :attr:`last`."""
        out: list[str | None] = []
        todo: list[int] = []
        self.last = latest = []
        for i, t in enumerate(tensors):
            found = small_cpu_fingerprint_at(t)
            if found is not None:
                small, ptr = found
                try:
                    latest.append((t, t._version, ptr, small))
                except RuntimeError:  # an inference tensor has no version counter to check: never reused
                    pass
                out.append(small)
                continue
            fp = self._checked(t, True)
            if fp is None:
                todo.append(i)
            out.append(fp)
        if todo:
            self._other_devices(tensors, todo, out, True)
        return out  # type: ignore[return-value]

    def _checked(self, t: torch.Tensor, fresh: bool) -> str | None:
        """The fingerprint of a tensor the small path did not take (cached unless ``fresh``), the reason it has
        none, or ``None`` for a tensor on another device (see :meth:`_other_devices`)."""
        fp = None
        try:
            if t.layout is not torch.strided or t.is_nested or t.is_meta:
                check_fingerprintable(t)  # raises with the reason, or lets a readable tensor through
            if not fresh:
                key = self._key(t)
                hit = self._cache.get(key)
                if hit is not None and hit[1] == _version(t) and not hit[0].expired():
                    return hit[2]
                if key in self._uninitialized:  # written or freed since it was marked
                    self._uninitialized.discard(key)
            fp = plain_cpu_fingerprint(t)  # most tensors: hashed right here
            if fp is not None:
                self._remember(t, fp, fresh)
        except UnfingerprintableError as exc:
            fp = f"unfingerprintable: {exc}"
        except Exception as exc:  # e.g. a tensor subclass without storage: record, never crash the run
            fp = f"unfingerprintable: {type(exc).__name__}"
        return fp

    def _other_devices(self, tensors: list[torch.Tensor], todo: list[int], out: list[str | None],
                       fresh: bool) -> None:
        """Fill ``out[i]`` for ``i`` in ``todo``: one fingerprint_many call copies two words per tensor back, once
        per device."""
        try:
            fps = fingerprint_many([tensors[i] for i in todo])
        except Exception as exc:
            fps = [f"unfingerprintable: {type(exc).__name__}"] * len(todo)
        for i, fp in zip(todo, fps):
            out[i] = fp
            self._remember(tensors[i], fp, fresh)

    def _remember(self, t: torch.Tensor, fp: str, fresh: bool) -> None:
        if fresh:  # an op output: an in-place op's version bump happens after it returns
            self._pending.append((t, fp))
        else:
            self._put(t, fp)

    def commit(self) -> None:
        """Cache the outputs of the previous op, now that any in-place version bump has happened."""
        for t, fp in self._pending:
            self._put(t, fp)
        self._pending.clear()

    def _put(self, t: torch.Tensor, fp: str) -> bool:
        """Cache ``fp`` for ``t``; False when ``t`` cannot be cached (no version counter, no storage)."""
        version = _version(t)
        if version < 0:
            return False
        try:
            self._cache[self._key(t)] = (StorageWeakRef(t.untyped_storage()), version, fp)
        except (RuntimeError, TypeError, NotImplementedError):
            return False
        return True

    def mark_uninitialized(self, tensors: list[torch.Tensor], *, inplace: bool = False) -> list[str]:
        """Give fresh ``torch.empty`` outputs a fixed fingerprint until something writes to them; ``inplace``: the
        outputs of an in-place op (``resize_``), whose version is bumped after it returns (cached on the next op,
        as :meth:`outputs` does)."""
        for t in tensors:
            if inplace:
                try:
                    key = self._key(t)
                except Exception:  # no data pointer: the checked path says why when it is read
                    continue
                self._pending.append((t, UNINITIALIZED))
                self._uninitialized.add(key)
            elif self._put(t, UNINITIALIZED):
                self._uninitialized.add(self._key(t))
        return [UNINITIALIZED] * len(tensors)

    def clear(self) -> None:
        self._cache.clear()
        self._pending.clear()
        self._uninitialized.clear()
        self.last = []
