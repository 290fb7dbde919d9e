"""Tensor digests: the two algorithms (XXH3 chunks on CPU, splitmix64 lane sums on the device) and their dispatch."""

from __future__ import annotations

import ctypes
import hashlib
import os
from collections.abc import Mapping, Sequence
from typing import Any, cast

import torch

from . import dtensor as _dtensor
from . import ompteam as _ompteam
from .compat import np, optional_import
from .tensorbits import (
    _COMPLEX_DTYPES,
    _PLAIN_TENSOR_TYPES,
    _QUANTIZED_DTYPES,
    _SMALL_BYTES,
    _STRIDED,
    _composite,
    _direct_bytes,
    _flat_bits,
    _is_transform_wrapper,
    _plain_bytes,
    _small_types,
    check_fingerprintable,
)

ALGORITHM_XXH3 = "xxh3-128-chunks-1MiB/1"
ALGORITHM_TORCH = "splitmix64-sum-128/1"
LEGACY_ALGORITHM = "fold63-splitmix64/0"  # runs whose manifest names no algorithm
CHUNK = 1 << 20  # bytes per XXH3 chunk (part of the algorithm)
TORCH_SLICE_WORDS = 1 << 22  # words per slice on the torch path (bounds temporary memory; not in the digest)
# Tensors of fewer chunks (16 MiB) are hashed in the calling thread: splitting a few MiB costs more than it
# saves (measured in the op tracer, with torch's OpenMP team and with a thread of our own). Larger ones are
# split over torch's OpenMP team where _ompteam can use it, else over a helper thread.
_TEAM_MIN_CHUNKS = 16
_PARALLEL_MIN_CHUNKS = 16
_BYTES = 8

# splitmix64 constants as signed int64 (torch has no uint64 arithmetic on every device).
_M1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_M2 = 0x94D049BB133111EB - (1 << 64)
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_LANE_SALTS = (0x243F6A8885A308D3, 0x13198A2E03707344)
_MASK = {s: (1 << (64 - s)) - 1 for s in (30, 27, 31)}

xxhash: Any = optional_import("xxhash")
_XXH3 = xxhash is not None and np is not None  # CPU tensors are hashed with XXH3 (else with the torch sums)
_digest: Any = getattr(xxhash, "xxh3_128_digest", None)
_hexdigest: Any = getattr(xxhash, "xxh3_128_hexdigest", None)
_usage: dict[str, int] = {}  # algorithm -> tensors fingerprinted with it in this process


def usage_mark() -> dict[str, int]:
    """A snapshot of how many tensors each algorithm has fingerprinted so far (see :func:`algorithms_since`)."""
    return dict(_usage)


def algorithms_since(mark: Mapping[str, int] | None = None) -> str | None:
    """The algorithm tags used since ``mark`` (``"+"``-joined, sorted), or None when nothing was fingerprinted."""
    mark = mark or {}
    used = sorted(a for a, n in _usage.items() if n > mark.get(a, 0))
    return "+".join(used) or None


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 words."""
    return (x >> s) & _MASK[s]


def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 finaliser: a bijection on 64-bit words (wrapping int64 arithmetic)."""
    x = (x ^ _shr(x, 30)) * _M1
    x = (x ^ _shr(x, 27)) * _M2
    return x ^ _shr(x, 31)


def _words(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as a 1-D int64 tensor on its device, zero-padded to whole words."""
    check_fingerprintable(t)
    flat = _flat_bits(t)
    if flat.numel() == 0:
        return torch.zeros(0, dtype=torch.int64, device=flat.device)
    raw = flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat
    pad = (-raw.numel()) % _BYTES
    if pad:
        raw = torch.cat([raw, torch.zeros(pad, dtype=torch.uint8, device=raw.device)])
    try:
        return raw.view(torch.int64)
    except RuntimeError:  # storage offset not 8-byte aligned
        return raw.clone().view(torch.int64)


def _lanes(u: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Two keyed splitmix lane terms per word: shape (2, len(u))."""
    key = positions * _GOLDEN
    return torch.stack([_mix(u + key + salt) for salt in _LANE_SALTS])


_header_cache: dict[tuple[torch.dtype, torch.Size], bytes] = {}


def _header(t: torch.Tensor) -> bytes:
    key = (t.dtype, t.shape)
    h = _header_cache.get(key)
    if h is None:
        h = f"{t.dtype}|{tuple(t.shape)}|{t.numel() * t.element_size()}".encode()
        if len(_header_cache) < 4096:
            _header_cache[key] = h
    return h


def _finish(t: torch.Tensor, lanes: Sequence[int]) -> str:
    h = hashlib.blake2b(_header(t), digest_size=16)
    for lane in lanes:
        h.update(int(lane & ((1 << 64) - 1)).to_bytes(8, "little"))
    return h.hexdigest()


def _lane_sums_torch(tensors: Sequence[torch.Tensor], device: torch.device) -> list[tuple[int, int]]:
    """Lane sums of tensors on one device, computed there with one device-to-host copy of 16 bytes per tensor.

    Small tensors are batched into one slice of at most ``TORCH_SLICE_WORDS`` words; long ones are read slice
    by slice, so temporaries stay bounded whatever the tensor's size."""
    sums = torch.zeros(2, len(tensors), dtype=torch.int64, device=device)
    batch: list[torch.Tensor] = []
    ids: list[int] = []
    held = 0

    def flush() -> None:
        nonlocal held
        if not batch:
            return
        u = torch.cat(batch) if len(batch) > 1 else batch[0]
        sizes = torch.tensor([w.numel() for w in batch], dtype=torch.int64, device=device)
        seg = torch.repeat_interleave(torch.arange(len(batch), device=device), sizes)
        starts = torch.cumsum(sizes, 0) - sizes
        pos = torch.arange(u.numel(), dtype=torch.int64, device=device) - starts[seg]
        which = torch.tensor(ids, dtype=torch.int64, device=device)[seg]
        sums.index_add_(1, which, _lanes(u, pos))
        batch.clear()
        ids.clear()
        held = 0

    for k, t in enumerate(tensors):
        w = _words(t)
        n = w.numel()
        if n > TORCH_SLICE_WORDS:
            for s in range(0, n, TORCH_SLICE_WORDS):
                part = w[s:s + TORCH_SLICE_WORDS]
                pos = torch.arange(s, s + part.numel(), dtype=torch.int64, device=device)
                sums[:, k] += _lanes(part, pos).sum(1)
            continue
        if held + n > TORCH_SLICE_WORDS:
            flush()
        if n:
            batch.append(w)
            ids.append(k)
            held += n
    flush()
    return [(a, b) for a, b in sums.t().tolist()]


def _digests_torch(tensors: Sequence[torch.Tensor], device: torch.device) -> list[str]:
    lanes = _lane_sums_torch(tensors, device)
    return [_finish(t, lane) for t, lane in zip(tensors, lanes)]


# --- CPU: XXH3-128 over 1 MiB chunks (xxhash releases the GIL on large inputs: chunks hash in parallel) ---
_pool: Any = None
_pool_key: tuple[int, int] | None = None  # (pid, workers) the pool was made for


def _executor(workers: int) -> Any:
    global _pool, _pool_key
    key = (os.getpid(), workers)
    if _pool_key != key:  # first use, a new thread count, or a forked child (the parent's threads are gone)
        from concurrent.futures import ThreadPoolExecutor

        _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="torchrepro-fingerprint")
        _pool_key = key
    return _pool


def _chunk_digests(buf: Any, first: int, last: int) -> bytes:
    digest = xxhash.xxh3_128_digest
    return b"".join([digest(buf[k * CHUNK:(k + 1) * CHUNK]) for k in range(first, last)])


def _xxh3_parts(buf: Any) -> bytes:
    """The chunk digests of a flat byte buffer (uint8 array or memoryview), concatenated in chunk order."""
    chunks = -(-len(buf) // CHUNK)
    threads = min(torch.get_num_threads(), chunks // 2)
    if threads <= 1 or chunks < min(_TEAM_MIN_CHUNKS, _PARALLEL_MIN_CHUNKS):
        return _chunk_digests(buf, 0, chunks)
    bounds = [chunks * i // threads for i in range(threads + 1)]
    parts = [b""] * threads

    def share(i: int) -> None:
        parts[i] = _chunk_digests(buf, bounds[i], bounds[i + 1])

    if chunks >= _TEAM_MIN_CHUNKS and _ompteam.run(share, threads):  # on torch's own OpenMP threads
        return b"".join(parts)
    if chunks < _PARALLEL_MIN_CHUNKS:
        return _chunk_digests(buf, 0, chunks)
    pool = _executor(threads - 1)
    futures = [pool.submit(share, i) for i in range(1, threads)]
    share(0)  # the calling thread takes the first share
    for f in futures:
        f.result()
    return b"".join(parts)


def _digest_xxh3(t: torch.Tensor, buf: Any = None, header: bytes | None = None) -> str:
    """The XXH3 fingerprint of a CPU tensor; ``buf``, ``header``: its bytes and header when the caller has them.

    The header is read before the bytes: a tensor that another thread ``set_()``s to other memory meanwhile
    gets its old digest (the bytes read in place stay allocated while they are hashed)."""
    header = header if header is not None else _header(t)
    buf = buf if buf is not None else _direct_bytes(t)
    if buf is None:
        check_fingerprintable(t)
        flat = _flat_bits(t)
        buf = (flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat).numpy()
    parts = xxhash.xxh3_128_digest(buf) if 0 < len(buf) <= CHUNK else _xxh3_parts(buf)  # one chunk: no loop
    return cast(str, xxhash.xxh3_128_hexdigest(header + b"|" + parts))


def plain_cpu_fingerprint(t: torch.Tensor) -> str | None:
    """``fingerprint(t)`` for a plain strided CPU tensor, with the least Python work (the op tracer's hot
    path); ``None`` for every other tensor (other devices, sparse, quantized, nested, or no ``xxhash``)."""
    if (not _XXH3 or not t.is_cpu or t.layout is not torch.strided or t.is_quantized
            or t.is_nested):
        return None
    _usage[ALGORITHM_XXH3] = _usage.get(ALGORITHM_XXH3, 0) + 1
    header = _header_cache.get((t.dtype, t.shape)) or _header(t)
    buf = _plain_bytes(t) if type(t) in _PLAIN_TENSOR_TYPES else None  # most tensors: read in place
    if buf is not None and len(buf) <= CHUNK:  # one chunk (most op tensors): no loop, no checks to repeat
        return cast(str, _hexdigest(header + b"|" + _digest(buf)))
    return _digest_xxh3(t, buf, header)


def small_cpu_fingerprint_at(t: torch.Tensor) -> tuple[str, int] | None:
    """(``fingerprint(t)``, ``t.data_ptr()``) for a plain contiguous CPU tensor of at most ``_SMALL_BYTES`` bytes
    read in place; ``None`` for every other tensor (call :func:`plain_cpu_fingerprint` or :func:`fingerprint`
    for those).

    The op tracer's hot path for small tensors, which it hashes again rather than looking them up in a cache:
    the checks of :func:`_direct_bytes` in one function, the cheap ones first (the size, so that a large tensor
    is turned away at once; only complex tensors can have the conjugate bit; quantized tensors are known by
    their dtype)."""
    if type(t) not in _PLAIN_TENSOR_TYPES or t.layout is not _STRIDED or not _XXH3:
        return None
    try:  # any of these can raise for an odd tensor (no byte size, no storage): the checked path says why
        n = t.nbytes
        if n > _SMALL_BYTES or n <= 0 or not t.is_cpu or t.is_nested:
            return None
        dtype = t.dtype
        if (dtype in _QUANTIZED_DTYPES or not t.is_contiguous() or (dtype in _COMPLEX_DTYPES and t.is_conj())
                or t.is_neg() or _is_transform_wrapper(t)):
            return None
        ptr = t.data_ptr()
        storage = t.untyped_storage()
        start = storage.data_ptr()
        if not ptr or ptr < start or ptr + n > start + storage.nbytes():
            return None
    except Exception:
        return None
    kind = _small_types.get(n)
    if kind is None:
        if len(_small_types) >= 4096:  # ever new sizes: stay bounded
            _small_types.clear()
        kind = _small_types[n] = ctypes.c_ubyte * n
    _usage[ALGORITHM_XXH3] = _usage.get(ALGORITHM_XXH3, 0) + 1
    header = _header_cache.get((dtype, t.shape)) or _header(t)
    return _hexdigest(header + b"|" + _digest(kind.from_address(ptr))), ptr  # storage: held until here


def fingerprint(t: torch.Tensor) -> str:
    """A 32-hex-digit exact digest of ``t``'s bits, dtype and shape (see the docs of ``_core/fingerprint``).

    Raises :class:`UnfingerprintableError` for meta tensors (they hold no data).
    """
    return fingerprint_many([t])[0]


def fingerprint_many(tensors: Sequence[torch.Tensor]) -> list[str]:
    """Fingerprints of many tensors with one device-to-host copy per device.

    Equal to ``[fingerprint(t) for t in tensors]``. CPU tensors are hashed with XXH3-128 (when ``xxhash`` and
    NumPy are installed); other devices compute on the device and copy back two words per tensor. A DTensor's
    fingerprint is its local shard's (``to_local()``: no collective; see ``_core/dtensor``).
    """
    if not tensors:
        return []
    dense: list[torch.Tensor] = []
    plan: list[tuple[str | None, int, int]] = []  # (header of a composite tensor or None, first part, parts)
    for t in tensors:
        if type(t) not in _PLAIN_TENSOR_TYPES:  # a DTensor (FSDP2, tensor parallel): this rank's local shard
            t = _dtensor.local_tensor(t)
        comp = _composite(t)
        if comp is None:
            plan.append((None, len(dense), 1))
            dense.append(t)
        else:
            plan.append((comp[0], len(dense), len(comp[1])))
            dense.extend(comp[1])
    fps = _dense_fingerprints(dense)
    out: list[str] = []
    for header, start, count in plan:
        if header is None:
            out.append(fps[start])
            continue
        h = hashlib.blake2b(header.encode(), digest_size=16)
        for fp in fps[start:start + count]:
            h.update(fp.encode())
        out.append(h.hexdigest())
    return out


def _dense_fingerprints(tensors: Sequence[torch.Tensor]) -> list[str]:
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        by_device.setdefault(t.device, []).append(i)
    out: list[str] = [""] * len(tensors)
    for device, idx in by_device.items():
        group = [tensors[i] for i in idx]
        if device.type == "cpu" and xxhash is not None and np is not None:
            algorithm, fps = ALGORITHM_XXH3, [_digest_xxh3(t) for t in group]
        else:
            algorithm, fps = ALGORITHM_TORCH, _digests_torch(group, device)
        _usage[algorithm] = _usage.get(algorithm, 0) + len(group)
        for j, fp in zip(idx, fps):
            out[j] = fp
    return out


