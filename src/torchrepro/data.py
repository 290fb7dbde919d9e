"""Reproducible DataLoader workers (layer L1).

Example:
    >>> import torch, torchrepro
    >>> loader = torch.utils.data.DataLoader(range(8), shuffle=True, num_workers=0,
    ...                                      worker_init_fn=torchrepro.seed_worker,
    ...                                      generator=torchrepro.make_generator(0))
"""

from __future__ import annotations

import os
import random

import torch

from ._compat import np
from .seeding import derive_seed, seed_from_env, validate_seed


def current_rank() -> int:
    """This process's global distributed rank (0 when not distributed)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    for var in ("RANK", "SLURM_PROCID", "LOCAL_RANK"):
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return 0


def worker_seed(base_seed: int, worker_id: int, rank: int | None = None) -> int:
    """The seed of DataLoader worker ``worker_id`` on ``rank`` for a loader whose base seed is ``base_seed``."""
    return derive_seed(base_seed, "worker", worker_id, "rank", current_rank() if rank is None else rank)


def seed_worker(worker_id: int) -> None:
    """A ``worker_init_fn`` that seeds ``random``, NumPy and torch in a DataLoader worker.

    The seed depends on the loader's base seed (drawn from its generator, so it changes each epoch and is
    reproducible under :func:`torchrepro.seed_everything`), the worker id and the distributed rank.
    """
    base = torch.initial_seed() - worker_id  # the loader's base_seed for this epoch
    seed = worker_seed(base % 2**64, worker_id)
    random.seed(seed)
    if np is not None:
        np.random.seed(seed)
    torch.manual_seed(seed)


def make_generator(seed: int | None = None) -> torch.Generator:
    """A CPU ``torch.Generator`` for a DataLoader's ``generator=``, seeded with ``seed``.

    ``seed=None`` uses ``TORCHREPRO_SEED`` (set by :func:`seed_everything`), else torch's initial seed.
    """
    if seed is None:
        seed = seed_from_env()
    g = torch.Generator()
    g.manual_seed(validate_seed(seed) if seed is not None else torch.initial_seed())
    return g
