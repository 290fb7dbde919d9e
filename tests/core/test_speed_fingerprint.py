"""Exact fingerprints on every code path: single bits and swaps at any distance change the digest.

Paths: CPU small (one XXH3 chunk), CPU large (many 1 MiB chunks, hashed in parallel threads and in one),
and the torch path that devices use (run here on the CPU, with small slices so that slicing and batching
are exercised). Each is also checked against a reference written from the module's documentation.
"""

from __future__ import annotations

import hashlib
import importlib
import subprocess
import sys

import pytest
import torch
import xxhash

import torchrepro  # noqa: F401

fp_mod = importlib.import_module("torchrepro._core.fingerprint")
digest_mod = importlib.import_module("torchrepro._core.tensordigest")  # the knobs the tests patch live here
CPU = torch.device("cpu")


def _xxh3_path(t: torch.Tensor, threads: int) -> str:
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return fp_mod.fingerprint(t)
    finally:
        torch.set_num_threads(old)


def _torch_path(t: torch.Tensor) -> str:
    return fp_mod._digests_torch([t], CPU)[0]


@pytest.fixture
def small_slices(monkeypatch):
    monkeypatch.setattr(digest_mod, "TORCH_SLICE_WORDS", 1000)


def _helper_thread_path(t: torch.Tensor) -> str:
    """The large-tensor path where torch's OpenMP team cannot be used: a helper thread of our own."""
    old = (digest_mod._ompteam.run, digest_mod._PARALLEL_MIN_CHUNKS)
    digest_mod._ompteam.run, digest_mod._PARALLEL_MIN_CHUNKS = (lambda fn, threads: False), 2
    try:
        return _xxh3_path(t, 2)
    finally:
        digest_mod._ompteam.run, digest_mod._PARALLEL_MIN_CHUNKS = old


def _team_path(t: torch.Tensor) -> str:
    """The large-tensor path on torch's OpenMP team (where usable), with the size threshold lowered."""
    old = digest_mod._TEAM_MIN_CHUNKS
    digest_mod._TEAM_MIN_CHUNKS = 2
    try:
        return _xxh3_path(t, 2)
    finally:
        digest_mod._TEAM_MIN_CHUNKS = old


def _strided_copy_path(t: torch.Tensor) -> str:
    """The path for tensors whose bytes cannot be read in place: a non-contiguous view with the same values."""
    u = torch.empty(2 * t.numel(), dtype=t.dtype)[::2].view(t.shape)
    u.copy_(t)
    assert fp_mod._direct_bytes(u) is None or t.numel() <= 1  # one element: contiguous whatever the stride
    return fp_mod.fingerprint(u)


PATHS = {
    "cpu-small": (3000, lambda t: _xxh3_path(t, 1)),
    "cpu-strided-copy": (3000, _strided_copy_path),
    "cpu-large-threads": (5 * fp_mod.CHUNK // 4 + 77, _team_path),
    "cpu-large-helper-thread": (5 * fp_mod.CHUNK // 4 + 77, _helper_thread_path),
    "cpu-large-1-thread": (5 * fp_mod.CHUNK // 4 + 77, lambda t: _xxh3_path(t, 1)),
    "torch-path": (9000, _torch_path),
}


def _reference_xxh3(t: torch.Tensor) -> str:
    data = t.contiguous().view(torch.uint8).reshape(-1).numpy().tobytes()
    header = f"{t.dtype}|{tuple(t.shape)}|{len(data)}|".encode()
    chunks = [data[k:k + fp_mod.CHUNK] for k in range(0, len(data), fp_mod.CHUNK)]
    return xxhash.xxh3_128_hexdigest(header + b"".join(xxhash.xxh3_128_digest(c) for c in chunks))


def _reference_torch(t: torch.Tensor) -> str:
    data = t.contiguous().view(torch.uint8).reshape(-1).numpy().tobytes()
    padded = data + bytes(-len(data) % 8)
    mask = (1 << 64) - 1

    def mix(x: int) -> int:
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
        return x ^ (x >> 31)

    lanes = [0, 0]
    for i in range(len(padded) // 8):
        w = int.from_bytes(padded[8 * i:8 * i + 8], "little")
        for k, salt in enumerate((0x243F6A8885A308D3, 0x13198A2E03707344)):
            lanes[k] = (lanes[k] + mix((w + i * 0x9E3779B97F4A7C15 + salt) & mask)) & mask
    h = hashlib.blake2b(f"{t.dtype}|{tuple(t.shape)}|{len(data)}".encode(), digest_size=16)
    for lane in lanes:
        h.update(lane.to_bytes(8, "little"))
    return h.hexdigest()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_bit_flip_and_swap_changes_the_digest(path, dtype, small_slices):
    n, digest = PATHS[path]
    n = n if dtype == torch.float32 else n // 2
    t = torch.randn(n, generator=torch.Generator().manual_seed(n), dtype=dtype)
    base = digest(t)
    assert digest(t.clone()) == base
    nbytes = t.numel() * t.element_size()
    chunk = fp_mod.CHUNK
    boundaries = {b for b in (chunk - 1, chunk, 2 * chunk - 1) if b < nbytes}
    for byte in sorted({0, 1, 7, 8, nbytes // 2, nbytes - 1} | boundaries):
        for bit in (0, 7):
            u = t.clone()
            u.view(torch.uint8)[byte] ^= 1 << bit
            assert digest(u) != base, (byte, bit)
    starts = {0, 5, n // 2} | ({chunk // t.element_size() - 3} if nbytes > chunk else set())
    for d in (1, 2, 63, 126, 4096):
        for i in starts:
            j = i + d
            if j >= n:
                continue
            u = t.clone()
            u[i], u[j] = t[j], t[i]
            assert digest(u) != base, (i, d)


@pytest.mark.parametrize("n", [0, 1, 3, 1000, fp_mod.CHUNK // 4, 5 * fp_mod.CHUNK // 4 + 77])
def test_cpu_paths_equal_the_documented_xxh3_algorithm(n):
    t = torch.randn(n, generator=torch.Generator().manual_seed(1))
    expected = _reference_xxh3(t)
    assert _xxh3_path(t, 1) == _xxh3_path(t, 2) == _team_path(t) == _helper_thread_path(t) == expected
    assert _strided_copy_path(t) == expected
    assert fp_mod.fingerprint_many([t, t[: n // 2]]) == [expected, _reference_xxh3(t[: n // 2])]
    m = t[: n - n % 4].view(-1, 4) if n >= 4 else t.view(-1, 1)
    assert fp_mod.fingerprint(m.t()) == _reference_xxh3(m.t().contiguous())  # non-contiguous: same bytes


def _all_dtypes() -> list[torch.dtype]:
    return sorted({d for d in vars(torch).values() if isinstance(d, torch.dtype)}, key=str)


@pytest.mark.parametrize("shape", [(7,), (3, 5), (3, fp_mod.CHUNK // 4 + 5)])
def test_bytes_read_in_place_equal_the_copied_bytes_for_every_dtype(shape):
    """The in-place read (plain contiguous CPU tensors) and the copy path agree bit for bit on every dtype."""
    read_in_place = 0
    for dtype in _all_dtypes():
        try:
            width = torch.empty(0, dtype=dtype).element_size()
            raw = torch.randint(0, 256, (shape[0] * shape[1] * width if len(shape) == 2 else shape[0] * width,),
                                dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
            raw = raw % 2 if dtype == torch.bool else raw  # a torch copy turns any other bool byte into 1
            t = raw.view(dtype).view(shape)
        except (RuntimeError, TypeError):  # dtypes with no storage of their own (none today)
            continue
        if t.is_quantized:
            continue
        assert fp_mod._direct_bytes(t) is not None, dtype
        read_in_place += 1
        assert bytes(fp_mod._direct_bytes(t)) == raw.numpy().tobytes(), dtype
        assert fp_mod.fingerprint(t) == _copy_path(t), dtype
        if t.dtype in (torch.float32, torch.bool, torch.int8, torch.complex128):
            assert fp_mod.fingerprint(t) == _strided_copy_path(t) == _reference_xxh3(t), dtype
    assert read_in_place >= 20


def _copy_path(t: torch.Tensor) -> str:
    """The digest with in-place reads switched off: the tensor's bits are copied out through torch."""
    direct = fp_mod._direct_bytes
    fp_mod._direct_bytes = lambda t: None
    try:
        return fp_mod.fingerprint(t)
    finally:
        fp_mod._direct_bytes = direct


def test_tensors_that_are_not_read_in_place():
    class Sub(torch.Tensor):
        pass

    base = torch.randn(6, 4)
    others = {"subclass": base.as_subclass(Sub), "transposed": base.t(), "conjugate view": torch.randn(
        3, dtype=torch.complex64).conj(), "negative view": torch.randn(3, dtype=torch.complex64).conj().imag,
        "empty": torch.empty(0), "channels_last": torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)}
    for name, t in others.items():
        assert fp_mod._direct_bytes(t) is None, name
        assert fp_mod.fingerprint(t) == fp_mod.fingerprint(t.as_subclass(torch.Tensor).resolve_conj()
                                                          .resolve_neg().contiguous()), name
    assert fp_mod._direct_bytes(base[1:]) is not None  # a contiguous view at an offset is read in place


def test_a_tensor_whose_storage_was_freed_is_not_read():
    t = torch.randn(1000)
    t.untyped_storage().resize_(0)  # what FSDP does to unsharded parameters between uses
    assert fp_mod._direct_bytes(t) is None
    with pytest.raises(fp_mod.UnfingerprintableError, match="needs 4000 bytes of storage but its storage holds 0"):
        fp_mod.fingerprint(t)
    u = torch.randn(1000)
    u.untyped_storage().resize_(400)  # shrunk, not freed: the address is valid, the end is not
    assert fp_mod._direct_bytes(u) is None
    with pytest.raises(fp_mod.UnfingerprintableError, match="needs 4000 bytes of storage but its storage holds 400"):
        fp_mod.fingerprint(u)


def test_a_tensor_inside_vmap_gets_a_clear_error():
    seen = []

    def body(t):
        assert fp_mod._direct_bytes(t) is None  # no storage of its own: never read by address
        with pytest.raises(fp_mod.UnfingerprintableError, match="has no storage of its own .*outside torch.func"):
            fp_mod.fingerprint(t)
        seen.append(True)
        return t * 2

    torch.func.vmap(body)(torch.randn(3, 4))
    assert seen == [True]


def test_a_tensor_inside_functionalize_gets_a_clear_error():
    seen = []

    def body(a):
        view = a[10:]  # inside functionalize its data pointer is a made-up address (0x28 here)
        assert fp_mod._direct_bytes(view) is None
        for fp in (fp_mod.fingerprint, fp_mod.plain_cpu_fingerprint):
            with pytest.raises(fp_mod.UnfingerprintableError, match="has no storage of its own"):
                fp(view)
        seen.append(True)
        return a * 2

    torch.func.functionalize(body)(torch.arange(100.0))
    assert seen == [True]


_SET_DURING_HASH = """
import importlib, random, sys, threading, time, torch
F = importlib.import_module("torchrepro._core.fingerprint")
t = torch.ones(16 << 20)  # 64 MiB: xxhash releases the GIL while it reads
expected = F.fingerprint(t)
digests = []
h = threading.Thread(target=lambda: digests.extend(F.plain_cpu_fingerprint(t) for _ in range(30)))
h.start()
time.sleep(0.05)
t.set_(torch.zeros(3))  # the tensor lets go of its storage while another thread hashes it
h.join()
assert digests and set(digests) <= {expected, F.fingerprint(torch.zeros(3))}, digests
# set_() at 40 moments while 1 MiB tensors are hashed: each digest is the old tensor's or the new one's, never a mix
# of one's shape and the other's bytes, and a set_() seen halfway (storage swapped, shape not yet) is no error
random.seed(0)
for trial in range(40):
    u = torch.ones(1 << 18)
    seen, errors = [], []
    def hash_u():
        try:
            seen.extend(F.plain_cpu_fingerprint(u) for _ in range(100))
        except Exception as e:
            errors.append(repr(e))
    h = threading.Thread(target=hash_u)
    h.start()
    time.sleep(random.random() * 0.005)
    u.set_(torch.zeros(3))
    h.join()
    assert not errors and set(seen) <= {F.fingerprint(torch.ones(1 << 18)), F.fingerprint(torch.zeros(3))}, (
        trial, errors, set(seen))
print("ok", len(digests))
"""


def test_a_tensor_set_to_other_memory_while_it_is_hashed_does_not_crash():
    """The bytes read in place stay allocated while they are hashed (the view holds the storage)."""
    proc = subprocess.run([sys.executable, "-c", _SET_DURING_HASH], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.startswith("ok 30")


def test_empty_strided_views_have_the_fingerprint_of_their_shape():
    assert fp_mod.fingerprint(torch.zeros(0)[::2]) == fp_mod.fingerprint(torch.zeros(0))
    assert fp_mod.fingerprint(torch.zeros(0, 3).t()) == fp_mod.fingerprint(torch.zeros(3, 0))


def test_torch_path_equals_the_documented_algorithm_sliced_or_batched(monkeypatch):
    ts = [torch.randn(n, generator=torch.Generator().manual_seed(n)) for n in (0, 1, 3, 301, 2500)]
    ts.append(torch.arange(7, dtype=torch.int8))  # not a whole number of words: zero-padded
    expected = [_reference_torch(t) for t in ts]
    assert fp_mod._digests_torch(ts, CPU) == expected  # one batch
    monkeypatch.setattr(digest_mod, "TORCH_SLICE_WORDS", 200)  # long tensors in slices, short ones in batches
    assert fp_mod._digests_torch(ts, CPU) == expected
    assert [fp_mod._digests_torch([t], CPU)[0] for t in ts] == expected


def test_the_algorithm_used_is_reported():
    mark = fp_mod.usage_mark()
    assert fp_mod.algorithms_since(mark) is None
    fp_mod.fingerprint(torch.zeros(3))
    assert fp_mod.algorithms_since(mark) == fp_mod.ALGORITHM_XXH3


def test_without_xxhash_cpu_tensors_use_the_torch_path(monkeypatch):
    t = torch.randn(100, generator=torch.Generator().manual_seed(0))
    monkeypatch.setattr(digest_mod, "xxhash", None)
    mark = fp_mod.usage_mark()
    assert fp_mod.fingerprint(t) == _reference_torch(t)
    assert fp_mod.algorithms_since(mark) == fp_mod.ALGORITHM_TORCH


def test_a_forked_child_gets_its_own_thread_pool():
    import multiprocessing as mp

    t = torch.randn(5 * fp_mod.CHUNK // 4)
    expected = _xxh3_path(t, 2)  # the parent's pool exists now
    ctx = mp.get_context("fork")
    with ctx.Pool(1) as pool:
        assert pool.apply_async(_xxh3_path, (t, 2)).get(timeout=120) == expected  # a stale pool would hang


def test_runs_fingerprinted_with_different_algorithms_are_not_compared(tmp_path):
    from tests.analysis.test_compare import make_run
    from torchrepro._core.errors import RunsNotComparableError
    from torchrepro.analysis.compare import compare_runs
    from torchrepro.record.store import load_run, write_manifest

    def with_algorithm(name: str, algorithm: object):
        run = make_run(tmp_path, name)
        manifest = {k: v for k, v in run.manifest.items() if k not in ("format", "version")}
        write_manifest(run.path, {**manifest, "fingerprint_algorithm": algorithm})
        return load_run(run.path)

    legacy = make_run(tmp_path, "legacy")  # no fingerprint_algorithm: recorded before it was named
    cpu, cpu2 = with_algorithm("cpu", fp_mod.ALGORITHM_XXH3), with_algorithm("cpu2", fp_mod.ALGORITHM_XXH3)
    cuda = with_algorithm("cuda", f"{fp_mod.ALGORITHM_TORCH}+{fp_mod.ALGORITHM_XXH3}")
    unknown = with_algorithm("died", None)
    assert compare_runs([cpu, cpu2]).verdict == compare_runs([cpu, unknown]).verdict == "identical"
    assert compare_runs([legacy, make_run(tmp_path, "legacy2")]).verdict == "identical"
    for other, named in ((cuda, fp_mod.ALGORITHM_TORCH), (legacy, fp_mod.LEGACY_ALGORITHM)):
        with pytest.raises(RunsNotComparableError) as exc:
            compare_runs([cpu, other])
        msg = str(exc.value)
        assert "different algorithms: run 1 with xxh3-128-chunks-1MiB/1, run 2 with" in msg and named in msg
        assert "same torchrepro version" in msg


def test_a_recorded_run_names_its_algorithm(tmp_path):
    from torch import nn

    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchrepro.watch(model, opt, run_dir=tmp_path / "run") as _:
        model(torch.ones(4, 3)).sum().backward()
        opt.step()
    from torchrepro.record.store import load_run

    assert load_run(tmp_path / "run").manifest["fingerprint_algorithm"] == fp_mod.ALGORITHM_XXH3
