"""Seeding every random-number source in one call.

Example:
    >>> import torchrepro
    >>> torchrepro.seed_everything(1234)
    1234
    >>> torchrepro.derive_seed(1234, "worker", 0) == torchrepro.derive_seed(1234, "worker", 0)
    True

Under ``torch.distributed`` (a process group of more than one rank, or ``WORLD_SIZE`` > 1 as set by
``torchrun``) :func:`seed_everything` follows the stream scheme of docs/distributed.md: the global RNGs start
identical on every rank (model initialisation), and at the first forward pass of any module they switch to a
per-rank stream (dropout); DataLoader workers get per-(rank, worker) seeds. ``shared=`` chooses which streams
are the same on every rank.
"""

from __future__ import annotations

import logging
import os
import random
import warnings
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from .._core.compat import accelerator_modules, np
from .._core.errors import InvalidSeedError, ReproWarning
from .._core.launchenv import LAUNCH_HASHSEED
from ._seeds import MAX_SEED, SEED_ENV, derive_seed, seed_from_env, validate_seed
from .determinism import deterministic as _deterministic

log = logging.getLogger("torchrepro")

HASHSEED_ENV = "PYTHONHASHSEED"
SHARED_ENV = "TORCHREPRO_SHARED_STREAMS"  # streams shared by every rank, for DataLoader workers (comma-separated)
RANK_ENV = "TORCHREPRO_STREAM_RANK"  # the rank that per-rank streams are derived from, when given explicitly

# The random streams of a distributed program and what draws from each (see docs/distributed.md).
STREAMS = {
    "init": "the global RNGs (torch, CUDA, Python random, NumPy) from seed_everything() to the first forward "
            "pass: model initialisation",
    "dropout": "the global RNGs from the first forward pass of any module on: dropout, random augmentation in the "
               "main process, anything else the training loop draws",
    "workers": "DataLoader workers seeded by torchrepro.seed_worker",
}
DEFAULT_SHARED = frozenset({"init"})

# PYTHONHASHSEED as it was when this interpreter started (torchrepro is imported before seeding).
_LAUNCH_HASHSEED = LAUNCH_HASHSEED
_hashseed_warned = False


def hashseed_fixed_at_launch() -> bool:
    """Whether this interpreter's string hashing was fixed when it started."""
    return _LAUNCH_HASHSEED not in (None, "", "random")


def _warn_hashseed_once() -> None:
    global _hashseed_warned
    if _hashseed_warned or hashseed_fixed_at_launch():
        return
    _hashseed_warned = True
    warnings.warn(
        "PYTHONHASHSEED was not set when Python started, so str/bytes hashing (set iteration order) in this "
        "process is randomised and cannot be fixed now. Child processes get the seed. To fix this process too, "
        "launch with `PYTHONHASHSEED=0 python train.py` or `torchrepro run -- python train.py`.",
        ReproWarning,
        stacklevel=3,
    )


def _seed_accelerators(seed: int) -> list[str]:
    seeded = []
    for name, mod in accelerator_modules().items():
        fn = getattr(mod, "manual_seed_all", None) or getattr(mod, "manual_seed", None)
        if fn is not None:
            fn(seed)
            seeded.append(name)
    return seeded


def _seed_globals(seed: int) -> None:
    """Seed Python ``random``, NumPy's global RNG, torch CPU and every available accelerator with ``seed``."""
    random.seed(seed)
    if np is not None:
        np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds CUDA lazily on current torch
    _seed_accelerators(seed)


# --- ranks ------------------------------------------------------------------------------------------------
def _env_int(*names: str) -> int | None:
    for var in names:
        value = os.environ.get(var, "").strip()
        if value.isdigit():
            return int(value)
    return None


def current_rank() -> int:
    """This process's global distributed rank (0 when not distributed).

    The process group's rank when one is initialised, else ``RANK`` (torchrun), ``SLURM_PROCID`` or ``LOCAL_RANK``.
    """
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    found = _env_int("RANK", "SLURM_PROCID", "LOCAL_RANK")
    return 0 if found is None else found


def world_size() -> int:
    """How many ranks this program runs on: the process group's size, else ``WORLD_SIZE`` (torchrun), else 1."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    found = _env_int("WORLD_SIZE", "SLURM_NTASKS")
    return 1 if found is None else max(found, 1)


def stream_rank() -> int:
    """The rank that per-rank streams are derived from: the ``rank=`` given to seed_everything, else the rank."""
    given = _env_int(RANK_ENV)
    return current_rank() if given is None else given


def shared_streams() -> frozenset[str]:
    """The streams that :func:`seed_everything` made the same on every rank (read by DataLoader workers)."""
    raw = os.environ.get(SHARED_ENV)
    if raw is None:
        return DEFAULT_SHARED
    return frozenset(name for name in raw.split(",") if name in STREAMS)


def _check_shared(shared: Any) -> frozenset[str]:
    if shared is None:
        return DEFAULT_SHARED
    if isinstance(shared, str):
        shared = (shared,)
    try:
        names = frozenset(shared)
    except TypeError:
        raise TypeError(f"shared must be a collection of stream names ({', '.join(STREAMS)}), got "
                        f"{shared!r}") from None
    unknown = sorted(str(n) for n in names if n not in STREAMS)
    if unknown:
        raise ValueError(f"shared names unknown stream(s) {', '.join(map(repr, unknown))}; the streams are "
                         f"{', '.join(map(repr, STREAMS))} (e.g. shared=('init', 'dropout') for the same dropout "
                         "masks on every rank).")
    return names


def stream_seed(seed: int, stream: str, *, rank: int | None = None, shared: Any = None) -> int:
    """The seed of ``stream`` (``"init"``, ``"dropout"``, ``"workers"``) on ``rank`` (default: this rank).

    A shared stream has the same seed on every rank: ``seed`` itself for ``"init"`` and
    ``derive_seed(seed, stream)`` for the others; a per-rank one has ``derive_seed(seed, stream, "rank", rank)``.

    >>> stream_seed(7, "init") == 7
    True
    >>> stream_seed(7, "dropout", rank=0) != stream_seed(7, "dropout", rank=1)
    True
    """
    if stream not in STREAMS:
        raise ValueError(f"unknown stream {stream!r}; the streams are {', '.join(map(repr, STREAMS))}.")
    if stream in _check_shared(shared):
        return seed if stream == "init" else derive_seed(seed, stream)
    return derive_seed(seed, stream, "rank", stream_rank() if rank is None else rank)


class _RankSwitch:
    """Switches the global RNGs from the shared init stream to this rank's dropout stream at the first forward.

    A global forward pre-hook, removed when it fires. When the global torch RNG was re-seeded or restored since
    :func:`seed_everything` (``torch.initial_seed()`` changed: ``manual_seed``, ``set_rng_state``, a checkpoint
    load), it switches nothing: the RNGs already hold a state the program chose.
    """

    def __init__(self, armed_seed: int, target_seed: int) -> None:
        self.armed_seed = armed_seed
        self.target_seed = target_seed
        self.state = "pending"
        self._handle: RemovableHandle | None = torch.nn.modules.module.register_module_forward_pre_hook(self._fire)

    def _fire(self, module: Any, args: Any) -> None:
        self.cancel()
        if torch.initial_seed() != self.armed_seed:
            self.state = "skipped"
            log.info("torchrepro: the global RNGs were re-seeded or restored after seed_everything; the switch to "
                     "the per-rank dropout stream was skipped")
            return
        _seed_globals(self.target_seed)
        self.state = "switched"

    def cancel(self, state: str | None = None) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        if state is not None:
            self.state = state


_switch: _RankSwitch | None = None
_streams: dict[str, Any] | None = None


def _cancel_switch(state: str = "cancelled") -> None:
    global _switch
    if _switch is not None:
        if _switch.state == "pending":
            _switch.cancel(state)
        _switch = None


def rng_streams() -> dict[str, Any] | None:
    """The streams :func:`seed_everything` set up in this process: seeds, rank, shared streams, switch state.

    None before the first call. ``"switch"`` is ``"none"`` (nothing to switch: not distributed, or init and
    dropout both shared), ``"pending"`` (waiting for the first forward pass), ``"switched"``, ``"skipped"`` (the
    RNGs were re-seeded or restored first) or ``"cancelled"``.
    """
    if _streams is None:
        return None
    return {**_streams, "switch": _switch.state if _switch is not None else _streams["switch"]}


def seed_everything(
    seed: int | None = None,
    *,
    workers: bool = True,
    deterministic: bool | str = False,
    shared: Any = None,
    rank: int | None = None,
) -> int:
    """Seed Python ``random``, NumPy's global RNG, torch CPU and every available accelerator; return the seed.

    Args:
        seed: an int in [0, 2**32 - 1]. None: use ``TORCHREPRO_SEED`` if set, else draw one and log it.
        workers: export the seed (``TORCHREPRO_SEED``, ``PYTHONHASHSEED``) so that DataLoader workers using
            :func:`torchrepro.seed_worker`, child processes and ranks derive their seeds from it.
        deterministic: True also calls :func:`torchrepro.deterministic`; ``"warn"`` does so with
            ``warn_only=True``.
        shared: in a distributed program, the streams that are the same on every rank (see :data:`STREAMS`);
            default ``{"init"}``: identical model initialisation, per-rank dropout and DataLoader workers.
            ``("init", "dropout", "workers")`` makes every rank draw the same numbers (tensor-parallel ranks).
        rank: the rank that per-rank streams derive from (default: the global rank), e.g. the data-parallel
            rank in 2-D parallelism. Giving it also turns the distributed scheme on in a single process.

    In a single process (no process group of more than one rank, no ``WORLD_SIZE`` > 1, no ``rank=``) the global
    RNGs are seeded with ``seed`` and nothing else happens. In a distributed program they are seeded with the
    ``"init"`` stream's seed, and, unless init and dropout are both shared, a forward pre-hook switches them to
    the ``"dropout"`` stream at the first forward pass of any module (see docs/distributed.md).

    >>> seed_everything(42, workers=False)
    42
    """
    global _switch, _streams
    if seed is None:
        seed = seed_from_env()
        if seed is None:
            seed = random.SystemRandom().randrange(MAX_SEED + 1)
            log.warning("torchrepro: no seed given; using seed %d. Repeat this run with seed_everything(%d) "
                        "or TORCHREPRO_SEED=%d.", seed, seed, seed)
    seed = validate_seed(seed)
    if deterministic not in (True, False, "warn"):
        raise ValueError(f"deterministic must be True, False or 'warn', got {deterministic!r}.")
    names = _check_shared(shared)
    if rank is not None:
        rank = validate_seed(rank, what="rank")
    _cancel_switch()
    distributed = rank is not None or world_size() > 1
    my_rank = (current_rank() if rank is None else rank) if distributed else 0
    init_seed = stream_seed(seed, "init", rank=my_rank, shared=names) if distributed else seed
    _seed_globals(init_seed)
    switch = "none"
    dropout_seed = init_seed
    if distributed and not {"init", "dropout"} <= names:
        dropout_seed = stream_seed(seed, "dropout", rank=my_rank, shared=names)
        _switch = _RankSwitch(init_seed, dropout_seed)
        switch = "pending"
    _streams = {"seed": seed, "rank": my_rank, "distributed": distributed, "shared": sorted(names),
                "init": init_seed, "dropout": dropout_seed, "switch": switch}
    if workers:
        os.environ[SEED_ENV] = str(seed)
        os.environ[HASHSEED_ENV] = str(seed)
        if distributed:
            os.environ[SHARED_ENV] = ",".join(sorted(names))
        if rank is not None:
            os.environ[RANK_ENV] = str(rank)
        else:
            os.environ.pop(RANK_ENV, None)
    _warn_hashseed_once()
    if deterministic:
        _deterministic(True, warn_only=deterministic == "warn")
    if distributed:
        log.info("torchrepro: seeded everything with %d (rank %d: init stream %d, dropout stream %d, shared %s)",
                 seed, my_rank, init_seed, dropout_seed, sorted(names))
    else:
        log.info("torchrepro: seeded everything with %d", seed)
    return seed


def start_rank_streams(seed: int | None = None, *, rank: int | None = None, shared: Any = None) -> int:
    """Switch the global RNGs to this rank's ``"dropout"`` stream now (instead of at the first forward pass).

    For programs without modules, or that want the switch at a point of their choosing (after building the model
    and before training). ``seed`` defaults to the last :func:`seed_everything` seed (else ``TORCHREPRO_SEED``).
    Cancels a pending automatic switch. Returns the seed the global RNGs were set to.
    """
    global _streams
    if seed is None:
        seed = _streams["seed"] if _streams is not None else seed_from_env()
        if seed is None:
            raise InvalidSeedError("start_rank_streams() needs a seed: call seed_everything(SEED) first, pass "
                                   "seed=, or set TORCHREPRO_SEED.")
    seed = validate_seed(seed)
    names = _check_shared(shared if shared is not None else (_streams or {}).get("shared"))
    my_rank = stream_rank() if rank is None else validate_seed(rank, what="rank")
    _cancel_switch()
    target = stream_seed(seed, "dropout", rank=my_rank, shared=names)
    _seed_globals(target)
    _streams = {"seed": seed, "rank": my_rank, "distributed": True, "shared": sorted(names),
                "init": (_streams or {}).get("init"), "dropout": target, "switch": "switched"}
    return target
