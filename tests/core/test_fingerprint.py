from __future__ import annotations

import collections
import copy
import dataclasses
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import torchrepro
from torchrepro._core.fingerprint import (
    UnfingerprintableError,
    UnreadableError,
    fingerprint,
    fingerprint_many,
    fingerprint_object,
)

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128]


def _sample(dtype: torch.dtype, n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(n, generator=g, dtype=dtype)
    return torch.randint(0, 100, (n,), generator=g, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_is_stable_and_bit_exact(dtype):
    t = _sample(dtype, 1000)
    fp = fingerprint(t)
    assert len(fp) == 32 and fp == fingerprint(t.clone())
    u = t.clone()
    u.view(torch.uint8)[5] ^= 1  # one bit of one element
    assert fingerprint(u) != fp


def test_dtype_and_shape_are_part_of_the_digest():
    t = torch.zeros(6)
    assert fingerprint(t) != fingerprint(t.view(2, 3))
    assert fingerprint(t) != fingerprint(t.view(torch.int32))
    assert fingerprint(torch.zeros(0)) != fingerprint(torch.zeros(0, 3))


def test_non_contiguous_and_0d_and_views():
    a = torch.randn(8, 9)
    assert fingerprint(a.t()) == fingerprint(a.t().contiguous())
    assert fingerprint(a[:, 1:4]) == fingerprint(a[:, 1:4].clone())
    assert fingerprint(torch.tensor(1.5)) == fingerprint(torch.tensor(1.5))
    assert fingerprint(torch.tensor(1.5)) != fingerprint(torch.tensor(-1.5))
    x = torch.arange(100, dtype=torch.int16)
    assert fingerprint(x[3:50]) == fingerprint(x[3:50].clone())  # misaligned storage offset
    c = torch.randn(4, dtype=torch.complex64)
    assert fingerprint(c.conj()) == fingerprint(c.conj().resolve_conj())
    assert fingerprint(c.conj()) != fingerprint(c)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 3000), data=st.data())
def test_any_single_bit_flip_changes_it(n, data):
    t = _sample(torch.float32, n, seed=n)
    byte = data.draw(st.integers(0, 4 * n - 1))
    bit = data.draw(st.integers(0, 7))
    u = t.clone()
    u.view(torch.uint8)[byte] ^= 1 << bit
    assert fingerprint(u) != fingerprint(t)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(2, 3000), data=st.data())
def test_swapping_two_different_values_changes_it(n, data):
    t = _sample(torch.float64, n, seed=n)
    i = data.draw(st.integers(0, n - 1))
    j = data.draw(st.integers(0, n - 1).filter(lambda j: j != i))
    u = t.clone()
    u[i], u[j] = t[j], t[i]
    assert fingerprint(u) != fingerprint(t)


def test_many_matches_single():
    ts = [_sample(d, n) for d in DTYPES for n in (1, 7, 300)] + [torch.tensor(2.0), torch.zeros(0)]
    assert fingerprint_many(ts) == [fingerprint(t) for t in ts]
    assert fingerprint_many([]) == []


def test_unfingerprintable_tensors_raise():
    with pytest.raises(UnfingerprintableError, match="meta tensor"):
        fingerprint(torch.empty(3, device="meta"))
    with pytest.raises(UnfingerprintableError, match="meta tensor"):
        fingerprint_many([torch.zeros(2), torch.empty(3, device="meta")])


def test_check_fingerprintable_is_about_reading_one_storage_directly():
    """The op tracer keys its cache on storage: sparse tensors stay "unfingerprintable" there."""
    from torchrepro._core.fingerprint import check_fingerprintable

    check_fingerprintable(torch.zeros(3))
    sp = torch.eye(3).to_sparse()
    with pytest.raises(UnfingerprintableError, match="layout torch.sparse_coo has no single storage"):
        check_fingerprintable(sp)
    assert len(fingerprint(sp)) == 32


QUANTIZED = {torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4}
ALL_DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)} - QUANTIZED, key=str)


def _random_bytes_as(dtype: torch.dtype, n: int = 300) -> torch.Tensor:
    size = torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=torch.Generator().manual_seed(n))
    return (raw & 1 if dtype == torch.bool else raw).view(dtype)  # bool bytes other than 0 and 1 are invalid


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_torch_dtype_is_read_bit_exactly(dtype):
    """float8/float4, bits, sub-byte and wide unsigned ints: NumPy lacks them, the bytes are read anyway."""
    from torchrepro._core.fingerprint import _digests_torch

    t = _random_bytes_as(dtype)
    fp = fingerprint(t)
    copy = t.view(torch.uint8).clone().view(dtype)  # some of these dtypes have no copy kernel
    assert fp == fingerprint(copy) and len(fp) == 32
    copy.view(torch.uint8)[7] ^= 1
    assert fingerprint(copy) != fp
    strided = t.view(10, -1)[:, 1:5]  # not contiguous: read through the integer view of the same width
    assert fingerprint(strided) == fingerprint(strided.view(torch.uint8).contiguous().view(dtype))
    on_device = _digests_torch([t], torch.device("cpu"))[0]
    assert on_device != _digests_torch([copy], torch.device("cpu"))[0]
    assert on_device == _digests_torch([t.view(torch.uint8).clone().view(dtype)], torch.device("cpu"))[0]


def test_strided_1d_views_are_read():
    x = torch.arange(20, dtype=torch.float32)
    assert fingerprint(x[::2]) == fingerprint(x[::2].clone())
    assert fingerprint(x[::2]) != fingerprint(x[1::2])


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_sparse_coo_is_its_coalesced_indices_and_values():
    i = torch.tensor([[0, 2, 0], [1, 0, 1]])
    v = torch.tensor([1.0, 2.0, 3.0])
    t = torch.sparse_coo_tensor(i, v, (3, 3))  # uncoalesced: (0, 1) twice, as nn.Embedding(sparse=True) grads
    fp = fingerprint(t)
    assert fp == fingerprint(t.coalesce()) == fingerprint(t.clone())
    assert fp != fingerprint(t.to_dense()) and fp != fingerprint(t.coalesce().to_sparse_csr())
    w = v.clone()
    w.view(torch.uint8)[1] ^= 1  # one bit of one value
    assert fingerprint(torch.sparse_coo_tensor(i, w, (3, 3))) != fp
    assert fingerprint(torch.sparse_coo_tensor(i.roll(1, 0), v, (3, 3))) != fp  # values at other indices
    assert fingerprint(torch.sparse_coo_tensor(i, v, (3, 4))) != fp  # shape
    assert fingerprint(torch.sparse_coo_tensor(i, v.double(), (3, 3))) != fp  # dtype
    emb = nn.Embedding(10, 3, sparse=True)
    emb(torch.tensor([1, 2, 1])).sum().backward()
    assert fingerprint(emb.weight.grad) == fingerprint(emb.weight.grad.coalesce())


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("to", ["to_sparse_csr", "to_sparse_csc", "bsr", "bsc"])
def test_compressed_sparse_layouts(to):
    d = torch.zeros(4, 4)
    d[0, 1], d[2, 3], d[3, 0] = 1.5, -2.0, 4.0
    convert = {"bsr": lambda x: x.to_sparse_bsr((2, 2)), "bsc": lambda x: x.to_sparse_bsc((2, 2))}.get(
        to, lambda x: getattr(x, to)())
    t = convert(d)
    fp = fingerprint(t)
    assert fp == fingerprint(convert(d.clone())) and fp != fingerprint(d)
    e = d.clone()
    e.view(torch.int32)[2, 3] ^= 1
    assert fingerprint(convert(e)) != fp
    assert fingerprint_many([t, d, t]) == [fp, fingerprint(d), fp]


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("dtype", sorted(QUANTIZED, key=str), ids=str)
def test_quantized_tensors(dtype):
    x = torch.randn(16, generator=torch.Generator().manual_seed(0))
    q = torch.quantize_per_tensor(x, 0.1, 3, dtype)
    fp = fingerprint(q)
    assert fp == fingerprint(torch.quantize_per_tensor(x.clone(), 0.1, 3, dtype))
    assert fp != fingerprint(torch.quantize_per_tensor(x, 0.2, 3, dtype))  # the scale is part of the value
    assert fp != fingerprint(torch.quantize_per_tensor(x + 1, 0.1, 3, dtype))
    if dtype in (torch.qint8, torch.quint8):
        pc = torch.quantize_per_channel(x.view(4, 4), torch.tensor([0.1, 0.2, 0.3, 0.4]), torch.zeros(4).long(),
                                        0, dtype)
        pc2 = torch.quantize_per_channel(x.view(4, 4), torch.tensor([0.1, 0.2, 0.3, 0.5]), torch.zeros(4).long(),
                                         0, dtype)
        assert fingerprint(pc) != fingerprint(pc2)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("layout", [torch.jagged, torch.strided], ids=str)
def test_nested_tensors(layout):
    a, b = torch.randn(2, 3), torch.randn(4, 3)
    nt = torch.nested.nested_tensor([a, b], layout=layout)
    fp = fingerprint(nt)
    assert fp == fingerprint(torch.nested.nested_tensor([a.clone(), b.clone()], layout=layout))
    assert fp != fingerprint(torch.nested.nested_tensor([b, a], layout=layout))
    c = b.clone()
    c.view(torch.uint8)[0, 0] ^= 1
    assert fp != fingerprint(torch.nested.nested_tensor([a, c], layout=layout))


def test_public_api():
    assert torchrepro.fingerprint is fingerprint
    assert sorted(torchrepro.__all__) == torchrepro.__all__
    for name in torchrepro.__all__:
        assert hasattr(torchrepro, name), name


# --- fingerprint_object: Python structures holding tensors (batches) ---------------------------------------
class _Point:
    def __init__(self, x, y):
        self.x, self.y = x, y


class _Slotted:
    __slots__ = ("a", "b")

    def __init__(self, a, b):
        self.a, self.b = a, b


@dataclasses.dataclass
class _DC:
    t: torch.Tensor
    n: int


_NT = collections.namedtuple("_NT", ["a", "b"])


def _same(a, b) -> bool:
    return fingerprint_object(a) == fingerprint_object(b)


def test_objects_are_read_by_value_not_by_identity_or_repr():
    t = torch.arange(5000.0)
    assert _same(_Point(t, "a"), _Point(t.clone(), "a"))  # two objects at different addresses
    u = t.clone()
    u[2500] += 1  # repr() of a 5000-element tensor elides the middle
    assert not _same(_Point(t, "a"), _Point(u, "a"))
    assert repr(t) == repr(u)
    assert _same(_Slotted(1, t), _Slotted(1, t.clone())) and not _same(_Slotted(1, t), _Slotted(2, t))
    assert _same(_DC(t, 3), _DC(t.clone(), 3)) and not _same(_DC(t, 3), _DC(t, 4))
    assert not _same(_NT(1, 2), (1, 2)) and not _same(_NT(1, 2), _NT(2, 1))
    assert not _same(_Point(1, 2), _Slotted(1, 2))  # the type is part of the value


@pytest.mark.parametrize("a, b", [
    (1, 2), (1, 1.0), (True, 1), (0.0, -0.0), (float("nan"), float("-nan")), ("a", b"a"), ("ab", ["a", "b"]),
    (None, 0), (1 + 2j, 1 - 2j), (list(range(100)), list(range(99)) + [100]), ([0.5] * 50, [0.5] * 49 + [0.25]),
    (torch.float32, torch.float64), ({"a": 1, "b": 2}, {"b": 2, "a": 1}), ({"a": 1}, {"a": 2}),
    ((1, (2, 3)), ((1, 2), 3)), ([[1], [2]], [[1, 2]]), (torch.zeros(2), torch.zeros(2).numpy()),
])
def test_different_values_have_different_fingerprints(a, b):
    assert fingerprint_object(a) == fingerprint_object(copy.deepcopy(a))
    assert fingerprint_object(a) != fingerprint_object(b)


def test_numpy_values_bytes_and_sets():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert _same(x, x.copy()) and _same(x.T, np.ascontiguousarray(x.T))
    assert not _same(x, x.astype(np.float64)) and not _same(x, x.reshape(4, 3))
    y = x.copy()
    y.reshape(-1).view(np.uint8)[17] ^= 1
    assert not _same(x, y)
    assert not _same(np.float32(1), np.float64(1)) and _same(np.int64(7), np.int64(7))
    assert not _same(np.array(["a", "b"]), np.array(["a", "c"]))
    assert _same(np.array([_Point(1, 2)], dtype=object), np.array([_Point(1, 2)], dtype=object))
    assert not _same(b"\x00\x01", bytearray(b"\x00\x02"))
    assert _same({"x", "y", "z"}, {"z", "y", "x"}) and not _same({"x", "y"}, {"x", "z"})


def test_cycles_depth_and_unreadable_parts():
    a: list = [1]
    a.append(a)
    b: list = [1]
    b.append(b)
    assert _same(a, b) and not _same(a, [1, [1]])
    p = _Point(1, None)
    p.y = p
    assert _same(p, p)
    deep: list = []
    for _ in range(40):
        deep = [deep]
    with pytest.raises(UnreadableError, match=r"nested more than 32 levels deep"):
        fingerprint_object(deep)
    with pytest.raises(UnreadableError, match=r"more than 10 elements"):
        fingerprint_object([[1, 2, 3]] * 5, max_nodes=10)
    with pytest.raises(UnreadableError, match=r"^batch\['meta'\]\.lock: cannot read an object of type _thread\.lock"):
        fingerprint_object({"x": torch.zeros(1), "meta": _Locked()})
    with pytest.raises(UnreadableError, match=r"^batch\[1\]: .*meta tensor"):
        fingerprint_object((torch.zeros(1), torch.empty(2, device="meta")))
    assert fingerprint_object(_Point(len, _Point)) == fingerprint_object(_Point(len, _Point))  # by name


class _Locked:
    def __init__(self):
        self.lock = threading.Lock()


def test_c_objects_are_read_through_their_pickle_state():
    import datetime
    import functools

    assert _same(functools.partial(max, 1), functools.partial(max, 1))
    assert not _same(functools.partial(max, 1), functools.partial(max, 2))
    d = datetime.datetime(2024, 1, 2, 3, 4, 5)
    assert _same(d, datetime.datetime(2024, 1, 2, 3, 4, 5)) and not _same(d, d + datetime.timedelta(microseconds=1))
    assert _same(object(), object())
