"""Exact, fast tensor fingerprints computed on the tensor's own device.

A fingerprint is a 128-bit digest of a tensor's bytes, dtype and shape, written as 32 hex digits. There are two
algorithms, each named by a tag that run directories record (``fingerprint_algorithm`` in ``manifest.json``):
equal bytes give equal fingerprints under one algorithm, on every device and thread count; fingerprints taken
with different algorithms are not comparable, and ``torchrepro diff`` says so instead of comparing them.

``xxh3-128-chunks-1MiB/1`` (CPU tensors, when ``xxhash`` and NumPy are installed):

1. The tensor's bytes (C order) are cut into chunks of 1 MiB (``CHUNK`` bytes; the last one shorter).
2. Each chunk is hashed with XXH3-128; the 16-byte digests are in canonical (big-endian) byte order. Large
   tensors have their chunks hashed in parallel (``torch.get_num_threads()`` shares, on torch's own OpenMP
   threads where possible: see ``_ompteam``); the result does not depend on the thread count.
3. The fingerprint is XXH3-128 of ``"{dtype}|{shape}|{nbytes}|"`` (UTF-8, e.g. ``torch.float32|(3, 4)|48|``)
   followed by the chunk digests in order.

``splitmix64-sum-128/1`` (tensors on other devices, computed there with no device-to-host copy of the data;
and CPU tensors when ``xxhash`` or NumPy is missing):

1. The bytes are zero-padded to a multiple of 8 and read as little-endian 64-bit words ``w_i``.
2. For two salts ``s``, lane ``L_s`` is the sum mod 2**64 of ``splitmix64(w_i + i * 0x9E3779B97F4A7C15 + s)``
   (the splitmix64 finaliser is a bijection; integer addition is associative, so the sum is exact and the
   same in any order). Long tensors are processed in slices of ``TORCH_SLICE_WORDS`` words to bound memory.
3. The fingerprint is BLAKE2b-128 of ``"{dtype}|{shape}|{nbytes}"`` followed by ``L_0`` and ``L_1`` (8 bytes
   each, little-endian).

Tensors that are not plain strided arrays are digested through the dense tensors that hold their bits:
sparse COO tensors through their coalesced indices and values, CSR/CSC/BSR/BSC tensors through their
compressed indices, plain indices and values, quantized tensors through their integer representation and
quantization parameters, nested tensors through their components, MKL-DNN tensors through their dense copy.
The digest of such a tensor is BLAKE2b-128 over a header (layout, dtype, shape, ...) and the fingerprints of
those parts. A DTensor (FSDP2, tensor parallel) is fingerprinted as its local shard, with no collective
(``_core/dtensor``). Every dtype torch has (float8 and float4 variants, bool, complex, unsigned and sub-byte integers,
bit types) is read as raw bytes. Plain contiguous CPU tensors are hashed in place; others are copied out first
(same digest). Only tensors without data of their own cannot be fingerprinted: ``meta`` tensors, tensors whose
storage was freed or shrunk under them, tensors inside ``torch.func`` transforms.

Guarantees: no known blind spot. Any change of bytes, including a swap of two different values at any
distance, changes the fingerprint except with the probability of a collision of the underlying 128-bit hash
(XXH3-128), or about 2**-64 for the keyed sums (a change of one 8-byte word always changes them: the
finaliser is a bijection). Runs recorded before the algorithm was named used ``fold63-splitmix64/0``
(``LEGACY_ALGORITHM``), which missed swaps of words 63 apart.

Example:
    >>> import torch, torchrepro
    >>> torchrepro.fingerprint(torch.zeros(3)) == torchrepro.fingerprint(torch.zeros(3))
    True
    >>> torchrepro.fingerprint(torch.zeros(3)) == torchrepro.fingerprint(torch.zeros(3, dtype=torch.float64))
    False
"""

from __future__ import annotations

import array
import ctypes
import enum
import hashlib
import os
import re
import struct
import sys
import types
from collections.abc import Mapping, Sequence
from typing import Any, cast

import torch

from . import dtensor as _dtensor
from . import ompteam as _ompteam
from .compat import np, optional_import

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


class UnfingerprintableError(TypeError):
    """A tensor whose bytes cannot be read (a meta tensor, or a tensor subclass without readable storage)."""


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 words."""
    return (x >> s) & _MASK[s]


def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 finaliser: a bijection on 64-bit words (wrapping int64 arithmetic)."""
    x = (x ^ _shr(x, 30)) * _M1
    x = (x ^ _shr(x, 27)) * _M2
    return x ^ _shr(x, 31)


def _check_readable(t: torch.Tensor) -> None:
    """Raise :class:`UnfingerprintableError` when :func:`fingerprint` cannot read ``t`` at all."""
    if t.device.type == "meta":
        raise UnfingerprintableError("cannot fingerprint a meta tensor (it has no data)")
    if _is_transform_wrapper(t):
        raise UnfingerprintableError("the tensor has no storage of its own (a torch.func transform's wrapper: "
                                     "vmap, grad, functionalize); fingerprint it outside torch.func transforms")
    if t.layout not in _PARTS and not getattr(t, "is_nested", False):
        raise UnfingerprintableError(f"cannot fingerprint a tensor with layout {t.layout} (no known way to "
                                     "read its bits); convert it with .to_dense() first")


def _check_storage_covers(t: torch.Tensor) -> None:
    """Raise :class:`UnfingerprintableError` when a CPU tensor reaches past the end of its storage (a storage
    resized or freed under it, e.g. by FSDP's ``resize_(0)``): reading it would read memory it does not own."""
    if t.numel() == 0:
        return
    try:
        have = t.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        if type(t) in _PLAIN_TENSOR_TYPES:  # e.g. a tensor seen inside torch.func.vmap/grad: no bytes of its own
            raise UnfingerprintableError(f"the tensor has no storage of its own ({exc}); fingerprint it outside "
                                         "torch.func transforms (vmap, grad, functionalize)") from None
        return  # a tensor subclass without storage: read through its own ops
    last = t.storage_offset() + sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()))
    need = (last + 1) * t.element_size()
    if need > have:
        raise UnfingerprintableError(f"the tensor needs {need} bytes of storage but its storage holds {have} "
                                     "(freed or resized under it, e.g. by `storage().resize_(0)`): it has no "
                                     "data to read")


def check_fingerprintable(t: torch.Tensor) -> None:
    """Raise :class:`UnfingerprintableError` unless ``t``'s bytes can be read directly from its own storage.

    For callers that key caches on storage (the op tracer): sparse, nested and meta tensors have no single
    storage to read. :func:`fingerprint` itself reads sparse and nested tensors through their parts.
    """
    _check_readable(t)
    if t.layout in _DIRECT_LAYOUTS and not getattr(t, "is_nested", False):
        if t.device.type == "cpu" and not t.is_quantized:  # quint4x2 and friends pack several values per byte
            _check_storage_covers(t)
        return
    kind = "a nested tensor" if getattr(t, "is_nested", False) else f"a tensor with layout {t.layout}"
    raise UnfingerprintableError(f"{kind} has no single storage to read directly (fingerprint() reads it "
                                 "through its parts)")


def _sparse_coo_parts(t: torch.Tensor) -> tuple[str, list[torch.Tensor]]:
    c = t if t.is_coalesced() else t.coalesce()  # the canonical form: sorted, duplicate indices summed
    return f"{c.sparse_dim()}|{c.dense_dim()}", [c._indices(), c._values()]


def _compressed_parts(t: torch.Tensor) -> tuple[str, list[torch.Tensor]]:
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return "rows", [t.crow_indices(), t.col_indices(), t.values()]
    return "cols", [t.ccol_indices(), t.row_indices(), t.values()]


_PARTS = {  # layout -> (header detail, the dense tensors that hold the bits); strided tensors are read directly
    torch.strided: None,
    torch.sparse_coo: _sparse_coo_parts,
    torch.sparse_csr: _compressed_parts,
    torch.sparse_csc: _compressed_parts,
    torch.sparse_bsr: _compressed_parts,
    torch.sparse_bsc: _compressed_parts,
    torch._mkldnn: lambda t: ("", [t.to_dense()]),  # type: ignore[attr-defined]
}
_DIRECT_LAYOUTS = {torch.strided}


def _quantized_parts(t: torch.Tensor) -> tuple[str, list[torch.Tensor]]:
    scheme = t.qscheme()
    if scheme in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        return f"{scheme}|{float(t.q_scale()).hex()}|{int(t.q_zero_point())}", [t.int_repr()]
    return (f"{scheme}|axis{t.q_per_channel_axis()}",
            [t.int_repr(), t.q_per_channel_scales(), t.q_per_channel_zero_points()])


def _composite(t: torch.Tensor) -> tuple[str, list[torch.Tensor]] | None:
    """For a tensor that is not a plain strided array: a header and the dense tensors holding its bits."""
    _check_readable(t)
    if getattr(t, "is_nested", False):
        parts = list(t.detach().unbind())
        return f"nested|{t.layout}|{t.dtype}|{len(parts)}", parts
    if t.is_quantized:
        detail, parts = _quantized_parts(t.detach())
    else:
        split = _PARTS[t.layout]
        if split is None:
            return None
        detail, parts = split(t.detach())
    return f"{t.layout}|{t.dtype}|{tuple(t.shape)}|{detail}", parts


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _flat_bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements, C order, as a contiguous 1-D tensor with the same bytes.

    Elements are reinterpreted as integers of the same width first: float8, bits and sub-byte dtypes have
    no copy kernels, and reinterpreting keeps every bit (a float copy could canonicalise NaN payloads)."""
    if t.numel() == 0:  # no bytes; a strided empty view (``x[::2]`` of an empty x) cannot be reinterpreted
        return torch.empty(0, dtype=torch.uint8, device=t.device)
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    as_int = _SAME_SIZE_INT.get(t.element_size())
    if as_int is not None and t.dtype != as_int and not t.is_contiguous():
        t = t.view(as_int)
    return t.contiguous().reshape(-1)


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


def fingerprint(t: torch.Tensor) -> str:
    """A 32-hex-digit exact digest of ``t``'s bits, dtype and shape (see the module docs).

    Raises :class:`UnfingerprintableError` for meta tensors (they hold no data).
    """
    return fingerprint_many([t])[0]


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


# One ctypes array type spanning the address space: a tensor's bytes are a slice of a view of it at the tensor's
# address (a type per size would be cached by ctypes forever).
_ADDRESS_SPACE = ctypes.c_ubyte * (sys.maxsize // 2)
_PLAIN_TENSOR_TYPES = frozenset({torch.Tensor, torch.nn.Parameter})
# A tensor seen inside torch.func transforms (vmap, grad, functionalize) wraps another: its data pointer and
# storage are not its bytes (functionalize even reports a fake address).
_is_transform_wrapper = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor",
                                lambda t: False)


def _direct_bytes(t: torch.Tensor) -> Any:
    """A buffer of the bytes of a plain, contiguous, non-empty CPU tensor, in place (no torch op, no copy; read
    only: a read-only memoryview, or for small tensors a ctypes array of their size); ``None`` for any other
    tensor (subclasses, views with conjugate/negative bits, non-contiguous or empty tensors, memory the
    tensor's storage does not cover). The op tracer's hot path: ~4x cheaper than
    ``detach().reshape(-1).view(uint8).numpy()``, which goes through the dispatcher three times."""
    if (type(t) not in _PLAIN_TENSOR_TYPES or not t.is_cpu or t.layout is not torch.strided or t.is_quantized
            or t.is_nested):
        return None
    return _plain_bytes(t)


_SMALL_BYTES = 1 << 14  # tensors up to this size are read through a ctypes array type of their own size
_small_types: dict[int, Any] = {}  # nbytes -> ctypes.c_ubyte * nbytes (bounded: see _plain_bytes)


def _plain_bytes(t: torch.Tensor) -> Any:
    """:func:`_direct_bytes` for a tensor already known to be a plain strided CPU tensor (not quantized or
    nested): a buffer of its bytes, or ``None``. Small tensors get a ctypes array of their own size (ten times
    cheaper to make than a slice of the address-space view); the array holds the storage like the view does."""
    if not t.is_contiguous() or t.is_conj() or t.is_neg() or _is_transform_wrapper(t):
        return None
    try:
        n = t.nbytes
        ptr = t.data_ptr()
        storage = t.untyped_storage()
        start = storage.data_ptr()
    except RuntimeError:  # no storage (a tensor inside vmap or grad): the checked path says why
        return None
    if n <= 0 or not ptr or ptr < start or ptr + n > start + storage.nbytes():  # e.g. a storage resized to 0
        return None
    if n <= _SMALL_BYTES:
        kind = _small_types.get(n)
        if kind is None:
            if len(_small_types) >= 4096:  # ever new sizes: stay bounded
                _small_types.clear()
            kind = _small_types[n] = ctypes.c_ubyte * n
        small: Any = kind.from_address(ptr)
        small.storage = storage  # the memory stays allocated while the array lives
        return small
    view = _ADDRESS_SPACE.from_address(ptr)
    view.storage = storage  # type: ignore[attr-defined]  # the memory stays allocated while the view lives, even if the tensor is set_() away
    return memoryview(view)[:n].toreadonly()


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


_STRIDED = torch.strided
_QUANTIZED_DTYPES = frozenset(getattr(torch, name) for name in ("qint8", "quint8", "qint32", "quint4x2", "quint2x4")
                              if hasattr(torch, name))
_COMPLEX_DTYPES = frozenset(d for d in (getattr(torch, n, None) for n in ("complex32", "complex64", "complex128",
                                                                          "chalf", "cfloat", "cdouble"))
                            if d is not None)


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


# --- Python structures holding tensors (data batches) -------------------------------------------------------
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
