from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torchrepro
from torchrepro.fingerprint import STRIDE, UnfingerprintableError, fingerprint, fingerprint_many

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
    t = _sample(torch.float64, n, seed=n)  # float64: one element per 8-byte word
    i = data.draw(st.integers(0, n - 1))
    j = data.draw(st.integers(0, n - 1).filter(lambda j: j != i))
    if n >= 2 * STRIDE and (i - j) % STRIDE == 0:
        j = (j + 1) % n if (j + 1) % n != i else (j + 2) % n  # avoid the documented blind spot
    u = t.clone()
    u[i], u[j] = t[j], t[i]
    assert fingerprint(u) != fingerprint(t)


def test_documented_blind_spot_is_real():
    """The module docs say swaps STRIDE words apart in long tensors are not seen; keep the docs honest."""
    t = torch.arange(4 * STRIDE, dtype=torch.float64)
    u = t.clone()
    u[1], u[STRIDE + 1] = t[STRIDE + 1], t[1]
    assert fingerprint(u) == fingerprint(t)
    short = torch.arange(STRIDE + 5, dtype=torch.float64)  # shorter tensors have no blind spot
    v = short.clone()
    v[1], v[STRIDE + 1] = short[STRIDE + 1], short[1]
    assert fingerprint(v) != fingerprint(short)


def test_many_matches_single():
    ts = [_sample(d, n) for d in DTYPES for n in (1, 7, 300)] + [torch.tensor(2.0), torch.zeros(0)]
    assert fingerprint_many(ts) == [fingerprint(t) for t in ts]
    assert fingerprint_many([]) == []


def test_unfingerprintable_tensors_raise():
    with pytest.raises(UnfingerprintableError, match="layout torch.sparse_coo"):
        fingerprint(torch.eye(3).to_sparse())
    with pytest.raises(UnfingerprintableError, match="meta tensor"):
        fingerprint(torch.empty(3, device="meta"))


def test_public_api():
    assert torchrepro.fingerprint is fingerprint
    assert sorted(torchrepro.__all__) == torchrepro.__all__
    for name in torchrepro.__all__:
        assert hasattr(torchrepro, name), name


@pytest.mark.parametrize("n", [0, 1, 5, 125, 126, 127, 1000, 70_000, 300_000])
def test_numpy_cpu_path_equals_torch_device_path(n):
    from torchrepro.fingerprint import _lane_sums_numpy, _lane_sums_torch

    ts = [_sample(d, n, seed=n) for d in DTYPES] + [torch.tensor(3.0)]
    mask = (1 << 64) - 1
    via_torch = [(a & mask, b & mask) for a, b in _lane_sums_torch(ts, torch.device("cpu"))]
    assert _lane_sums_numpy(ts) == via_torch
