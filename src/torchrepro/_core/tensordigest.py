"""Tensor digests: the two algorithms (XXH3 chunks on CPU, splitmix64 lane sums on the device) and their dispatch."""

from __future__ import annotations

import ctypes
import hashlib
import os
import time
from collections.abc import Iterator, Mapping, Sequence
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
    UnfingerprintableError,
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
# On the CPU (the torch path without xxhash) slices of 2 MiB keep the three buffers of the lane sums in the caches:
# 3x the throughput of 32 MiB slices on a 2-core machine (1.56 against 0.52 GB/s over a transformer's tensors). On
# other devices each slice costs ~27 kernel launches, so slices stay long there (not yet measured on a GPU).
CPU_SLICE_WORDS = 1 << 18
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


def _wrap(x: int) -> int:
    """``x`` mod 2**64 as a signed int64 (torch's int64 arithmetic wraps the same way)."""
    return ((x + (1 << 63)) & ((1 << 64) - 1)) - (1 << 63)


def _mix_(x: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser applied to ``x`` in place (a bijection on 64-bit words, wrapping int64 arithmetic);
    ``scratch``: a tensor of ``x``'s size for the shifted words. Two buffers whatever the size, no allocation."""
    for shift, factor in ((30, _M1), (27, _M2), (31, 0)):
        torch.bitwise_right_shift(x, shift, out=scratch)
        scratch.bitwise_and_(_MASK[shift])  # the logical shift of the word: an arithmetic one, sign bits cleared
        x.bitwise_xor_(scratch)
        if factor:
            x.mul_(factor)
    return x


_keys: dict[torch.device, torch.Tensor] = {}  # device -> arange(m) * _GOLDEN, m a power of two <= one slice


def _slice_words(device: torch.device) -> int:
    """Words per slice of the torch path on ``device`` (see ``CPU_SLICE_WORDS``)."""
    return min(TORCH_SLICE_WORDS, CPU_SLICE_WORDS) if device.type == "cpu" else TORCH_SLICE_WORDS


def _position_keys(device: torch.device, n: int) -> torch.Tensor:
    """``arange(n) * 0x9E3779B97F4A7C15`` (wrapping) on ``device``, for ``n <= _slice_words(device)``, kept for
    the next call (at most one slice's worth per device): the word at position ``p`` of a slice that starts
    at word ``s`` gets the key ``keys[p] + s * 0x9E3779B97F4A7C15``, a scalar added to the slice.

    >>> int(_position_keys(torch.device("cpu"), 3)[2]) == _wrap(2 * 0x9E3779B97F4A7C15)
    True
    """
    keys = _keys.get(device)
    most = _slice_words(device)
    if keys is None or keys.numel() < n or keys.numel() > most:
        m = min(most, 1 << max(n - 1, 0).bit_length())
        keys = _keys[device] = torch.arange(m, dtype=torch.int64, device=device) * _GOLDEN
    return keys[:n]


def _word_slices(t: torch.Tensor) -> list[torch.Tensor]:
    """The tensor's bytes as little-endian int64 words, zero-padded to whole words, in slices of at most
    :func:`_slice_words` words (views where the bytes allow it; a copy of one slice at most otherwise: the
    last, padded slice, or a slice whose storage offset is not a multiple of 8 bytes)."""
    check_fingerprintable(t)
    flat = _flat_bits(t)
    raw = flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat
    step = _slice_words(t.device) * _BYTES
    return [_as_words(raw[b:b + step]) for b in range(0, raw.numel(), step)]


def _as_words(raw: torch.Tensor) -> torch.Tensor:
    pad = (-raw.numel()) % _BYTES
    if pad:
        raw = torch.cat([raw, torch.zeros(pad, dtype=torch.uint8, device=raw.device)])
    try:
        return raw.view(torch.int64)
    except RuntimeError:  # storage offset not 8-byte aligned
        return raw.clone().view(torch.int64)


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

    The words go through three buffers of at most one slice (:func:`_slice_words`), every op writing into one of them
    (no temporary is allocated per op): small tensors are batched into one buffer's worth, long ones are read
    slice by slice. Temporary memory: those three buffers and the position keys (:func:`_position_keys`), whatever
    the tensors' sizes."""
    sums = torch.zeros(2, len(tensors), dtype=torch.int64, device=device)
    most = _slice_words(device)
    buffers: list[torch.Tensor] = []  # base (words + keys), x (a lane's terms), scratch: grown as needed

    def sized(n: int) -> list[torch.Tensor]:
        if not buffers or buffers[0].numel() < n:
            buffers.clear()  # the smaller ones go first
            buffers.extend(torch.empty(n, dtype=torch.int64, device=device) for _ in range(3))
        return [b[:n] for b in buffers]

    def lanes(n: int, offset: int) -> Iterator[torch.Tensor]:
        """The two lanes' terms of ``base[:n]`` (words already keyed by position), each in ``x[:n]``: use one
        before asking for the next, which overwrites it; ``offset``: what every key still lacks (a slice's start)."""
        base, x, scratch = sized(n)
        for salt in _LANE_SALTS:
            torch.add(base[:n], _wrap(offset + salt), out=x[:n])
            yield _mix_(x[:n], scratch[:n])

    batch: list[torch.Tensor] = []
    ids: list[int] = []
    held = 0

    def flush() -> None:
        nonlocal held
        if not batch:
            return
        base, x, _ = sized(held)
        torch.cat(batch, out=base)
        torch.cat([_position_keys(device, w.numel()) for w in batch], out=x)
        base.add_(x)
        ends = torch.tensor([w.numel() for w in batch], dtype=torch.int64, device=device).cumsum_(0) - 1
        which = torch.tensor(ids, dtype=torch.int64, device=device)
        for lane, terms in enumerate(lanes(held, 0)):
            at_end = terms.cumsum_(0)[ends]  # running sums (wrapping: exact mod 2**64) at each tensor's last word
            at_end[1:] -= at_end[:-1].clone()
            sums[lane].index_add_(0, which, at_end)
        batch.clear()
        ids.clear()
        held = 0

    for k, t in enumerate(tensors):
        slices = _word_slices(t)
        n = sum(w.numel() for w in slices)
        if n > most:
            start = 0
            for part in slices:
                m = part.numel()
                torch.add(part, _position_keys(device, m), out=sized(m)[0])
                for lane, terms in enumerate(lanes(m, start * _GOLDEN)):
                    sums[lane, k] += terms.sum()
                start += m
            continue
        if held + n > most:
            flush()
        if n:
            batch.extend(slices)
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


# xxhash releases the GIL while it hashes more than 64 KiB (python-xxhash's XXHASH_GIL_MINSIZE): only such
# pieces are worth handing to other threads; smaller ones are hashed in the calling thread.
_GIL_FREE_BYTES = 1 << 16


def _parts_of_many(bufs: Sequence[Any]) -> list[bytes]:
    """The chunk digests of each flat byte buffer (uint8 array or memoryview), concatenated in chunk order.

    The chunks of all the buffers together are shared among ``torch.get_num_threads()`` threads (torch's OpenMP
    team where :mod:`_ompteam` can use it, else a pool of our own), so that a model's many medium tensors (a
    transformer's 2-10 MB matrices) are hashed in parallel, not only the tensors of 16 chunks and more. Only
    pieces xxhash hashes without the GIL go to other threads. The digests do not depend on the thread count.

    >>> import numpy
    >>> _parts_of_many([numpy.zeros(3, numpy.uint8)]) == [xxhash.xxh3_128_digest(bytes(3))]
    True
    """
    out: list[list[bytes]] = [[] for _ in bufs]
    pieces: list[tuple[int, int, Any]] = []  # (buffer, chunk, bytes) hashed in parallel
    for i, buf in enumerate(bufs):
        n = len(buf)
        if n <= _GIL_FREE_BYTES:
            out[i].append(xxhash.xxh3_128_digest(buf) if n else b"")
            continue
        k = -(-n // CHUNK)
        out[i] = [b""] * k
        pieces.extend((i, c, buf[c * CHUNK:(c + 1) * CHUNK] if k > 1 else buf) for c in range(k))
    threads = min(torch.get_num_threads(), len(pieces) // 2)
    if pieces and (threads <= 1 or len(pieces) < min(_TEAM_MIN_CHUNKS, _PARALLEL_MIN_CHUNKS)):
        threads = 1
    bounds = _shares([len(b) for _, _, b in pieces], max(threads, 1))

    def share(j: int) -> None:
        digest = xxhash.xxh3_128_digest
        for i, c, b in pieces[bounds[j]:bounds[j + 1]]:
            out[i][c] = digest(b)

    if threads <= 1:
        share(0)
    elif not (len(pieces) >= _TEAM_MIN_CHUNKS and _ompteam.run(share, threads)):  # on torch's OpenMP threads
        if len(pieces) < _PARALLEL_MIN_CHUNKS:
            for j in range(threads):
                share(j)
        else:
            pool = _executor(threads - 1)
            futures = [pool.submit(share, j) for j in range(1, threads)]
            share(0)  # the calling thread takes the first share
            for f in futures:
                f.result()
    return [b"".join(parts) for parts in out]


def _shares(sizes: Sequence[int], threads: int) -> list[int]:
    """Bounds that cut ``sizes`` (in order) into ``threads`` runs of about equal total size.

    >>> _shares([1, 1, 1, 1], 2)
    [0, 2, 4]
    >>> _shares([4, 1, 1, 1, 1], 2)
    [0, 1, 5]
    """
    total = sum(sizes)
    bounds, acc, j = [0], 0, 1
    for k, n in enumerate(sizes):
        acc += n
        while j < threads and acc * threads >= total * j:
            bounds.append(k + 1)
            j += 1
    bounds.extend([len(sizes)] * (threads + 1 - len(bounds)))
    return bounds


def _xxh3_parts(buf: Any) -> bytes:
    """The chunk digests of a flat byte buffer (uint8 array or memoryview), concatenated in chunk order."""
    return _parts_of_many([buf])[0]


def _cpu_bytes(t: torch.Tensor) -> Any:
    """A buffer of a CPU tensor's bytes: read in place where possible, else copied out through torch."""
    buf = _direct_bytes(t)
    if buf is None:
        check_fingerprintable(t)
        flat = _flat_bits(t)
        buf = (flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat).numpy()
    return buf


def _digest_xxh3(t: torch.Tensor, buf: Any = None, header: bytes | None = None) -> str:
    """The XXH3 fingerprint of a CPU tensor; ``buf``, ``header``: its bytes and header when the caller has them.

    A tensor that another thread ``set_()``s to other memory meanwhile gets its old or its new digest, never a
    mix of the two: the bytes read in place stay allocated while they are hashed, and a shape that changed while
    the header and the bytes were read has them read again."""
    if header is None or buf is None:
        shape = t.shape
        header = header if header is not None else _header(t)
        buf = buf if buf is not None else _cpu_bytes(t)
        if t.shape != shape:  # set_() between the header and the bytes: read both again
            return _digest_xxh3(t)
    parts = xxhash.xxh3_128_digest(buf) if 0 < len(buf) <= CHUNK else _xxh3_parts(buf)  # one chunk: no loop
    return cast(str, xxhash.xxh3_128_hexdigest(header + b"|" + parts))


def _digests_xxh3(tensors: Sequence[torch.Tensor]) -> list[str]:
    """:func:`_digest_xxh3` of many CPU tensors; those read in place have their chunks hashed in parallel together
    (:func:`_parts_of_many`). A tensor whose bytes must be copied out is hashed at once, alone: no more than one
    such copy exists at a time. A tensor ``set_()`` meanwhile is read as in :func:`_digest_xxh3`."""
    out: list[str] = [""] * len(tensors)
    direct: list[tuple[int, bytes, Any]] = []  # (index, header, bytes in place)
    for i, t in enumerate(tensors):
        shape = t.shape
        header = _header(t)
        buf = _direct_bytes(t)
        if buf is None or t.shape != shape:  # copied out, or set_() meanwhile: read again, alone
            out[i] = _digest_xxh3(t)
        else:
            direct.append((i, header, buf))
    hexdigest = xxhash.xxh3_128_hexdigest
    for (i, header, _), parts in zip(direct, _parts_of_many([buf for _, _, buf in direct])):
        out[i] = hexdigest(header + b"|" + parts)
    return out


def plain_cpu_fingerprint(t: torch.Tensor) -> str | None:
    """``fingerprint(t)`` for a plain strided CPU tensor, with the least Python work (the op tracer's hot
    path); ``None`` for every other tensor (other devices, sparse, quantized, nested, or no ``xxhash``)."""
    if (not _XXH3 or not t.is_cpu or t.layout is not torch.strided or t.is_quantized
            or t.is_nested):
        return None
    _usage[ALGORITHM_XXH3] = _usage.get(ALGORITHM_XXH3, 0) + 1
    shape = t.shape
    header = _header_cache.get((t.dtype, shape)) or _header(t)
    buf = _plain_bytes(t) if type(t) in _PLAIN_TENSOR_TYPES else None  # most tensors: read in place
    if t.shape != shape:  # another thread set_() it to other memory between the header and the bytes: again
        return plain_cpu_fingerprint(t)
    if buf is not None and len(buf) <= CHUNK:  # one chunk (most op tensors): no loop, no checks to repeat
        return cast(str, _hexdigest(header + b"|" + _digest(buf)))
    try:
        return _digest_xxh3(t, buf, header)
    except UnfingerprintableError:
        if _changing(t, shape):  # caught halfway through another thread's set_(): its new storage, old shape
            return plain_cpu_fingerprint(t)
        raise


def _changing(t: torch.Tensor, shape: torch.Size, wait_s: float = 0.2) -> bool:
    """Whether ``t``'s shape changes within ``wait_s``: a ``set_()`` in another thread (torch releases the GIL in
    it) can be seen halfway, the storage swapped and the shape not yet. A storage freed to 0 bytes (FSDP frees
    its unsharded parameters so) is not waited for."""
    if t.untyped_storage().nbytes() == 0:
        return False
    deadline = time.monotonic() + wait_s
    while t.shape == shape:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


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
            algorithm, fps = ALGORITHM_XXH3, _digests_xxh3(group)
        else:
            algorithm, fps = ALGORITHM_TORCH, _digests_torch(group, device)
        _usage[algorithm] = _usage.get(algorithm, 0) + len(group)
        for j, fp in zip(idx, fps):
            out[j] = fp
    return out


