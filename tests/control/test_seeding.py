from __future__ import annotations

import json
import os
import random
import warnings

import numpy as np
import pytest
import torch

import torchrepro
from torchrepro._core.errors import InvalidSeedError, ReproWarning
from torchrepro.control import seeding

from ..conftest import run_python

DRAW = r"""
import json, random, sys
import numpy as np, torch
import torchrepro

seed = int(sys.argv[1])
torchrepro.seed_everything(seed)

class Aug(torch.utils.data.Dataset):
    def __len__(self):
        return 32
    def __getitem__(self, i):
        x = torch.full((4,), float(i))
        return x + torch.rand(4) + random.random() + float(np.random.rand())

loader = torch.utils.data.DataLoader(Aug(), batch_size=4, shuffle=True, num_workers=2,
                                     worker_init_fn=torchrepro.seed_worker)
batches = [b.tolist() for b in loader]
print(json.dumps({
    "random": [random.random() for _ in range(5)],
    "numpy": np.random.rand(5).tolist(),
    "torch": torch.rand(5).tolist(),
    "batches": batches,
    "env": [__import__("os").environ["TORCHREPRO_SEED"], __import__("os").environ["PYTHONHASHSEED"]],
}))
"""


def _draws(seed: int) -> dict:
    proc = run_python(DRAW, str(seed))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_two_processes_same_seed_bitwise_identical_and_different_seed_differs():
    a, b, c = _draws(123), _draws(123), _draws(124)
    assert a == b  # floats survive JSON exactly (repr round-trips), so this is bitwise equality
    assert a["env"] == ["123", "123"]
    for key in ("random", "numpy", "torch", "batches"):
        assert a[key] != c[key], key


@pytest.mark.parametrize("bad", [-1, 2**32, True, False, 1.0, "1", [1]])
def test_bad_seeds_rejected_with_value_and_range(bad):
    with pytest.raises(ValueError) as info:
        torchrepro.seed_everything(bad)
    assert isinstance(info.value, InvalidSeedError)
    assert "[0, 4294967295]" in str(info.value)
    assert repr(bad) in str(info.value) or str(bad) in str(info.value)


def test_seed_none_uses_env_then_random_and_logs(monkeypatch, caplog):
    monkeypatch.setenv("TORCHREPRO_SEED", "77")
    assert torchrepro.seed_everything() == 77
    monkeypatch.delenv("TORCHREPRO_SEED")
    with caplog.at_level("WARNING", logger="torchrepro"):
        seed = torchrepro.seed_everything(workers=False)
    assert 0 <= seed <= 2**32 - 1
    assert f"using seed {seed}" in caplog.text


def test_bad_env_seed(monkeypatch):
    monkeypatch.setenv("TORCHREPRO_SEED", "abc")
    with pytest.raises(InvalidSeedError, match="TORCHREPRO_SEED='abc' is not an integer"):
        torchrepro.seed_everything()


def test_workers_false_exports_nothing(monkeypatch):
    monkeypatch.delenv("TORCHREPRO_SEED", raising=False)
    torchrepro.seed_everything(5, workers=False)
    assert "TORCHREPRO_SEED" not in os.environ


def test_hashseed_warning_once(monkeypatch):
    monkeypatch.setattr(seeding, "_LAUNCH_HASHSEED", None)
    monkeypatch.setattr(seeding, "_hashseed_warned", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torchrepro.seed_everything(1)
        torchrepro.seed_everything(2)
    msgs = [w for w in caught if issubclass(w.category, ReproWarning)]
    assert len(msgs) == 1
    assert "PYTHONHASHSEED=0 python train.py" in str(msgs[0].message)


def test_no_hashseed_warning_when_fixed(monkeypatch):
    monkeypatch.setattr(seeding, "_LAUNCH_HASHSEED", "0")
    monkeypatch.setattr(seeding, "_hashseed_warned", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReproWarning)
        torchrepro.seed_everything(1)


def test_seed_everything_deterministic_flag():
    torchrepro.seed_everything(3, deterministic=True)
    assert torch.are_deterministic_algorithms_enabled()
    torchrepro.seed_everything(3, deterministic="warn")
    assert torch.is_deterministic_algorithms_warn_only_enabled()
    with pytest.raises(ValueError, match="deterministic must be True, False or 'warn'"):
        torchrepro.seed_everything(3, deterministic="yes")


def test_derive_seed_stable_distinct_and_cross_process():
    seeds = {torchrepro.derive_seed(10, "worker", w, "rank", r) for w in range(16) for r in range(16)}
    assert len(seeds) == 256
    assert torchrepro.derive_seed(10, 1) != torchrepro.derive_seed(10, "1")
    assert torchrepro.derive_seed(10, 1, 23) != torchrepro.derive_seed(10, 12, 3)
    here = torchrepro.derive_seed(99, "epoch", 3)
    proc = run_python("import torchrepro; print(torchrepro.derive_seed(99, 'epoch', 3))",
                      env={"PYTHONHASHSEED": "random"})
    assert int(proc.stdout) == here
    assert 0 <= here <= 2**32 - 1
    with pytest.raises(TypeError, match="keys must be int, str, bytes or bool"):
        torchrepro.derive_seed(1, 1.5)
    with pytest.raises(InvalidSeedError):
        torchrepro.derive_seed(-1)


def test_worker_seed_depends_on_rank(monkeypatch):
    from torchrepro.resume.data import worker_seed

    assert worker_seed(5, 0, rank=0) != worker_seed(5, 0, rank=1)
    monkeypatch.setenv("RANK", "3")
    assert worker_seed(5, 1) == worker_seed(5, 1, rank=3)


def test_make_generator():
    g1, g2 = torchrepro.make_generator(8), torchrepro.make_generator(8)
    assert torch.equal(torch.rand(3, generator=g1), torch.rand(3, generator=g2))
    with pytest.raises(InvalidSeedError):
        torchrepro.make_generator(-3)


class WorkerDraws(torch.utils.data.Dataset):
    """Each sample reports the worker that loaded it and one draw from random, NumPy and torch."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> dict:
        info = torch.utils.data.get_worker_info()
        return {"worker": info.id, "base": info.seed - info.id, "random": random.random(),
                "numpy": float(np.random.rand()), "torch": torch.rand(()).item()}


def test_seed_worker_gives_each_worker_its_own_seed():
    from torchrepro.resume.data import worker_seed

    loader = torch.utils.data.DataLoader(WorkerDraws(), batch_size=None, num_workers=2,
                                         worker_init_fn=torchrepro.seed_worker,
                                         generator=torchrepro.make_generator(0))
    samples = list(loader)
    first = {s["worker"]: s for s in reversed(samples)}  # the first sample each worker loaded
    assert sorted(first) == [0, 1]
    for source in ("random", "numpy", "torch"):
        assert first[0][source] != first[1][source], f"workers 0 and 1 drew the same {source} numbers"
    for w, s in first.items():  # and each worker's seed is the documented one
        seed = worker_seed(s["base"], w)
        expected = {"random": random.Random(seed).random(), "numpy": float(np.random.RandomState(seed).rand()),
                    "torch": torch.rand((), generator=torch.Generator().manual_seed(seed)).item()}
        assert {k: s[k] for k in expected} == expected, w
