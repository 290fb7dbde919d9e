"""Fingerprints are part of the run-directory format: runs recorded by an earlier torchrepro must compare with runs
recorded now. These digests were computed by the implementation of December 2026 (before the device path was
reworked for speed); both algorithms must keep giving them, bit for bit."""

from __future__ import annotations

import torch

from torchrepro import fingerprint
from torchrepro._core.fingerprint import _digests_torch


def _tensors() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return [torch.randn(1000, generator=g), torch.randint(0, 255, (12345,), dtype=torch.uint8, generator=g),
            torch.randn(3, 5, generator=g, dtype=torch.float64).t(), torch.randn(1 << 21, generator=g), torch.ones(0),
            torch.arange(7, dtype=torch.int16)]


def test_the_device_algorithm_gives_the_digests_it_always_gave():
    """splitmix64-sum-128/1, the path of CUDA and other devices (run here on the CPU): a 4-byte-aligned float
    vector, odd-sized bytes, a transposed float64 view, 8 MiB (several slices), an empty tensor, int16."""
    assert _digests_torch(_tensors(), torch.device("cpu")) == [
        "d84858c423ff112d88d1a03b0ea9e9e9", "0bfc269f6cc3e3640ca04ca73f85eebd", "4785c0e3e0fae797b4cd754752e1cc1e",
        "362df18e8bae3553b7eb8d02345d4648", "dd86d8130bf802052b2f1ad30d9fbf09", "49d7f183fb20df183965a5f791f43eff"]


def test_the_cpu_algorithm_gives_the_digests_it_always_gave():
    assert [fingerprint(t) for t in _tensors()] == [
        "2769cac757663353c6dea6a966ef98fe", "024b4452890d3765b901c4cf5741f5ce", "c6480006e94f4a2a65fd96ddd8a62ac6",
        "89939857c59cbf184492f58266d392e5", "eccc656d32b6d454daea16a760887da0", "7c85260799dce008ce4617728516783f"]
