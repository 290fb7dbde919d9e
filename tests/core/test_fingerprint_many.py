"""Fingerprints of many tensors at once (issue 41): what a recorder step hashes.

XXH3 (CPU): the chunks of all the tensors of one ``fingerprint_many`` call are shared among threads together,
so a model's many medium tensors are hashed in parallel; each digest must stay the documented one, whatever the
mix of sizes, the thread count and the threads used (torch's OpenMP team, a helper pool, none).

splitmix64 (the device path, run here on the CPU): the lane sums go through three slice-sized buffers; every
digest must stay the documented one (slices, batches of small tensors and their boundaries, a tail that is not a
whole word, an unaligned storage offset), and no op may allocate more than one slice however large the tensor.
"""

from __future__ import annotations

import importlib
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from tests.core.test_speed_fingerprint import _reference_torch, _reference_xxh3

fp_mod = importlib.import_module("torchrepro._core.fingerprint")
digest_mod = importlib.import_module("torchrepro._core.tensordigest")
CPU = torch.device("cpu")
CHUNK = fp_mod.CHUNK


def _mixed_tensors() -> list[torch.Tensor]:
    """Sizes around every threshold: empty, tiny, at and past 64 KiB (the GIL), one chunk, several chunks with a
    short last one; a transposed (copied) and a sliced (in place, offset) tensor among them."""
    g = torch.Generator().manual_seed(7)
    sizes = [0, 3, (1 << 14), (1 << 14) + 1, CHUNK // 4, CHUNK // 4 + 5, 3 * CHUNK // 4 + 17, 2 * CHUNK // 4, 1000]
    ts = [torch.randn(n, generator=g) for n in sizes]
    ts.append(torch.randn(300, 700, generator=g).t())  # not contiguous: copied out
    ts.append(torch.randn(CHUNK // 2 + 9, generator=g)[9:])  # a view at an offset, read in place
    ts.append(torch.randn(5, 3, generator=g, dtype=torch.float64))
    return ts


def _with(monkeypatch: pytest.MonkeyPatch, threads: int, **knobs: object) -> None:
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    for name, value in knobs.items():
        if name == "team":
            monkeypatch.setattr(digest_mod._ompteam, "run", value)
        else:
            monkeypatch.setattr(digest_mod, name, value)


@pytest.mark.parametrize("how", ["team", "helper threads", "one thread", "three threads"])
def test_many_tensors_hashed_together_equal_the_documented_digest(monkeypatch, how):
    ts = _mixed_tensors()
    expected = [_reference_xxh3(t) for t in ts]
    calls: list[int] = []
    real_run = digest_mod._ompteam.run

    def team(fn, threads):
        calls.append(threads)
        return real_run(fn, threads)

    knobs = {"team": {"team": team, "_TEAM_MIN_CHUNKS": 2},
             "helper threads": {"team": lambda fn, threads: False, "_PARALLEL_MIN_CHUNKS": 2},
             "one thread": {},
             "three threads": {"team": lambda fn, threads: False, "_PARALLEL_MIN_CHUNKS": 2}}[how]
    _with(monkeypatch, {"one thread": 1, "three threads": 3}.get(how, 2), **knobs)
    assert fp_mod.fingerprint_many(ts) == expected
    if how == "team":
        assert calls == [2]  # the chunks of all the tensors went to the team together, in one call
    assert [fp_mod.fingerprint(t) for t in ts] == expected


def test_tensors_of_one_chunk_each_are_hashed_in_parallel_together(monkeypatch):
    """A transformer's 2-10 MB matrices: none is large enough to be split alone, all of them together are."""
    ts = [torch.randn(CHUNK // 4, generator=torch.Generator().manual_seed(i)) for i in range(20)]
    expected = [_reference_xxh3(t) for t in ts]
    shares: list[int] = []

    def team(fn, threads):
        shares.append(threads)
        for i in range(threads):
            fn(i)
        return True

    _with(monkeypatch, 2, team=team)
    assert fp_mod.fingerprint_many(ts) == expected
    assert shares == [2]
    shares.clear()
    assert [fp_mod.fingerprint(t) for t in ts] == expected and shares == []  # one chunk alone: not split


def test_the_work_is_shared_by_bytes_and_every_piece_is_hashed(monkeypatch):
    """Every chunk of every tensor goes to exactly one share: a piece left out or hashed twice into another
    tensor's digest would change a digest; the shares are balanced by bytes, not by count."""
    sizes = [CHUNK] * 3 + [CHUNK // 8] * 8 + [CHUNK]
    bounds = digest_mod._shares(sizes, 2)
    assert bounds[0] == 0 and bounds[-1] == len(sizes) and bounds == sorted(bounds)
    halves = [sum(sizes[bounds[i]:bounds[i + 1]]) for i in range(2)]
    assert abs(halves[0] - halves[1]) <= CHUNK
    assert digest_mod._shares([], 3) == [0, 0, 0, 0]
    assert digest_mod._shares([5], 3) == [0, 1, 1, 1]
    seen: list[int] = []
    xxhash = digest_mod.xxhash
    real = xxhash.xxh3_128_digest

    class Counting:
        def __getattr__(self, name):
            return getattr(xxhash, name)

        @staticmethod
        def xxh3_128_digest(buf):
            seen.append(len(buf))
            return real(buf)

    ts = [torch.randn(n // 4) for n in sizes]
    expected = [_reference_xxh3(t) for t in ts]
    _with(monkeypatch, 2, team=lambda fn, threads: False, _PARALLEL_MIN_CHUNKS=2)
    monkeypatch.setattr(digest_mod, "xxhash", Counting())
    assert fp_mod.fingerprint_many(ts) == expected
    assert sorted(seen) == sorted(sizes)  # one digest per chunk, none twice


class _Allocations(TorchDispatchMode):
    """The largest tensor any op allocates, and the peak of the bytes the ops' allocations hold alive at once
    (views, in-place and ``out=`` results are not allocations)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0
        self.peak = 0
        self._alive: dict[int, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not func.is_view and "out" not in kwargs:
            read = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
            for t in tree_leaves(out):
                if not isinstance(t, torch.Tensor):
                    continue
                ptr, size = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
                if ptr in read or ptr in self._alive or not size:
                    continue
                self.largest = max(self.largest, size)
                self._alive[ptr] = size
                weakref.finalize(t, self._alive.pop, ptr, None)
            self.peak = max(self.peak, sum(self._alive.values()))
        return out


@pytest.mark.parametrize("case", ["whole words", "a tail of 3 bytes", "unaligned offset", "strided"])
def test_the_device_path_allocates_one_slice_at_most_and_keeps_the_digest(monkeypatch, case):
    monkeypatch.setattr(digest_mod, "TORCH_SLICE_WORDS", 256)
    monkeypatch.setattr(digest_mod, "_keys", {})
    g = torch.Generator().manual_seed(3)
    raw = torch.randint(0, 256, (40_003,), dtype=torch.uint8, generator=g)
    t = {"whole words": raw[:40_000].view(torch.float32),
         "a tail of 3 bytes": raw,
         "unaligned offset": raw[1:32_002],  # its storage offset is not a multiple of 8 bytes
         "strided": raw[:40_000].view(torch.float32).view(100, 100).t()}[case]
    expected = _reference_torch(t)
    digest_mod._digests_torch([t], CPU)  # the position keys (one slice) are made once per device, then kept
    with _Allocations() as seen:
        assert digest_mod._digests_torch([t], CPU)[0] == expected
    # the bytes of a strided tensor are copied out once (C order) before hashing; nothing else is whole-sized
    whole = t.numel() * t.element_size() if case == "strided" else 0
    slice_bytes = 256 * 8
    assert seen.largest <= max(slice_bytes, whole), seen.largest
    # three slice buffers and a padded or realigned slice, whatever the tensor's size (it is 20 slices long)
    assert seen.peak <= whole + 4 * slice_bytes + 64, seen.peak
    assert digest_mod._digests_torch([t, t.clone()], CPU) == [expected, expected]


def test_the_device_path_batches_and_slices_many_tensors_in_order(monkeypatch):
    """Tensors that fill a batch exactly, cross it by one word, and exceed a slice, in one call: each gets its own
    lane sums (a running sum differenced at each tensor's last word) in its own place."""
    monkeypatch.setattr(digest_mod, "TORCH_SLICE_WORDS", 200)
    g = torch.Generator().manual_seed(5)
    words = [199, 1, 200, 201, 0, 1, 57, 400, 399, 3, 200]
    ts = [torch.randn(2 * n, generator=g) for n in words]  # float32: two per word
    ts.insert(4, torch.arange(7, dtype=torch.int8))  # not a whole word
    expected = [_reference_torch(t) for t in ts]
    assert digest_mod._digests_torch(ts, CPU) == expected
    assert digest_mod._digests_torch(ts[::-1], CPU) == expected[::-1]
    ts[2][5] += 1  # one tensor changed: only its digest changes
    again = digest_mod._digests_torch(ts, CPU)
    assert [a == b for a, b in zip(again, expected)] == [i != 2 for i in range(len(ts))]
