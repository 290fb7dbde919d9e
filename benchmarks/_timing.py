"""Side-by-side timing helpers: variants are interleaved in rounds so machine noise hits all of them alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def interleaved(variants: dict[str, Callable[[], object]], *, rounds: int = 15, inner: int = 5) -> dict[str, float]:
    """Median seconds per call of each variant, measured in alternating rounds."""
    for fn in variants.values():
        fn()  # warm-up
    samples: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            samples[name].append((time.perf_counter() - t0) / inner)
    return {k: statistics.median(v) for k, v in samples.items()}
