"""Exact, fast tensor fingerprints computed on the tensor's own device (layer L0).

A fingerprint is a 128-bit digest of a tensor's bytes, dtype and shape, written as 32 hex digits.

Algorithm (documented so that other tools can reproduce it):

1. The tensor's bytes (C order) are zero-padded to a multiple of 8 and read as little-endian int64 words.
2. Tensors of at least ``2 * STRIDE`` words are first folded: word ``i`` is added (mod 2**64) into
   column sums by overlapping rows of ``STRIDE + 1`` words taken every ``STRIDE`` words, which groups
   words by ``i mod STRIDE``. Integer addition is associative, so this reduction is exact and the same
   on every device and thread count. Words after the last full row are kept as they are.
3. Each remaining word ``u_k`` (column sums, then tail words) is keyed by its position ``k`` and passed
   through the splitmix64 finaliser, a bijection; two lanes with different keys are summed mod 2**64.
4. The two lane sums, the dtype, the shape and the byte count are hashed with BLAKE2b-128 on the host.

Tensors that are not plain strided arrays are digested through the dense tensors that hold their bits:
sparse COO tensors through their coalesced indices and values, CSR/CSC/BSR/BSC tensors through their
compressed indices, plain indices and values, quantized tensors through their integer representation and
quantization parameters, nested tensors through their components, MKL-DNN tensors through their dense copy.
The digest of such a tensor is BLAKE2b-128 over a header (layout, dtype, shape, ...) and the fingerprints of
those parts. Every dtype torch has (float8 and float4 variants, bool, complex, unsigned and sub-byte integers,
bit types) is read as raw bytes. Only tensors without data (``meta``) cannot be fingerprinted.

Guarantees: any change of a single bit changes the fingerprint; swapping two different values changes
it, except for the documented blind spot: in tensors of at least ``2 * STRIDE`` words (1,008 bytes),
swapping two 8-byte words whose word indices differ by a multiple of ``STRIDE`` (63 words, 504
bytes) can leave the column sums, and so the fingerprint, unchanged (it always does when neither index is
itself a multiple of ``STRIDE``). For float32 that means two elements 126 positions apart (or a multiple),
in the same half of their 8-byte word. Other collisions happen with
probability about 2**-64 per compared pair.

Example:
    >>> import torch, torchrepro
    >>> torchrepro.fingerprint(torch.zeros(3)) == torchrepro.fingerprint(torch.zeros(3))
    True
    >>> torchrepro.fingerprint(torch.zeros(3)) == torchrepro.fingerprint(torch.zeros(3, dtype=torch.float64))
    False
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch

from ._compat import np

STRIDE = 63
_ROW = STRIDE + 1
_BYTES = 8

# splitmix64 constants as signed int64 (torch has no uint64 arithmetic on every device).
_M1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_M2 = 0x94D049BB133111EB - (1 << 64)
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_LANE_SALTS = (0x243F6A8885A308D3, 0x13198A2E03707344)
_MASK = {s: (1 << (64 - s)) - 1 for s in (30, 27, 31)}


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


def check_fingerprintable(t: torch.Tensor) -> None:
    """Raise :class:`UnfingerprintableError` when ``t``'s bytes cannot be read."""
    if t.device.type == "meta":
        raise UnfingerprintableError("cannot fingerprint a meta tensor (it has no data)")
    if t.layout not in _PARTS and not getattr(t, "is_nested", False):
        raise UnfingerprintableError(f"cannot fingerprint a tensor with layout {t.layout} (no known way to "
                                     "read its bits); convert it with .to_dense() first")


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


def _quantized_parts(t: torch.Tensor) -> tuple[str, list[torch.Tensor]]:
    scheme = t.qscheme()
    if scheme in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        return f"{scheme}|{float(t.q_scale()).hex()}|{int(t.q_zero_point())}", [t.int_repr()]
    return (f"{scheme}|axis{t.q_per_channel_axis()}",
            [t.int_repr(), t.q_per_channel_scales(), t.q_per_channel_zero_points()])


def _composite(t: torch.Tensor) -> tuple[str, list[torch.Tensor]] | None:
    """For a tensor that is not a plain strided array: a header and the dense tensors holding its bits."""
    check_fingerprintable(t)
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


def _fold(words: torch.Tensor) -> torch.Tensor:
    """Reduce long word vectors to STRIDE + 1 column sums plus a short tail (exact, order-free)."""
    n = words.numel()
    if n < 2 * STRIDE:
        return words
    rows = (n - _ROW) // STRIDE + 1
    cols = words.as_strided((rows, _ROW), (STRIDE, 1)).sum(0)
    return torch.cat([cols, words[(rows - 1) * STRIDE + _ROW :]])


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
    """Lane sums of tensors on one device, computed there with one device-to-host copy."""
    us = [_fold(_words(t)) for t in tensors]
    lengths = [u.numel() for u in us]
    u = torch.cat(us) if len(us) > 1 else us[0]
    sizes = torch.tensor(lengths, dtype=torch.int64, device=device)
    seg = torch.repeat_interleave(torch.arange(len(us), device=device), sizes)
    starts = torch.cumsum(sizes, 0) - sizes
    pos = torch.arange(u.numel(), dtype=torch.int64, device=device) - starts[seg]
    terms = _lanes(u, pos)
    sums = torch.zeros(2, len(us), dtype=torch.int64, device=device).index_add_(1, seg, terms)
    return [(a, b) for a, b in sums.t().tolist()]


# --- CPU fast path: the same arithmetic in NumPy uint64, which has far less per-call overhead than torch ---
_TORCH_FOLD_MIN_WORDS = 1 << 16  # longer tensors are folded by torch (multi-threaded), the rest by NumPy
_NP_CONSTS = None


def _np_consts() -> tuple:
    global _NP_CONSTS
    if _NP_CONSTS is None:
        u = np.uint64
        salts = np.array(_LANE_SALTS, dtype=np.uint64).reshape(2, 1)
        _NP_CONSTS = (u(_M1 % (1 << 64)), u(_M2 % (1 << 64)), u(_GOLDEN % (1 << 64)), salts, u(30), u(27), u(31))
    return _NP_CONSTS


def _np_mix(x: Any) -> Any:
    m1, m2, _, _, s30, s27, s31 = _np_consts()
    x = (x ^ (x >> s30)) * m1
    x = (x ^ (x >> s27)) * m2
    return x ^ (x >> s31)


def _np_lane_terms(u: Any, pos: Any) -> Any:
    """Both keyed lanes at once: shape (2, len(u))."""
    _, _, golden, salts, *_ = _np_consts()
    return _np_mix((u + pos * golden)[None, :] + salts)  # uint64 array arithmetic wraps silently


def _np_words(t: torch.Tensor) -> Any:
    """A CPU tensor's bytes as a NumPy uint64 array (zero-copy when contiguous and whole words).

    The bytes are taken through a torch ``uint8`` view, so dtypes NumPy lacks (bfloat16, float8, bits, ...)
    are read like any other."""
    flat = _flat_bits(t)
    raw = (flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat).numpy()
    pad = (-raw.size) % _BYTES
    if pad:
        raw = np.concatenate([raw, np.zeros(pad, dtype=np.uint8)])
    return raw.view(np.uint64)


def _np_folded(t: torch.Tensor) -> Any:
    if t.numel() * t.element_size() >= _TORCH_FOLD_MIN_WORDS * _BYTES:
        return _fold(_words(t)).numpy().view(np.uint64)
    w = _np_words(t)
    n = w.size
    if n < 2 * STRIDE:
        return w
    rows = (n - _ROW) // STRIDE + 1
    cols = np.lib.stride_tricks.as_strided(w, (rows, _ROW), (STRIDE * 8, 8)).sum(axis=0, dtype=np.uint64)
    return np.concatenate([cols, w[(rows - 1) * STRIDE + _ROW :]])


def _lane_sums_numpy(tensors: Sequence[torch.Tensor]) -> list[tuple[int, int]]:
    if len(tensors) == 1:  # the common case in the op tracer: no segment bookkeeping
        u = _np_folded(tensors[0])
        a, b = _np_lane_terms(u, np.arange(u.size, dtype=np.uint64)).sum(axis=1, dtype=np.uint64).tolist()
        return [(a, b)]
    us = [_np_folded(t) for t in tensors]
    sizes = np.fromiter((u.size for u in us), dtype=np.int64, count=len(us))
    u = np.concatenate(us)
    if u.size == 0:
        return [(0, 0)] * len(us)
    starts = np.cumsum(sizes) - sizes
    pos = np.arange(u.size, dtype=np.uint64) - np.repeat(starts.astype(np.uint64), sizes)
    terms = _np_lane_terms(u, pos)
    nonempty = sizes > 0
    sums = np.zeros((2, len(us)), dtype=np.uint64)
    sums[:, nonempty] = np.add.reduceat(terms, starts[nonempty], axis=1, dtype=np.uint64)
    return list(zip(*sums.tolist()))


def fingerprint_many(tensors: Sequence[torch.Tensor]) -> list[str]:
    """Fingerprints of many tensors with one device-to-host copy per device.

    Equal to ``[fingerprint(t) for t in tensors]``. CPU tensors use a NumPy path with the same arithmetic
    (when NumPy is installed); other devices compute on the device and copy back two words per tensor.
    """
    if not tensors:
        return []
    dense: list[torch.Tensor] = []
    plan: list[tuple[str | None, int, int]] = []  # (header of a composite tensor or None, first part, parts)
    for t in tensors:
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
    lanes: list[tuple[int, int]] = [(0, 0)] * len(tensors)
    for device, idx in by_device.items():
        group = [tensors[i] for i in idx]
        sums = _lane_sums_numpy(group) if device.type == "cpu" and np is not None else _lane_sums_torch(group, device)
        for j, lane in zip(idx, sums):
            lanes[j] = lane
    return [_finish(t, lane) for t, lane in zip(tensors, lanes)]
