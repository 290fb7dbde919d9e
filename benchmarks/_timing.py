"""Side-by-side timing helpers: variants are interleaved in rounds so machine noise hits all of them alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def interleaved_samples(variants: dict[str, Callable[[], object]], *, rounds: int = 15,
                        inner: int = 5) -> dict[str, list[float]]:
    """Seconds per call of each variant in each round; the variants alternate within every round."""
    for fn in variants.values():
        fn()  # warm-up
    samples: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            samples[name].append((time.perf_counter() - t0) / inner)
    return samples


def interleaved(variants: dict[str, Callable[[], object]], *, rounds: int = 15, inner: int = 5) -> dict[str, float]:
    """Median seconds per call of each variant, measured in alternating rounds."""
    samples = interleaved_samples(variants, rounds=rounds, inner=inner)
    return {k: statistics.median(v) for k, v in samples.items()}


def paired_ratio(samples: dict[str, list[float]], name: str, base: str) -> tuple[float, float, float]:
    """Median and quartiles of ``name / base`` taken round by round: robust to load that drifts between rounds
    (both variants of a round saw the same machine)."""
    ratios = [a / b for a, b in zip(samples[name], samples[base])]
    q1, med, q3 = statistics.quantiles(ratios, n=4)
    return med, q1, q3
