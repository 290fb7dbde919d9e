"""Fingerprint throughput vs tensor.sum(), sha256 of host bytes and torch.hash_tensor (10M float32, CPU).

Targets: fingerprint >= 0.8x the throughput of tensor.sum(), and >= 5x that of sha256.
Also printed: the CPU fingerprint hashed in one thread, and the on-device algorithm (splitmix64 sums, what
CUDA tensors use) run on the CPU, for reference.
Run: python benchmarks/bench_fingerprint.py
"""

from __future__ import annotations

import hashlib
import importlib
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _timing import interleaved  # noqa: E402

import torchrepro  # noqa: E402, F401

fpmod = importlib.import_module("torchrepro._core.fingerprint")


def _one_thread(fn: Any) -> Any:
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn()
    finally:
        torch.set_num_threads(old)


def main() -> int:
    x = torch.randn(10_000_000, generator=torch.Generator().manual_seed(0))
    cpu = torch.device("cpu")
    variants = {
        "tensor.sum()": lambda: x.sum(),
        "torchrepro.fingerprint": lambda: fpmod.fingerprint(x),
        "fingerprint, 1 thread": lambda: _one_thread(lambda: fpmod.fingerprint(x)),
        "tensor.sum(), 1 thread": lambda: _one_thread(x.sum),
        "sha256(host bytes)": lambda: hashlib.sha256(x.numpy().tobytes()).digest(),
    }
    if hasattr(torch, "hash_tensor"):
        variants["torch.hash_tensor"] = lambda: torch.hash_tensor(x)
    times = interleaved(variants, rounds=31, inner=5)
    times.update(interleaved({"device algorithm on CPU": lambda: fpmod._digests_torch([x], cpu)}, rounds=3, inner=1))
    used = fpmod.algorithms_since()
    print(f"10M float32 on CPU, {torch.get_num_threads()} threads, torch {torch.__version__}, algorithms {used}")
    for name, t in times.items():
        print(f"  {name:<24} {t * 1e3:8.3f} ms   {x.numel() * 4 / t / 1e9:7.2f} GB/s")
    fp = times["torchrepro.fingerprint"]
    vs_sum = times["tensor.sum()"] / fp
    vs_sha = times["sha256(host bytes)"] / fp
    ok_sum, ok_sha = ("OK" if vs_sum >= 0.8 else "MISSED"), ("OK" if vs_sha >= 5 else "MISSED")
    print(f"throughput ratio fingerprint / sum    = {vs_sum:.2f}x  (target >= 0.8x) {ok_sum}")
    print(f"throughput ratio fingerprint / sha256 = {vs_sha:.2f}x  (target >= 5x)   {ok_sha}")
    one = times["tensor.sum()"] / times["fingerprint, 1 thread"]
    print(f"throughput ratio fingerprint (1 thread) / sum = {one:.2f}x")
    core = times["tensor.sum(), 1 thread"] / times["fingerprint, 1 thread"]
    print(f"per core: fingerprint (1 thread) / sum (1 thread) = {core:.2f}x  (XXH3 against a plain reduction, "
          "each on one core)")
    if "torch.hash_tensor" in times:
        print(f"throughput ratio fingerprint / torch.hash_tensor = {times['torch.hash_tensor'] / fp:.2f}x "
              "(hash_tensor is XOR-based and does not see swapped values)")
    else:
        print("torch.hash_tensor: not in this torch version")
    return 0


if __name__ == "__main__":
    sys.exit(main())
