"""Seeding every random-number source in one call (layer L1).

Example:
    >>> import torchrepro
    >>> torchrepro.seed_everything(1234)
    1234
    >>> torchrepro.derive_seed(1234, "worker", 0) == torchrepro.derive_seed(1234, "worker", 0)
    True
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import warnings
from typing import Any

import torch

from ._compat import accelerator_modules, np
from .determinism import deterministic as _deterministic
from .errors import InvalidSeedError, ReproWarning

log = logging.getLogger("torchrepro")

SEED_ENV = "TORCHREPRO_SEED"
HASHSEED_ENV = "PYTHONHASHSEED"
MAX_SEED = 2**32 - 1

# PYTHONHASHSEED as it was when this interpreter started (torchrepro is imported before seeding).
_LAUNCH_HASHSEED = os.environ.get(HASHSEED_ENV)
_hashseed_warned = False


def validate_seed(seed: Any, *, what: str = "seed") -> int:
    """Return ``seed`` if it is an int in [0, 2**32 - 1]; raise :class:`InvalidSeedError` otherwise."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InvalidSeedError(
            f"{what} must be an integer in [0, {MAX_SEED}], got {seed!r} of type {type(seed).__name__}."
        )
    if not 0 <= seed <= MAX_SEED:
        raise InvalidSeedError(f"{what} must be an integer in [0, {MAX_SEED}], got {seed}.")
    return seed


def seed_from_env() -> int | None:
    """The seed recorded in ``TORCHREPRO_SEED``, or None when unset."""
    raw = os.environ.get(SEED_ENV)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise InvalidSeedError(
            f"{SEED_ENV}={raw!r} is not an integer; set it to an integer in [0, {MAX_SEED}] or unset it."
        ) from None
    return validate_seed(value, what=SEED_ENV)


def _encode_key(key: Any) -> bytes:
    if isinstance(key, bool):
        return b"b" + (b"1" if key else b"0")
    if isinstance(key, int):
        return b"i" + str(key).encode()
    if isinstance(key, str):
        return b"s" + key.encode("utf-8")
    if isinstance(key, bytes):
        return b"y" + key
    raise TypeError(f"derive_seed keys must be int, str, bytes or bool, got {key!r} ({type(key).__name__})")


def derive_seed(base: int, *keys: int | str | bytes | bool) -> int:
    """A seed in [0, 2**32 - 1] mixed from ``base`` and ``keys`` with BLAKE2b (never Python's ``hash()``).

    The same inputs give the same seed in every process; distinct keys give distinct seeds.

    >>> derive_seed(7, "rank", 1) != derive_seed(7, "rank", 2)
    True
    """
    if isinstance(base, bool) or not isinstance(base, int) or base < 0:
        raise InvalidSeedError(f"derive_seed base must be a non-negative integer, got {base!r}.")
    h = hashlib.blake2b(digest_size=8, person=b"torchrepro-seed")
    for part in (base, *keys):
        enc = _encode_key(part)
        h.update(len(enc).to_bytes(4, "little"))
        h.update(enc)
    return int.from_bytes(h.digest(), "little") & MAX_SEED


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


def seed_everything(
    seed: int | None = None, *, workers: bool = True, deterministic: bool | str = False
) -> int:
    """Seed Python ``random``, NumPy's global RNG, torch CPU and every available accelerator; return the seed.

    Args:
        seed: an int in [0, 2**32 - 1]. None: use ``TORCHREPRO_SEED`` if set, else draw one and log it.
        workers: export the seed (``TORCHREPRO_SEED``, ``PYTHONHASHSEED``) so that DataLoader workers using
            :func:`torchrepro.seed_worker`, child processes and ranks derive their seeds from it.
        deterministic: True also calls :func:`torchrepro.deterministic`; ``"warn"`` does so with
            ``warn_only=True``.

    >>> seed_everything(42, workers=False)
    42
    """
    if seed is None:
        seed = seed_from_env()
        if seed is None:
            seed = random.SystemRandom().randrange(MAX_SEED + 1)
            log.warning("torchrepro: no seed given; using seed %d. Repeat this run with seed_everything(%d) "
                        "or TORCHREPRO_SEED=%d.", seed, seed, seed)
    seed = validate_seed(seed)
    if deterministic not in (True, False, "warn"):
        raise ValueError(f"deterministic must be True, False or 'warn', got {deterministic!r}.")

    random.seed(seed)
    if np is not None:
        np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds CUDA lazily on current torch
    _seed_accelerators(seed)
    if workers:
        os.environ[SEED_ENV] = str(seed)
        os.environ[HASHSEED_ENV] = str(seed)
    _warn_hashseed_once()
    if deterministic:
        _deterministic(True, warn_only=deterministic == "warn")
    log.info("torchrepro: seeded everything with %d", seed)
    return seed
