"""Reproducible DataLoader workers.

Example:
    >>> import torch, torchrepro
    >>> loader = torch.utils.data.DataLoader(range(8), shuffle=True, num_workers=0,
    ...                                      worker_init_fn=torchrepro.seed_worker,
    ...                                      generator=torchrepro.make_generator(0))
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from .._core.compat import np
from .._core.errors import InvalidSeedError
from ..control.seeding import (
    current_rank,
    derive_seed,
    seed_from_env,
    shared_streams,
    stream_rank,
    validate_seed,
    world_size,
)

__all__ = ["ResumableLoader", "current_rank", "make_generator", "seed_worker", "worker_seed"]


def worker_seed(base_seed: int, worker_id: int, rank: int | None = None) -> int:
    """The seed of DataLoader worker ``worker_id`` on ``rank`` for a loader whose base seed is ``base_seed``.

    ``rank`` defaults to the stream rank (the ``rank=`` given to :func:`seed_everything`, else the global rank).
    """
    return derive_seed(base_seed, "worker", worker_id, "rank", stream_rank() if rank is None else rank)


def seed_worker(worker_id: int) -> None:
    """A ``worker_init_fn`` that seeds ``random``, NumPy and torch in a DataLoader worker.

    The seed depends on the loader's base seed (drawn from its generator, so it changes each epoch and is
    reproducible under :func:`torchrepro.seed_everything`), the worker id and the distributed rank (rank 0 for
    every rank when ``seed_everything(..., shared=...)`` includes ``"workers"``).
    """
    base = torch.initial_seed() - worker_id  # the loader's base_seed for this epoch
    seed = worker_seed(base % 2**64, worker_id, rank=0 if "workers" in shared_streams() else None)
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


# --- resumable data path ------------------------------------------------------------------------------
class _SeededSamples(torch.utils.data.Dataset[Any]):
    """Wraps a dataset so that sample (epoch, position) draws its augmentation randomness from its own seed.

    Before each ``dataset[index]`` the global ``random``, NumPy and torch RNGs are seeded with
    ``derive_seed(seed, "sample", epoch, position)``: the randomness of a sample depends only on where it
    is in the epoch, not on which worker loads it or on what that worker loaded before. In the main process
    (``num_workers=0``) the caller's RNG states are put back afterwards.
    """

    def __init__(self, dataset: Any, seed: int) -> None:
        self.dataset = dataset
        self.seed = seed

    def __len__(self) -> int:
        return len(self.dataset)

    def _seed_all(self, epoch: int, position: int) -> None:
        s = derive_seed(self.seed, "sample", epoch, position)
        random.seed(s)
        if np is not None:
            np.random.seed(s)
        torch.manual_seed(s)

    def __getitem__(self, key: tuple[int, int, int]) -> Any:
        epoch, position, index = key
        if torch.utils.data.get_worker_info() is not None:
            self._seed_all(epoch, position)
            return self.dataset[index]
        py, tc = random.getstate(), torch.get_rng_state()
        npy = np.random.get_state() if np is not None else None
        try:
            self._seed_all(epoch, position)
            return self.dataset[index]
        finally:
            random.setstate(py)
            torch.set_rng_state(tc)
            if np is not None:
                np.random.set_state(npy)


class _KeyBatches(torch.utils.data.Sampler[list[tuple[int, int, int]]]):
    """Batches of (epoch, position, index) keys for one epoch, starting at a given batch.

    ``order`` holds (position in the epoch, dataset index) pairs: one rank's share of the epoch.
    """

    def __init__(self, order: list[tuple[int, int]], epoch: int, batch_size: int, start_batch: int,
                 drop_last: bool) -> None:
        self.order, self.epoch, self.batch_size = order, epoch, batch_size
        self.start_batch, self.drop_last = start_batch, drop_last

    def _n_batches(self) -> int:
        n = len(self.order)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __len__(self) -> int:
        return max(0, self._n_batches() - self.start_batch)

    def __iter__(self) -> Iterator[list[tuple[int, int, int]]]:
        for b in range(self.start_batch, self._n_batches()):
            lo = b * self.batch_size
            hi = min(lo + self.batch_size, len(self.order))
            yield [(self.epoch, *self.order[k]) for k in range(lo, hi)]


# must match the saving run (num_replicas and rank are absent from states saved before sharding existed)
_CONFIG_KEYS = ("dataset_len", "batch_size", "shuffle", "drop_last", "num_replicas", "rank")
_POSITION_KEYS = ("epoch", "batches_consumed", "seed")  # the position to continue from


class ResumableLoader:
    """A DataLoader whose position can be saved and restored exactly, mid-epoch, with workers.

    * The shuffle order of epoch ``e`` is a permutation drawn from ``derive_seed(seed, "epoch", e)``.
    * Each sample's augmentation randomness (``random``, NumPy, torch) is seeded from (seed, epoch,
      position in epoch), so it is the same whichever worker loads it and whatever was loaded before.
    * The loader never draws from the global torch RNG (its workers' base seed comes from its own generator),
      so creating it or resuming it does not shift the RNG stream of the training loop (e.g. dropout).
    * ``state_dict()`` holds (epoch, batches consumed, seed); after ``load_state_dict`` iteration continues
      with the next batch the uninterrupted run would have seen, without loading the skipped samples.
    * Across ranks it shards like ``DistributedSampler``: every rank draws the same permutation, pads it by
      repeating its start to a multiple of ``num_replicas``, and takes positions ``rank, rank + num_replicas,
      ...``. The shards are disjoint and together cover the dataset (the padding repeats at most
      ``num_replicas - 1`` samples), every rank gets the same number of batches, and each sample's randomness
      is seeded by its position in the whole epoch, so it does not depend on which rank loads it.
      ``num_replicas``/``rank`` default to the process group's (else ``WORLD_SIZE``/``RANK``); pass
      ``num_replicas=1, rank=0`` for the whole dataset on every rank.

    >>> loader = ResumableLoader(range(10), batch_size=4, seed=0)
    >>> first = next(iter(loader))
    >>> state = loader.state_dict()      # {'epoch': 0, 'batches_consumed': 1, ...}
    """

    def __init__(
        self,
        dataset: Any,
        *,
        batch_size: int = 1,
        shuffle: bool = True,
        seed: int | None = None,
        drop_last: bool = False,
        num_workers: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        **dataloader_kwargs: Any,
    ) -> None:
        for bad in ("sampler", "batch_sampler", "generator", "worker_init_fn"):
            if bad in dataloader_kwargs:
                raise TypeError(f"ResumableLoader sets {bad} itself; remove the {bad}= argument.")
        if seed is None:
            seed = seed_from_env()
        self.seed = validate_seed(seed if seed is not None else 0)
        self.num_replicas = world_size() if num_replicas is None else num_replicas
        self.rank = (current_rank() if self.num_replicas > 1 else 0) if rank is None else rank
        if isinstance(self.num_replicas, bool) or not isinstance(self.num_replicas, int) or self.num_replicas < 1:
            raise ValueError(f"num_replicas must be a positive integer, got {num_replicas!r}.")
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or not 0 <= self.rank < self.num_replicas:
            raise ValueError(f"rank must be an integer in [0, {self.num_replicas - 1}] (num_replicas="
                             f"{self.num_replicas}), got {self.rank!r}.")
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.num_workers = num_workers
        self.kwargs = dataloader_kwargs
        self.epoch = 0
        self.batches_consumed = 0
        self._it: Iterator[Any] | None = None

    def next_batch(self) -> Any:
        """The next batch, rolling over into the next epoch: handy for step-based training loops."""
        if self._it is None:
            self._it = iter(self)
        try:
            return next(self._it)
        except StopIteration:
            self._it = iter(self)
            return next(self._it)

    def _order(self, epoch: int) -> list[tuple[int, int]]:
        """This rank's (position in the epoch, dataset index) pairs for ``epoch``."""
        n = len(self.dataset)
        if not self.shuffle:
            order = list(range(n))
        else:
            g = torch.Generator().manual_seed(derive_seed(self.seed, "epoch", epoch))
            order = torch.randperm(n, generator=g).tolist()
        if self.num_replicas == 1:
            return list(enumerate(order))
        total = self._per_rank() * self.num_replicas
        padded = (order * (-(-total // n)))[:total] if n else []
        return [(pos, padded[pos]) for pos in range(self.rank, total, self.num_replicas)]

    def _per_rank(self) -> int:
        """Samples per rank and epoch (the padded dataset length over the ranks)."""
        return -(-len(self.dataset) // self.num_replicas)

    def __len__(self) -> int:
        n = self._per_rank()
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its first batch at the next iteration."""
        self.epoch, self.batches_consumed, self._it = epoch, 0, None

    def __iter__(self) -> Iterator[Any]:
        epoch, start = self.epoch, self.batches_consumed
        batches = _KeyBatches(self._order(epoch), epoch, self.batch_size, start, self.drop_last)
        loader = torch.utils.data.DataLoader(
            _SeededSamples(self.dataset, self.seed), batch_sampler=batches, num_workers=self.num_workers,
            generator=torch.Generator().manual_seed(derive_seed(self.seed, "loader", epoch, start)),
            **self.kwargs,
        )
        for batch in loader:
            self.batches_consumed += 1
            yield batch
        self.epoch, self.batches_consumed = epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "batches_consumed": self.batches_consumed, "seed": self.seed,
                "dataset_len": len(self.dataset), "batch_size": self.batch_size, "shuffle": self.shuffle,
                "drop_last": self.drop_last, "num_replicas": self.num_replicas, "rank": self.rank}

    def state_dict_problems(self, state: Any) -> list[str]:
        """Every reason why ``state`` cannot be loaded into this loader; empty when it can."""
        if not isinstance(state, Mapping):
            return [f"loader state is a {type(state).__name__}, expected the dict of ResumableLoader.state_dict()"]
        mine = self.state_dict()
        problems = [f"loader state has {key}={state[key]!r} but this loader has {mine[key]!r}"
                    for key in _CONFIG_KEYS if key in state and state[key] != mine[key]]
        missing = [key for key in _POSITION_KEYS if key not in state]
        if missing:
            problems.append(f"loader state lacks {', '.join(missing)}")
        for key in ("epoch", "batches_consumed"):
            value = state.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                problems.append(f"loader state has {key}={value!r}, expected a non-negative integer")
        try:
            validate_seed(state.get("seed", 0), what="loader state seed")
        except InvalidSeedError as exc:
            problems.append(str(exc).rstrip("."))
        return problems

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position; the dataset and batching must match the saving run.

        Raises ``ValueError`` naming every mismatch, and changes nothing, when the state does not fit.
        """
        problems = self.state_dict_problems(state)
        if problems:
            raise ValueError(f"{'; '.join(problems)}; resuming would not give the same batches. Build the loader "
                             "as in the saved run.")
        self.seed = state["seed"]
        self.epoch = state["epoch"]
        self.batches_consumed = state["batches_consumed"]
        self._it = None
