"""Seed values without any RNG: validation, the environment seed, and derived seeds.

Standard library only, so that light entry points (the pytest plugin, the lint command) can use them without
importing torch. :mod:`torchrepro.control.seeding` re-exports everything here.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from .._core.errors import InvalidSeedError

SEED_ENV = "TORCHREPRO_SEED"
MAX_SEED = 2**32 - 1


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
